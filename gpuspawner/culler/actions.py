"""Carry out decisions (or, in a dry run, only say what would be done), log every
decision with its reasons, count what was done, and follow GPU memory reclaimed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from jupyterhub_idle_culler import format_td, utcnow

from gpuspawner.culler import notices
from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.gpu_metrics import GpuView, PodGpuView
from gpuspawner.culler.hubclient import HubClient
from gpuspawner.culler.kernels import KernelClient, KernelShutdown
from gpuspawner.culler.notify import Notifier
from gpuspawner.culler.policy import HELD_BACK, KEEP, RECLAIM, STOP, CullDecision, Policy
from gpuspawner.culler.records import GPU_IDLE_LIMIT, UNRESPONSIVE, ServerRecord
from gpuspawner.culler.transport import RequestFailed
from gpuspawner.names.vocabulary import StopReason


@dataclass
class ActionResult:
    #: "stopped", "stopping" (hub said 202), "gone" (404), or None (not stopped)
    stopped: str | None = None
    kernels_shut_down: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False


@dataclass
class _Expected:
    before_mib: float
    kind: str
    label: str
    cycles: int = 0
    #: a DRA pod's devices (contract.ServerOffering.devices): its memory is read by device
    devices: tuple[Mapping[str, str], ...] = ()


class ReclaimTracker:
    """GPU memory freed by kernel shutdowns is what dcgm-exporter shows gone in a
    later cycle (the drop in FB_USED of the pod), not a guess at shutdown time."""

    #: give up on a pod whose memory could not be read for this many cycles
    max_cycles = 10

    def __init__(self, metrics: CullerMetrics, log: logging.Logger) -> None:
        self.metrics = metrics
        self.log = log
        self._pending: dict[tuple[str, str], _Expected] = {}

    def expect(self, key: tuple[str, str], before_mib: float, kind: str, label: str, devices: tuple[Mapping[str, str], ...] = ()) -> None:
        self._pending[key] = _Expected(before_mib, kind, label, devices=devices)

    def observe(self, view: GpuView) -> dict[str, float]:
        """Settle what this view shows; returns {server label: MiB reclaimed}."""
        settled: dict[str, float] = {}
        for key, exp in list(self._pending.items()):
            exp.cycles += 1
            if not view.available:
                now_mib = None
            elif exp.devices:  # a DRA pod's devices keep their series: only what they report counts
                now_mib = view.for_devices(exp.devices).memory_mib
            else:
                pod_view = view.for_pod(key[0] or None, key[1])
                # no series at all for the pod: its GPU processes are gone
                now_mib = pod_view.memory_mib if pod_view.devices else 0.0
            if now_mib is None:
                if exp.cycles >= self.max_cycles:
                    self.log.info("giving up measuring memory reclaimed from %s", exp.label)
                    del self._pending[key]
                continue
            freed = max(0.0, exp.before_mib - now_mib)
            self.metrics.memory_reclaimed.labels("kernel_shutdown", exp.kind).inc(freed)
            self.log.info(
                "GPU memory of %s: %.0f MiB -> %.0f MiB after kernel shutdown (%.0f MiB reclaimed)",
                exp.label,
                exp.before_mib,
                now_mib,
                freed,
            )
            settled[exp.label] = freed
            del self._pending[key]
        return settled


class Actions:
    def __init__(
        self,
        hub: HubClient,
        kernels: KernelClient,
        metrics: CullerMetrics,
        log: logging.Logger,
        *,
        dry_run: bool = False,
        remove_named_servers: bool = False,
        policy: Policy | None = None,
        notifier: Notifier | None = None,
        action_log: ActionLog | None = None,
        kernel_concurrency: int = 4,
    ) -> None:
        self.hub = hub
        #: kernel shutdowns in flight at once to one server
        self.kernel_concurrency = max(1, int(kernel_concurrency))
        self.kernels = kernels
        self.metrics = metrics
        self.log = log
        self.dry_run = dry_run
        self.remove_named_servers = remove_named_servers
        self.policy = policy or Policy()
        #: tells the server's notebook what is reclaimed, just before (None: nothing sent)
        self.notifier = notifier
        #: keeps what was done, for the user it concerns (None: not kept)
        self.action_log = action_log
        self.tracker = ReclaimTracker(metrics, log)
        self._held: dict[tuple[str, str], tuple[str, ...]] = {}

    def _log_decision(self, server: ServerRecord, d: CullDecision) -> None:
        if d.action != HELD_BACK:
            self._held.pop((server.user, server.name), None)
        o = server.offering
        what = f"{server.label} [{o.kind}{' ' + o.slug if o.slug else ''}]"
        dry = "DRY RUN: would " if self.dry_run else ""
        if d.action == STOP and d.stop_reason == GPU_IDLE_LIMIT:
            self.log.warning(
                "%sstop server %s (%s): GPU telemetry has shown its GPU idle for %s, past"
                " gpu_idle_limit, while the server claims: %s -- the GPU's telemetry wins over"
                " what a pod says. %s",
                dry,
                what,
                d.stop_reason,
                format_td(d.gpu_idle_for),
                "; ".join(d.overruled),
                d.summary(),
            )
        elif d.action == STOP and d.stop_reason == UNRESPONSIVE:
            self.log.warning(
                "%sstop server %s (%s): its pod stalled the culler cycle after cycle; judged by GPU telemetry alone. %s",
                dry,
                what,
                d.stop_reason,
                d.summary(),
            )
        elif d.action == STOP:
            self.log.info("%sstop server %s (%s): %s", dry, what, d.stop_reason, d.summary())
        elif d.action == RECLAIM:
            self.log.info(
                "%sshut down %d idle kernel(s) of %s, keeping the server: %s",
                dry,
                len(d.shutdown),
                what,
                d.summary(),
            )
        elif d.action == HELD_BACK:
            # INFO when the reason is new for this server, DEBUG while it repeats
            # (an outage would otherwise log every GPU server every cycle)
            key = (server.user, server.name)
            level = logging.DEBUG if self._held.get(key) == d.held_back else logging.INFO
            self._held[key] = d.held_back
            self.log.log(level, "holding back on %s: %s", what, d.summary())
        elif self.log.isEnabledFor(logging.DEBUG):  # (its summary is built for the log only)
            self.log.debug("keeping %s: %s", what, d.summary())

    async def _tell(
        self, server: ServerRecord, d: CullDecision, now: datetime, idle_since: datetime | None, gpu: PodGpuView | None
    ) -> None:
        """Tell the notebook what is reclaimed now (before it goes), best effort."""
        if self.notifier is not None:
            await self.notifier.put(server, notices.acting(server, d, self.policy, now, idle_since, gpu), force=True)

    def _keep(self, server: ServerRecord, d: CullDecision, now: datetime, gpu: PodGpuView | None, kernels: list[str]) -> None:
        if self.action_log is not None:
            self.action_log.add(notices.action_record(server, d, self.policy, now, gpu, kernels))

    async def apply(
        self,
        server: ServerRecord,
        d: CullDecision,
        *,
        gpu: PodGpuView | None = None,
        idle_since: datetime | None = None,
        now: datetime | None = None,
        tell: bool = True,
    ) -> ActionResult:
        """Carry out ``d`` (log it, count it; tell the notebook just before -- unless
        ``tell`` is False: a pod that does not answer -- and keep a record of what
        was done). ``gpu`` and ``idle_since`` are what it was decided on, for the
        notice and the record."""
        now = now or utcnow()
        self._log_decision(server, d)
        kind = server.offering.kind
        self.metrics.decisions.labels(d.action, kind, str(self.dry_run).lower()).inc()
        result = ActionResult(dry_run=self.dry_run)
        if self.dry_run or d.action in (KEEP, HELD_BACK):
            return result
        if d.action == STOP:
            if tell:
                await self._tell(server, d, now, idle_since, gpu)
            try:
                result.stopped = await self.hub.stop_server(
                    server.user, server.name, remove=self.remove_named_servers and bool(server.name)
                )
            except RequestFailed as e:
                self.metrics.errors.labels("hub").inc()
                result.errors.append(str(e))
                self.log.error("could not stop %s: %s (will retry next cycle)", server.label, e)
                return result
            if result.stopped == "stopping":
                self.log.warning("server %s is slow to stop", server.label)
            self.metrics.server_stops.labels(d.stop_reason or StopReason.IDLE, kind).inc()
            if d.memory_mib:
                self.metrics.memory_reclaimed.labels("server_stop", kind).inc(d.memory_mib)
            if result.stopped != "gone":
                self._keep(server, d, now, gpu, [])
            return result
        # RECLAIM: the notebook hears which kernels go before they go
        if tell:
            await self._tell(server, d, now, idle_since, gpu)
        # concurrently, at most kernel_concurrency at once to this server (the
        # decision holds at most kernel_shutdowns_per_cycle of them)
        limit = asyncio.Semaphore(self.kernel_concurrency)

        async def one(kernel_id: str) -> KernelShutdown:
            async with limit:
                return await self.kernels.shutdown(server, kernel_id)

        done = await asyncio.gather(*(one(a.kernel_id) for a in d.shutdown))
        for action, r in zip(d.shutdown, done, strict=True):
            if r.ok:
                result.kernels_shut_down.append(action.kernel_id)
                self.metrics.kernel_shutdowns.labels("idle", kind).inc()
            else:
                self.metrics.errors.labels("server").inc()
                result.errors.append(r.error or "unknown error")
                self.log.error(
                    "could not shut down kernel %s of %s: %s",
                    action.kernel_id,
                    server.label,
                    r.error,
                )
        if result.kernels_shut_down:
            self._keep(server, d, now, gpu, result.kernels_shut_down)
        if result.kernels_shut_down and d.memory_mib is not None and server.offering.pod:
            key = (server.offering.namespace or "", server.offering.pod)
            self.tracker.expect(key, d.memory_mib, kind, server.label, server.offering.devices)
        return result
