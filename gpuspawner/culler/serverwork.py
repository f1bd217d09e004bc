"""One server's part of a cull cycle: its pod's work (the kernel view, the warning, the
decision, the action) within the cycle's per-server deadline, and what happens to a
server whose pod stalls the culler (carried over; judged by GPU telemetry alone after
repeated stalls). A mixin of :class:`gpuspawner.culler.cycle.Culler`, whose state it reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jupyterhub_idle_culler import format_td
from jupyterhub_idle_culler.utils import maybe_future

from gpuspawner.culler import notices
from gpuspawner.culler.actions import ActionResult
from gpuspawner.culler.decide import decide, decide_unresponsive, upcoming
from gpuspawner.culler.gpu_metrics import GpuView, PodGpuView, expect_devices
from gpuspawner.culler.hubclient import server_record
from gpuspawner.culler.leases import lease_reclaimed, lease_status
from gpuspawner.culler.observations import kernel_memo, last_seen, plan_kernel_view, track_gpu_idle
from gpuspawner.culler.policy import RECLAIM, STOP, CullDecision
from gpuspawner.culler.records import BUDGET, GPU_IDLE_LIMIT, GPU_LEASE, WAITING, KernelView, ServerRecord

if TYPE_CHECKING:
    from gpuspawner.culler.actions import Actions
    from gpuspawner.culler.cullmetrics import CullerMetrics
    from gpuspawner.culler.kernels import KernelClient
    from gpuspawner.culler.leases import LeaseBook
    from gpuspawner.culler.notify import Notifier
    from gpuspawner.culler.observations import GpuIdleStreak, KernelMemo
    from gpuspawner.culler.policy import Policy
    from gpuspawner.culler.tokens import ServerTokens

#: what can still prevent a warned stop, by its reason (else: any activity)
_UNLESS: dict[str | None, str] = {
    GPU_IDLE_LIMIT: "unless the GPU is used (only GPU use counts)",
    GPU_LEASE: "whatever happens (its GPU lease ends)",
    BUDGET: "whatever happens (a budget of its user's runs out: GPU-hours or cost)",
}


@dataclass
class ServerOutcome:
    server: ServerRecord
    decision: CullDecision
    result: ActionResult
    kernel_view: KernelView | None = None
    #: its pod's work missed the cycle's deadline and goes on in the background
    carried_over: bool = False


class ServerWork:
    """The per-server methods of :class:`~gpuspawner.culler.cycle.Culler` (its attributes: the
    clients, the policy, the metrics and log, and the per-server memories)."""

    # What the mixin reads of the Culler (set in Culler.__init__; declared here for the type checker).
    policy: Policy
    log: logging.Logger
    metrics: CullerMetrics
    kernels: KernelClient
    tokens: ServerTokens
    actions: Actions
    leases: LeaseBook
    notifier: Notifier | None
    arbiter: Callable[..., Any] | None
    dry_run: bool
    server_deadline_s: float
    warn_before_s: int
    _carried: dict[tuple[str, str], tuple[tuple[Any, Any], asyncio.Future[ServerOutcome]]]
    _stalls: dict[tuple[str, str], int]
    _warned_contracts: set[tuple[str, str]]
    _gpu_last_active: dict[tuple[str, str], datetime]
    _gpu_idle: dict[tuple[str, str], GpuIdleStreak]
    _gpu_pods_seen: set[tuple[str, str]]
    _memos: dict[tuple[str, str], tuple[tuple[Any, Any], KernelMemo]]
    _seen: set[tuple[str, str]]
    _planning: dict[str, datetime]

    async def _server(
        self,
        user: Mapping[str, Any],
        name: str,
        model: Mapping[str, Any],
        gpu_task: asyncio.Future[GpuView],
        now: datetime,
    ) -> ServerOutcome:
        rec = server_record(user, name, model)
        o = rec.offering
        if o.problem and (rec.user, rec.name) not in self._warned_contracts:
            self._warned_contracts.add((rec.user, rec.name))
            self.log.warning("server %s: %s", rec.label, o.problem)
        gpu = None
        gpu_seen = None
        idle_since = None
        if o.is_gpu:
            view = await gpu_task
            if o.devices:  # Dynamic Resource Allocation: found by its devices (gpu_metrics.GpuView.for_devices)
                gpu = view.for_devices(o.devices)
            else:
                gpu = expect_devices(view.for_pod(o.namespace, o.pod, shared=o.shares_gpu), o.expected_devices)
            pod = (o.namespace or "", o.pod or "")
            self._gpu_pods_seen.add(pod)
            if gpu.active:
                self._gpu_last_active[pod] = now
            gpu_seen = self._gpu_last_active.get(pod)
            streak = track_gpu_idle(self._gpu_idle.get(pod), gpu, now, view.window_s)
            if streak is None:
                self._gpu_idle.pop(pod, None)
            else:
                self._gpu_idle[pod] = streak
                idle_since = streak.since
        key = (rec.user, rec.name)
        self._seen.add(key)
        instance = (rec.started, o.url)
        carried = self._carried.pop(key, None)
        if carried is not None and not carried[1].done():
            if carried[0] == instance:  # still at last cycle's work: nothing waits for it
                self._carried[key] = carried
                return await self._stalled(rec, gpu, now, idle_since)
            carried[1].cancel()  # another instance of the server: that work is moot
        work = asyncio.ensure_future(self._pod_work(rec, model, gpu, gpu_seen, idle_since, now))
        done, _ = await asyncio.wait({work}, timeout=self.server_deadline_s)
        if work in done:
            self._stalls.pop(key, None)
            return work.result()
        work.add_done_callback(self._carried_done)
        self._carried[key] = (instance, work)
        return await self._stalled(rec, gpu, now, idle_since)

    async def _pod_work(
        self,
        rec: ServerRecord,
        model: Mapping[str, Any],
        gpu: PodGpuView | None,
        gpu_seen: datetime | None,
        idle_since: datetime | None,
        now: datetime,
    ) -> ServerOutcome:
        """What waits on the server's pod: its kernel view, the warning, the action."""
        o = rec.offering
        custom = self.arbiter is not None
        key = (rec.user, rec.name)
        memo_entry = self._memos.get(key)
        memo = memo_entry[1] if memo_entry and memo_entry[0] == (rec.started, o.url) else None
        ask = plan_kernel_view(
            rec,
            gpu,
            self.policy,
            now,
            custom_arbiter=custom,
            gpu_last_active=gpu_seen,
            memo=memo,
            gpu_idle_since=idle_since,
            horizon_s=self.warn_before_s,
        )
        kv = None
        if ask.kernels:
            kv = await self.kernels.view(rec, with_status=ask.status)
            if kv.deferred:
                self.log.debug("kernel view of %s %s", rec.label, kv.error)
            elif not kv.ok:
                self.metrics.errors.labels("server").inc()
                self.log.warning("kernel view of %s unavailable: %s", rec.label, kv.error)
            new_memo = kernel_memo(kv, now, self.policy, o)
            if new_memo is None:
                self._memos.pop(key, None)
            else:
                self._memos[key] = ((rec.started, o.url), new_memo)
        arbiter_idle = None
        if custom:
            seen = last_seen(rec, kv, gpu_seen)
            inactive = now - seen if seen else timedelta(0)
            arbiter_idle = bool(
                await maybe_future(
                    self.arbiter(  # type: ignore[misc]
                        inactive=inactive,
                        inactive_limit=self.policy.timeout_for(o),
                        server=dict(model),
                    )
                )
            )
        decision = decide(rec, kv, gpu, self.policy, now, arbiter_idle, gpu_seen, idle_since)
        lease = lease_status(rec, self.policy, now)
        if lease is None:
            self.leases.status.pop(key, None)
        else:
            self.leases.status[key] = lease
        seen = last_seen(rec, kv, gpu_seen)
        if self.policy.in_turn(o):
            self._plan_turn(rec, kv, gpu, decision, now, gpu_seen, idle_since)
        if decision.action not in (STOP, RECLAIM) and not custom and (kv is None or kv.ok):
            await self._warn(rec, kv, gpu, now, gpu_seen, idle_since, seen)
        result = await self.actions.apply(rec, decision, gpu=gpu, idle_since=seen, now=now)
        if result.stopped:
            await self.tokens.revoke(rec)
        elif lease_reclaimed(decision.action, decision.stop_reason) and not self.dry_run and not result.errors:
            self.leases.renewed(rec, now)  # its kernels are gone: a new lease begins with new ones
            self.leases.status.pop(key, None)
        return ServerOutcome(rec, decision, result, kv)

    async def _stalled(
        self,
        rec: ServerRecord,
        gpu: PodGpuView | None,
        now: datetime,
        idle_since: datetime | None,
    ) -> ServerOutcome:
        """The server's pod did not let its work finish within ``server_deadline_s``:
        the work goes on in the background (carried over), and the server is judged,
        after repeated stalls, by its GPU telemetry alone (decide_unresponsive)."""
        key = (rec.user, rec.name)
        stalls = self._stalls[key] = self._stalls.get(key, 0) + 1
        self.metrics.errors.labels("stall").inc()
        self.log.warning(
            "server %s stalled: its pod kept the culler past the server deadline (%ss) -- carried over, "
            "no one else waits for it (%d cycle(s) in a row; judged by GPU telemetry alone from %d)",
            rec.label,
            f"{self.server_deadline_s:g}",
            stalls,
            self.policy.stalls_before_telemetry,
        )
        decision = decide_unresponsive(rec, gpu, self.policy, now, idle_since, stalls)
        if decision.action == STOP and not self.dry_run:
            carried = self._carried.pop(key, None)
            if carried is not None:
                carried[1].cancel()
        # no notice: the pod does not answer (decide_unresponsive's stop is in the log and the action log)
        result = await self.actions.apply(rec, decision, gpu=gpu, idle_since=idle_since, now=now, tell=False)
        if result.stopped:
            self._stalls.pop(key, None)
            await self.tokens.revoke(rec)
        return ServerOutcome(rec, decision, result, None, carried_over=decision.action != STOP or self.dry_run)

    def _carried_done(self, task: asyncio.Future[ServerOutcome]) -> None:
        """Carried-over work ended (its own actions logged and counted what it did)."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.metrics.errors.labels("culler").inc()
            self.log.error("error in carried-over work", exc_info=exc)

    def _plan_turn(
        self,
        rec: ServerRecord,
        kv: KernelView | None,
        gpu: PodGpuView | None,
        decision: CullDecision,
        now: datetime,
        gpu_seen: datetime | None,
        gpu_idle_since: datetime | None,
    ) -> None:
        """When this server, in turn, makes room for its offering's waiting spawns if nothing
        changes: now, or what :func:`upcoming` finds within its bound (what the waiting spawn
        is told). A server that will not make room (busy, unknown) plans nothing."""
        slug = rec.offering.slug or ""
        if decision.action == STOP and decision.stop_reason == WAITING:
            at: datetime | None = now
        else:
            horizon = max(self.policy.waiting_bound_for(rec.offering), self.policy.turn_notice)
            coming = upcoming(rec, kv, gpu, self.policy, now, horizon, gpu_seen, gpu_idle_since)
            at = coming.at if coming is not None and coming.decision.stop_reason == WAITING else None
        if at is not None and (slug not in self._planning or at < self._planning[slug]):
            self._planning[slug] = at

    async def _warn(
        self,
        rec: ServerRecord,
        kv: KernelView | None,
        gpu: PodGpuView | None,
        now: datetime,
        gpu_seen: datetime | None,
        gpu_idle_since: datetime | None,
        seen: datetime | None,
    ) -> None:
        """Tell the server's notebook what will be reclaimed within the warning
        window, and when -- or that nothing is, once activity took it back.
        Only when that is news for the server: a decision is never changed."""
        if self.notifier is None or not rec.offering.url or not self.notifier.supported(rec):
            return
        # No kernel view: plan_kernel_view, asked with the same window, saw no action
        # possible within it -- no need to ask decide() again.
        coming = None
        if kv is not None:
            coming = upcoming(rec, kv, gpu, self.policy, now, self.warn_before_s, gpu_seen, gpu_idle_since)
        body = notices.notice(rec, coming, self.policy, now, seen, gpu)
        lease = self.leases.status.get((rec.user, rec.name))
        if lease is not None and lease.extensions_allowed > 0:  # the notebook shows it, and where to extend it
            body["lease"] = {
                "ends_at": lease.ends_at.isoformat(),
                "extensions_left": lease.extensions_left,
                "can_extend": not lease.why_not,
                "words": lease.words(),
            }
        if not self.notifier.pending(rec, body):
            return
        if await self.notifier.put(rec, body) and coming is not None:
            self.log.info(
                "warned %s: %s in %s (at %s) %s: %s",
                rec.label,
                "kernel shutdown" if coming.action == RECLAIM else "server stop",
                format_td(coming.at - now),
                coming.at.isoformat(timespec="seconds"),
                _UNLESS.get(coming.decision.stop_reason, "unless there is activity"),
                body["reason"],
            )
