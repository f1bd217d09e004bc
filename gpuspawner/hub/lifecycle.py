"""One server's start and stop on this hub, around KubeSpawner's own: the start raced against
the scheduler's verdict (a pod it marks Unschedulable is refused in seconds with its reason),
a start whose Kubernetes call cannot connect refused with a 503, the stop retried while the
pod cannot be deleted, and the spawn's own progress steps between KubeSpawner's events.

The spawner is read through the seam (``spawner``: :class:`gpuspawner.hub.seam.Spawner`); KubeSpawner's
calls (its ``super()``'s) are handed down as arguments.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from gpuspawner.capacity.access import allowed
from gpuspawner.capacity.admission import REFUSE, admit
from gpuspawner.capacity.index import Health
from gpuspawner.core import noticewords as nw
from gpuspawner.core.windows import window_state
from gpuspawner.core.wording import slow_cluster_message, start_timeout_message, unreachable_message
from gpuspawner.hub import admitting, autoscaler, budgets, catalogs, claimlife, departures, kueue, metrics, spawnview, storedoptions
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.reflector import VerdictPodReflector, scheduler_verdict
from gpuspawner.hub.scheduling import SpawnRefused, brief, chain, unreachable_cause
from gpuspawner.hub.seam import Spawner
from gpuspawner.hub.spawnstate import SpawnState
from gpuspawner.names.vocabulary import RECORD_KEY, RECORD_OFFERING, AdmissionPolicy, Refusal
from gpuspawner.page.useroptions import too_long_message


async def start(spawner: Spawner, kubespawner_start: Callable[[], Awaitable[Any]]) -> Any:
    """KubeSpawner's start (``kubespawner_start``) raced against the scheduler's verdict on its
    pod; a refusal of the options themselves puts the hub's stored options back."""
    spawner.spawn_state = SpawnState(started_at=time.monotonic())
    before, spawner.options_before = spawner.options_before, None
    if spawner.too_long:  # (left out of user_options: see storedoptions.validated)
        spawner.spawn_state.refused = True
        malformed = SpawnRefused(too_long_message(spawner.too_long), Refusal.MALFORMED)
        malformed.during_start = True
        raise malformed
    starting = asyncio.ensure_future(kubespawner_start())
    watch = asyncio.ensure_future(first_verdict(watch_scheduling(spawner), kueue.held(spawner)))
    preparing = asyncio.ensure_future(claimlife.watch_binding(spawner))  # words only: a progress step
    deadline = asyncio.ensure_future(asyncio.sleep(own_deadline(spawner.start_timeout)))
    try:
        done, _ = await asyncio.wait({starting, watch, deadline}, return_when=asyncio.FIRST_COMPLETED)
        if starting in done and not kubespawner_gave_up(starting):
            url = starting.result()
            kueue.say_admitted(spawner.spawn_state)
            await claimlife.record_devices(spawner)
            state = spawner.spawn_state
            if state.choice is not None and state.started_at is not None:
                metrics.TIME_TO_SCHEDULE.labels(state.choice.offering.kind.value).observe(time.monotonic() - state.started_at)
        else:  # the scheduler or Kueue said no, or the start's (or KubeSpawner's) time is up: its pod goes
            if watch in done:
                reason, why = watch.result(), Refusal.UNSCHEDULABLE
            else:
                reason, why = start_timeout_message(spawner.start_timeout, waiting_for(spawner)), Refusal.START_TIMEOUT
                spawner.log.warning("%s: %s", spawner.log_name, reason)
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await spawner.stop(now=True)
            raise SpawnRefused(reason, why)
    except BaseException as exc:
        spawner.quota_ledger.release(admitting.reservation_key(spawner))
        refused: SpawnRefused | None = (
            exc if isinstance(exc, SpawnRefused) else failed_call_refusal(spawner, exc) if isinstance(exc, Exception) else None
        )
        if refused is None and isinstance(exc, asyncio.CancelledError) and cut_by_start_timeout(spawner):
            refused = SpawnRefused(start_timeout_message(spawner.start_timeout, waiting_for(spawner)), Refusal.START_TIMEOUT)
            spawner.log.warning("%s: %s", spawner.log_name, refused.message)
        if refused is None:
            raise
        refused.during_start = True  # JupyterHub's User.spawn logs it (see hubhooks)
        # Kept for the home page until the next start, and saved at once: a user who left the
        # spawn-pending page, or whose hub stopped just after the verdict, still reads why.
        spawner.stop_notice = refused_start_notice(spawner.name, datetime.now(UTC), refused.message)
        storedoptions.store_notice(spawner)
        storedoptions.put_back(spawner, before, refused)
        if refused is exc:
            raise
        raise refused from None
    finally:
        watch.cancel()
        preparing.cancel()
        deadline.cancel()
        starting.cancel()  # an interrupted spawn must not go on to create its pod after the stop
        admitting.release_reservation(spawner)
    spawner.stop_notice = None  # (why Kueue stopped it last time: running again now)
    spawner.spawn_state.started = spawner.spawn_state.choice is not None  # (without GPU offerings in play it is KubeSpawner's alone)
    if spawner.spawn_state.choice is not None:
        budgets.opened(spawner, spawner.spawn_state.choice.offering, spawner.spawn_state.choice.count)  # the GPU-hour ledger
        # Without the hub's Server object (a script, a test) there is no base URL to name.
        spawner.spawn_state.record_url = f"{url.rstrip('/')}{spawner.server.base_url}" if url and spawner.server else None
        # The hub's REST API serves the spawner's user_options; the record outlives a hub restart in the
        # saved state JupyterHub commits right after this start returns (spawnview.load_state puts it back
        # into user_options). A commit of its own here would cost each spawn one more write of the hub's
        # database, on sqlite an fsync on the event loop (found in a paired storm on sqlite).
        spawner.user_options = {**spawner.user_options, RECORD_KEY: spawnview.record(spawner)}
    return url


