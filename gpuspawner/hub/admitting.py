"""One spawn's admission on this hub: the window -> quota -> capacity order
(:func:`gpuspawner.capacity.admission.in_order`) fed with this hub's live counts, its quota
ledger and its wait queue; then queue, warn or go, and reserve the units on a node.

The spawner is read through the seam (``spawner``: a :class:`gpuspawner.hub.seam.Spawner`)
for the user, the traits and the spawn's state; the counts are :mod:`gpuspawner.hub.catalogs`'.
"""

from __future__ import annotations

import asyncio
import functools
import time
from datetime import datetime

from gpuspawner.capacity.access import allowed, named
from gpuspawner.capacity.admission import ADMIT, QUEUE, REFUSE, WARN, Decision, Held, QuotaRequest, Quotas, in_order, units_held
from gpuspawner.core import wording
from gpuspawner.core.model import Offering
from gpuspawner.core.noticewords import reserved_words, starting_uncounted
from gpuspawner.core.windows import window_state
from gpuspawner.core.wording import image_refusal, turn_words
from gpuspawner.hub import budgets, catalogs, culleractions, hubhooks, hubid, metrics, spawnview
from gpuspawner.hub.scheduling import SpawnRefused, WaitQueue, refusal
from gpuspawner.hub.seam import Spawner
from gpuspawner.hub.spawnstate import saved_holdings, user_label
from gpuspawner.names.vocabulary import RECORD_KEY, Refusal
from gpuspawner.offerings.choice import Choice, shown

#: (kept here too: where admission's reservations were first named)
reservation_key = spawnview.reservation_key
release_reservation = spawnview.release_reservation


def bound_holdings(spawner: Spawner, catalog: dict[str, Offering]) -> dict[str, Held]:
    """GPU units that bound pods of this hub's users hold now (from the inventory), by pod key.
    Without counts: none (quotas then count the grants this hub process made)."""
    out = {}
    index = catalogs.counts(spawner)
    # the pods of this hub's users only (another hub's users are not ours), never every pod of the cluster;
    # with those it made before it had an identity (hub.hubid.made_before)
    pods = index.user_pods(spawner.hub_id) if index is not None else {}
    if index is not None and spawner.hub_id:
        pods = {**pods, **hubid.made_before(getattr(spawner.user, "db", None), index.user_pods(""))}
    for key, pod in pods.items():
        offering = catalog.get(pod.offering or "")
        if offering is not None:
            out[key] = Held(offering.kind.value, units_held(offering, pod.requests), pod.user or "")  # (user_pods: all carry a user)
    return out


def group_members(spawner: Spawner) -> dict[str, list[str]]:
    """Members (as pod labels) of this user's groups that have a quota."""
    out: dict[str, list[str]] = {}
    for name, group in spawnview.user_groups(spawner):
        if name in spawner.group_quotas:
            out[name] = [user_label(member) for member, _ in named(getattr(group, "users", None))]
    return out


def check_quota(
    spawner: Spawner, offering: Offering, count: int, bound: dict[str, Held], members: dict[str, list[str]], grant: bool = False
) -> Decision:
    """This server's quota decision, counting bound pods and every grant not yet bound.
    With ``grant``, an admitted decision is recorded in the same step (see QuotaLedger)."""
    ledger = spawner.quota_ledger
    watch_grants(spawner)
    if not ledger.restored:
        restore_grants(spawner, bound)
    quotas = Quotas(spawner.user_quota, spawner.group_quotas)
    request = QuotaRequest(reservation_key(spawner), offering, count, user_label(spawner.user.name), quotas, members, bound)
    return ledger.grant(request) if grant else ledger.check(request)


def watch_grants(spawner: Spawner) -> None:
    """Let the quota ledger hear, from the live index, when a pod of this hub is bound or leaves
    the cluster (see QuotaLedger.pod_event): a server whose pod is deleted behind the hub's back
    gives its units back within that one watch event. Once per index (none without counts)."""
    index = catalogs.counts(spawner)
    if index is not None:
        index.observe_user_pods(spawner.hub_id, spawner.quota_ledger.pod_event)


def restore_grants(spawner: Spawner, bound: dict[str, Held] | None = None) -> None:
    """Give the quota ledger what this hub's running servers hold, from each one's saved
    record (once per hub process, at the first quota check): a restarted hub counts a DRA
    server's true count, a pod not bound yet, and every server when it may not read the
    cluster, as the hub that started them did. ``bound``: this hub's bound pods now."""
    db = getattr(spawner.user, "db", None)
    if db is None:  # no hub database (a script, a test): nothing was saved
        spawner.quota_ledger.restored = True
        return
    saved = saved_holdings(hubhooks.saved_records(db, RECORD_KEY))
    spawner.quota_ledger.restore(saved, bound or {})
    if saved:
        spawner.log.info("GPUSpawner: quotas count %d running server(s) from their saved records", len(saved))


