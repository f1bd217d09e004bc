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

import asyncio
import contextlib
import copy
import functools
import importlib.resources
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import aiohttp
from jupyterhub.utils import maybe_future
from kubernetes_asyncio.client.rest import ApiException
from kubespawner import KubeSpawner
from kubespawner.slugs import is_valid_label, safe_slug
from markupsafe import Markup
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default, validate

from gpuspawner.capacity.admission import ADMIT, QUEUE, QUOTA_KEYS, REFUSE, WARN, Decision, Held, QuotaLedger, Quotas, admit, units_held
from gpuspawner.capacity.checks import config_problems
from gpuspawner.capacity.index import ClusterIndex, Health
from gpuspawner.capacity.policy import Requester, allowed, named
from gpuspawner.core.model import UNCOUNTED, Availability, Offering
from gpuspawner.core.windows import window_state
from gpuspawner.dra.devices import unmatched
from gpuspawner.hub import hubhooks, metrics
from gpuspawner.hub.claims import KIND as CLAIM_TEMPLATE_KIND
from gpuspawner.hub.claims import ClaimTemplates
from gpuspawner.hub.form import render_form
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.orphans import OrphanReconciler, hub_servers_from_db
from gpuspawner.hub.reflector import VerdictPodReflector
from gpuspawner.hub.scheduling import ProfileRefused, SpawnRefused, WaitQueue, unschedulable_reason
from gpuspawner.names.vocabulary import (
    CLAIM_NAME,
    COUNT_FIELD_PREFIX,
    COUNT_KEY,
    LABEL_HUB,
    LABEL_KIND,
    LABEL_OFFERING,
    OFFERING_KEY,
    RECORD_CLAIM_TEMPLATE,
    RECORD_COUNT,
    RECORD_DEVICES,
    RECORD_KEY,
    RECORD_KIND,
    RECORD_NAMESPACE,
    RECORD_OFFERING,
    RECORD_POD,
    RECORD_RESOURCES,
    RECORD_SHARED_CLAIM,
    RECORD_URL,
    AdmissionPolicy,
    Kind,
)
from gpuspawner.offerings.catalog import TRAITS as CATALOG_TRAITS
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog, gpu_offerings_in_play
from gpuspawner.offerings.choice import Choice, ChoiceError, parse_choice
from gpuspawner.offerings.config import OfferingConfigError
from gpuspawner.page.cards import counts_notice, default_choice, option_views, unreachable_message
from gpuspawner.page.useroptions import KnownKeys, check_profile, describe_keys, known_keys, oversized, split_known, too_long_message
from gpuspawner.page.views import FormView, group_options, user_options_from_form
from gpuspawner.pod.memguard import GuardChanges, GuardConfigError, GuardDefaults, guard_changes, guard_for
from gpuspawner.pod.notebook import NOTEBOOK_TRAITS, Notebook
from gpuspawner.pod.podspec import (
    POD_SETTINGS,
    PodChanges,
    claim_template,
    container_claim,
    default_hub_id,
    hub_id_problem,
    hub_selector,
    identity,
    layered_settings,
    pod_changes,
    pod_claim,
    user_key,
)

#: The kinds a saved record may hold quota units of (quota keys but "total").
QUOTA_KINDS = frozenset(QUOTA_KEYS) - {"total"}


def user_label(name: str) -> str:
    """A user name as KubeSpawner writes it in its pod label (``vocabulary.KUBESPAWNER_USER_LABEL``)."""
    return safe_slug(name, is_valid=is_valid_label)