def kubespawner_gave_up(starting: asyncio.Future[Any]) -> bool:
    """Whether KubeSpawner's start ended in its own wait for the pod running out of time. That
    wait's deadline is drawn within 10% either side of ``start_timeout`` (its
    ``exponential_backoff`` jitters it), so it can come before this start's own deadline; its
    TimeoutError says only "pod ... did not start in N seconds!", and the start ends with the
    words of :func:`waiting_for` instead."""
    if starting.cancelled():
        return False
    failure = starting.exception()
    return isinstance(failure, TimeoutError) and "did not start in" in str(failure)


def own_deadline(start_timeout: float) -> float:
    """When a start gives up with words: shortly before JupyterHub's own ``start_timeout``, whose
    TimeoutError has no message (the user would read an empty "Spawn failed: ")."""
    return max(start_timeout - min(10.0, max(1.0, 0.05 * start_timeout)), 0.5 * start_timeout)


def cut_by_start_timeout(spawner: Spawner) -> bool:
    """Whether a cancelled start is JupyterHub's ``start_timeout`` running out before the start's own
    deadline: on a hub whose event loop is late by seconds (a storm on a small machine) the own
    deadline, which starts a turn or two after JupyterHub's clock, can come too late. Such a start
    ends with the words of :func:`waiting_for` instead of being cancelled: ``asyncio.wait_for``
    (JupyterHub's) raises what the cancelled task raised, so the user reads why, not an empty
    "Spawn failed: ". Nothing else cancels a start in its second half (JupyterHub stops the
    server after any failed start, so the pod goes either way)."""
    started = spawner.spawn_state.started_at
    return started is not None and time.monotonic() - started >= spawner.start_timeout / 2


def waiting_for(spawner: Spawner) -> str:
    """What a start that ran out of time was still waiting for, in the user's words: its place in
    the hub's queue, its pod never confirmed, a node, its container, or the notebook's answer."""
    state = spawner.spawn_state
    if state.queue_position is not None:
        return nw.queue_place_waiting(state.queue_position)
    if state.held_in:
        return nw.batch_queue_waiting(state.held_in)
    reflector = spawner.pod_reflector
    pod = reflector.pods.get(f"{spawner.namespace}/{spawner.pod_name}") if reflector is not None else None
    return nw.pod_waiting_words(pod)


