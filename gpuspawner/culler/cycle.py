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
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from jupyterhub_idle_culler import format_td, utcnow

from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.actions import Actions
from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.dates import parse_time
from gpuspawner.culler.gpu_metrics import GpuView, unavailable
from gpuspawner.culler.hubclient import HubClient
from gpuspawner.culler.kernels import KernelClient
from gpuspawner.culler.leases import LeaseBook
from gpuspawner.culler.notify import Notifier
from gpuspawner.culler.observations import GpuIdleStreak, KernelMemo, turns, waiting_ranking
from gpuspawner.culler.policy import COST, STOP, BudgetRunway, Policy
from gpuspawner.culler.promclient import PrometheusClient
from gpuspawner.culler.serverwork import ServerOutcome, ServerWork
from gpuspawner.culler.tokens import ServerTokens
from gpuspawner.culler.transport import RequestFailed
from gpuspawner.names.vocabulary import Kind


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


class Culler(ServerWork):
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
        #: per offering, the last cycle's GPU servers from the longest idle down (who makes
        #: room first when spawns wait for it)
        self._ranking: dict[str, list[tuple[str, str]]] = {}
        #: per offering slug, the earliest time a server in turn makes room for its waiting
        #: spawns: as the last cycle planned it (``planned_turns``), and as this one does
        self.planned_turns: dict[str, datetime] = {}
        self._planning: dict[str, datetime] = {}
        #: every running server's GPU lease grant (extensions, renewals), kept in the action log
        self.leases = LeaseBook(action_log)

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
        self._take_turns(view)
        if view.available and view.probe != self._probe_seen:
            self._log_probe(view.probe)
        report.gpu_view = view
        report.reclaimed_mib.update(self.actions.tracker.observe(view))
        return view

    def _take_turns(self, view: GpuView) -> None:
        """This cycle's policy sees the spawns waiting now (none when Prometheus did not
        answer: unknown never justifies a cull) and whose turn it is to make room for them,
        from the last cycle's ranking. GPU servers are decided only after this."""
        now = self.clock()
        waiting = dict(view.waiting) if view.available else {}
        began = turns(self._ranking, waiting, self.policy.turns, now)
        budgets = {user: BudgetRunway(remaining, rate, now) for user, (remaining, rate) in view.budgets.items()} if view.available else {}
        noticed = self._budget_noticed(budgets, self.policy.budget_noticed, now)
        cost_budgets = (
            {user: BudgetRunway(remaining, rate, now, COST) for user, (remaining, rate) in view.cost_budgets.items()}
            if view.available
            else {}
        )
        cost_noticed = self._budget_noticed(cost_budgets, self.policy.cost_budget_noticed, now)
        self.policy = replace(
            self.policy,
            waiting=waiting,
            turns=began,
            turn_notice=self.warn_before_s,
            leases=self.leases.grants(),
            budgets=budgets,
            budget_noticed=noticed,
            cost_budgets=cost_budgets,
            cost_budget_noticed=cost_noticed,
        )
        self.actions.policy = self.policy
        if waiting:
            self.log.info(
                "spawns waiting: %s",
                ", ".join(f"{count} for {name}" for count, name in waiting.values()),
            )

    def _budget_noticed(self, budgets: Mapping[str, BudgetRunway], before: Mapping[str, datetime], now: datetime) -> dict[str, datetime]:
        """Per user, when the culler first saw their budget (GPU-hours or cost: ``budgets``; as
        seen ``before``) run out within the warning window (kept while it stays so; a budget the
        hub no longer exports, or one that no longer runs out that soon, is forgotten)."""
        horizon = now.timestamp() + self.warn_before_s
        noticed = {}
        for user, runway in budgets.items():
            out = runway.runs_out_at()
            if out is not None and out.timestamp() <= horizon:
                noticed[user] = before.get(user, now)
                if user not in before:
                    self.log.info(
                        "the %s of %s runs out at %s: its GPU servers are warned, then stopped",
                        runway.name,
                        user,
                        out.isoformat(timespec="seconds"),
                    )
        return noticed

    def lease_list(self, user: str | None) -> list[dict[str, Any]]:
        """The running servers' GPU leases as the last cycle saw them (``user``'s only, when given)."""
        return [s.to_json() for (who, _), s in sorted(self.leases.status.items()) if user is None or who == user]

    def extend_lease(self, user: str, server: str) -> dict[str, Any]:
        """Extend a lease by one extension (:class:`gpuspawner.culler.leases.LeaseRefused` when
        it may not be); the next decision sees it at once."""
        status, record = self.leases.extend(user, server, self.policy, self.clock())
        self.policy = replace(self.policy, leases=self.leases.grants())
        self.actions.policy = self.policy
        self.log.info("GPU lease of %s/%s extended by its user: %s", user, server, record["why"])
        return {"lease": status.to_json(), "message": f"{record['what']} {record['why']}."}

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
        self._planning = {}
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
            self.leases.forget_all_but(self._seen)
            await self.tokens.keep_only(self._seen)
            if self.notifier is not None:
                self.notifier.keep_only(self._seen)
        report.duration_s = time.monotonic() - t0
        self.planned_turns = self._planning
        self._ranking = waiting_ranking(
            (o.server.offering, o.decision.inactive, bool(o.kernel_view and o.kernel_view.ok and o.kernel_view.busy_kernels))
            for o in report.outcomes
            if not o.result.stopped
        )
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
