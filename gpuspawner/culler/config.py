"""The ``gpuspawner-culler`` application: jupyterhub-idle-culler's traitlets
application, extended with the GPU and kernel views.

Every option of jupyterhub-idle-culler 2.0 keeps its name, flag and meaning
(``--url``, ``--timeout``, ``--cull-every``, ``--max-age``, ``--concurrency``,
``--api-page-size``, ``--cull-users``, ``--cull-admin-users``,
``--cull-default-servers``, ``--cull-named-servers``, ``--remove-named-servers``,
``--ssl-enabled``, ``--internal-certs-location``, ``--config``,
``--generate-config``, ``cull_arbiter_hook``); ``c.IdleCuller.*`` config applies too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from textwrap import dedent
from urllib.parse import urlparse

from jupyterhub_idle_culler import IdleCuller, default_cull_arbiter, make_ssl_context
from tornado.httpserver import HTTPServer
from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, default, validate

from ..vocabulary import Kind
from .cycle import Culler
from .decide import DEFAULT_GPU_IDLE_LIMIT, DEFAULT_KIND_TIMEOUTS, DEFAULT_RECLAIM_KINDS, Policy
from .gpu_metrics import GpuQuerySettings
from .hub import HubClient
from .kernels import KernelClient
from .metrics import CullerMetrics, make_metrics_app
from .prometheus import PrometheusClient
from .tokens import ServerTokens
from .transport import RequestFailed, RetryPolicy, Transport

#: the scopes the culler's role needs, and no more (see docs/culler.md). No
#: ``access:servers``: the culler reaches each server with a token of that
#: server's own user (``tokens``), never with its own.
REQUIRED_SCOPES: tuple[str, ...] = (
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    "tokens",
)
#: scopes that would let the culler's own token into users' servers: not needed
NEEDLESS_SCOPES: tuple[str, ...] = ("access:servers", "admin:servers", "servers")
#: only with --cull-users
USER_CULLING_SCOPES: tuple[str, ...] = ("admin:users",)

_GPU_KIND_DEFAULTS = {k: v for k, v in DEFAULT_KIND_TIMEOUTS.items() if k != Kind.CPU}


def scope_problems(scopes: list[str], cull_users: bool = False) -> list[str]:
    """What is wrong with the scopes the culler's token holds (as ``GET
    /hub/api/user`` lists them): too much, or too little."""
    bases = {s.split("!", 1)[0] for s in scopes}
    out = [
        f"the culler's role grants {s!r}, which it does not need (it reaches each server"
        " with a token of that server's own user): remove it, so that the culler's token"
        " cannot open users' servers (docs/culler.md, Scopes)"
        for s in sorted(set(scopes) & set(NEEDLESS_SCOPES))
    ]
    if "tokens" not in bases:
        out.append(
            "the culler's role lacks 'tokens': it cannot mint per-server tokens, so it"
            " cannot read kernels, and servers with a direct address are held back"
            " (docs/culler.md, Scopes)"
        )
    for need in REQUIRED_SCOPES:
        if need != "tokens" and need not in bases:
            out.append(f"the culler's role lacks {need!r} (docs/culler.md, Scopes)")
    if cull_users and "admin:users" not in bases:
        out.append("--cull-users needs 'admin:users' in the culler's role")
    return out


def _h(text: str) -> str:
    return dedent(text).strip()


class GpuCuller(IdleCuller):
    """Reclaims GPU memory and GPUs held by idle notebooks."""

    name = "gpuspawner-culler"
    description = _h(
        """
        GPU-aware idle culler for JupyterHub: stops idle servers that hold a GPU or
        MIG slice, shuts down idle kernels that hold GPU memory on shared GPUs,
        and never touches a server with a busy kernel or an active GPU.
        """
    )

    # ---- upstream options whose meaning or default changes ---------------
    timeout = Int(
        DEFAULT_KIND_TIMEOUTS[Kind.CPU],
        help=_h(
            """
            Idle timeout (seconds) of plain servers (kind ``cpu``: no gpuspawner
            contract) and of any kind not in ``kind_timeouts``; also the user
            timeout for ``--cull-users``. Default 8 hours.
            """
        ),
    ).tag(config=True)

    cull_every = Int(
        120,
        help="Seconds between the starts of two culling cycles.",
    ).tag(config=True)

    max_age = Int(
        0,
        help=_h(
            """
            Stop servers older than this (seconds) even if recently used -- but,
            unlike jupyterhub-idle-culler, never one with a busy kernel or GPU
            activity in the window, and a GPU server only with a known GPU view.
            0: off.
            """
        ),
    ).tag(config=True)

    config_file = Unicode(
        "gpuspawner_culler_config.py", help="Config file to load (if it exists)."
    ).tag(config=True)

    # ---- timeouts ---------------------------------------------------------
    kind_timeouts = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=_h(
            f"""
            Idle timeout (seconds) per offering kind, merged over the defaults
            {_GPU_KIND_DEFAULTS}. Kinds not listed here (``cpu``: plain servers)
            use ``--timeout`` (default 8 hours). 0 or less: never stop that kind
            for idleness. Example::

                c.GpuCuller.kind_timeouts = {{"full": 900, "shared": 4 * 3600}}

            or ``--kind-timeout full=900 --kind-timeout shared=14400``.
            """
        ),
    ).tag(config=True)

    offering_timeouts = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=_h(
            """
            Idle timeout (seconds) per offering slug; wins over the kind's.
            Example: ``{"a100-80gb-full": 600, "t4-shared-teaching": 0}``.
            """
        ),
    ).tag(config=True)

    kernel_timeout = Int(
        1800,
        help=_h(
            """
            Seconds a kernel must be idle (execution_state idle, no message) before
            it is shut down to reclaim GPU memory, on kinds in ``reclaim_kinds``
            and only while the pod holds GPU memory. 0 disables kernel shutdowns.
            """
        ),
    ).tag(config=True)

    offering_kernel_timeouts = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help="Kernel timeout (seconds) per offering slug; wins over kernel_timeout.",
    ).tag(config=True)

    reclaim_kinds = List(
        Unicode(),
        list(DEFAULT_RECLAIM_KINDS),
        help=_h(
            """
            Kinds whose idle kernels are shut down to reclaim GPU memory while the
            server keeps running: kinds whose GPU memory other users share
            (time-slicing/MPS ``shared``, fractional ``custom``). On ``full``,
            ``mig`` and ``vgpu`` the memory belongs to the pod anyway: stopping
            the server after its timeout is what frees the device.
            """
        ),
    ).tag(config=True)

    stop_kinds = List(
        Unicode(),
        [k.value for k in Kind],
        help="Kinds whose idle servers may be stopped (default: all).",
    ).tag(config=True)

    memory_held_mib = Float(
        64.0,
        help="A pod holds GPU memory when DCGM_FI_DEV_FB_USED is at least this (MiB).",
    ).tag(config=True)

    require_kernel_view = Bool(
        True,
        help=_h(
            """
            Stop a server that has a direct address only if its kernel API
            answered this cycle. If False, a server whose API cannot be reached
            is judged on hub and GPU signals alone.
            """
        ),
    ).tag(config=True)

    reclaim_connected_kernels = Bool(
        True,
        help=_h(
            """
            Shut down idle kernels even while a browser tab is connected to them
            (an open tab is the usual way GPU memory is left held). False: only
            kernels with no connection, like jupyter_server's own ``cull_connected``.
            """
        ),
    ).tag(config=True)

    gpu_activity_blocks_kernel_reclaim = Bool(
        True,
        help=_h(
            """
            Do not shut down idle kernels while the pod's GPU shows activity (a
            kernel can run GPU work in a thread while it reads 'idle'). Note that
            with older dcgm-exporter releases a shared GPU's activity is copied
            onto every pod that shares it.
            """
        ),
    ).tag(config=True)

    gpu_idle_limit = Int(
        DEFAULT_GPU_IDLE_LIMIT,
        help=_h(
            """
            Seconds after which a GPU that GPU telemetry has shown idle, in every
            cycle since, wins over everything its pod claims: the server is
            stopped even though it says a kernel is busy, reports fresh activity
            (kernels, ``/api/status``, the hub's ``last_activity``, which the
            pod's own jupyterhub-singleuser reports) or does not answer -- with a
            WARNING in the log naming what it claimed. Only with a known GPU view
            that is idle now; real GPU activity always keeps the server and
            starts the count again. Never shorter than the offering's idle
            timeout; no effect where that timeout is 0. Counted from the first
            cycle that saw the GPU idle (after a culler restart: from scratch).
            0: off (the pod's word can keep a GPU forever). Default 4 hours.
            """
        ),
    ).tag(config=True)

    offering_gpu_idle_limits = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=_h(
            """
            ``gpu_idle_limit`` per offering slug (seconds; 0: off for that
            offering). Example: ``{"a100-80gb-full": 3600, "t4-shared": 0}``.
            """
        ),
    ).tag(config=True)

    # ---- GPU view ----------------------------------------------------------
    prometheus_url = Unicode(
        os.environ.get("GPUSPAWNER_CULLER_PROMETHEUS_URL", ""),
        help=_h(
            """
            Base URL of the Prometheus HTTP API that scrapes dcgm-exporter, e.g.
            ``http://prometheus-server.monitoring.svc``. Empty: no GPU view, so
            servers holding a GPU are never stopped (their kernels are not shut
            down either) and the log says so.
            """
        ),
    ).tag(config=True)

    prometheus_selector = Unicode(
        "",
        help=_h(
            """
            Extra PromQL label matchers for the dcgm-exporter series, e.g.
            ``exported_namespace="jhub"`` (when Prometheus renamed the pod labels)
            or ``namespace="jhub"``.
            """
        ),
    ).tag(config=True)

    prometheus_headers = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help='Extra HTTP headers for Prometheus, e.g. {"Authorization": "Bearer ..."}.',
    ).tag(config=True)

    gpu_window = Int(
        600,
        help="Seconds of dcgm-exporter samples looked at each cycle (max/count over time).",
    ).tag(config=True)

    gpu_min_samples = Int(
        4,
        help="A series with fewer samples in the window is 'unknown': never a reason to cull.",
    ).tag(config=True)

    gpu_engine_threshold = Float(
        0.0, help="DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio 0-1) above this is activity."
    ).tag(config=True)

    gpu_util_threshold = Float(
        0.0, help="DCGM_FI_DEV_GPU_UTIL (percent, whole GPUs only) above this is activity."
    ).tag(config=True)

    pod_labels = List(
        Unicode(),
        ["exported_pod", "pod"],
        help="Series labels holding the notebook pod's name, by preference.",
    ).tag(config=True)

    namespace_labels = List(
        Unicode(),
        ["exported_namespace", "namespace"],
        help="Series labels holding the notebook pod's namespace, by preference.",
    ).tag(config=True)

    # ---- robustness ------------------------------------------------------
    hub_request_timeout = Float(
        float(os.environ.get("JUPYTERHUB_REQUEST_TIMEOUT") or 60),
        help="Seconds before a hub request times out (env JUPYTERHUB_REQUEST_TIMEOUT).",
    ).tag(config=True)
    server_request_timeout = Float(
        10.0, help="Seconds before a single-user server request times out."
    ).tag(config=True)
    prometheus_request_timeout = Float(
        20.0, help="Seconds before the Prometheus query times out."
    ).tag(config=True)
    retries = Int(
        3, help="Tries per request (hub, server, Prometheus) before it counts as an error."
    ).tag(config=True)
    retry_base_delay = Float(0.5, help="First backoff delay (seconds), doubled per retry.").tag(
        config=True
    )
    retry_max_delay = Float(10.0, help="Longest backoff delay (seconds).").tag(config=True)
    server_concurrency = Int(
        20, help="Requests in flight at once to single-user servers (kernel view, shutdowns)."
    ).tag(config=True)

    server_token_lifetime = Int(
        3600,
        help=_h(
            """
            Lifetime (seconds, at least 60) of the per-server tokens the culler
            sends to notebook servers to read their kernels. Each is owned by the
            server's user and grants only ``access:servers!server=<user>/<name>``;
            it is renewed after three quarters of its lifetime and revoked when
            the server is gone or the culler stops. The lifetime bounds how long
            a token sent to a pod address that has meanwhile gone to another pod
            stays usable (docs/culler.md, Threat model). Capped by the hub's
            ``c.JupyterHub.token_expires_in_max_seconds`` (the culler logs it
            and uses the cap).
            """
        ),
    ).tag(config=True)

    token_mints_per_cycle = Int(
        100,
        help=_h(
            """
            Per-server tokens minted per cycle, at most, for kernel views that can
            only lead to a kernel shutdown (each mint is a write to the hub's
            database). Servers beyond it are read in a later cycle: a culler
            restarted among thousands of shared-GPU servers catches up over a few
            cycles instead of holding the hub busy for one long one. Views that
            can lead to a stop are never deferred. 0: no limit.
            """
        ),
    ).tag(config=True)

    @validate("server_token_lifetime")
    def _valid_token_lifetime(self, proposal: dict) -> int:
        value = int(proposal["value"])
        if value < 60:
            raise TraitError(
                f"server_token_lifetime={value}: must be at least 60 seconds (a token is"
                " renewed after three quarters of its lifetime; shorter ones would be"
                " minted for nearly every request)"
            )
        return value

    # ---- the rest ----------------------------------------------------------
    dry_run = Bool(False, help="Log what would be done, with its reasons, and do nothing.").tag(
        config=True
    )

    api_token = Unicode(
        help="Token of the culler service (default: env JUPYTERHUB_API_TOKEN)."
    ).tag(config=True)

    @default("api_token")
    def _default_api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    metrics_port = Int(
        0,
        help=_h(
            """
            Serve the culler's Prometheus metrics at ``/metrics`` on this port.
            0: serve them on the service's own URL (``JUPYTERHUB_SERVICE_URL``,
            when the hub service has a ``url``), else not at all.
            """
        ),
    ).tag(config=True)
    metrics_ip = Unicode("", help="Address for --metrics-port (default: all).").tag(config=True)

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

    # ---- building ------------------------------------------------------------
    def policy(self) -> Policy:
        kinds = {**_GPU_KIND_DEFAULTS, **self.kind_timeouts}
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
        )

    def _log_startup(self, culler: Culler) -> None:
        p = culler.policy
        self.log.info(
            "gpuspawner culler%s: every %ss; timeouts %s, plain servers %ss, offerings %s; "
            "kernel timeout %ss on kinds %s; gpu_idle_limit %s; GPU view %s",
            " (DRY RUN)" if self.dry_run else "",
            self.cull_every,
            dict(p.kind_timeouts),
            p.default_timeout,
            dict(p.offering_timeouts) or "-",
            p.kernel_timeout,
            sorted(p.reclaim_kinds),
            f"{p.gpu_idle_limit}s" if p.gpu_idle_limit > 0 else "off",
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
        if self.cull_users:
            self.log.info("--cull-users: the service's role also needs %s", USER_CULLING_SCOPES)
        if any(k not in tuple(Kind) for k in p.stop_kinds):
            self.log.warning("stop_kinds has unknown kinds: %s", sorted(p.stop_kinds))

    def _serve_metrics(self, culler: Culler) -> HTTPServer | None:
        if self.metrics_port:
            ip, port, prefix = self.metrics_ip, self.metrics_port, "/"
        elif os.environ.get("JUPYTERHUB_SERVICE_URL"):
            u = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
            # The hub hands services without a url "http://127.0.0.1:0/": nowhere to serve.
            if not u.port:
                return None
            ip, port = u.hostname or "", u.port
            prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
        else:
            return None
        server = HTTPServer(make_metrics_app(culler.metrics, prefix))
        try:
            server.listen(port, ip)
        except OSError as exc:  # metrics are not worth a crash: the culling goes on
            self.log.error("cannot serve metrics on %s:%s (%s); culling without them", ip, port, exc)
            return None
        self.log.info("serving metrics at http://%s:%s%smetrics", ip or "*", port, prefix)
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