@dataclass
class SpawnState:
    """What the current (or last) spawn of one server decided and said: made with the
    spawner, replaced at the start of each spawn (load_user_options), and cleared with
    JupyterHub's ``clear_state``, so no spawn reads what an earlier one left."""

    choice: Choice | None = None  # the admitted offering and count; None without a GPU offering in play
    pod_changes: PodChanges | None = None  # what the choice adds to the pod (get_pod_manifest layers it on)
    profile_env_keys: frozenset[str] = frozenset()  # variables the user's profile set (the memory guard may defer to them)
    user_env: bool = False  # whether those keep their value over the memory guard's (memory_guard_user_env)
    refused: bool = False  # refused before any pod was made: poll() says so without asking the cluster
    messages: list[str] = field(default_factory=list)  # our progress steps (admission, reservation, queue)
    expect_wait: bool = False  # admitted with a warning that the pod may wait: no fail-fast watch
    queue_position: int | None = None  # place in the offering's wait queue, while waiting
    started_at: float | None = None  # monotonic time _start began, for the time-to-schedule metric
    record_url: str | None = None  # the server's URL as the record names it (None without a Server)
    saved_record: dict[str, Any] | None = None  # the record from the hub's saved state (after a restart)
    claim_template: str | None = None  # the ResourceClaimTemplate this spawn made (DRA offerings), until deleted
    shared_claim: str | None = None  # the ResourceClaim this spawn's pod shares (shared DRA offerings)
    devices: list[dict[str, str]] | None = None  # the devices allocated to the pod's claim (DRA offerings)
    decided: asyncio.Event = field(default_factory=asyncio.Event)  # set once load_user_options admitted or refused

    def restart(self) -> None:
        """Forget an earlier load's decisions, in place (the start that is timing it may hold this object)."""
        self.choice, self.refused, self.messages, self.expect_wait = None, False, [], False
        self.pod_changes, self.profile_env_keys, self.user_env = None, frozenset(), False
        self.queue_position, self.record_url, self.saved_record = None, None, None
        self.devices = None
        self.decided.clear()


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
        vGPU node classes. Configured offerings with the same slug win.
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
        Offerings on autoscaled pools (`scalable_nodes`) are never refused for lack of nodes.
        """,
    ).tag(config=True)

    queue_timeout = Integer(
        300,
        help="Seconds a queued spawn waits for a free unit before it is refused (per offering: `queue_timeout`).",
    ).tag(config=True)

    user_quota = Dict(
        help="""
        GPU units one user may hold at once across all their named servers: `total` for any GPU,
        or a kind (`full`, `mig`, `shared`, `vgpu`, `custom`). A whole-GPU server holds as many
        units as GPUs. Example: `c.GPUSpawner.user_quota = {"total": 2, "full": 1}`.
        """,
    ).tag(config=True)

    group_quotas = Dict(
        help="""
        GPU units the members of a group may hold together, by group name. Example::

            c.GPUSpawner.group_quotas = {"students": {"total": 8, "full": 0}}
        """,
    ).tag(config=True)

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
        This hub's identity on the cluster, stamped as the label `gpuspawner.io/hub` on every GPU
        pod, claim template and claim it makes. The orphan reconciler, the quotas' count of bound
        pods and the shared DRA claims select on it, so hubs that share a cluster (or a namespace)
        never count or delete each other's pods. A Kubernetes label value (at most 63 characters).
        Default: under zero-to-jupyterhub, `<namespace>.<release>` from the hub's `POD_NAMESPACE`
        and `HELM_RELEASE_NAME` environment; elsewhere "" (no identity: the reconciler then keeps
        to pods that carry no hub's identity, and with `enable_user_namespaces` it does not run).
        Changing it leaves the pods made under the old identity to be deleted by hand.
        """,
    ).tag(config=True)

    @default("hub_id")
    def _hub_id_default(self) -> str:
        return default_hub_id(os.environ)

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

    def config_problems(self) -> list[str]:
        """What is wrong with this hub's GPUSpawner settings (see :mod:`gpuspawner.capacity.checks`)."""
        names = (
            "offerings",
            "offering_overrides",
            "user_quota",
            "group_quotas",
            "site_timezone",
            "admission",
            "memory_guard_kinds",
            "memory_guard_user_env",
        )
        problems = config_problems({name: getattr(self, name) for name in names})
        return [*problems, *filter(None, [hub_id_problem(self.hub_id)])]

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
        self._ensure_orphan_reconciler()

    @property
    def choice(self) -> Choice | None:
        """The current spawn's admitted offering and count (None before one, or with no GPU offering in play)."""
        return self.spawn_state.choice

    #: This hub process's orphan reconciler (see gpuspawner.hub.orphans), made by its first spawner.
    _orphans: ClassVar[OrphanReconciler | None] = None
    #: Whether this process has said why it runs no orphan reconciler (once).
    _orphans_refused: ClassVar[bool] = False

    def _ensure_orphan_reconciler(self) -> None:
        """Start the process's orphan reconciler, inside a hub (with its database and loop)."""
        db = getattr(self.user, "db", None)
        if not self.reconcile_orphan_pods or db is None or GPUSpawner._orphans is not None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        if not self.hub_id and self.enable_user_namespaces:
            if not GPUSpawner._orphans_refused:
                GPUSpawner._orphans_refused = True
                self.log.error(
                    "GPUSpawner: the orphan reconciler does not run: with enable_user_namespaces other hubs' pods may be "
                    "anywhere, and this hub has no identity to tell its own (set c.GPUSpawner.hub_id; docs/config.md)."
                )
            return
        if hub_id_problem(self.hub_id):
            return  # config_problems refuses every spawn and says why
        list_objects, delete_object = self.orphan_io()
        GPUSpawner._orphans = OrphanReconciler(
            list_objects,
            lambda: hub_servers_from_db(db),
            delete_object,
            grace=self.orphan_pod_grace_seconds,
            interval=self.orphan_pod_check_seconds,
            dry_run=self.orphan_pod_dry_run,
            log=self.log,
        )
        GPUSpawner._orphans.start()

    def orphan_io(self) -> tuple[Callable[[], Awaitable[list[dict[str, Any]]]], Callable[[str, str, str], Awaitable[None]]]:
        """The orphan reconciler's two calls to the cluster: list GPUSpawner's pods and the
        claim templates of its DRA pods (each with its ``kind``), and delete one of them."""
        namespace, api = self.namespace, self.api
        every_namespace, grace = self.enable_user_namespaces, self.delete_grace_period
        claims = ClaimTemplates(api.api_client, namespace, self.log, self.hub_id)
        selector = hub_selector(self.hub_id, LABEL_OFFERING)  # this hub's GPU pods only

        async def list_objects() -> list[dict[str, Any]]:
            if every_namespace:
                response = await api.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False)
            else:
                response = await api.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
            pods = json.loads(await response.read()).get("items") or []
            try:
                templates = await claims.list(selector, all_namespaces=every_namespace)
            except ApiException as exc:
                if exc.status not in (403, 404):  # 404: no DRA in this cluster; 403: the hub may not read templates
                    raise
                templates = []
            return pods + [{**template, "kind": CLAIM_TEMPLATE_KIND} for template in templates]

        async def delete_object(kind: str, object_namespace: str, name: str) -> None:
            try:
                if kind == CLAIM_TEMPLATE_KIND:
                    await claims.delete(name, object_namespace)
                else:
                    await api.delete_namespaced_pod(name, object_namespace, grace_period_seconds=grace)
            except ApiException as exc:
                if exc.status != 404:  # already gone is what we wanted
                    raise

        return list_objects, delete_object

    @property
    def catalog_config(self) -> CatalogConfig:
        return CatalogConfig.from_settings({trait: getattr(self, trait) for trait in CATALOG_TRAITS})

    def _user_groups(self) -> list[tuple[str, Any]]:
        """(name, group) of the user's groups, whatever shape the hub's User gives them in."""
        return named(getattr(self.user, "groups", None))

    def requester(self) -> Requester:
        user = self.user
        groups = frozenset(name for name, _ in self._user_groups())
        metrics.observe_groups(user_label(user.name), groups)  # keyed as the pod label the inventory reads
        return Requester(name=user.name, groups=groups, admin=bool(getattr(user, "admin", False)))

    @property
    def inventory(self) -> Inventory:
        """This process's one watch-based cache of Nodes and Pods."""
        return Inventory.shared(self.api, self.vgpu_class_labels)

    async def catalog(self) -> list[Offering]:
        """Every offering this hub has now (configured + discovered), in display order.

        Raises OfferingConfigError (logged; users see a short message) if the settings are wrong.
        """
        if not self.config_problems() and self.catalog_config.needs_inventory() and not self.inventory.ready:
            await self.inventory.wait_answered(self.inventory_ready_timeout)  # at once unless the hub has just started
        return self._catalog_now()

    def _catalog_now(self) -> list[Offering]:
        """:meth:`catalog` from what is known now, without waiting for the cluster."""
        problems = self.config_problems()
        if problems:
            raise OfferingConfigError("; ".join(problems))
        config = self.catalog_config
        if not config.needs_inventory():
            return build_catalog(config)  # nothing to discover or count: no cluster-wide watch
        inventory = self.inventory
        try:  # free counts fit the notebook's own cpu/memory guarantees, selector and tolerations beside the GPU
            inventory.index.set_notebook(Notebook.from_settings({n: getattr(self, n) for n in NOTEBOOK_TRAITS}))
        except ValueError as exc:
            raise OfferingConfigError(str(exc)) from None
        discovered = inventory.index.discovered() if self.discover_offerings else None
        catalog = build_catalog(config, discovered=discovered)
        if not inventory.forbidden:
            metrics.observe_catalog(inventory.index, catalog)
        self._warn_unmatched(catalog)
        return catalog

    #: The warnings about the admin's DRA selectors this hub process has logged (each once).
    _unmatched_logged: ClassVar[set[str]] = set()

    def _warn_unmatched(self, catalog: list[Offering]) -> None:
        """Log, once per hub process, each admin DRA offering whose selectors match no device the
        cluster publishes (known only once the slices are listed; it may match later)."""
        for warning in unmatched(catalog, self.inventory.index.dra):
            if warning not in GPUSpawner._unmatched_logged:
                GPUSpawner._unmatched_logged.add(warning)
                self.log.warning("GPUSpawner: %s", warning)

    def _health(self) -> Health:
        """How far the counts can be trusted; live when none are needed (no watch is started)."""
        return self.inventory.health if self.catalog_config.needs_inventory() else Health(ready=True)

    def _counts(self) -> ClusterIndex | None:
        """The live counts, or None where there are none: no offering needs them (no watch
        is started then), or the hub may not read the cluster (see Inventory.forbidden)."""
        if not self.catalog_config.needs_inventory():
            return None
        inventory = self.inventory
        return None if inventory.forbidden else inventory.index

    def availability(self, offering: Offering) -> Availability:
        """Capacity and free units of ``offering`` now; uncounted where there are no counts."""
        index = self._counts()
        return index.availability(offering) if index is not None else UNCOUNTED

    def _default_slug(self, offerings: dict[str, Offering]) -> str | None:
        if self.default_offering and self.default_offering in offerings:
            return self.default_offering
        cpu = [slug for slug, o in offerings.items() if not o.is_gpu]
        return cpu[0] if cpu else next(iter(offerings), None)

    def _misconfigured(self, exc: OfferingConfigError) -> SpawnRefused:
        self.log.error("GPUSpawner configuration error: %s", exc)
        return SpawnRefused("This hub's GPU options are misconfigured; please tell your administrator.", "misconfigured")

    def _choose(self, user_options: dict[str, Any], catalog: list[Offering]) -> Choice:
        """The offering and count ``user_options`` ask for, if this user may take it from
        ``catalog``. Raises :class:`SpawnRefused`: 503 when the cluster cannot be reached, 400
        malformed, 403 not offered to this user."""
        health = self._health()
        if not health.ready and not health.forbidden:  # no pod can be made, and the counts cannot be trusted
            raise SpawnRefused(unreachable_message(health, self.now()), "unreachable")
        offerings = allowed(catalog, self.requester())
        try:
            return parse_choice(user_options, offerings, self._default_slug(offerings))
        except ChoiceError as exc:
            raise SpawnRefused(str(exc), exc.reason) from None

    # ------------------------------------------------------------------ user_options keys

    def known_user_options(self) -> KnownKeys:
        """The ``user_options`` keys a spawn may carry (see :mod:`gpuspawner.page.useroptions`)."""
        declared = list(self.extra_user_options)
        if isinstance(self.apply_user_options, dict):
            declared += list(self.apply_user_options)
        return known_keys(self._sorted_dict_values(self.profile_list), declared)

    def storable_user_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """What of ``options`` the hub may store for this server (called as it is stored; see
        :mod:`gpuspawner.hub.hubhooks`). The other keys are named in one log line. Raises
        :class:`~gpuspawner.hub.hubhooks.NotStored` when a kept key's value is over the bound
        (``useroptions.MAX_VALUE_CHARS``): then nothing of ``options`` is stored."""
        kept, dropped = self._known_options(options, stored_record_is_ours=False)
        if dropped:
            self.log.warning("%s: user_options keys dropped, not stored: %s", self._log_name, describe_keys(dropped))
        too_long = oversized({k: v for k, v in kept.items() if k != RECORD_KEY})
        if too_long:
            self.log.warning("%s: user_options not stored: the value of %s is too long", self._log_name, describe_keys(too_long))
            raise hubhooks.NotStored(too_long_message(too_long))
        return kept

    #: The ``user_options`` keys whose values were over the bound when they were last set (and
    #: were left out): a start with them is refused (400) before anything else.
    _too_long: tuple[str, ...] = ()
    #: What the hub's row held before JupyterHub stored the coming start's options (None: the
    #: start stored none, e.g. a POST without a body).
    _options_before: dict[str, Any] | None = None

    def stored_for_start(self, before: dict[str, Any]) -> None:
        """JupyterHub stored a start's options over ``before`` (see hubhooks): a start refused
        for the options themselves puts ``before`` back."""
        self._options_before = dict(before)

    def _put_back_options(self, before: dict[str, Any] | None, refusal: SpawnRefused) -> None:
        """After a refusal of the options themselves (malformed, not offered), the hub's row and
        this spawner hold what they held before the refused request; a refusal for the state of
        things (quota, capacity, window, the cluster) keeps them, for the next try."""
        if before is None or refusal.reason not in ("malformed", "not_offered"):
            return
        self.user_options = before
        if self.orm_spawner is not None:
            self.orm_spawner.user_options = dict(self.user_options)  # the hub commits as it cleans up
        self._options_before = None

    @validate("user_options")
    def _only_known_user_options(self, proposal: dict[str, Any]) -> dict[str, Any]:
        """``self.user_options`` holds known keys only, whoever sets it (the hub serves it in its
        REST API while this spawner object lives), and no value over the bound (it is left out,
        and the start refuses); the other values are checked at start."""
        kept = self._known_options(proposal["value"])[0]
        self._too_long = tuple(oversized({k: v for k, v in kept.items() if k != RECORD_KEY}))
        return {k: v for k, v in kept.items() if k not in self._too_long}

    def _known_options(self, options: dict[str, Any], stored_record_is_ours: bool = True) -> tuple[dict[str, Any], list[str]]:
        """Split ``options`` into known keys and the rest; the ``gpuspawner`` record is kept only
        when this spawner wrote it: it is the running server's record, or (for the hub's copy)
        the one in the database row, which only this spawner stores (see storable_user_options)."""
        kept, dropped = split_known(options, self.known_user_options())
        if RECORD_KEY in dropped:
            record = options[RECORD_KEY]
            ours = getattr(self, "choice", None) is not None and record == self.record()
            if not ours and stored_record_is_ours and self.orm_spawner is not None:
                ours = record == (self.orm_spawner.user_options or {}).get(RECORD_KEY)
            if ours:
                kept[RECORD_KEY] = record
                dropped.remove(RECORD_KEY)
        return kept, dropped

    async def _run_apply_user_options(self, user_options):
        """JupyterHub's ``apply_user_options`` hook still works (on the known keys); without one,
        nothing is "unhandled": gpuspawner applies ``offering``/``count`` (and KubeSpawner's
        profile) in load_user_options."""
        if self.apply_user_options:
            return await super()._run_apply_user_options(user_options)

    async def load_user_options(self) -> None:
        """KubeSpawner's profile, then the chosen offering checked and admitted (KubeSpawner's
        ``_start`` calls this after the hub ran its hooks).

        With no GPU offering in play this is KubeSpawner's own: user_options, the pod, the
        state and the refusals of a wrong profile stay KubeSpawner's (an ``offering`` key,
        which KubeSpawner would ignore, is still checked, so a request for a GPU this hub
        does not have is refused). Nothing here changes KubeSpawner's pod settings: the
        offering is added to the pod as it is built (:meth:`get_pod_manifest`).
        Raises :class:`SpawnRefused` (its status and message become the hub's answer).
        """
        self.spawn_state.restart()  # (KubeSpawner's _start calls this, after our _start began timing it)
        try:
            try:
                catalog = await self.catalog()  # once per spawn: the choice, quotas and capacity read this one
            except OfferingConfigError as exc:
                raise self._misconfigured(exc) from None
            in_play = gpu_offerings_in_play(catalog)
            before = copy.deepcopy(self.environment)  # what the config and the hooks set
            await self._load_profile_options(in_play)
            self.spawn_state.profile_env_keys = frozenset(k for k, v in self.environment.items() if k not in before or before[k] != v)
            choice = self._choose(self.user_options, catalog)
            if in_play:
                self.apply_choice(choice)
                await self.admit(choice, catalog)
        except SpawnRefused:
            self.spawn_state.refused = True
            self.refused_options = dict(self.user_options)
            raise
        finally:
            self.spawn_state.decided.set()
        self.refused_options = None

    @staticmethod
    def _check_profile(options: dict[str, Any], profile_list: list[dict]) -> None:
        try:
            check_profile(options, profile_list)
        except ChoiceError as exc:
            raise SpawnRefused(str(exc), exc.reason) from None

    async def _initialized_profile_list(self) -> list[dict]:
        profile_list = self._sorted_dict_values(self.profile_list)
        if callable(profile_list):
            profile_list = await maybe_future(profile_list(self))
        return self._get_initialized_profile_list(profile_list)

    async def _load_profile_options(self, gpu_in_play: bool) -> None:
        """KubeSpawner's profile choice, by KubeSpawner's own ``load_user_options``.

        A wrong profile or option is refused where KubeSpawner refuses it, with its words and
        as a ``ValueError`` (a :class:`~gpuspawner.hub.scheduling.ProfileRefused`, which the hub
        answers with 400 where KubeSpawner's plain ``ValueError`` gets a 500). While GPU
        offerings are in play it is checked first, with a short message (the form's choice
        was checked the same way when it was posted: see _refuse_now).
        """
        if gpu_in_play and self.profile_list:
            self._check_profile(self.user_options, await self._initialized_profile_list())
        try:
            await super().load_user_options()
        except ValueError as exc:  # KubeSpawner's unlisted-choice and profile checks
            message = f"The profile options were not accepted: {exc}" if gpu_in_play else str(exc)
            raise ProfileRefused(message) from None

    def _guard_changes(self, choice: Choice) -> tuple[GuardChanges | None, bool]:
        """The memory guard of ``choice``'s pod (None: none), and whether the user's profile env wins."""
        try:
            defaults = GuardDefaults.from_settings(self.memory_guard_kinds, self.memory_guard_user_env)
        except GuardConfigError as exc:  # config_problems has refused the spawn before this
            raise OfferingConfigError(str(exc)) from None
        guard = guard_for(choice.offering, defaults)
        if guard is None:
            return None, False
        changes = guard_changes(guard, choice.count, _hook_source())
        return changes, guard.user_env

    def apply_choice(self, choice: Choice) -> None:
        """Take ``choice`` for this spawn: what it adds to the pod (layered onto KubeSpawner's
        settings by :meth:`get_pod_manifest`, never written into them) and the user_options
        that name it."""
        guard, user_env = self._guard_changes(choice)
        changes = pod_changes(choice.offering, choice.count, guard)
        state = self.spawn_state
        state.choice, state.pod_changes, state.user_env = choice, changes, user_env
        self.user_options = {**choice.as_user_options(), **self._passthrough_options(), RECORD_KEY: self.record()}
        self.log.info(
            "%s: offering %s x%d -> limits %s, selector %s",
            self._log_name,
            choice.offering.slug,
            choice.count,
            changes.limits,
            changes.node_selector,
        )

    def _passthrough_options(self) -> dict[str, Any]:
        """Options that are not gpuspawner's (e.g. KubeSpawner's ``profile``) are kept as they were."""
        ours = {OFFERING_KEY, COUNT_KEY, RECORD_KEY}
        return {k: v for k, v in (self.user_options or {}).items() if k not in ours}

    def record(self, url: str | None = None) -> dict[str, Any]:
        """What other services (the culler, the inventory) may read about this server's GPU."""
        assert self.choice is not None
        offering = self.choice.offering
        return {
            RECORD_OFFERING: offering.slug,
            RECORD_KIND: offering.kind.value,
            RECORD_COUNT: self.choice.count,
            RECORD_RESOURCES: {k: str(v) for k, v in offering.limits_for(self.choice.count).items()},
            RECORD_POD: self.pod_name,
            RECORD_NAMESPACE: self.namespace,
            RECORD_URL: url or self.spawn_state.record_url,
            **({RECORD_CLAIM_TEMPLATE: self.pod_name} if offering.claim is not None and offering.claim.shares == 1 else {}),
            **({RECORD_SHARED_CLAIM: self.spawn_state.shared_claim} if self.spawn_state.shared_claim else {}),
            **({RECORD_DEVICES: self.spawn_state.devices} if self.spawn_state.devices is not None else {}),
        }

    # ------------------------------------------------------------------ the spawn page

    def _options_form_default(self):
        """KubeSpawner's own form while no GPU offering can be in play (none configured,
        discovery off); otherwise decided on each view (see _render_gpu_form)."""
        if not self.offerings and not self.discover_offerings:
            return KubeSpawner._options_form_default(self)
        return self._render_gpu_form

    def now(self) -> datetime:
        return datetime.now(ZoneInfo(self.site_timezone))  # checked by catalog() before any use

    async def _render_gpu_form(self, spawner: GPUSpawner | None = None) -> str:
        """The spawn page: the GPU choice with KubeSpawner's profile form inside it, or
        KubeSpawner's form alone while no GPU offering is in play."""
        try:
            catalog = await self.catalog()
        except OfferingConfigError as exc:
            self.log.error("GPUSpawner configuration error: %s", exc)
            return render_form(
                FormView(
                    groups=(),
                    selected=None,
                    selected_count=1,
                    message="This hub's GPU options are misconfigured; please tell your administrator.",
                )
            )
        if not gpu_offerings_in_play(catalog):
            return await self._kubespawner_form()
        by_slug = {o.slug: o for o in catalog}
        bound, members = self._bound_holdings(by_slug), self._group_members()

        def quota_reason(offering: Offering) -> str:
            decision = self._check_quota(offering, offering.counts[0], bound, members)
            return "over your quota" if decision.action == REFUSE else ""

        notice = counts_notice(self._health(), self.now())
        rows = option_views(
            catalog,
            self.requester(),
            self.availability,
            self.now(),
            self.admission,
            quota_reason,
            WaitQueue.length,
            self.hide_forbidden_offerings,
        )
        last = self.user_options or (self.orm_spawner.user_options if self.orm_spawner else None)
        # (JupyterHub shows the form again after a refusal: refused_options selects the refused choice)
        selected, count = default_choice(rows, self.default_offering, last, by_slug, self.refused_options)
        return render_form(
            FormView(
                groups=group_options(rows, [k.value for k in Kind]),
                selected=selected,
                selected_count=count,
                extra_html=Markup(await self._kubespawner_form()),
                refresh_seconds=self.form_refresh_seconds,
                notice=notice,
            )
        )

    async def _kubespawner_form(self) -> str:
        """KubeSpawner's own spawn form (its profile list); "" without a profile_list."""
        form = KubeSpawner._options_form_default(self)
        return await maybe_future(form(self)) if callable(form) else form

    def _options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """KubeSpawner's ``_options_from_form``: the same signature, synchronous, a dict.

        A post without a GPU choice (KubeSpawner's own form, a query string) gets KubeSpawner's
        answer, and its profile is checked where KubeSpawner checks it, at start. With a GPU choice, its ``offering`` and ``count`` are added as posted and
        checked at once from what the hub knows without waiting (see _refuse_now); the start
        checks everything again (load_user_options), as the cluster may change in between.
        """
        if OFFERING_KEY not in formdata:  # KubeSpawner's form (or a query): KubeSpawner's answer, checked at start
            return super()._options_from_form(formdata)
        ours = {k for k in formdata if k in (OFFERING_KEY, COUNT_KEY) or k.startswith(COUNT_FIELD_PREFIX)}
        options = super()._options_from_form({k: v for k, v in formdata.items() if k not in ours})
        options = {**options, **user_options_from_form({k: formdata[k] for k in ours})}
        try:
            self._refuse_now(options)
        except SpawnRefused:
            self.refused_options = options  # JupyterHub shows the form again: it keeps the choice
            raise
        return options

    def _check_profile_now(self, options: dict[str, Any]) -> None:
        """KubeSpawner's profile choice checked at once (400); a callable profile_list (it may
        need awaiting) is left to the start."""
        if self.profile_list and not callable(self.profile_list):
            self._check_profile(options, self._get_initialized_profile_list(self._sorted_dict_values(self.profile_list)))

    def _refuse_now(self, options: dict[str, Any]) -> None:
        """Refuse at once what the start would refuse, from what is known without waiting.

        JupyterHub shows the form again with a start's refusal only if the start fails within
        a second of the POST; on a busy hub it takes longer and the user lands on the
        spawn-pending page instead. So a posted choice is also checked here, in the start's
        order (profile, cluster, choice, window, quota, capacity), recording nothing; the
        start checks it all again, as the cluster may change in between. Left to the start:
        a callable profile_list (it may need awaiting), and everything while the hub has not
        heard from the cluster yet.
        """
        self._check_profile_now(options)
        try:
            if not self.config_problems() and self.catalog_config.needs_inventory() and not self.inventory.health.answered:
                return
            catalog = self._catalog_now()
        except OfferingConfigError as exc:
            raise self._misconfigured(exc) from None
        choice = self._choose(options, catalog)
        if gpu_offerings_in_play(catalog):
            reason, decision = self._obstacle_now(choice, catalog)
            if decision.action == REFUSE:
                raise _refusal(reason, decision)

    # ------------------------------------------------------------------ admission

    @property
    def _reservation_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    def _release_reservation(self) -> None:
        """Give back units reserved for this pod, in the inventory if one runs (never starts one)."""
        inventory = Inventory.running(self.api)
        if inventory is not None:
            inventory.index.release(self._reservation_key)

    def _bound_holdings(self, catalog: dict[str, Offering]) -> dict[str, Held]:
        """GPU units that bound pods of this hub's users hold now (from the inventory), by pod key.
        Without counts: none (quotas then count the grants this hub process made)."""
        out = {}
        index = self._counts()
        for key, pod in (index.pods if index is not None else {}).items():
            offering = catalog.get(pod.offering or "")
            if pod.user and offering is not None and (pod.hub or "") == self.hub_id:  # another hub's users are not ours
                out[key] = Held(offering.kind.value, units_held(offering, pod.requests), pod.user)
        return out

    def _group_members(self) -> dict[str, list[str]]:
        """Members (as pod labels) of this user's groups that have a quota."""
        out: dict[str, list[str]] = {}
        for name, group in self._user_groups():
            if name in self.group_quotas:
                out[name] = [user_label(member) for member, _ in named(getattr(group, "users", None))]
        return out

    def _check_quota(
        self, offering: Offering, count: int, bound: dict[str, Held], members: dict[str, list[str]], grant: bool = False
    ) -> Decision:
        """This server's quota decision, counting bound pods and every grant not yet bound.
        With ``grant``, an admitted decision is recorded in the same step (see QuotaLedger)."""
        ledger = self.quota_ledger
        if not ledger.restored:
            self._restore_grants()
        args = (
            self._reservation_key,
            offering,
            count,
            user_label(self.user.name),
            Quotas(self.user_quota, self.group_quotas),
            members,
            bound,
        )
        return ledger.grant(*args) if grant else ledger.check(*args)

    def _restore_grants(self) -> None:
        """Give the quota ledger what this hub's running servers hold, from each one's saved
        record (once per hub process, at the first quota check): a restarted hub counts a DRA
        server's true count, a pod not bound yet, and every server when it may not read the
        cluster, as the hub that started them did."""
        db = getattr(self.user, "db", None)
        if db is None:  # no hub database (a script, a test): nothing was saved
            self.quota_ledger.restored = True
            return
        saved = {}
        for name, record in hubhooks.saved_records(db, RECORD_KEY):
            kind, count = record.get(RECORD_KIND), record.get(RECORD_COUNT)
            where = f"{record.get(RECORD_NAMESPACE)}/{record.get(RECORD_POD)}"
            takes_units = record.get(RECORD_RESOURCES) or record.get(RECORD_CLAIM_TEMPLATE) or record.get(RECORD_SHARED_CLAIM)
            if kind in QUOTA_KINDS and takes_units and isinstance(count, int) and not isinstance(count, bool) and count > 0:
                saved[where] = Held(kind, count, user_label(name))
        self.quota_ledger.restore(saved)
        if saved:
            self.log.info("GPUSpawner: quotas count %d running server(s) from their saved records", len(saved))

    def _obstacle_now(self, choice: Choice, offerings: list[Offering], grant: bool = False) -> tuple[str, Decision]:
        """What stands in the way of ``choice`` now, checked in order: its time window (every
        kind, also those without a Kubernetes resource), quotas, then capacity; in one step
        (nothing else runs between the quota check and its grant).

        Returns (refusal reason for the metrics, decision); the reason is "" unless refused.
        With ``grant`` (at start), the quota check also records the grant: release it if the
        spawn does not go on.
        """
        offering, count = choice.offering, choice.count
        closed = window_state(offering.windows, self.now())
        if closed:
            return "window", Decision(REFUSE, f"{offering.display_name} is {closed}.")
        if not offering.takes_units:
            return "", Decision(ADMIT)
        catalog = {o.slug: o for o in offerings}
        quota = self._check_quota(offering, count, self._bound_holdings(catalog), self._group_members(), grant=grant)
        if quota.action == REFUSE:
            return "quota", quota
        others = [(o, self.availability(o)) for o in allowed(catalog.values(), self.requester()).values()]
        decision = admit(offering, count, self.availability(offering), self.admission, others)
        return ("no_capacity" if decision.action == REFUSE else ""), decision

    async def admit(self, choice: Choice, catalog: list[Offering]) -> None:
        """Quotas, then capacity: refuse, warn, queue, or go. Holds a reservation when admitted."""
        offering, count = choice.offering, choice.count
        reason, decision = self._obstacle_now(choice, catalog, grant=True)
        if decision.action == REFUSE:
            self.quota_ledger.release(self._reservation_key)
            metrics.refused(offering, reason)
            raise _refusal(reason, decision)
        if not offering.takes_units:
            return
        try:
            await self._take(offering, count, decision)
        except BaseException:
            self.quota_ledger.release(self._reservation_key)
            raise

    async def _take(self, offering: Offering, count: int, decision: Decision) -> None:
        """Queue, warn or go for ``decision``, then reserve the units on a node."""
        index = self._counts()
        if index is None:  # the hub may not read the cluster: the scheduler decides alone
            metrics.admitted(offering, decision.action)
            self.spawn_state.messages.append(f"Starting {count} x {offering.display_name} (free count unavailable).")
            return
        if decision.action == QUEUE:
            await self._wait_in_queue(offering, count, decision.message)
        elif decision.action == WARN:
            self.spawn_state.expect_wait = True
            self.spawn_state.messages.append(decision.message)
        # (nothing to reserve where the counts do not know, e.g. a DRA pool being republished: the scheduler decides)
        counted = self.availability(offering).counted
        if (
            decision.action != WARN
            and counted
            and index.reserve(self._reservation_key, offering, count) is None
            and decision.action == ADMIT
        ):
            # Counted free but no single node fits now (a race with another spawn): say so now.
            metrics.refused(offering, "no_capacity")
            raise SpawnRefused(f"The last {offering.display_name} was just taken by another spawn. Please pick again.")
        metrics.admitted(offering, decision.action)
        self.spawn_state.messages.append(f"Reserved {count} x {offering.display_name}.")

    async def _wait_in_queue(self, offering: Offering, count: int, message: str) -> None:
        queue = WaitQueue.for_offering(offering.slug)
        timeout = offering.queue_timeout or self.queue_timeout
        self.spawn_state.messages.append(message)
        async with queue.place(self._reservation_key) as place:
            deadline = time.monotonic() + timeout
            while True:
                if place.first and (self.availability(offering).largest_free or 0) >= count:
                    return  # admit() reserves before anyone else can run
                if time.monotonic() > deadline:
                    metrics.refused(offering, "queue_timeout")
                    raise SpawnRefused(
                        f"No {offering.display_name} became free within {timeout // 60 or 1} minute(s). Please try again later.",
                        "queue_timeout",
                    )
                self.spawn_state.queue_position = place.position
                await asyncio.sleep(0.25)

    # ------------------------------------------------------------------ start / stop

    async def _start(self):
        self.spawn_state = SpawnState(started_at=time.monotonic())
        before, self._options_before = self._options_before, None
        if self._too_long:  # (left out of user_options: see _only_known_user_options)
            self.spawn_state.refused = True
            refusal = SpawnRefused(too_long_message(self._too_long), "malformed")
            refusal.during_start = True
            raise refusal
        start = asyncio.ensure_future(super()._start())
        watch = asyncio.ensure_future(self._watch_scheduling())
        try:
            done, _ = await asyncio.wait({start, watch}, return_when=asyncio.FIRST_COMPLETED)
            if start in done:
                url = start.result()
                await self._record_devices()
                state = self.spawn_state
                if state.choice is not None and state.started_at is not None:
                    metrics.TIME_TO_SCHEDULE.labels(state.choice.offering.kind.value).observe(time.monotonic() - state.started_at)
            else:
                reason = watch.result()
                start.cancel()
                await asyncio.gather(start, return_exceptions=True)
                await self.stop(now=True)
                raise SpawnRefused(reason, "unschedulable")
        except BaseException as exc:
            self.quota_ledger.release(self._reservation_key)
            refusal = exc if isinstance(exc, SpawnRefused) else self._unreachable_refusal(exc) if isinstance(exc, Exception) else None
            if refusal is None:
                raise
            refusal.during_start = True  # JupyterHub's User.spawn logs it (see hubhooks)
            self._put_back_options(before, refusal)
            if refusal is exc:
                raise
            raise refusal from None
        finally:
            watch.cancel()
            start.cancel()  # an interrupted spawn must not go on to create its pod after the stop
            self._release_reservation()
        if self.choice is not None:
            # Without the hub's Server object (a script, a test) there is no base URL to name.
            self.spawn_state.record_url = f"{url.rstrip('/')}{self.server.base_url}" if url and self.server else None
            record = self.record()
            self.user_options = {**self.user_options, RECORD_KEY: record}
            if self.orm_spawner is not None:
                # The hub's REST API serves orm_spawner.user_options; the hub commits after start returns.
                self.orm_spawner.user_options = dict(self.user_options)
        return url

    def _unreachable_refusal(self, exc: BaseException) -> SpawnRefused | None:
        """The 503 for a start whose Kubernetes call could not connect or timed out (None for
        any other failure). The inventory is told, so the page and later spawns say the cluster
        cannot be reached even while its watches still look live (an API server shutting down
        keeps them open); the hub polls this server as refused, so its cleanup asks the cluster
        nothing (a pod made by a request whose answer never came is the orphan reconciler's)."""
        cause = unreachable_cause(exc)
        if cause is None:
            return None
        reason = f"{type(cause).__name__}: {_brief(cause)}"
        api = self.api
        namespace = self.namespace

        async def probe() -> None:
            await api.list_namespaced_pod(namespace, limit=1, _request_timeout=5)

        self.log.warning(
            "%s: a Kubernetes request failed (%s); refusing the spawn as the cluster cannot be reached", self._log_name, reason
        )
        inventory = Inventory.running(self.api)  # (none where no offering needs counts: nothing to tell)
        if inventory is not None:
            inventory.call_failed(reason, probe)
        health = inventory.health if inventory is not None else Health(ready=False, as_of=time.time(), error=reason)
        self.spawn_state.refused = True
        return SpawnRefused(unreachable_message(health, self.now()), "unreachable")

    # ------------------------------------------------------------------ Dynamic Resource Allocation

    def _claimed(self) -> Offering | None:
        """The current spawn's offering when it is served through Dynamic Resource Allocation."""
        choice = self.choice
        return choice.offering if choice is not None and choice.offering.claim is not None else None

    @property
    def _claim_templates(self) -> ClaimTemplates:
        return ClaimTemplates(self.api.api_client, self.namespace, self.log, self.hub_id)

    def _stamp_identity(self, pod: Any) -> None:
        """Label the pod with this hub's identity and annotate whose server it is in the hub's
        database (see podspec.identity), for the orphan reconciler and the quotas; the claim
        template copies both from the pod."""
        labels, annotations = identity(self.hub_id, user_key(self.user.id, getattr(self.user, "created", None)))
        pod.metadata.labels = {**(pod.metadata.labels or {}), **labels}
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), **annotations}

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

    async def get_pod_manifest(self):
        """KubeSpawner's pod with the chosen offering added (:meth:`_offering_added`); for a
        DRA offering, also with the GPU claim added to the pod's
        ``resourceClaims`` and the notebook container's ``resources.claims`` (after whatever
        the admin's ``extra_pod_config``/``extra_container_config`` put there; a
        ``modify_pod_hook`` still sees and may change the result)."""
        with self._offering_added():
            pod = await super().get_pod_manifest()
        if self.choice is not None:  # a GPU offering is in play: the pod is gpuspawner's to stamp
            self._stamp_identity(pod)
        if self._claimed() is None:
            return pod
        pod.spec.resource_claims = [*(pod.spec.resource_claims or []), pod_claim(self.pod_name)]
        notebook = next(c for c in pod.spec.containers if c.name == "notebook")  # KubeSpawner's name for it
        resources = notebook.resources  # a model, or a plain dict where extra_container_config set it
        if isinstance(resources, dict):
            resources["claims"] = [*(resources.get("claims") or []), container_claim()]
        elif resources is not None:
            resources.claims = [*(resources.claims or []), container_claim()]
        else:
            notebook.resources = {"claims": [container_claim()]}
        return pod

    async def _make_create_pod_request(self, pod, request_timeout):
        """KubeSpawner's pod creation; for a DRA offering, the claim template is made first
        (the pod cannot be scheduled without it) and given the pod as its owner after."""
        offering = self._claimed()
        if offering is None or offering.claim is None or self.choice is None:
            return await super()._make_create_pod_request(pod, request_timeout)
        if offering.claim.shares > 1:
            return await self._create_pod_sharing_a_claim(offering, pod, request_timeout)
        meta = pod.metadata
        template = claim_template(offering.claim, self.choice.count, self.pod_name, meta.labels or {}, meta.annotations or {})
        try:
            await self._claim_templates.create(template)
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise
            fix = (
                "grant it with charts/gpuspawner's dra.enabled=true (docs/dra.md)"
                if exc.status == 403
                else "this cluster serves no resource.k8s.io/v1 (Kubernetes 1.34 or newer, with DRA)"
            )
            self.log.error(
                "%s: cannot create ResourceClaimTemplate %s/%s for offering %s (%s): %s",
                self._log_name,
                self.namespace,
                self.pod_name,
                offering.slug,
                _brief(exc),
                fix,
            )
            raise SpawnRefused("This hub's GPU options are misconfigured; please tell your administrator.", "misconfigured") from None
        self.spawn_state.claim_template = self.pod_name
        created = await super()._make_create_pod_request(pod, request_timeout)
        if created:
            try:
                response = await self.api.read_namespaced_pod(self.pod_name, self.namespace, _preload_content=False)
                await self._claim_templates.own(self.pod_name, json.loads(await response.read()))
            except Exception as exc:  # the stop (or the orphan reconciler) still deletes it
                self.log.warning(
                    "%s: could not make pod %s the owner of its claim template (%s)", self._log_name, self.pod_name, _brief(exc)
                )
        return created

    #: One lock per shared offering (and namespace) in this hub process: choosing a claim with room
    #: and becoming its owner happen together, so two spawns never overfill one claim.
    _shared_locks: ClassVar[dict[str, asyncio.Lock]] = {}

    async def _create_pod_sharing_a_claim(self, offering: Offering, pod: Any, request_timeout: int) -> bool:
        """A shared DRA offering's pod joins a claim of that offering with room (or a new one;
        see :meth:`gpuspawner.hub.claims.ClaimTemplates.shared_with_room`)."""
        assert offering.claim is not None
        claims = self._claim_templates
        async with GPUSpawner._shared_locks.setdefault(f"{self.namespace}/{offering.slug}", asyncio.Lock()):
            labels = {k: v for k, v in (pod.metadata.labels or {}).items() if k in (LABEL_OFFERING, LABEL_KIND, LABEL_HUB)}
            name = await claims.shared_with_room(offering.slug, offering.claim, labels)
            self.spawn_state.shared_claim = name
            pod.spec.resource_claims = [
                {"name": CLAIM_NAME, "resourceClaimName": name} if _claim_name_of(ref) == CLAIM_NAME else ref
                for ref in pod.spec.resource_claims or ()
            ]
            return await super()._make_create_pod_request(pod, request_timeout)

    def _claim_template_name(self) -> str | None:
        """The template to delete at stop: this spawn's, or the saved record's after a hub restart."""
        return self.spawn_state.claim_template or (self.spawn_state.saved_record or {}).get(RECORD_CLAIM_TEMPLATE)

    async def _delete_claim_template(self) -> None:
        """Delete this server's claim template; a shared claim once no pod uses it."""
        name = self._claim_template_name()
        if name:
            await self._claim_templates.delete(name)
            self.spawn_state.claim_template = None
        record = self.record() if self.choice is not None else (self.spawn_state.saved_record or {})
        shared, slug = self.spawn_state.shared_claim or record.get(RECORD_SHARED_CLAIM), record.get(RECORD_OFFERING)
        if shared and slug:
            async with GPUSpawner._shared_locks.setdefault(f"{self.namespace}/{slug}", asyncio.Lock()):
                await self._claim_templates.delete_if_unused(slug, shared)
            self.spawn_state.shared_claim = None

    async def _record_devices(self) -> None:
        """Note which devices the scheduler allocated to the pod's claim (for the record the
        culler reads). Best effort: without them the culler never calls the GPU idle."""
        if self._claimed() is None or self.pod_reflector is None:
            return
        pod = self.pod_reflector.pods.get(f"{self.namespace}/{self.pod_name}")
        try:
            self.spawn_state.devices = await self._claim_templates.devices(pod) if pod else None
        except Exception as exc:
            self.log.warning("%s: could not read the devices allocated to pod %s (%s)", self._log_name, self.pod_name, _brief(exc))

    async def _watch_scheduling(self) -> str:
        """Return the user's reason as soon as the real scheduler says the pod cannot run.

        Event-driven: KubeSpawner's pod reflector (see :mod:`gpuspawner.hub.reflector`) tells it
        the moment its watch sees the pod marked Unschedulable.
        """
        state = self.spawn_state
        await state.decided.wait()  # load_user_options runs inside KubeSpawner's _start
        choice = state.choice
        if choice is None or state.expect_wait:
            await asyncio.Future()  # nothing to watch: warned users (or no GPU) wait it out
        key = f"{self.namespace}/{self.pod_name}"
        scheduler_says = None
        while not scheduler_says:
            reflector = self.pod_reflector
            if not isinstance(reflector, VerdictPodReflector):  # a KubeSpawner's, in the same process: read it
                pod = reflector.pods.get(key) if reflector is not None else None
                scheduler_says = unschedulable_reason(pod) if pod else None
                await asyncio.sleep(0 if scheduler_says else 0.1)
                continue
            verdict = reflector.unschedulable(key)
            try:  # (looked at again now and then: an outage replaces the reflector)
                scheduler_says = await asyncio.wait_for(asyncio.shield(verdict), timeout=5)
            except TimeoutError:
                pass
            finally:
                verdict.cancel()
        offering = choice.offering
        self._release_reservation()  # this pod will not run: its own units are not what stands in the way
        catalog = allowed(await self.catalog(), self.requester()).values()
        decision = admit(
            offering, choice.count, self.availability(offering), AdmissionPolicy.BLOCK, [(o, self.availability(o)) for o in catalog]
        )
        metrics.refused(offering, "unschedulable")
        head = decision.message if decision.action == REFUSE else f"{offering.display_name} cannot run now."
        return f"{head} The scheduler says: {scheduler_says}"

    async def poll(self):
        """KubeSpawner's poll; with ``stop_outside_window``, a server past its window counts as done."""
        if self.spawn_state.refused:
            return 1  # refused before its pod was made (the hub polls before cleaning up): nothing runs
        status = await super().poll()
        if status is None and self.stop_outside_window:
            slug = self.choice.offering.slug if self.choice else (self.spawn_state.saved_record or {}).get(RECORD_OFFERING)
            offering = next((o for o in await self.catalog() if o.slug == slug), None) if slug else None
            closed = window_state(offering.windows, self.now()) if offering else ""
            if closed:
                self.log.info("%s: %s is %s now; stopping the server (stop_outside_window)", self._log_name, offering.slug, closed)
                return 0  # the hub then stops it as a server that has exited
        return status

    async def stop(self, now: bool = False):
        """KubeSpawner's stop, retried while the pod cannot be deleted (see ``stop_retry_timeout``)."""
        self._release_reservation()
        deadline = time.monotonic() + self.stop_retry_timeout
        attempt = 0
        try:
            while True:
                try:
                    await super().stop(now=now)
                    return await self._delete_claim_template()
                except Exception as exc:  # the API server down, refusing, or the pod not going away
                    attempt += 1
                    what = f"{self._log_name}: could not delete pod {self._reservation_key} ({_brief(exc)})"
                    if time.monotonic() >= deadline:
                        self.log.error(
                            "%s; giving up after %d attempts. The hub will show the server stopped; "
                            "the orphan reconciler deletes the pod once the cluster answers.",
                            what,
                            attempt,
                        )
                        raise
                    delay = min(30, 2**attempt)
                    self.log.warning(
                        "%s; retrying in %ds (attempt %d). The server stays 'stopping' until its pod is gone.", what, delay, attempt
                    )
                    await asyncio.sleep(delay)
        finally:
            self.quota_ledger.release(self._reservation_key)

    #: The inventory's stream failures when the pod reflector was last (re)started.
    _reflector_outages: ClassVar[int] = 0

    async def _start_watching_pods(self, replace: bool = False):
        """KubeSpawner's pod reflector, started afresh after an API server outage.

        After an outage KubeSpawner's reflector may have given up (it stops for good after
        about 30 s of errors) or may resume without seeing new pods; it is replaced only
        when a stop times out, so until then every start waits out ``start_timeout`` for a
        pod it never sees, and poll reads a frozen picture. Every start, poll and stop comes
        through here first: once the inventory (which reconnects on its own) has seen an
        outage and is in sync again, the next one restarts the reflector.
        """
        inventory = Inventory.running(self.api)
        outages = inventory.stream_failures if inventory is not None and inventory.ready else GPUSpawner._reflector_outages
        task = getattr(self.pod_reflector, "watch_task", None)
        if (
            not replace
            and self.pod_reflector is not None
            and ((task is not None and task.done()) or outages != GPUSpawner._reflector_outages)
        ):
            self.log.warning("%s: restarting KubeSpawner's pod reflector after an API server outage", self._log_name)
            replace = True
        GPUSpawner._reflector_outages = outages
        # KubeSpawner's own call, with a reflector that tells waiting spawns the scheduler's verdict.
        return await self._start_reflector(
            kind="pods",
            reflector_class=VerdictPodReflector,
            labels={"component": self.component_label},
            omit_namespace=self.enable_user_namespaces,
            replace=replace,
        )

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """KubeSpawner's pod events, with our own steps (admission, reservation, queue position) between."""
        sent, position = 0, None
        inner = super().progress().__aiter__()
        pending = asyncio.ensure_future(inner.__anext__())
        try:
            while True:
                for message in self.spawn_state.messages[sent:]:
                    sent += 1
                    yield {"progress": 2, "message": message}
                now = self.spawn_state.queue_position
                if now is not None and now != position:
                    position = now
                    yield {"progress": 1, "message": f"Waiting for a free GPU: number {now} in the queue."}
                done, _ = await asyncio.wait({pending}, timeout=0.5)
                if pending in done:
                    try:
                        event = pending.result()
                    except StopAsyncIteration:
                        return
                    yield event
                    pending = asyncio.ensure_future(inner.__anext__())
        finally:
            pending.cancel()

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        """KubeSpawner's state plus what this server holds (kept across hub restarts)."""
        state = super().get_state()
        record = self.record() if self.choice is not None else self.spawn_state.saved_record
        if record:
            state[RECORD_KEY] = record
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.spawn_state.saved_record = state.get(RECORD_KEY)

    def clear_state(self) -> None:
        super().clear_state()
        self.spawn_state = SpawnState()


