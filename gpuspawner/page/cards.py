"""What the spawn page shows for each offering, for one user, now. Pure.

Turns offerings, their live availability and the policy answers (allowed? within
its time window? within quota? queued?) into :class:`~gpuspawner.page.views.OptionView`
rows (:mod:`gpuspawner.page.views`), and picks the default choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from gpuspawner.capacity.access import Requester, may_use
from gpuspawner.capacity.index import Health
from gpuspawner.core.model import Availability, Offering
from gpuspawner.core.products import product_name
from gpuspawner.core.windows import window_state
from gpuspawner.core.wording import QUEUE_UNKNOWN, isolation_phrase, memory_truth, queue_words
from gpuspawner.dra.alternatives import choice_words, choices
from gpuspawner.names.vocabulary import COUNT_KEY, OFFERING_KEY, AdmissionPolicy, Kind
from gpuspawner.page.views import OptionView


def availability_text(offering: Offering, avail: Availability, policy: str, queued: int) -> tuple[str, str]:
    """(badge text, disabled reason) for an offering the user may take now: the badge may promise
    a queue place or a wait (``admission``), as the start would keep that promise."""
    if not avail.counted:  # nothing to count (CPU), or the hub may not read the cluster
        return ("free count unavailable" if offering.takes_units else ""), ""
    free = avail.free or 0
    policy = offering.admission or policy
    room = avail.queue
    if avail.queue_limits and room is not None:  # Kueue's quota is the smaller: say so, beside the nodes' count
        text = queue_words(room.queue, room.free or 0, avail.node_free or 0, room.borrowed, room.cohort)
        if free > 0:
            return text, ""
        if policy != AdmissionPolicy.BLOCK:  # Kueue holds the server until its quota allows it
            return f"{text}: your server would wait", ""
        return text, f"your queue '{room.queue}' allows none more right now"
    if free > 0:
        return f"{free} of {avail.capacity} free" + (f" on the nodes; {QUEUE_UNKNOWN}" if avail.queue_unknown else ""), ""
    if offering.scalable_nodes:
        return f"free after scale-up, about {offering.scale_up_minutes} min", ""
    if policy == AdmissionPolicy.QUEUE:
        return (f"queue: {queued} waiting" if queued else "none free: you would be first in the queue"), ""
    if policy == AdmissionPolicy.WARN:
        return "none free: your server would wait", ""
    return "none free", "none free right now"


def _with_choices(offering: Offering, availability: Callable[[Offering], Availability]) -> str:
    """The description, after what an offering with alternatives may give ("MIG 3g.20gb (1 free),
    or MIG 2g.10gb if none is free (2 free)."; :mod:`gpuspawner.dra.alternatives`)."""
    claim = offering.claim
    if claim is None or not claim.alternatives:
        return offering.description
    words = choice_words(claim, [availability(o).free for o in choices(offering)])
    return f"{words}. {offering.description}".strip()


def count_text(avail: Availability) -> str:
    """The badge of a choice the user may not start now (outside its time window, over quota):
    what is free, and no queue place, wait or scale-up promised, for none would be kept."""
    if not avail.counted:
        return ""
    free = avail.free or 0
    return f"{free} of {avail.capacity} free" if free > 0 else "none free"


def option_views(
    catalog: Iterable[Offering],
    who: Requester,
    availability: Callable[[Offering], Availability],
    now: datetime,
    default_policy: str = AdmissionPolicy.BLOCK,
    quota_reason: Callable[[Offering], str] = lambda o: "",
    queue_length: Callable[[str], int] = lambda slug: 0,
    hide_forbidden: bool = False,
    hour_cost: Callable[[Offering], str] = lambda o: "",
    image_reason: Callable[[Offering], str] = lambda o: "",
) -> list[OptionView]:
    """One row per offering the page shows (hidden ones never; forbidden ones disabled or hidden).

    ``availability`` counts, and ``image_reason`` says why none of an offering's nodes can run
    the image the form starts with (gpuspawner.core.imagefit; "" where one can)."""
    rows = []
    for offering in catalog:
        if offering.hidden:
            continue
        allowed = may_use(offering, who)
        if not allowed and hide_forbidden:
            continue
        avail = availability(offering)
        text, reason = availability_text(offering, avail, default_policy, queue_length(offering.slug))
        if not allowed:  # no count, queue place or wait on a choice the user may never take
            text, reason = "", "not allowed for your groups"
        elif closed := window_state(offering.windows, now) or quota_reason(offering):
            text, reason = count_text(avail), closed
        elif misfit := image_reason(offering):  # none of its nodes can run the image: no promise either
            text, reason = "not for this image", misfit
        counts = offering.counts
        if offering.kind is Kind.FULL and avail.counted and not offering.scalable_nodes and (avail.free or 0) > 0:
            counts = tuple(c for c in offering.counts if c <= (avail.largest_free or 0)) or offering.counts[:1]
        rows.append(
            OptionView(
                slug=offering.slug,
                kind=offering.kind.value,
                display_name=offering.display_name,
                description=_with_choices(offering, availability),
                memory=memory_truth(
                    offering.kind,
                    offering.memory_mib,
                    offering.sharing,
                    offering.replicas,
                    product_name(offering.product) if offering.product else "",
                ),
                compute_share=offering.compute_share,
                isolation=isolation_phrase(offering.isolation),
                availability=text,
                free=avail.free,
                capacity=avail.capacity,
                disabled_reason=reason,
                counts=counts,
                hour_cost=hour_cost(offering),
            )
        )
    return rows


def default_choice(
    rows: list[OptionView],
    admin_default: str,
    last: Mapping[str, Any] | None,
    offerings: Mapping[str, Offering],
    refused: Mapping[str, Any] | None = None,
) -> tuple[str | None, int]:
    """A just-refused choice if still selectable (the form shown again keeps it), else the admin's
    default, else the user's last choice if still selectable, else the smallest free GPU, else No GPU."""
    selectable = {r.slug: r for r in rows if not r.disabled}

    def still_selectable(choice: Mapping[str, Any] | None) -> tuple[str, int] | None:
        slug = choice.get(OFFERING_KEY) if choice else None
        if choice is None or not isinstance(slug, str) or slug not in selectable:
            return None
        count = choice.get(COUNT_KEY, 1)
        counts = selectable[slug].counts
        return slug, int(count) if str(count).isdigit() and int(count) in counts else counts[0]

    found = still_selectable(refused)
    if found:
        return found
    if admin_default in selectable:
        return admin_default, selectable[admin_default].counts[0]
    found = still_selectable(last)
    if found:
        return found
    gpus = [r for r in selectable.values() if r.kind != Kind.CPU and (r.free or 0) > 0]
    if gpus:
        smallest = min(gpus, key=lambda r: (offerings[r.slug].memory_mib or 10**9, r.slug))
        return smallest.slug, smallest.counts[0]
    cpu = [r for r in selectable.values() if r.kind == Kind.CPU]
    if cpu:
        return cpu[0].slug, 1
    first = next(iter(selectable.values()), None)
    return (first.slug, first.counts[0]) if first else (None, 1)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def counts_notice(health: Health, now: datetime) -> str:
    """What the spawn page says above the choices when the free counts are not live ("" when they are).

    ``now`` is timezone-aware (the site's zone): the time the counts are from is shown in it,
    with the zone's abbreviation (``c.GPUSpawner.site_timezone``), so no reader takes it for theirs.
    """
    if health.ready or health.forbidden:  # forbidden: each offering says "free count unavailable"
        return ""
    if not health.answered:
        return "Counting free GPUs: the hub is still connecting to the cluster. Reload the page in a moment."
    if health.as_of is None:
        return (
            "The GPU cluster cannot be reached, so the free counts are unknown and no server can start "
            "right now. Please try again in a few minutes."
        )
    as_of = datetime.fromtimestamp(health.as_of, now.tzinfo)
    return (
        f"The GPU cluster cannot be reached: the free counts are as of {as_of:%H:%M:%S %Z} "
        f"({_age(now.timestamp() - health.as_of)} ago) and may be out of date. No server can start "
        "until the cluster is back; please try again in a few minutes."
    )


def slow_cluster_message() -> str:
    """Why a spawn is refused when the API server answers, but not the hub's request in time (the 503's message)."""
    return (
        "The cluster is answering too slowly right now: it did not confirm your server's pod in time, "
        "so your server was not started. Please try again in a minute."
    )


def start_timeout_message(start_timeout: float, waiting_for: str) -> str:
    """Why a start ran out of time (``waiting_for``: what it was still waiting for)."""
    return (
        f"Your server did not start within the hub's time limit ({start_timeout:.0f} seconds): {waiting_for}. "
        "Nothing is left running. Please try again; if it happens again, tell the hub's administrators."
    )


def unreachable_message(health: Health, now: datetime) -> str:
    """Why a spawn is refused while the counts are not live (the 503's message)."""
    if not health.answered:
        return "The hub is still connecting to the GPU cluster, so no server can start yet. Please try again in a few seconds."
    since = ""
    if health.as_of is not None:
        since = f" (since {datetime.fromtimestamp(health.as_of, now.tzinfo):%H:%M:%S %Z}, {_age(now.timestamp() - health.as_of)} ago)"
    return f"The GPU cluster cannot be reached{since}, so no server can start now. Please try again in a few minutes."
