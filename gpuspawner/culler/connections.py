"""How the culler reaches what it reads, as ``c.GpuCuller.<name>`` options: Prometheus and
the GPU view's query, the hub and the single-user servers (timeouts, retries, concurrency,
per-server tokens), and its own metrics endpoint. A ``HasTraits`` mix-in of
:class:`gpuspawner.culler.settings.CullerSettings` (whose traits are the rest).
"""

from __future__ import annotations

import os
from textwrap import dedent
from typing import Any

from traitlets import Bool, Dict, Float, HasTraits, Int, List, TraitError, Unicode, default, validate

from gpuspawner.culler.gpu_query import DEFAULT_ENGINE_THRESHOLD, DEFAULT_UTIL_THRESHOLD


def positive(name: str, value: object, what: str) -> float:
    """``value`` as a float, or a TraitError naming ``name`` when it is not more than 0."""
    number = float(value)  # type: ignore[arg-type]
    if number <= 0:
        raise TraitError(f"{name}={number:g}: must be more than 0 ({what})")
    return number


def help_text(text: str) -> str:
    """A trait's help, written indented in the source, as one dedented block."""
    return dedent(text).strip()


class ConnectionSettings(HasTraits):
    """The culler's connection settings (see the module docstring)."""

    # ---- GPU view ----------------------------------------------------------
    prometheus_url = Unicode(
        os.environ.get("GPUSPAWNER_CULLER_PROMETHEUS_URL", ""),
        help=help_text(
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
        help=help_text(
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
        DEFAULT_ENGINE_THRESHOLD,
        help=help_text(
            """
            A GPU is active in a window when the MEAN of DCGM_FI_PROF_GR_ENGINE_ACTIVE
            (ratio 0-1) over the window is above this (the per-pod probe's SM ratio
            alike). Default 0.05: the engine busy 5 % of the time. A tiny kernel a
            minute, which keeps no one's work going, stays far below it; 0 counts any
            activity at all (then a trivial keep-alive holds the GPU).
            """
        ),
    ).tag(config=True)

    gpu_util_threshold = Float(
        DEFAULT_UTIL_THRESHOLD,
        help="As gpu_engine_threshold, for the mean of DCGM_FI_DEV_GPU_UTIL (percent, whole GPUs only). Default 5.",
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
    server_request_timeout = Float(10.0, help="Seconds before a single-user server request times out.").tag(config=True)
    prometheus_request_timeout = Float(20.0, help="Seconds before the Prometheus query times out.").tag(config=True)
    retries = Int(3, help="Tries per request (hub, server, Prometheus) before it counts as an error.").tag(config=True)
    retry_base_delay = Float(0.5, help="First backoff delay (seconds), doubled per retry.").tag(config=True)
    retry_max_delay = Float(10.0, help="Longest backoff delay (seconds).").tag(config=True)
    server_concurrency = Int(20, help="Requests in flight at once to single-user servers (kernel view, shutdowns).").tag(config=True)

    server_token_lifetime = Int(
        3600,
        help=help_text(
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
        help=help_text(
            """
            Per-server tokens minted per cycle, at most, for kernel views that can
            only lead to a kernel shutdown (each mint is a write to the hub's
            database). A cycle makes at most 10 of them itself and the rest after
            its decisions, one at a time; those servers are read in the next
            cycle, and servers beyond the limit in a later one: a culler restarted
            among thousands of shared-GPU servers catches up over a few cycles
            instead of holding the hub busy for one long one. Views that can lead
            to a stop are never deferred. 0: no limit.
            """
        ),
    ).tag(config=True)

    @validate("server_token_lifetime")
    def _valid_token_lifetime(self, proposal: dict[str, Any]) -> int:
        value = int(proposal["value"])
        if value < 60:
            raise TraitError(
                f"server_token_lifetime={value}: must be at least 60 seconds (a token is"
                " renewed after three quarters of its lifetime; shorter ones would be"
                " minted for nearly every request)"
            )
        return value

    # ---- the rest ----------------------------------------------------------
    dry_run = Bool(False, help="Log what would be done, with its reasons, and do nothing.").tag(config=True)

    api_token = Unicode(help="Token of the culler service (default: env JUPYTERHUB_API_TOKEN).").tag(config=True)

    @default("api_token")
    def _default_api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    metrics_port = Int(
        0,
        help=help_text(
            """
            Serve the culler's Prometheus metrics at ``/metrics`` on this port.
            0: serve them on the service's own URL (``JUPYTERHUB_SERVICE_URL``,
            when the hub service has a ``url``), else not at all.
            """
        ),
    ).tag(config=True)
    metrics_ip = Unicode("", help="Address for --metrics-port (default: all).").tag(config=True)
