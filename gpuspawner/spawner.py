"""GPUSpawner: KubeSpawner that lets users pick a GPU offering.

KubeSpawner still builds the pod. This class decides which offerings exist
(configured and discovered), validates the user's choice on the server, and adds
the chosen offering to KubeSpawner's own settings (``extra_resource_limits``,
``node_selector``, ``tolerations``, ``environment``, ``extra_labels`` ...) only
while KubeSpawner builds the pod manifest (:meth:`GPUSpawner.get_pod_manifest`).
The settings themselves keep what the admin's config, the hub's hooks
(``auth_state_hook``, ``pre_spawn_hook``, group overrides) and the user's profile
made of them, so no spawn loses what a hook set and none leaves an offering behind.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default, validate

from gpuspawner.capacity.admission import QuotaLedger
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.capacity.kueuequeues import KueueRouting
from gpuspawner.core.model import Availability, Offering
from gpuspawner.hub import (
    catalogs,
    choosing,
    claimlife,
    hubhooks,
    hubid,
    lifecycle,
    orphans,
    reflector,
    spawnform,
    spawnview,
    storedoptions,
)
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.spawnstate import SpawnState
from gpuspawner.hub.spawnview import CHECKED_TRAITS
from gpuspawner.names.vocabulary import (
    ANNOTATION_DO_NOT_DISRUPT,
    AdmissionPolicy,
)
from gpuspawner.offerings.catalog import CatalogConfig
from gpuspawner.offerings.choice import Choice
from gpuspawner.pod.podspec import (
    POD_SETTINGS,
    default_hub_id,
    default_pod_name_template,
    layered_settings,
)

__all__ = ["CHECKED_TRAITS", "GPUSpawner"]


class GPUSpawner(KubeSpawner):
    """A KubeSpawner whose users choose a whole GPU, a MIG slice, a shared GPU, a vGPU class or no GPU."""

    #: GPU units granted by this hub process against quotas (shared by every spawner).
    quota_ledger = QuotaLedger()

    offerings = List(
        Dict(),
        help="""
        The GPU choices this hub offers, in addition to discovered ones. Each is a dict; see
        `gpuspawner.offerings.config.offering_from_config` for every field. Examples::

            c.GPUSpawner.offerings = [
                {"slug": "a100-mig-1g", "kind": "mig", "display_name": "A100 · MIG 1g.5gb",
                 "profile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB", "groups": ["students"]},
                {"slug": "h100", "kind": "full", "product": "NVIDIA-H100-80GB-HBM3", "counts": [1, 2, 4]},
                {"slug": "t4-shared", "kind": "shared", "sharing": "time-slicing", "replicas": 4},
                {"slug": "half-v100", "kind": "custom", "resources": {"nvidia.com/vgpu": 500}},
            ]

        A wrong entry is refused with a message naming the entry and the field.
        """,
    ).tag(config=True)

    discover_offerings = Bool(
        True,
        help="""
        Derive offerings from the cluster's GPU nodes (GPU Feature Discovery labels and
        `status.allocatable`): whole GPUs per product, MIG slices, time-sliced/MPS shares,
        vGPU node classes. Configured offerings with the same slug win. Where the cluster serves
        Karpenter's NodePools (karpenter.sh/v1), also each pool's offering before it has a node,
        autoscaled with its limit (docs/autoscaling.md).
        """,
    ).tag(config=True)

    offering_overrides = Dict(
        help="""
        Rename, hide or restrict discovered offerings, by slug (see `gpuspawner offerings`
        for the slugs). Example::

            c.GPUSpawner.offering_overrides = {
                "gpu-nvidia-h100-80gb-hbm3": {"groups": ["researchers"], "counts": [1, 2]},
                "shared-tesla-t4-time-slicing-4x": {"display_name": "T4 (shared, for teaching)"},
                "mig-nvidia-a100-sxm4-40gb-3g-20gb": {"hidden": True},
            }
        """,
    ).tag(config=True)

    vgpu_class_labels = List(
        Unicode(),
        default_value=["vgpu.type"],
        help="""
        Node labels that name a site's vGPU node class (e.g. `vgpu.type=v100-8g-8GB`). Each
        distinct value becomes a vGPU offering selected by that label.
        """,
    ).tag(config=True)

    include_cpu_offering = Bool(
        True,
        help="Offer a 'No GPU' choice (slug `cpu`) unless an offering of kind `cpu` is configured.",
    ).tag(config=True)

    default_offering = Unicode(
        "",
        help="""
        Slug of the offering used when a spawn names none (e.g. an API start without options).
        Empty: the CPU offering if there is one, else the first offering the user may use.
        Example: `c.GPUSpawner.default_offering = "cpu"`.
        """,
    ).tag(config=True)

    admission = Unicode(
        AdmissionPolicy.BLOCK.value,
        help="""
        What to do when the chosen offering has nothing free, unless the offering says otherwise
        (its `admission` field): `block` refuses at once and names what is free instead; `warn`
        starts anyway and tells the user the server may wait; `queue` waits up to
        `queue_timeout` seconds for a unit to free up, showing the queue position.
        Offerings on autoscaled pools (`scalable_nodes`) are never refused for lack of nodes,
        unless discovery read the pool's limit and it is reached ("the pool is at its limit").
        """,
    ).tag(config=True)

    queue_timeout = Integer(
        300,
        help="""Seconds a queued spawn waits for a free unit before it is refused (per offering: `queue_timeout`).
        Keep it shorter than `start_timeout` (by the time a server takes to start), or JupyterHub gives the
        waiting spawn up first: `check_config` refuses a queue that waits as long as `start_timeout` or longer.""",
    ).tag(config=True)

    user_quota = Dict(
        help="""
        GPU units one user may hold at once across all their named servers: `total` for any GPU,
        or a kind (`full`, `mig`, `shared`, `vgpu`, `custom`). A whole-GPU server holds as many
        units as GPUs. Example: `c.GPUSpawner.user_quota = {"total": 2, "full": 1}`.
        What a user holds is what the cluster says runs: this hub's live pods (those labelled
        with its `hub_id`) plus the spawns it admitted that are not bound yet; a pod deleted
        behind the hub's back (an eviction, its node gone) frees its units at once
        (docs/fair-turns.md, "What a user holds").
        """,
    ).tag(config=True)

    group_quotas = Dict(
        help="""
        GPU units the members of a group may hold together, by group name. Example::

            c.GPUSpawner.group_quotas = {"students": {"total": 8, "full": 0}}
        """,
    ).tag(config=True)

    user_gpu_budget = Dict(
        help="""
        Weighted GPU-hours every user may use per window (docs/fair-turns.md): `hours` and `window` (`day`: since
        00:00; `week`: the calendar week since Monday 00:00; `rolling-7d`: the last 7 x 24 hours; in `site_timezone`).
        An hour of an offering costs its `gpu_hour_cost` per unit (default 1 per GPU unit held). `cost`: a cost budget
        in the same window, in the site's money at the offerings' `price_per_hour` per unit (an offering without one
        costs nothing). A spawn either does not cover for one more hour is refused with 429. Empty or 0: no budget.
        Example: `c.GPUSpawner.user_gpu_budget = {"hours": 20, "cost": 150, "window": "week"}` (docs/autoscaling.md).
        """,
    ).tag(config=True)

    group_gpu_budgets = Dict(
        help="""
        GPU-hour budgets by group name, each as `user_gpu_budget`. A user with several (the
        default and their groups') gets the most generous: the most hours per day. Example::

            c.GPUSpawner.group_gpu_budgets = {"students": {"hours": 4, "window": "day"}}
        """,
    ).tag(config=True)

    budget_prometheus_url = Unicode(
        "",
        help="""
        Prometheus' HTTP API (e.g. http://prometheus-server.monitoring.svc) that scrapes the
        hub's `/hub/metrics`: GPU-hour budgets count usage from its `gpuspawner_server_gpus`,
        the series of this hub's pods only (its `hub` label, the `hub_id`), each pod once
        however many hubs, or scrapes of one hub, the Prometheus holds.
        Empty, or no answer within `budget_prometheus_timeout`: from the hub's own record of
        server starts and stops (each server's saved state). The refusal says which was used.
        """,
    ).tag(config=True)

    budget_prometheus_timeout = Float(
        2.0, help="Seconds the hub waits for Prometheus' answer on usage before it counts from its own record."
    ).tag(config=True)

    budget_prometheus_step = Integer(
        60, help="Seconds between the samples of `gpuspawner_server_gpus` the usage query sums (at least the scrape interval)."
    ).tag(config=True)

    #: This server's GPU-hour ledger (kept in its state, also after it stops: see hub.budgets).
    gpu_usage: List[Any] = List()

    site_timezone = Unicode(
        "UTC",
        help="""
        The IANA time zone in which offerings' `windows` are read, e.g. "Europe/Zurich".
        A window such as "Mon-Fri 20:00-07:00" belongs to the day it starts on.
        """,
    ).tag(config=True)

    stop_outside_window = Bool(
        False,
        help="""
        Stop a running server when its offering's time window closes (e.g. a whole GPU taken
        at night, still running at 07:00). Off by default: a window only limits new spawns.
        The hub notices within its `c.JupyterHub.last_activity_interval`/poll interval.
        """,
    ).tag(config=True)

    hide_forbidden_offerings = Bool(
        False,
        help="Hide offerings a user may not use, instead of showing them disabled with the reason.",
    ).tag(config=True)

    form_refresh_seconds = Integer(
        15,
        help="How often the open spawn page refreshes its free counts (0: never).",
    ).tag(config=True)

    inventory_ready_timeout = Float(
        3.0,
        help="""
        Seconds a spawn page or a spawn waits, right after the hub starts, for the API server's
        first answer to the GPU inventory. Never longer, and never again once it has answered:
        an API server that is down is noticed at once, the page then says so (and how old its
        counts are) and spawns are refused with 503 until it is back.
        """,
    ).tag(config=True)

    extra_user_options = List(
        Unicode(),
        help="""
        `user_options` keys that a REST API spawn may carry besides gpuspawner's (`offering`,
        `count`), KubeSpawner's profile keys and the keys of a dict `apply_user_options`: name
        here the keys a callable `apply_user_options` or a `pre_spawn_hook` reads. Every other
        key is dropped (logged, never stored).
        """,
    ).tag(config=True)

    stop_retry_timeout = Integer(
        3600,
        help="""
        Seconds `stop()` keeps retrying a pod deletion that fails (say, the API server cannot
        be reached) before it gives up. Meanwhile the server shows as stopping, never as
        stopped while its pod may still hold a GPU. After giving up, the orphan reconciler
        (`reconcile_orphan_pods`) deletes the pod once the cluster answers again.
        """,
    ).tag(config=True)

    @default("k8s_api_request_retry_timeout")
    def _retry_while_the_start_may_wait(self) -> int:
        """A request that times out is retried until the start's own time is up (KubeSpawner: 30 s):
        a slow API server delays a start, it does not refuse one that fits (docs/config.md)."""
        return int(self.start_timeout)

    reconcile_orphan_pods = Bool(
        True,
        help="""
        Delete GPU pods that GPUSpawner made and that no server of this hub owns any more
        (a stop that gave up during an outage, a hub restart in the middle of a stop), after
        `orphan_pod_grace_seconds`. Each one is logged and counted in the metric
        `gpuspawner_orphan_pods_total`. Runs in the hub process, from its first spawner on.
        """,
    ).tag(config=True)

    orphan_pod_grace_seconds = Integer(
        300,
        help="Seconds a GPU pod must have had no hub server behind it before it is deleted as an orphan.",
    ).tag(config=True)

    orphan_pod_check_seconds = Integer(
        60,
        help="How often the hub looks for orphaned GPU pods.",
    ).tag(config=True)

    orphan_pod_dry_run = Bool(
        False,
        help="Only log the orphaned GPU pods that would be deleted (and count them as `would_delete`).",
    ).tag(config=True)

    hub_id = Unicode(
        help="""
        This hub's identity on the cluster, stamped as the label `gpuspawner.io/hub` on every
        pod, claim template and claim it makes (with the annotation `gpuspawner.io/hub-user`,
        the user's id and creation time in the hub's database). The orphan reconciler, the
        quotas' count of bound pods and the shared DRA claims select on it, and a spawn never
        deletes a pod of another identity that has its pod's name (it is refused, 409), so hubs
        that share a cluster or a namespace never count or delete each other's pods; the default
        `pod_name_template` ends with six characters of it, so two hubs with the same user names
        in one namespace never want the same pod name. A Kubernetes label value (at most 63
        characters). Default: under zero-to-jupyterhub, `<namespace>.<release>` from the hub's
        `POD_NAMESPACE` and `HELM_RELEASE_NAME` environment; elsewhere `<namespace>.<random>`,
        made once and kept in the hub's database, so it survives restarts and upgrades and two
        hubs with two databases never share one. It is kept in a table of its own,
        `gpuspawner_hub` (one row), not in a row of JupyterHub's tables: `jupyterhub upgrade-db`
        migrates JupyterHub's tables only, and JupyterHub deletes rows of its own (roles,
        services, OAuth clients) that its config no longer names. A hub made from a copy of
        another's database keeps that one's identity: set its own.
        Upgrading a hub that had no identity renames and orphans nothing: a running server keeps
        its pod's name (KubeSpawner's saved state; the new default name is taken at its next
        start), and a pod without the label that carries one of this hub's users' keys is this
        hub's for the orphan reconciler, the quotas and a stop. Changing `hub_id` leaves the pods
        made under the old identity to be deleted by hand.
        """,
    ).tag(config=True)

    @default("hub_id")
    def _hub_id_default(self) -> str:
        from_deployment = default_hub_id(os.environ)
        db = getattr(self.user, "db", None)
        if from_deployment or db is None:  # (no hub database: a script or a test, without an identity)
            return from_deployment
        namespace = self._namespace_default() if self.enable_user_namespaces else self.namespace
        return hubid.stored_hub_id(db, namespace, self.log)

    @default("pod_name_template")
    def _pod_name_template_default(self) -> str:
        """KubeSpawner's `jupyter-{user_server}` with six characters of this hub's identity
        (`jupyter-alice-3f9a2c`); a `pod_name_template` set in the config is used as it is.
        A running server keeps the pod name in its saved state (KubeSpawner's), so an upgrade
        renames no running pod: the new name is taken at the server's next start."""
        return default_pod_name_template(self.hub_id)

    memory_guard_kinds = List(
        Unicode(),
        default_value=["shared", "custom"],
        help="""
        The offering kinds whose pods get the memory guard unless an offering's `memory_guard`
        field says otherwise: cooperative limits that PyTorch, TensorFlow and JAX honour, sized
        from the offering's share of the GPU's memory (docs/memory-guard.md). Default: the
        time-sliced/MPS shares and site-specific fractional GPUs, whose memory nothing else
        isolates. Add `mig` and `full` (and `vgpu`) to stop the frameworks' up-front grab there
        too; `[]` turns the guard off except where an offering turns it on.
        """,
    ).tag(config=True)

    memory_guard_user_env = Bool(
        False,
        help="""
        Let an environment variable that the user's chosen KubeSpawner profile (or profile
        option) sets through `kubespawner_override: {"environment": ...}` win over the memory
        guard's value for it (per offering: `memory_guard: {"user_env": true}`). Off: the
        guard's values win; the admin's own `c.KubeSpawner.environment` never counts as the
        user's, and an offering's `env` always wins.
        """,
    ).tag(config=True)

    block_node_disruption = Bool(
        True,
        help="""
        Annotate every notebook pod `karpenter.sh/do-not-disrupt: "true"`, so that Karpenter's
        consolidation never evicts a running notebook (its kernels' memory would be lost) to
        pack or remove its node: only the culler, which warns first and never stops a busy
        notebook, frees the node, and consolidation removes it once empty. Off: Karpenter may
        move notebooks to save nodes. A value the admin set in `extra_annotations` (such as a
        duration, `"4h"`) is kept. Harmless where Karpenter does not run (docs/autoscaling.md).
        """,
    ).tag(config=True)

    kueue_queues = Dict(
        help="""
        Which servers go through Kueue (docs/kueue.md), by the LocalQueue in the server's
        namespace: `default` for every GPU offering, `groups` (group -> queue; the first group
        listed that the user is in wins) and `offerings` (slug -> queue, "" for none; the only way
        to send the CPU offering through Kueue). The most specific wins: offering, group, default.
        The pod gets the label `kueue.x-k8s.io/queue-name` and Kueue admits it by its
        ClusterQueue's quota. The spawn page's free count, and admission, are then the smaller
        of the nodes' and what the user's queue still allows (the hub watches Kueue's queues:
        it needs list/watch on `localqueues`, `clusterqueues` and `resourceflavors`; without,
        the page says the queue's limit is unknown). Empty: no server goes through Kueue. Example::

            c.GPUSpawner.kueue_queues = {"default": "gpu", "groups": {"ml-course": "ml-course"}}
        """,
    ).tag(config=True)

    kueue_priority_classes = Dict(
        help="""
        A Kueue WorkloadPriorityClass per group (group -> name; the first group listed that the
        user is in wins), set as the pod label `kueue.x-k8s.io/priority-class` on servers that go
        through Kueue. Example: `c.GPUSpawner.kueue_priority_classes = {"staff": "interactive-high"}`.
        """,
    ).tag(config=True)

    image_requirements = Dict(
        help="""
        What an image needs of the GPU node's NVIDIA driver, by image: glob patterns on the image
        (`*` matches anything, `/` too; the first pattern that matches wins, so put narrow ones
        first), each a dict of `min_driver` (the driver version, e.g. "570" or "570.86"),
        `min_cuda` (the CUDA version the driver must support, e.g. "12.8") and `min_compute` (the
        GPU's compute capability, e.g. "8.0"), every one optional and written as text; or the
        image's own `NVIDIA_REQUIRE_CUDA` string (its first alternative: `cuda>=`, `driver>=`,
        `arch>=`). `{}` for a pattern says "needs nothing" before a broader one. Example::

            c.GPUSpawner.image_requirements = {
                "quay.io/jupyter/pytorch-notebook:cuda12-*": {"min_driver": "570", "min_cuda": "12.8"},
                "nvcr.io/nvidia/pytorch:24.*": "cuda>=12.4 brand=tesla,driver>=470,driver<471",
            }

        A server's pod then lands only on nodes whose GPU Feature Discovery labels
        (`nvidia.com/cuda.driver-version.*`, `nvidia.com/cuda.runtime-version.*`,
        `nvidia.com/gpu.compute.*`) meet its image's needs (node affinity; a node without the
        labels does not), and a DRA offering's claim selects only devices whose `driverVersion`,
        `cudaDriverVersion` and `cudaComputeCapability` do. Free counts are of those nodes and
        devices; an offering none of whose nodes can run the image is disabled on the spawn page
        with the reason ("needs driver >= 570; these nodes have 535.183.01"), and a spawn of it
        is refused (409) with the same words.
        """,
    ).tag(config=True)

    def image_fit(self, offering: Offering, image: str) -> tuple[Offering, str]:
        """``offering`` for ``image`` (see :func:`gpuspawner.hub.catalogs.image_fit`)."""
        return catalogs.image_fit(self, offering, image)

    @property
    def kueue_routing(self) -> KueueRouting:
        """The queue mapping (see :func:`gpuspawner.hub.spawnview.kueue_routing`)."""
        return spawnview.kueue_routing(self)

    def config_problems(self) -> list[str]:
        """What is wrong with this hub's GPUSpawner settings (see :func:`gpuspawner.hub.spawnview.config_problems`)."""
        return spawnview.config_problems(self)

    # ------------------------------------------------------------------ lifecycle

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "user_options" in kwargs:
            # traitlets sets keyword traits before the config: JupyterHub's stored user_options
            # were checked against an empty profile_list. Checked again now that it is loaded.
            self.user_options = dict(kwargs["user_options"] or {})
        self.spawn_state = SpawnState()
        #: The options of a refused spawn, kept past clear_state: the form shown again selects them.
        self.refused_options: dict[str, Any] | None = None
        hubhooks.own_row(self)
        hubhooks.log_refusals_on_one_line(self.log)
        hubhooks.hub_log_for_gpuspawner(self.log)
        orphans.start_reconciler(self)

    @property
    def choice(self) -> Choice | None:
        """The current spawn's admitted offering and count (None before one, or with no GPU offering in play)."""
        return self.spawn_state.choice

    @property
    def log_name(self) -> str:
        """How the log names this server (JupyterHub's ``_log_name``; the seam's name for it)."""
        return str(self._log_name)

    def orphan_io(self) -> tuple[Callable[[], Awaitable[list[dict[str, Any]]]], Callable[[str, str, str], Awaitable[None]]]:
        """The orphan reconciler's calls to the cluster (see :func:`gpuspawner.hub.orphans.cluster_io`)."""
        return orphans.cluster_io(self)

    @property
    def catalog_config(self) -> CatalogConfig:
        return spawnview.catalog_config(self)

    @property
    def inventory(self) -> Inventory:
        """This process's one watch-based cache of Nodes and Pods."""
        return spawnview.inventory(self)

    async def catalog(self) -> list[Offering]:
        """Every offering this hub has now (see :func:`gpuspawner.hub.catalogs.catalog`)."""
        return await catalogs.catalog(self)

    def catalog_now(self) -> list[Offering]:
        """:meth:`catalog` from what is known now, without waiting for the cluster."""
        return catalogs.catalog_now(self)

    def counts(self) -> ClusterIndex | None:
        """The live counts, or None where there are none (see :func:`gpuspawner.hub.catalogs.counts`)."""
        return catalogs.counts(self)

    def availability(self, offering: Offering, through_queue: bool = True) -> Availability:
        """Capacity and free units of ``offering`` now (see :func:`gpuspawner.hub.catalogs.availability`)."""
        return catalogs.availability(self, offering, through_queue)

    # ------------------------------------------------------------------ user_options keys

    #: The ``user_options`` keys whose values were over the bound when they were last set (and
    #: were left out): a start with them is refused (400) before anything else.
    too_long: tuple[str, ...] = ()
    #: What the hub's row held before JupyterHub stored the coming start's options (None: the
    #: start stored none, e.g. a POST without a body): a start refused for them puts it back.
    options_before: dict[str, Any] | None = None

    @validate("user_options")
    def _only_known_user_options(self, proposal: dict[str, Any]) -> dict[str, Any]:
        """``self.user_options`` holds known keys only, whoever sets it (see :func:`gpuspawner.hub.storedoptions.validated`)."""
        kept, self.too_long = storedoptions.validated(self, proposal["value"])
        return kept

    async def _run_apply_user_options(self, user_options: dict[str, Any]) -> Any:
        """JupyterHub's ``apply_user_options`` hook still works (on the known keys); without one,
        nothing is "unhandled": gpuspawner applies ``offering``/``count`` (and KubeSpawner's
        profile) in load_user_options."""
        if self.apply_user_options:
            return await super()._run_apply_user_options(user_options)

    async def load_user_options(self) -> None:
        """KubeSpawner's profile, then the chosen offering checked and admitted (KubeSpawner's
        ``_start`` calls this after the hub ran its hooks; see :func:`gpuspawner.hub.choosing.load_user_options`)."""
        await choosing.load_user_options(self, self._load_profile_options)

    def _profiles_now(self) -> list[dict[str, Any]]:
        """KubeSpawner's profile list, initialized as KubeSpawner does, where it needs no awaiting
        ([] without one, or where it is a callable)."""
        if not self.profile_list or callable(self.profile_list):
            return []
        initialized: list[dict[str, Any]] = self._get_initialized_profile_list(self._sorted_dict_values(self.profile_list))
        return initialized

    async def _initialized_profile_list(self) -> list[dict[str, Any]]:
        profile_list = self._sorted_dict_values(self.profile_list)
        if callable(profile_list):
            profile_list = await maybe_future(profile_list(self))
        initialized: list[dict[str, Any]] = self._get_initialized_profile_list(profile_list)
        return initialized

    async def _load_profile_options(self, gpu_in_play: bool) -> None:
        """KubeSpawner's profile choice, by KubeSpawner's own ``load_user_options`` (see :func:`gpuspawner.hub.choosing.load_profile_options`)."""
        await choosing.load_profile_options(self, gpu_in_play, super().load_user_options, self._initialized_profile_list)

    def apply_choice(self, choice: Choice) -> None:
        """Take ``choice`` for this spawn (see :func:`gpuspawner.hub.choosing.apply_choice`)."""
        choosing.apply_choice(self, choice)

    def record(self, url: str | None = None) -> dict[str, Any]:
        """What other services (the culler, the inventory) may read about this server's GPU."""
        return spawnview.record(self, url)

    # ------------------------------------------------------------------ the spawn page

    def _options_form_default(self) -> Any:
        """KubeSpawner's own form while no GPU offering can be in play (none configured,
        discovery off); otherwise decided on each view (see _render_gpu_form)."""
        if not self.offerings and not self.discover_offerings:
            return KubeSpawner._options_form_default(self)
        return self._render_gpu_form

    async def get_options_form(self) -> Any:
        """JupyterHub's, but our own form awaited in place: JupyterHub runs a callable form as a task of
        its own, two turns of the event loop per view (on a hub busy with a storm, hundreds of ms
        each), where KubeSpawner's static profile list is a string, ready at once."""
        if self.options_form == self._render_gpu_form:
            return await self._render_gpu_form(self)
        return await super().get_options_form()

    def now(self) -> datetime:
        return datetime.now(ZoneInfo(self.site_timezone))  # checked by catalog() before any use

    async def _render_gpu_form(self, spawner: GPUSpawner | None = None) -> str:
        """The spawn page (see :func:`gpuspawner.hub.spawnform.render_gpu_form`)."""
        return await spawnform.render_gpu_form(self, self._initialized_profile_list)

    def _options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """KubeSpawner's ``_options_from_form``: the same signature, synchronous, a dict; a GPU
        choice checked at once (see :func:`gpuspawner.hub.spawnform.options_from_form`)."""
        return spawnform.options_from_form(self, formdata, super()._options_from_form, self._profiles_now)

    # ------------------------------------------------------------------ start / stop

    async def _start(self) -> Any:
        return await lifecycle.start(self, super()._start)

    # ------------------------------------------------------------------ Dynamic Resource Allocation

    @contextlib.contextmanager
    def _offering_added(self) -> Iterator[None]:
        """KubeSpawner's pod settings with this spawn's offering on top while KubeSpawner
        builds the pod, then the very values that were there before. What the admin's
        config, the hub's hooks and the user's profile set is never replaced, and nothing of
        an offering outlives the manifest it went into (docs/architecture.md, "The pod settings")."""
        state = self.spawn_state
        if state.pod_changes is None:
            yield
            return
        site = {name: getattr(self, name) for name in POD_SETTINGS}
        as_lists = {name: self._sorted_dict_values(site[name]) for name in ("tolerations", "volumes", "volume_mounts")}
        layered = layered_settings({**site, **as_lists}, state.pod_changes, state.profile_env_keys, state.user_env)
        try:
            for name, value in layered.items():
                setattr(self, name, value)
            yield
        finally:
            for name, value in site.items():
                setattr(self, name, value)

    async def get_pod_manifest(self) -> Any:
        """KubeSpawner's pod with the chosen offering added (:meth:`_offering_added`); for a
        DRA offering, also with the GPU claim added to the pod's
        ``resourceClaims`` and the notebook container's ``resources.claims`` (after whatever
        the admin's ``extra_pod_config``/``extra_container_config`` put there; a
        ``modify_pod_hook`` still sees and may change the result)."""
        with self._offering_added():
            pod = await super().get_pod_manifest()
        hubid.stamp_identity(self, pod)  # every pod, GPU offerings in play or not: whose it is (hub.hubid)
        if self.block_node_disruption:  # the admin's own value (extra_annotations) wins
            pod.metadata.annotations.setdefault(ANNOTATION_DO_NOT_DISRUPT, "true")
        if claimlife.claimed(self) is not None:
            claimlife.add_claim(pod, self.pod_name)
        return pod

    async def _make_create_pod_request(self, pod: Any, request_timeout: int) -> bool:
        """KubeSpawner's pod creation, which never deletes a pod that is not this server's own
        (a spawn whose pod name another hub's pod holds is refused, 409: :mod:`gpuspawner.hub.hubid`);
        a DRA server's claim is made with it (see :func:`gpuspawner.hub.claimlife.create_pod`)."""
        create = functools.partial(hubid.create_pod, self, super()._make_create_pod_request)
        offering = claimlife.claimed(self)
        if offering is None:
            return await create(pod, request_timeout)  # (a name held by another hub's pod: its 409 is read)
        await hubid.check_pod_name(self, pod.metadata.name)  # before the claim template named after the pod is made
        return await claimlife.create_pod(self, offering, pod, request_timeout, create)

    async def poll(self) -> int | None:
        """KubeSpawner's poll; with ``stop_outside_window``, a server past its window counts as done (:func:`gpuspawner.hub.lifecycle.poll`)."""
        return await lifecycle.poll(self, super().poll)

    #: Why Kueue (or a device taint, the cluster behind the hub's back, or a hub restart in its start) stopped this server, for the
    #: home page ({"time", "text"}; kept in the saved state past the stop, until the next start).
    stop_notice: dict[str, str] | None = None

    async def stop(self, now: bool = False) -> None:
        """KubeSpawner's stop, retried while the pod cannot be deleted (see ``stop_retry_timeout``);
        never of a pod of another hub that has this server's pod name (hub.hubid.stop_unless_taken)."""
        await lifecycle.stop(self, functools.partial(hubid.stop_unless_taken, self, super().stop, now))

    async def _start_watching_pods(self, replace: bool = False) -> Any:
        """KubeSpawner's pod reflector, started afresh after an API server outage (see :func:`gpuspawner.hub.reflector.start_watching`)."""
        return await reflector.start_watching(self, self._start_reflector, self.component_label, replace)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """KubeSpawner's pod events, with our own steps (admission, reservation, queue position) between."""
        async for event in lifecycle.progress(lambda: self.spawn_state, super().progress(), self.log):
            yield event

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        """KubeSpawner's state plus what this server holds (kept across hub restarts: :func:`gpuspawner.hub.spawnview.saved_state`)."""
        return spawnview.saved_state(self, super().get_state())

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        spawnview.load_state(self, state)

    def start_polling(self) -> None:
        """JupyterHub's polling, once the server answers: a later stop is not the restart check's."""
        self.spawn_state.answered = True
        super().start_polling()

    def clear_state(self) -> None:
        """KubeSpawner's, and the spawn's; the GPU-hour ledger stays (the hub saves it after a stop)."""
        super().clear_state()
        self.spawn_state = SpawnState()