@functools.cache
def _hook_source() -> str:
    """The memory guard's start-up hook as shipped in the package (read once), its braces
    doubled: KubeSpawner expands ``{username}``-style templates in every annotation, and
    gives the source back exactly as shipped."""
    source = importlib.resources.files("gpuspawner.pod").joinpath("memguard_hook.py").read_text(encoding="utf-8")
    return source.replace("{", "{{").replace("}", "}}")


def _refusal(reason: str, decision: Decision) -> SpawnRefused:
    """A refused window, quota or capacity decision, with what the user can do about it."""
    advice = {"window": " Please pick another option.", "no_capacity": " Your choice was taken just now; please pick again."}
    return SpawnRefused(decision.message + advice.get(reason, ""), reason)


#: The start of KubeSpawner's message when a Kubernetes call kept timing out until
#: ``k8s_api_request_retry_timeout`` (JupyterHub's ``exponential_backoff`` raises it as a
#: TimeoutError: "Could not create pod <namespace>/<name>", "... PVC ...", "... service ...").
_KUBESPAWNER_GAVE_UP = "Could not create "


def unreachable_cause(exc: BaseException | None) -> BaseException | None:
    """The exception in ``exc``'s chain that says the API server could not be reached: a
    connection refused, reset or timed out (aiohttp's, the OS's), or KubeSpawner giving up on
    a call that kept timing out. None for anything else (an answer with an HTTP error is an
    answer; a pod that does not start in ``start_timeout`` is not the API server's fault)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError)):
            return exc
        if isinstance(exc, TimeoutError) and str(exc).startswith(_KUBESPAWNER_GAVE_UP):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _claim_name_of(ref: Any) -> str | None:
    """The ``name`` of a pod's ``resourceClaims`` entry, a dict or a Kubernetes model."""
    return ref.get("name") if isinstance(ref, dict) else getattr(ref, "name", None)


def _brief(exc: BaseException) -> str:
    """One line about a failed Kubernetes call, for the hub log."""
    text = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return str(text).splitlines()[0][:200]
