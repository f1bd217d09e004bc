"""The seam between the spawner and the hub integration: what ``gpuspawner/hub`` may read and
write of one :class:`gpuspawner.spawner.GPUSpawner`, named and typed.

The hub's modules take the spawner as a :class:`Spawner` (a :class:`typing.Protocol`), never
as ``Any``: a use of the spawner that is not named here fails mypy, so the list below is the
whole of what the two sides share. It has four parts:

- **where and who**: the user, the server's name, pod and namespace, the log, the Kubernetes
  client and KubeSpawner's pod reflector (KubeSpawner's and JupyterHub's own attributes);
- **the settings**: the traits the hub reads (read-only here);
- **the spawn's state**: what the current spawn decided (:class:`SpawnState`) and the few
  values JupyterHub keeps on the spawner (``user_options``, the GPU-hour ledger, the stop
  notice, the options of a refused or stored start), which the hub writes;
- **two callbacks** (docs/architecture.md, "One spawn request"): :meth:`Spawner.now`, the
  site's clock (the one place the time of day is read, in ``site_timezone``: tests move it),
  and :meth:`Spawner.stop`, GPUSpawner's whole stop (a start that gives up deletes its pod
  the way the hub would). Everything else the hub decides from the settings and the state
  (:mod:`gpuspawner.hub.spawnview`, :mod:`gpuspawner.hub.catalogs`, :mod:`gpuspawner.hub.choosing`).

KubeSpawner's own calls that GPUSpawner wraps (its ``_start``, ``stop``, pod creation,
progress and profile list) are handed down as arguments where they are needed, not called
back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from jupyterhub.orm import Spawner as OrmSpawner

    from gpuspawner.capacity.admission import QuotaLedger
    from gpuspawner.hub.spawnstate import SpawnState


class Spawner(Protocol):
    """What the hub's modules use of one GPUSpawner (see the module's docstring)."""

    # ------------------------------------------------------------------ where and who (JupyterHub's, KubeSpawner's)

    #: JupyterHub's ``User`` (untyped: its ``name``, ``id``, ``created``, ``groups``, ``admin``, ``db``, ``orm_user``).
    user: Any
    #: The named server's name ("" for the default one).
    name: str
    namespace: str
    pod_name: str
    #: The hub's database row of this server (``user_options``, ``state``); None in scripts and tests.
    orm_spawner: OrmSpawner | None
    #: JupyterHub's ``Server`` (its ``base_url``); None before a start.
    server: Any
    #: KubeSpawner's Kubernetes client (kubernetes_asyncio's ``CoreV1Api``, untyped).
    api: Any
    #: KubeSpawner's pod reflector (a :class:`gpuspawner.hub.reflector.VerdictPodReflector`), None before the first start.
    pod_reflector: Any

    @property
    def log(self) -> logging.Logger: ...

    @property
    def events(self) -> list[dict[str, Any]]:
        """The Kubernetes events of this server's pod since its start (KubeSpawner's event reflector)."""
        ...

    @property
    def log_name(self) -> str:
        """How the log names this server (JupyterHub's ``_log_name``)."""
        ...

    # ------------------------------------------------------------------ the settings (traits, read only)

    @property
    def hub_id(self) -> str: ...
    @property
    def enable_user_namespaces(self) -> bool: ...
    @property
    def image(self) -> str: ...
    @property
    def start_timeout(self) -> int: ...
    @property
    def http_timeout(self) -> int: ...
    @property
    def delete_grace_period(self) -> int: ...
    @property
    def profile_list(self) -> Any: ...
    @property
    def apply_user_options(self) -> Any: ...
    @property
    def extra_user_options(self) -> list[str]: ...
    @property
    def offerings(self) -> list[dict[str, Any]]: ...
    @property
    def offering_overrides(self) -> dict[str, dict[str, Any]]: ...
    @property
    def discover_offerings(self) -> bool: ...
    @property
    def vgpu_class_labels(self) -> list[str]: ...
    @property
    def default_offering(self) -> str: ...
    @property
    def admission(self) -> str: ...
    @property
    def queue_timeout(self) -> int: ...
    @property
    def user_quota(self) -> dict[str, Any]: ...
    @property
    def group_quotas(self) -> dict[str, Any]: ...
    @property
    def user_gpu_budget(self) -> dict[str, Any]: ...
    @property
    def group_gpu_budgets(self) -> dict[str, Any]: ...
    @property
    def budget_prometheus_url(self) -> str: ...
    @property
    def budget_prometheus_timeout(self) -> float: ...
    @property
    def budget_prometheus_step(self) -> int: ...
    @property
    def hide_forbidden_offerings(self) -> bool: ...
    @property
    def form_refresh_seconds(self) -> int: ...
    @property
    def inventory_ready_timeout(self) -> float: ...
    @property
    def kueue_queues(self) -> dict[str, Any]: ...
    @property
    def kueue_priority_classes(self) -> dict[str, Any]: ...
    @property
    def image_requirements(self) -> dict[str, Any]: ...
    @property
    def stop_retry_timeout(self) -> int: ...
    @property
    def stop_outside_window(self) -> bool: ...
    @property
    def memory_guard_kinds(self) -> list[str]: ...
    @property
    def memory_guard_user_env(self) -> bool: ...
    #: KubeSpawner's ``environment`` (the config's, the hooks' and the profile's; read only here).
    @property
    def environment(self) -> dict[str, Any]: ...
    @property
    def reconcile_orphan_pods(self) -> bool: ...
    @property
    def orphan_pod_grace_seconds(self) -> int: ...
    @property
    def orphan_pod_check_seconds(self) -> int: ...
    @property
    def orphan_pod_dry_run(self) -> bool: ...

    # ------------------------------------------------------------------ the spawn's state (the hub writes these)

    spawn_state: SpawnState
    #: The options of the server (known keys only: GPUSpawner validates every assignment).
    user_options: dict[str, Any]
    #: This server's GPU-hour ledger (kept in its state: :mod:`gpuspawner.hub.budgets`).
    gpu_usage: list[Any]
    #: Why the server was stopped behind the hub's back, for the home page ({"time", "text"}).
    stop_notice: dict[str, str] | None
    #: The options of a refused spawn (the form shown again selects them).
    refused_options: dict[str, Any] | None
    #: What the hub's row held before JupyterHub stored the coming start's options (:mod:`gpuspawner.hub.hubhooks`).
    options_before: dict[str, Any] | None
    #: The ``user_options`` keys left out for being over the bound: the start refuses them.
    too_long: tuple[str, ...]

    @property
    def quota_ledger(self) -> QuotaLedger:
        """The units this hub process granted against quotas (one for every spawner)."""
        ...

    # ------------------------------------------------------------------ the two callbacks

    def now(self) -> datetime:
        """The time now in ``site_timezone``."""
        ...

    def stop(self, now: bool = False) -> Awaitable[Any]:
        """GPUSpawner's stop (KubeSpawner's, retried; never another hub's pod)."""
        ...