def fit_image(spawner: Spawner, choice: Choice, image: str) -> Choice:
    """``choice`` on the nodes (devices) that can run ``image`` (``c.GPUSpawner.image_requirements``):
    its pod's affinity, its claim's selectors and its free count are those of the fitting ones.
    Refused (409) at once, with the versions in words, when the offering has nodes and none fits."""
    offering, reason = catalogs.image_fit(spawner, choice.offering, image)
    if reason:
        metrics.refused(choice.offering, Refusal.IMAGE)
        raise SpawnRefused(image_refusal(choice.offering.display_name, shown(image, 160), reason), Refusal.IMAGE)
    return Choice(offering, choice.count)


def obstacle_now(spawner: Spawner, choice: Choice, offerings: list[Offering], grant: bool = False) -> tuple[str, Decision]:
    """What stands in the way of ``choice`` now, in the one order (window, quota, capacity),
    in one step: nothing else runs between the quota check and its grant. With ``grant`` (at
    start), the quota check also records the grant: release it if the spawn does not go on."""
    offering, count = choice.offering, choice.count
    catalog = {o.slug: o for o in offerings}

    def quota() -> Decision:
        return check_quota(spawner, offering, count, bound_holdings(spawner, catalog), group_members(spawner), grant=grant)

    return in_order(
        offering,
        count,
        window_state(offering.windows, spawner.now()),
        quota,
        functools.partial(catalogs.availability, spawner),
        lambda: allowed(catalog.values(), spawnview.requester(spawner)).values(),
        spawner.admission,
    )


async def admit(spawner: Spawner, choice: Choice, catalog: list[Offering]) -> None:
    """Quotas, then capacity: refuse, warn, queue, or go. Holds a reservation when admitted."""
    offering, count = choice.offering, choice.count
    key = reservation_key(spawner)
    await budgets.check(spawner, offering, count, catalog)  # 429 when the GPU-hour budget does not cover an hour
    reason, decision = obstacle_now(spawner, choice, catalog, grant=True)
    if decision.action == REFUSE:
        spawner.quota_ledger.release(key)
        metrics.refused(offering, reason)
        raise refusal(reason, decision)
    if not offering.takes_units:
        return
    try:
        await _take(spawner, offering, count, decision)
    except BaseException:
        spawner.quota_ledger.release(key)
        raise


async def _take(spawner: Spawner, offering: Offering, count: int, decision: Decision) -> None:
    """Queue, warn or go for ``decision``, then reserve the units on a node."""
    state = spawner.spawn_state
    index = catalogs.counts(spawner)
    if index is None:  # the hub may not read the cluster: the scheduler decides alone
        metrics.admitted(offering, decision.action)
        state.messages.append(starting_uncounted(count, offering.display_name))
        return
    if decision.action == QUEUE:
        await _wait_in_queue(spawner, offering, count, decision.message)
    elif decision.action == WARN:
        state.expect_wait = True
        state.messages.append(decision.message)
    # (nothing to reserve where the counts do not know, e.g. a DRA pool being republished: the scheduler decides)
    counted = catalogs.availability(spawner, offering).counted
    if (
        decision.action != WARN
        and counted
        and index.reserve(reservation_key(spawner), offering, count) is None
        and decision.action == ADMIT
    ):
        # Counted free but no single node fits now (a race with another spawn): say so now.
        metrics.refused(offering, Refusal.NO_CAPACITY)
        raise SpawnRefused(wording.just_taken(offering.display_name))
    metrics.admitted(offering, decision.action)
    state.messages.append(reserved_words(count, offering.display_name))


#: how often a waiting spawn asks the culler when an idle server will make room
TURNS_EVERY_S = 5.0


async def _turn_words(offering: Offering, position: int, now: datetime) -> str:
    """What the waiting spawn is told of the culler's plan: "An idle MIG 1g.10gb will be
    reclaimed for you in about 2 minutes." ("" when the culler plans none, or is not wired)."""
    source = culleractions.CullerActions.latest
    at = (await source.turns()).get(offering.slug) if source is not None else None
    if at is None:
        return ""
    return turn_words(offering.display_name, position, (at - now).total_seconds())


async def _wait_in_queue(spawner: Spawner, offering: Offering, count: int, message: str) -> None:
    queue = WaitQueue.for_offering(offering.slug)
    timeout = offering.queue_timeout or spawner.queue_timeout
    spawner.spawn_state.messages.append(message)
    async with queue.place(reservation_key(spawner)) as place:
        deadline = time.monotonic() + timeout
        told, asked = "", 0.0
        while True:
            if place.first and (catalogs.availability(spawner, offering).largest_free or 0) >= count:
                return  # admit() reserves before anyone else can run
            if time.monotonic() - asked >= TURNS_EVERY_S:
                asked = time.monotonic()
                news = await _turn_words(offering, place.position, spawner.now())
                if news and news != told:
                    told = news
                    spawner.spawn_state.messages.append(news)
            if time.monotonic() > deadline:
                metrics.refused(offering, Refusal.QUEUE_TIMEOUT)
                raise SpawnRefused(
                    wording.queue_timeout(offering.display_name, timeout // 60 or 1),
                    Refusal.QUEUE_TIMEOUT,
                )
            spawner.spawn_state.queue_position = place.position
            await asyncio.sleep(0.25)
