"""One culling cycle: list the hub's servers page by page, and for each server --
as soon as its page arrives, concurrently -- read its views, decide, act.

The GPU view (one Prometheus query) is asked at the start of the cycle, in
parallel with the first page of users; only GPU servers wait for it. Across
cycles the culler remembers, per pod, the last cycle that saw its GPU active and
how long its GPU has been idle, and per server its kernel memo and its token;
what belongs to servers the hub no longer lists is forgotten (tokens revoked) at
the end of each cycle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jupyterhub_idle_culler import format_td, utcnow
from jupyterhub_idle_culler.utils import maybe_future

from gpuspawner.culler import notices
from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.actions import ActionResult, Actions
from gpuspawner.culler.dates import parse_time
from gpuspawner.culler.decide import GPU_IDLE_LIMIT, GPU_LEASE, decide, decide_unresponsive, upcoming
from gpuspawner.culler.gpu_metrics import GpuView, PodGpuView, expect_devices, unavailable
from gpuspawner.culler.hub import HubClient, server_record
from gpuspawner.culler.kernels import KernelClient
from gpuspawner.culler.metrics import CullerMetrics
from gpuspawner.culler.notify import Notifier
from gpuspawner.culler.observations import GpuIdleStreak, KernelMemo, kernel_memo, last_seen, plan_kernel_view, track_gpu_idle
from gpuspawner.culler.policy import RECLAIM, STOP, CullDecision, Policy
from gpuspawner.culler.prometheus import PrometheusClient
from gpuspawner.culler.records import KernelView, ServerRecord
from gpuspawner.culler.tokens import ServerTokens
from gpuspawner.culler.transport import RequestFailed
from gpuspawner.names.vocabulary import Kind

#: what can still prevent a warned stop, by its reason (else: any activity)
_UNLESS = {
    GPU_IDLE_LIMIT: "unless the GPU is used (only GPU use counts)",
    GPU_LEASE: "whatever happens (its GPU lease ends)",
}


@dataclass
class ServerOutcome:
    server: ServerRecord
    decision: CullDecision
    result: ActionResult
    kernel_view: KernelView | None = None
    #: its pod's work missed the cycle's deadline and goes on in the background
    carried_over: bool = False


@dataclass
class CycleReport:
    """What one cycle saw and did (for logs, tests and the bench)."""

    started: datetime
    duration_s: float = 0.0
    hub_error: str | None = None
    gpu_view: GpuView | None = None
    outcomes: list[ServerOutcome] = field(default_factory=list)
    users_deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reclaimed_mib: dict[str, float] = field(default_factory=dict)

    def outcome(self, user: str, name: str = "") -> ServerOutcome | None:
        for o in self.outcomes:
            if o.server.user == user and o.server.name == name:
                return o
        return None

    def counts(self) -> Counter[str]:
        return Counter(o.decision.action for o in self.outcomes)


class Culler:
    """Runs cycles. Everything it talks to is passed in."""

    def __init__(
        self,
        *,
        hub: HubClient,
        kernels: KernelClient,
        tokens: ServerTokens,
        prometheus: PrometheusClient | None,
        policy: Policy,
        metrics: CullerMetrics,
        log: logging.Logger,
        dry_run: bool = False,
        remove_named_servers: bool = False,
        cull_users: bool = False,
        cull_admin_users: bool = True,
        user_timeout: int = 0,
        arbiter: Callable[..., Any] | None = None,
        clock: Callable[[], datetime] = utcnow,
        notifier: Notifier | None = None,
        warn_before_s: int = 0,
        action_log: ActionLog | None = None,
        server_deadline_s: float = 60.0,
        kernel_concurrency: int = 4,
    ) -> None:
        self.hub = hub
        #: how long a cycle waits for one server's pod (kernel view, notices, shutdowns)
        self.server_deadline_s = float(server_deadline_s)
        self.kernels = kernels
        self.tokens = tokens
        self.prometheus = prometheus
        self.policy = policy
        self.metrics = metrics
        self.log = log
        self.dry_run = dry_run
        self.cull_users = cull_users
        self.cull_admin_users = cull_admin_users
        self.user_timeout = user_timeout
        self.arbiter = arbiter
        self.clock = clock
        #: None in a dry run: a user is never warned of what will not be done
        self.notifier = None if dry_run else notifier
        self.warn_before_s = max(0, warn_before_s) if self.notifier is not None else 0
        self.action_log = action_log
        self.actions = Actions(
            hub,
            kernels,
            metrics,
            log,
            dry_run=dry_run,
            remove_named_servers=remove_named_servers,
            policy=policy,
            notifier=self.notifier,
            action_log=action_log,
            kernel_concurrency=kernel_concurrency,
        )
        #: (user, server) -> (instance, its pod's work still running from an earlier cycle)
        self._carried: dict[tuple[str, str], tuple[tuple[Any, Any], asyncio.Future[ServerOutcome]]] = {}
        #: (user, server) -> consecutive cycles its pod's work missed the deadline
        self._stalls: dict[tuple[str, str], int] = {}
        self._warned_contracts: set[tuple[str, str]] = set()
        #: the tokens the last cycle's deferred kernel views wanted, being minted
        self._minting: asyncio.Future[int] | None = None
        #: (namespace, pod) -> the last cycle's time that saw its GPU active
        self._gpu_last_active: dict[tuple[str, str], datetime] = {}
        #: (namespace, pod) -> how long every GPU view has shown its GPU idle
        self._gpu_idle: dict[tuple[str, str], GpuIdleStreak] = {}
        self._gpu_pods_seen: set[tuple[str, str]] = set()
        #: (user, server) -> ((started, url), memo of its last kernel view)
        self._memos: dict[tuple[str, str], tuple[tuple[Any, Any], KernelMemo]] = {}
        self._seen: set[tuple[str, str]] = set()
        #: whether the last available GPU view had the per-pod probe's series (None: none yet)
        self._probe_seen: bool | None = None

    # -- views -------------------------------------------------------------
    async def _gpu_view(self, report: CycleReport) -> GpuView:
        if self.prometheus is None:
            view = unavailable("no prometheus_url configured")
        else:
            view = await self.prometheus.gpu_view()
            if not view.available:
                self.metrics.errors.labels("prometheus").inc()
                self.log.warning(
                    "GPU view unavailable: %s -- no GPU-based culls this cycle; CPU servers are judged on hub and kernel signals",
                    view.error,
                )
        self.metrics.gpu_view_up.set(1 if view.available else 0)
        if view.available and view.probe != self._probe_seen:
            self._log_probe(view.probe)
        report.gpu_view = view
        report.reclaimed_mib.update(self.actions.tracker.observe(view))
        return view

    def _log_probe(self, present: bool) -> None:
        """Say once (and again only when it changes) whose numbers shared GPUs are judged on."""
        self._probe_seen = present
        if present:
            self.log.info(
                "per-pod GPU probe series found (gpuspawner probe): pods sharing a GPU are judged on their own processes' "
                "memory and activity where the probe covers the device"
            )
        else:
            self.log.info(
                "no per-pod GPU probe series (gpuspawner probe, docs/probe.md): pods sharing a time-sliced or MPS GPU are "
                "judged on dcgm-exporter's whole-GPU numbers, so a busy neighbour keeps an idle pod's memory held"
            )

    # -- per server / user -------------------------------------------------
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
        seen = last_seen(rec, kv, gpu_seen)
        if decision.action not in (STOP, RECLAIM) and not custom and (kv is None or kv.ok):
            await self._warn(rec, kv, gpu, now, gpu_seen, idle_since, seen)
        result = await self.actions.apply(rec, decision, gpu=gpu, idle_since=seen, now=now)
        if result.stopped:
            await self.tokens.revoke(rec)
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

    async def _user(
        self,
        user: Mapping[str, Any],
        gpu_task: asyncio.Future[GpuView],
        now: datetime,
        report: CycleReport,
    ) -> None:
        servers = user.get("servers") or {}
        results = await asyncio.gather(
            *(self._server(user, name, s, gpu_task, now) for name, s in servers.items()),
            return_exceptions=True,
        )
        alive = 0
        for (name, _), r in zip(servers.items(), results, strict=True):
            if isinstance(r, BaseException):
                alive += 1
                self.metrics.errors.labels("culler").inc()
                report.errors.append(f"{user['name']}/{name}: {r!r}")
                self.log.error("error handling server %s/%s", user["name"], name, exc_info=r)
                continue
            report.outcomes.append(r)
            if r.result.stopped not in ("stopped", "gone"):
                alive += 1
        if self.cull_users and not alive:
            await self._maybe_delete_user(user, now, report)

    async def _maybe_delete_user(self, user: Mapping[str, Any], now: datetime, report: CycleReport) -> None:
        """Same rule as jupyterhub-idle-culler: only with --cull-users, only users
        with no server left, inactive for ``timeout``, admins per cull_admin_users."""
        if user.get("admin") and not self.cull_admin_users:
            return
        when = user.get("last_activity") or user.get("created")
        if not when or self.user_timeout <= 0:
            return
        inactive = now - (parse_time(when) or now)
        if inactive.total_seconds() < self.user_timeout:
            return
        if self.dry_run:
            self.log.info("DRY RUN: would delete user %s (inactive for %s)", user["name"], format_td(inactive))
            return
        self.log.info("deleting user %s (inactive for %s)", user["name"], format_td(inactive))
        try:
            await self.hub.delete_user(user["name"])
        except RequestFailed as e:
            self.metrics.errors.labels("hub").inc()
            self.log.error("could not delete user %s: %s", user["name"], e)
            return
        report.users_deleted.append(user["name"])

    # -- the cycle ---------------------------------------------------------
    async def cycle(self) -> CycleReport:
        """One cycle. Never raises for hub, server or Prometheus trouble."""
        await self.tokens_minted()  # the tokens the last cycle wanted (minted while the culler slept)
        t0 = time.monotonic()
        now = self.clock()
        report = CycleReport(started=now)
        self._seen = set()
        self._gpu_pods_seen = set()
        self.tokens.new_cycle()
        gpu_task = asyncio.ensure_future(self._gpu_view(report))
        tasks: list[asyncio.Future[None]] = []
        states = ["ready"] + (["inactive"] if self.cull_users else [])
        try:
            for state in states:
                async for user in self.hub.iter_users(state):
                    tasks.append(asyncio.ensure_future(self._user(user, gpu_task, now, report)))
        except RequestFailed as e:
            self.metrics.errors.labels("hub").inc()
            report.hub_error = str(e)
            self.log.error(
                "listing the hub's servers failed: %s -- %d users listed before the "
                "failure are still handled; the rest wait for the next cycle",
                e,
                len(tasks),
            )
        for r in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(r, BaseException):
                self.metrics.errors.labels("culler").inc()
                report.errors.append(repr(r))
                self.log.error("error in cycle", exc_info=r)
        await gpu_task
        self._forget_old_gpu_activity(now)
        if report.hub_error is None:  # servers gone from the hub: forget them
            for key in set(self._memos) - self._seen:
                del self._memos[key]
            for pod in set(self._gpu_idle) - self._gpu_pods_seen:
                del self._gpu_idle[pod]
            for key in set(self._carried) - self._seen:
                self._carried.pop(key)[1].cancel()
            for key in set(self._stalls) - self._seen:
                del self._stalls[key]
            await self.tokens.keep_only(self._seen)
            if self.notifier is not None:
                self.notifier.keep_only(self._seen)
        report.duration_s = time.monotonic() - t0
        self._finish(report)
        if self.tokens.wanted:  # after the cycle: its decisions never wait on the hub's database
            self._minting = asyncio.ensure_future(self.tokens.mint_wanted())
        return report

    async def tokens_minted(self) -> None:
        """Wait until the tokens the last cycle wanted are minted (ServerTokens.mint_wanted)."""
        task, self._minting = self._minting, None
        if task is not None:
            try:
                await task
            except Exception:
                self.metrics.errors.labels("culler").inc()
                self.log.exception("unexpected error minting per-server tokens")

    async def close(self) -> None:
        """Revoke every per-server token (the culler is stopping)."""
        carried = [task for _, task in self._carried.values()]
        self._carried.clear()
        for task in carried:
            task.cancel()
        await asyncio.gather(*carried, return_exceptions=True)
        if self._minting is not None:
            self._minting.cancel()
            await asyncio.gather(self._minting, return_exceptions=True)
            self._minting = None
        await self.tokens.close()

    def _forget_old_gpu_activity(self, now: datetime) -> None:
        longest = max(
            [
                self.policy.default_timeout,
                *self.policy.kind_timeouts.values(),
                *self.policy.offering_timeouts.values(),
            ]
        )
        for key, when in list(self._gpu_last_active.items()):
            if (now - when).total_seconds() > longest:
                del self._gpu_last_active[key]

    def _finish(self, report: CycleReport) -> None:
        self.metrics.cycle_duration.observe(report.duration_s)
        self.metrics.last_cycle.set(time.time())
        by_kind = Counter(o.server.offering.kind for o in report.outcomes)
        for kind in Kind:
            self.metrics.servers.labels(kind.value).set(by_kind.get(kind, 0))
        counts = report.counts()
        kernels = sum(len(o.decision.shutdown) for o in report.outcomes if o.decision.action != STOP)
        carried = sum(1 for o in report.outcomes if o.carried_over)
        self.log.info(
            "%scycle done in %.2fs: %d servers; %d stop, %d reclaim (%d kernels), %d held back, %d keep%s%s%s",
            "DRY RUN " if self.dry_run else "",
            report.duration_s,
            len(report.outcomes),
            counts.get("stop", 0),
            counts.get("reclaim", 0),
            kernels,
            counts.get("held_back", 0),
            counts.get("keep", 0),
            f"; {carried} carried over (stalled pods)" if carried else "",
            "" if report.gpu_view is None or report.gpu_view.available else f"; GPU view unavailable ({report.gpu_view.error})",
            f"; hub error ({report.hub_error})" if report.hub_error else "",
        )
