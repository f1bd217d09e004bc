"""The ``gpuspawner-culler`` application: jupyterhub-idle-culler's traitlets
application, extended with the GPU and kernel views.

Every option of jupyterhub-idle-culler 2.0 keeps its name, flag and meaning
(``--url``, ``--timeout``, ``--cull-every``, ``--max-age``, ``--concurrency``,
``--api-page-size``, ``--cull-users``, ``--cull-admin-users``,
``--cull-default-servers``, ``--cull-named-servers``, ``--remove-named-servers``,
``--ssl-enabled``, ``--internal-certs-location``, ``--config``,
``--generate-config``, ``cull_arbiter_hook``); ``c.IdleCuller.*`` config applies too.
The settings themselves are :mod:`gpuspawner.culler.settings`'s; this module wires them
into a :class:`~gpuspawner.culler.cycle.Culler` (hub, kernel and Prometheus clients,
tokens, metrics) and runs it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from urllib.parse import urlparse

from jupyterhub.services.auth import HubAuth
from jupyterhub_idle_culler import IdleCuller, default_cull_arbiter, make_ssl_context
from tornado.httpserver import HTTPServer

from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.api import make_service_app
from gpuspawner.culler.connections import help_text
from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.cycle import Culler
from gpuspawner.culler.gpu_query import GpuQuerySettings
from gpuspawner.culler.hubclient import HubClient
from gpuspawner.culler.kernels import KernelClient
from gpuspawner.culler.notify import Notifier
from gpuspawner.culler.policy import DEFAULT_GPU_LEASES, Policy
from gpuspawner.culler.promclient import PrometheusClient
from gpuspawner.culler.settings import DEFAULT_GPU_KIND_TIMEOUTS, USER_CULLING_SCOPES, CullerSettings, scope_problems
from gpuspawner.culler.tokens import ServerTokens
from gpuspawner.culler.transport import RequestFailed, RetryPolicy, Transport
from gpuspawner.names.vocabulary import Kind


class GpuCuller(CullerSettings, IdleCuller):
    """Reclaims GPU memory and GPUs held by idle notebooks."""

    name = "gpuspawner-culler"
    description = help_text(
        """
        GPU-aware idle culler for JupyterHub: stops idle servers that hold a GPU or
        MIG slice, shuts down idle kernels that hold GPU memory on shared GPUs,
        and never touches a server with a busy kernel or an active GPU.
        """
    )

    aliases = {
        **IdleCuller.aliases,
        "config": "GpuCuller.config_file",
        "timeout": "GpuCuller.timeout",
        "cull-every": "GpuCuller.cull_every",
        "max-age": "GpuCuller.max_age",
        "kind-timeout": "GpuCuller.kind_timeouts",
        "offering-timeout": "GpuCuller.offering_timeouts",
        "kernel-timeout": "GpuCuller.kernel_timeout",
        "prometheus-url": "GpuCuller.prometheus_url",
        "prometheus-selector": "GpuCuller.prometheus_selector",
        "gpu-window": "GpuCuller.gpu_window",
        "gpu-min-samples": "GpuCuller.gpu_min_samples",
        "gpu-idle-limit": "GpuCuller.gpu_idle_limit",
        "offering-gpu-idle-limit": "GpuCuller.offering_gpu_idle_limits",
        "reclaim-for-waiting-after": "GpuCuller.reclaim_for_waiting_after",
        "offering-gpu-lease": "GpuCuller.offering_gpu_leases",
        "gpu-lease-extensions": "GpuCuller.gpu_lease_extensions",
        "offering-gpu-lease-extensions": "GpuCuller.offering_gpu_lease_extensions",
        "gpu-lease-extension": "GpuCuller.gpu_lease_extension",
        "offering-gpu-lease-ends": "GpuCuller.offering_gpu_lease_ends",
        "server-token-lifetime": "GpuCuller.server_token_lifetime",
        "memory-held-mib": "GpuCuller.memory_held_mib",
        "metrics-port": "GpuCuller.metrics_port",
        "log-level": "Application.log_level",
    }
    flags = {
        **IdleCuller.flags,
        "dry-run": ({"GpuCuller": {"dry_run": True}}, "Log what would be done; do nothing."),
        "generate-config": (
            {"GpuCuller": {"generate_config": True}},
            "Generate default config file.",
        ),
    }

    def _configure_logging(self) -> None:
        """traitlets leaves the application's logger at DEBUG and filters in its handler, so every
        ``log.debug`` a cycle makes would build its record (two per server at thousands of
        servers: a measurable share of a cycle's CPU); the logger drops what no handler takes."""
        super()._configure_logging()
        handlers = self.log.handlers
        self.log.setLevel(min(h.level or logging.DEBUG for h in handlers) if handlers else logging.DEBUG)

    # ---- building ------------------------------------------------------------
    def policy(self) -> Policy:
        kinds = {**DEFAULT_GPU_KIND_TIMEOUTS, **self.kind_timeouts}
        unknown = set(kinds) - {k.value for k in Kind}
        if unknown:
            self.log.warning("kind_timeouts: unknown kinds %s ignored", sorted(unknown))
        return Policy(
            kind_timeouts={k: v for k, v in kinds.items() if k in tuple(Kind)},
            default_timeout=self.timeout,
            offering_timeouts=dict(self.offering_timeouts),
            kernel_timeout=self.kernel_timeout,
            offering_kernel_timeouts=dict(self.offering_kernel_timeouts),
            reclaim_kinds=frozenset(self.reclaim_kinds),
            stop_kinds=frozenset(self.stop_kinds),
            max_age=self.max_age,
            memory_held_mib=self.memory_held_mib,
            require_kernel_view=self.require_kernel_view,
            reclaim_connected_kernels=self.reclaim_connected_kernels,
            gpu_activity_blocks_kernel_reclaim=self.gpu_activity_blocks_kernel_reclaim,
            cull_default_servers=self.cull_default_servers,
            cull_named_servers=self.cull_named_servers,
            gpu_idle_limit=self.gpu_idle_limit,
            offering_gpu_idle_limits=dict(self.offering_gpu_idle_limits),
            kernel_shutdowns_per_cycle=self.kernel_shutdowns_per_cycle,
            stalls_before_telemetry=max(1, self.stalls_before_telemetry),
            gpu_leases={**DEFAULT_GPU_LEASES, **self.gpu_leases},
            offering_gpu_leases=dict(self.offering_gpu_leases),
            gpu_lease_extensions=self.gpu_lease_extensions,
            offering_gpu_lease_extensions=dict(self.offering_gpu_lease_extensions),
            gpu_lease_extension=self.gpu_lease_extension,
            offering_gpu_lease_ends=dict(self.offering_gpu_lease_ends),
            reclaim_for_waiting_after=self.reclaim_for_waiting_after,
            offering_reclaim_for_waiting_after=dict(self.offering_reclaim_for_waiting_after),
        )

    def gpu_settings(self) -> GpuQuerySettings:
        return GpuQuerySettings(
            window_s=self.gpu_window,
            selector=self.prometheus_selector,
            min_samples=self.gpu_min_samples,
            engine_threshold=self.gpu_engine_threshold,
            util_threshold=self.gpu_util_threshold,
            pod_labels=tuple(self.pod_labels),
            namespace_labels=tuple(self.namespace_labels),
        )

    def _retry(self, timeout: float) -> RetryPolicy:
        return RetryPolicy(
            attempts=max(1, self.retries),
            base_delay=self.retry_base_delay,
            max_delay=self.retry_max_delay,
            request_timeout=timeout,
            connect_timeout=min(timeout, 10.0),
        )

    def config_problem(self) -> str | None:
        if not self.url:
            return "no hub API URL: set --url or JUPYTERHUB_API_URL"
        if not self.api_token:
            return "no API token: set JUPYTERHUB_API_TOKEN or c.GpuCuller.api_token"
        return None

    def make_culler(self, metrics: CullerMetrics | None = None) -> Culler:
        """Build a :class:`Culler` from this application's configuration
        (inside a running event loop)."""
        problem = self.config_problem()
        if problem:
            raise ValueError(problem)
        metrics = metrics or CullerMetrics()
        ssl_ctx = None
        if self.ssl_enabled:
            loc = self.internal_certs_location
            ssl_ctx = make_ssl_context(
                f"{loc}/hub-internal/hub-internal.key",
                f"{loc}/hub-internal/hub-internal.crt",
                f"{loc}/hub-ca/hub-ca.crt",
            )
        log = self.log
        hub_t = Transport(
            "hub",
            concurrency=max(1, self.concurrency),
            retry=self._retry(self.hub_request_timeout),
            metrics=metrics,
            log=log,
            ssl_context=ssl_ctx,
        )
        srv_t = Transport(
            "server",
            concurrency=self.server_concurrency,
            retry=self._retry(self.server_request_timeout),
            metrics=metrics,
            log=log,
            ssl_context=ssl_ctx,
        )
        prom = None
        if self.prometheus_url:
            prom_t = Transport(
                "prometheus",
                concurrency=1,
                retry=self._retry(self.prometheus_request_timeout),
                metrics=metrics,
                log=log,
                headers=dict(self.prometheus_headers),
            )
            prom = PrometheusClient(self.prometheus_url, self.gpu_settings(), prom_t)
        arbiter = self.cull_arbiter_hook
        if arbiter is default_cull_arbiter:
            arbiter = None
        # the culler's own token goes on the hub transport only; servers get theirs
        hub = HubClient(self.url, self.api_token, hub_t, page_size=self.api_page_size)
        tokens = ServerTokens(
            hub,
            self.server_token_lifetime,
            log,
            metrics,
            mints_per_cycle=max(0, self.token_mints_per_cycle),
        )
        return Culler(
            hub=hub,
            kernels=KernelClient(tokens, srv_t),
            notifier=Notifier(tokens, srv_t, log) if self.notify_servers else None,
            warn_before_s=self.warn_before_seconds,
            action_log=self.make_action_log(),
            tokens=tokens,
            prometheus=prom,
            policy=self.policy(),
            metrics=metrics,
            log=log,
            dry_run=self.dry_run,
            remove_named_servers=self.remove_named_servers,
            cull_users=self.cull_users,
            cull_admin_users=self.cull_admin_users,
            user_timeout=self.timeout,
            arbiter=arbiter,
            server_deadline_s=self.server_deadline_seconds,
            kernel_concurrency=self.kernel_shutdown_concurrency,
        )

    def make_action_log(self) -> ActionLog:
        return ActionLog(
            self.action_log_path or None,
            max_entries=self.action_log_max_entries,
            retention=timedelta(days=self.action_log_retention_days),
            log=self.log,
        )

    def hub_auth(self) -> HubAuth:
        """JupyterHub's own service auth, for ``api/actions``: it admits tokens
        with ``access:services!service=<this service>`` (from the hub's
        environment; ``gpu-culler`` when run outside the hub)."""
        auth = HubAuth(api_url=self.url, api_token=self.api_token, cache_max_age=60)
        if not auth.access_scopes:
            name = os.environ.get("JUPYTERHUB_SERVICE_NAME") or "gpu-culler"
            auth.access_scopes = {f"access:services!service={name}"}
        return auth

    def _log_startup(self, culler: Culler) -> None:
        p = culler.policy
        self.log.info(
            "gpuspawner culler%s: every %ss; timeouts %s, plain servers %ss, offerings %s; "
            "kernel timeout %ss on kinds %s; gpu_idle_limit %s; GPU leases %s; reclaim for waiting spawns %s; GPU view %s",
            " (DRY RUN)" if self.dry_run else "",
            self.cull_every,
            dict(p.kind_timeouts),
            p.default_timeout,
            dict(p.offering_timeouts) or "-",
            p.kernel_timeout,
            sorted(p.reclaim_kinds),
            f"{p.gpu_idle_limit}s" if p.gpu_idle_limit > 0 else "off",
            {**{k: v for k, v in p.gpu_leases.items() if v > 0}, **dict(p.offering_gpu_leases)} or "none",
            f"after {p.reclaim_for_waiting_after}s idle" if p.reclaim_for_waiting_after > 0 else "off",
            f"from {self.prometheus_url} over {self.gpu_window}s"
            if self.prometheus_url
            else "DISABLED (no prometheus_url): GPU servers will not be stopped",
        )
        if self.prometheus_url and self.cull_every > self.gpu_window:
            self.log.warning(
                "cull_every (%ss) > gpu_window (%ss): GPU activity between two windows is "
                "missed, and no GPU idle streak lasts (gpu_idle_limit never applies); make "
                "gpu_window at least cull_every",
                self.cull_every,
                self.gpu_window,
            )
        if culler.notifier is not None and 0 < self.warn_before_seconds <= self.cull_every:
            self.log.warning(
                "warn_before_seconds (%ss) <= cull_every (%ss): an action may come in the cycle"
                " after its warning or with none; make warn_before_seconds longer than cull_every",
                self.warn_before_seconds,
                self.cull_every,
            )
        if self.cull_users:
            self.log.info("--cull-users: the service's role also needs %s", USER_CULLING_SCOPES)
        if any(k not in tuple(Kind) for k in p.stop_kinds):
            self.log.warning("stop_kinds has unknown kinds: %s", sorted(p.stop_kinds))

    def _serve_metrics(self, culler: Culler) -> HTTPServer | None:
        if self.metrics_port:
            ip, port = self.metrics_ip, self.metrics_port
            prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
        elif os.environ.get("JUPYTERHUB_SERVICE_URL"):
            u = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
            # The hub hands services without a url "http://127.0.0.1:0/": nowhere to serve.
            if not u.port:
                return None
            ip, port = u.hostname or "", u.port
            prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
        else:
            return None
        app = make_service_app(
            culler.metrics,
            prefix,
            actions=culler.action_log,
            hub_auth=self.hub_auth(),
            read_all_scopes=tuple(self.actions_read_all_scopes),
            turns=lambda: culler.planned_turns,
            leases=culler.lease_list,
            extend=culler.extend_lease,
        )
        server = HTTPServer(app)
        try:
            server.listen(port, ip)
        except OSError as exc:  # metrics are not worth a crash: the culling goes on
            self.log.error("cannot serve metrics on %s:%s (%s); culling without them", ip, port, exc)
            return None
        self.log.info("serving metrics and its API at http://%s:%s%s{metrics,api/actions,api/turns,api/leases}", ip or "*", port, prefix)
        return server

    async def check_hub(self, culler: Culler) -> None:
        """Log the hub's version and what is wrong with the culler's scopes."""
        try:
            info = await culler.hub.info()
            self.log.info("hub version %s at %s", info.get("version"), self.url)
            me = await culler.hub.whoami()
        except RequestFailed as e:
            culler.metrics.errors.labels("hub").inc()
            self.log.error("hub not reachable yet (%s); cycling anyway", e)
            return
        culler.tokens.scopes_held = tuple(me.get("scopes") or ())
        for problem in scope_problems(me.get("scopes") or [], self.cull_users):
            self.log.warning("%s", problem)

    async def run(self) -> None:
        """Cycle forever; nothing the hub, a server or Prometheus does ends this.
        SIGTERM (how the hub stops a managed service) and Ctrl-C end it after
        revoking the per-server tokens it holds."""
        culler = self.make_culler()
        self._log_startup(culler)
        self._serve_metrics(culler)
        task = asyncio.current_task()
        if task is not None:
            try:
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        try:
            await self.check_hub(culler)
            while True:
                t0 = time.monotonic()
                try:
                    await culler.cycle()
                except Exception:  # a bug, not an outage: log it and keep the service up
                    culler.metrics.errors.labels("culler").inc()
                    self.log.exception("unexpected error in a culling cycle")
                await asyncio.sleep(max(1.0, self.cull_every - (time.monotonic() - t0)))
        finally:
            self.log.info("stopping: revoking %d per-server tokens", len(culler.tokens))
            try:
                await asyncio.wait_for(culler.close(), 15)
            except Exception as e:  # they expire on their own
                self.log.warning("could not revoke every per-server token: %r", e)

    def start(self) -> None:
        if self.generate_config:
            print(self.generate_config_file())
            sys.exit(0)
        if self.config_file:
            self.load_config_file(self.config_file)
        problem = self.config_problem()
        if problem:  # fail fast, before looping
            self.log.critical("%s", problem)
            sys.exit(2)
        try:
            asyncio.run(self.run())
        except (KeyboardInterrupt, asyncio.CancelledError):
            pass


def main(argv: list[str] | None = None) -> None:
    """Console entry point: ``gpuspawner-culler`` / ``python -m gpuspawner.culler``."""
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    GpuCuller.launch_instance(argv)