async def first_verdict(*watches: Awaitable[str]) -> str:
    """The first refusal any of ``watches`` returns (the scheduler's, Kueue's); the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in watches]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(iter(done)).result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def failed_call_refusal(spawner: Spawner, exc: BaseException) -> SpawnRefused | None:
    """The 503 for a start whose Kubernetes call failed for want of a dependency: the API
    server (see :func:`unreachable_refusal`) or an admission webhook such as Kueue's, which
    fail closed (see :func:`gpuspawner.hub.kueue.webhook_refusal`); None for any other failure."""
    words = next(filter(None, map(kueue.webhook_refusal, chain(exc))), None)
    if words:
        spawner.log.warning("%s: refusing the spawn: %s", spawner.log_name, words)
        spawner.spawn_state.refused = True  # no pod was made
        return SpawnRefused(words, Refusal.UNREACHABLE)
    return unreachable_refusal(spawner, exc)


def unreachable_refusal(spawner: Spawner, exc: BaseException) -> SpawnRefused | None:
    """The 503 for a start whose Kubernetes call could not connect or timed out (None for
    any other failure). The inventory is told, so the page and later spawns say the cluster
    cannot be reached even while its watches still look live (an API server shutting down
    keeps them open); the hub polls this server as refused, so its cleanup asks the cluster
    nothing (a pod made by a request whose answer never came is the orphan reconciler's).
    But a request that timed out while the watches bring events met a slow API server (or an
    overloaded hub), not a missing one: that spawn alone is refused, as too slow, and its cleanup
    deletes the pod the request may have made."""
    cause = unreachable_cause(exc)
    if cause is None:
        return None
    reason = f"{type(cause).__name__}: {brief(cause)}"
    api, namespace = spawner.api, spawner.namespace
    inventory = Inventory.running(api)  # (none where no offering needs counts: nothing to tell)
    if isinstance(cause, TimeoutError) and inventory is not None and inventory.hears_the_api_server():
        # The API server is answering (the watches bring events): the request was slow, not lost
        # (an overloaded hub or API server). The cluster is not called unreachable for everyone;
        # the pod the request may have made is the hub's cleanup's to delete (poll finds it).
        spawner.log.warning(
            "%s: a Kubernetes request timed out (%s) while the API server answers the watches; refusing this spawn as too slow",
            spawner.log_name,
            reason,
        )
        return SpawnRefused(slow_cluster_message(), Refusal.UNREACHABLE)

    async def probe() -> None:
        await api.list_namespaced_pod(namespace, limit=1, _request_timeout=5)

    spawner.log.warning(
        "%s: a Kubernetes request failed (%s); refusing the spawn as the cluster cannot be reached", spawner.log_name, reason
    )
    if inventory is not None:
        inventory.call_failed(reason, probe)
    health = inventory.health if inventory is not None else Health(ready=False, as_of=time.time(), error=reason)
    spawner.spawn_state.refused = True
    return SpawnRefused(unreachable_message(health, spawner.now()), Refusal.UNREACHABLE)


async def watch_scheduling(spawner: Spawner) -> str:
    """Return the user's reason as soon as the real scheduler says the pod cannot run.

    Event-driven: KubeSpawner's pod reflector (see :mod:`gpuspawner.hub.reflector`) tells it
    the moment its watch sees the pod marked Unschedulable.
    """
    state = spawner.spawn_state
    await state.decided.wait()  # load_user_options runs inside KubeSpawner's _start
    choice = state.choice
    if choice is not None and state.expect_wait and choice.offering.scalable_nodes:  # waits for a new node
        karpenter_says = await autoscaler.karpenter_verdict(spawner, state.messages)  # unless none can come
        admitting.release_reservation(spawner)
        metrics.refused(choice.offering, Refusal.UNSCHEDULABLE)
        return f"No new node can start for {choice.offering.display_name}. The autoscaler (Karpenter) says: {karpenter_says}"
    if choice is None or state.expect_wait:
        await asyncio.Future()  # nothing to watch: warned users (or no GPU) wait it out
    assert choice is not None  # (the future above is never done)
    scheduler_says = await scheduler_verdict(lambda: spawner.pod_reflector, f"{spawner.namespace}/{spawner.pod_name}")
    offering = choice.offering
    admitting.release_reservation(spawner)  # this pod will not run: its own units are not what stands in the way
    catalog = allowed(await catalogs.catalog(spawner), spawnview.requester(spawner)).values()
    # the nodes' counts only: the scheduler speaks of nodes, and Kueue's quota already holds this pod
    availability = functools.partial(catalogs.availability, spawner, through_queue=False)
    decision = admit(offering, choice.count, availability(offering), AdmissionPolicy.BLOCK, [(o, availability(o)) for o in catalog])
    metrics.refused(offering, Refusal.UNSCHEDULABLE)
    head = decision.message if decision.action == REFUSE else f"{offering.display_name} cannot run now."
    return f"{head} The scheduler says: {scheduler_says}"


async def stop(spawner: Spawner, kubespawner_stop: Callable[[], Awaitable[Any]]) -> None:
    """KubeSpawner's stop (``kubespawner_stop``), retried while the pod cannot be deleted (see
    ``stop_retry_timeout``), then the server's DRA claims deleted."""
    admitting.release_reservation(spawner)
    if stopped_by_the_restart_check(spawner):
        now = datetime.now(UTC)
        spawner.stop_notice = (
            interrupted_start_notice(spawner.name, now)
            if start_was_interrupted(spawner)
            else unanswered_after_restart_notice(spawner.name, now, spawner.http_timeout)
        )
        spawner.log.info("%s: %s", spawner.log_name, spawner.stop_notice["text"])
    key = admitting.reservation_key(spawner)
    deadline = time.monotonic() + spawner.stop_retry_timeout
    attempt = 0
    releasing = asyncio.ensure_future(kueue.release_finalizer(spawner)) if kueue.managed(spawner) else None
    try:
        while True:
            try:
                await kubespawner_stop()
                record = spawnview.record(spawner) if spawner.spawn_state.choice is not None else (spawner.spawn_state.saved_record or {})
                return await claimlife.delete_claims(spawner, record)
            except Exception as exc:  # the API server down, refusing, or the pod not going away
                attempt += 1
                what = f"{spawner.log_name}: could not delete pod {key} ({brief(exc)})"
                if time.monotonic() >= deadline:
                    spawner.log.error(
                        "%s; giving up after %d attempts. The hub will show the server stopped; "
                        "the orphan reconciler deletes the pod once the cluster answers.",
                        what,
                        attempt,
                    )
                    raise
                delay = min(30, 2**attempt)
                spawner.log.warning(
                    "%s; retrying in %ds (attempt %d). The server stays 'stopping' until its pod is gone.", what, delay, attempt
                )
                await asyncio.sleep(delay)
    finally:
        if releasing is not None:
            releasing.cancel()
        spawner.quota_ledger.release(key)
        budgets.closed(spawner)


def stopped_by_the_restart_check(spawner: Spawner) -> bool:
    """Whether a stop is JupyterHub's at its start-up, of a server it found but that never
    answered it: its pod was there (the poll said running; a pod already gone has its own
    notice, see :func:`gpuspawner.hub.departures`) but the notebook did not answer within
    ``http_timeout``, as when the hub restarted while the server was still starting. Nothing
    of this process started, refused or heard that server, and no other reason is kept."""
    state = spawner.spawn_state
    in_play = bool(spawner.offerings or spawner.discover_offerings)
    fresh = state.started_at is None and not state.decided.is_set() and not state.answered
    return in_play and fresh and spawner.spawn_state.choice is None and not spawner.stop_notice


async def progress(
    state_of: Callable[[], SpawnState], events: AsyncIterator[dict[str, Any]], log: Any = None
) -> AsyncIterator[dict[str, Any]]:
    """KubeSpawner's pod ``events``, with the spawn's own steps (admission, reservation, queue
    position) between; ``state_of`` gives the spawn's current state.

    KubeSpawner's events need its event watch; where that cannot start (the API server gone) its
    generator raises, and the stream would end without the spawn's outcome (JupyterHub sends the
    refusal's words only after a stream that ends normally). So its failure ends its part only
    (said once in ``log``): the spawn's own steps go on until JupyterHub ends the stream."""
    sent, position = 0, None
    inner = events.__aiter__()
    pending: asyncio.Future[dict[str, Any]] | None = asyncio.ensure_future(inner.__anext__())
    try:
        while True:
            state = state_of()
            for message in state.messages[sent:]:
                sent += 1
                yield {"progress": 2, "message": message}
            now = state.queue_position
            if now is not None and now != position:
                position = now
                yield {"progress": 1, "message": f"Waiting for a free GPU: number {now} in the queue."}
            if pending is None:
                await asyncio.sleep(0.5)
                continue
            done, _ = await asyncio.wait({pending}, timeout=0.5)
            if pending in done:
                try:
                    event = pending.result()
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    if log is not None:
                        log.warning("the pod's events cannot be read now (%s); the progress shows the spawn's own steps", brief(exc))
                    pending = None
                    continue
                yield event
                pending = asyncio.ensure_future(inner.__anext__())
    finally:
        if pending is not None:
            pending.cancel()


def pod_left(spawner: Spawner, explained: bool) -> None:
    """The hub's poll found the server stopped: if its pod left the cluster behind the hub's back
    (evicted, its node gone, deleted by someone else, preempted), JupyterHub marks the server
    stopped without calling its stop, so its units go back here (the index's watch gave them
    back already where the hub reads the cluster: see QuotaLedger), its GPU-hour row closes when
    the pod's deletion began, and, unless Kueue's words already say why (``explained``), the
    home page says why, in the cluster's words (gpuspawner.hub.departures).

    Only for a server that runs with GPU offerings in play: started in this process, or running
    when it began (its saved record); a pod that is still there (its container ended) is
    KubeSpawner's own stop's."""
    state = spawner.spawn_state
    if not (state.started or state.saved_record is not None):
        return
    key = admitting.reservation_key(spawner)
    reflector = spawner.pod_reflector
    if reflector is not None and key in reflector.pods:
        return
    gone = reflector.gone.pop(key, None) if isinstance(reflector, VerdictPodReflector) else None
    state.started, state.saved_record = False, None  # (told once)
    spawner.quota_ledger.release(key)
    budgets.closed(spawner, departures.gone_at(gone))
    if explained:
        return
    index = catalogs.counts(spawner)
    node = (gone or {}).get("node", "")
    node_gone = bool(node) and index is not None and catalogs.health(spawner).ready and node not in index.nodes
    said = departures.karpenter_departure(spawner.events)  # Karpenter drained its node: its reason
    spawner.stop_notice = departures.home_notice(gone, node_gone, spawner.name, datetime.now(UTC), said)
    spawner.log.warning(
        "%s: its pod %s left the cluster without the hub stopping it: %s", spawner.log_name, key, spawner.stop_notice["text"]
    )


def interrupted_start_notice(server_name: str, now: datetime) -> dict[str, str]:
    """The home page's notice of a server whose start the hub never finished: the hub restarted
    (or was stopped) while the server was starting, and JupyterHub does not resume a start; so
    the server is not running, and nobody else tells the user why."""
    at = now.astimezone(UTC).isoformat()
    return nw.server_notice(server_name, at, nw.interrupted_start_says(at))


def refused_start_notice(server_name: str, now: datetime, words: str) -> dict[str, str]:
    """The home page's notice of a start refused on its way (the scheduler's or Kueue's
    verdict, the start's own deadline, the cluster unreachable): the refusal's words, dated."""
    at = now.astimezone(UTC).isoformat()
    return nw.server_notice(server_name, at, nw.refused_start_says(at, words))


def unanswered_after_restart_notice(server_name: str, now: datetime, http_timeout: float) -> dict[str, str]:
    """The home page's notice of a server the restarted hub found but that did not answer it
    (see :func:`stopped_by_the_restart_check`): the hub stopped it, and nobody else says why."""
    at = now.astimezone(UTC).isoformat()
    return nw.server_notice(server_name, at, nw.unanswered_after_restart_says(at, http_timeout))


def start_was_interrupted(spawner: Spawner) -> bool:
    """Whether the hub finds, after a restart, a server of its database that never finished
    starting: GPU offerings in play (every finished start then saves its record), no record in
    the saved state, no start of this process, and no other reason already kept."""
    in_play = bool(spawner.offerings or spawner.discover_offerings)
    return in_play and spawner.spawn_state.choice is None and spawner.spawn_state.saved_record is None and not spawner.stop_notice


async def poll(spawner: Spawner, kubespawner_poll: Callable[[], Awaitable[int | None]]) -> int | None:
    """KubeSpawner's poll (``kubespawner_poll``); with ``stop_outside_window``, a server past its
    window counts as done; a pod that left tells the home page why."""
    state = spawner.spawn_state
    if state.refused:
        return 1  # refused before its pod was made (the hub polls before cleaning up): nothing runs
    status = await kubespawner_poll()
    if status is None and spawner.stop_outside_window:
        slug = state.choice.offering.slug if state.choice else (state.saved_record or {}).get(RECORD_OFFERING)
        offering = next((o for o in await catalogs.catalog(spawner) if o.slug == slug), None) if slug else None
        closed = window_state(offering.windows, spawner.now()) if offering else ""
        if offering is not None and closed:  # (closed only where there is an offering)
            spawner.log.info("%s: %s is %s now; stopping the server (stop_outside_window)", spawner.log_name, offering.slug, closed)
            return 0  # the hub then stops it as a server that has exited
    if status is None:
        await budgets.refresh(spawner)  # the exported budget figures stay fresh (for the culler)
    else:
        pod_left(spawner, explained=kueue_stopped(spawner))
        if start_was_interrupted(spawner):
            spawner.stop_notice = interrupted_start_notice(spawner.name, datetime.now(UTC))
            spawner.log.info("%s: %s", spawner.log_name, spawner.stop_notice["text"])
    return status


def kueue_stopped(spawner: Spawner) -> bool:
    """If Kueue stopped the server's pod (preempted it), say why: logged, and kept for the home
    page. Whether it did (else the cluster's own words may say why: :func:`pod_left`)."""
    ended = kueue.take_ended(spawner)
    if ended is None:
        return False
    spawner.stop_notice = kueue.home_notice(ended, spawner.name)
    spawner.log.info("%s: stopped by Kueue or a device taint: %s", spawner.log_name, spawner.stop_notice["text"])
    return True
