"""GPUSpawner: KubeSpawner that lets users pick a GPU offering.

KubeSpawner still builds the pod. This class decides which offerings exist
(configured and discovered), validates the user's choice on the server, and
sets KubeSpawner's own settings (``extra_resource_limits``, ``node_selector``,
``tolerations``, ``environment``, ``extra_labels`` ...) from the chosen
offering, rebuilding them from the admin's config on *every* spawn: a spawner
object is reused across spawns, and a GPU spawn must never leak its limits into
a later CPU spawn.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from kubespawner import KubeSpawner
from traitlets import Bool, Dict, Float, List, Unicode, validate
from traitlets import TraitError

from .catalog import CatalogConfig, build_catalog
from .choice import RECORD_KEY, Choice, ChoiceError, parse_choice
from .offerings import Offering, OfferingConfigError
from .podspec import merge_tolerations, pod_changes
from .policy import Requester, allowed

#: KubeSpawner settings that an offering changes; restored from config before every spawn.
POD_TRAITS = (
    "extra_resource_limits",
    "extra_resource_guarantees",
    "node_selector",
    "tolerations",
    "environment",
    "extra_labels",
    "extra_annotations",
    "cmd",
)


class GPUSpawner(KubeSpawner):
    """A KubeSpawner whose users choose a whole GPU, a MIG slice, a shared GPU, a vGPU class or no GPU."""

    offerings = List(
        Dict(),
        help="""
        The GPU choices this hub offers, in addition to discovered ones. Each is a dict; see
        `gpuspawner.offerings.offering_from_config` for every field. Examples::

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

    node_cache_seconds = Float(
        5.0,
        help="How long a listing of the cluster's nodes is reused for discovery, in seconds.",
    ).tag(config=True)

    @validate("offerings")
    def _validate_offerings(self, proposal):
        try:
            CatalogConfig(offerings=proposal["value"]).configured()
        except OfferingConfigError as exc:
            raise TraitError(str(exc)) from None
        return proposal["value"]

    @validate("offering_overrides")
    def _validate_overrides(self, proposal):
        try:
            CatalogConfig(overrides=proposal["value"]).configured()
        except OfferingConfigError as exc:
            raise TraitError(str(exc)) from None
        return proposal["value"]

    # ------------------------------------------------------------------ lifecycle

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # What the admin configured, before any offering touched it.
        self._baseline = {name: copy.deepcopy(getattr(self, name)) for name in POD_TRAITS}
        self.choice: Choice | None = None

    def _restore_baseline(self) -> None:
        for name, value in self._baseline.items():
            setattr(self, name, copy.deepcopy(value))

    @property
    def catalog_config(self) -> CatalogConfig:
        return CatalogConfig(
            offerings=self.offerings,
            overrides=self.offering_overrides,
            discover=self.discover_offerings,
            include_cpu=self.include_cpu_offering,
            vgpu_class_labels=self.vgpu_class_labels,
        )

    def requester(self) -> Requester:
        user = self.user
        groups = frozenset(getattr(g, "name", str(g)) for g in (getattr(user, "groups", None) or ()))
        return Requester(name=user.name, groups=groups, admin=bool(getattr(user, "admin", False)))

    async def cluster_nodes(self) -> list[dict] | None:
        """Node dicts for discovery (None when discovery is off)."""
        if not self.discover_offerings:
            return None
        cache = _NODE_CACHE
        ttl = self.node_cache_seconds
        if cache.get("at", 0.0) + ttl < time.monotonic():
            response = await self.api.list_node(_preload_content=False, _request_timeout=self.k8s_api_request_timeout)
            cache["nodes"] = json.loads(await response.read())["items"]
            cache["at"] = time.monotonic()
        return cache["nodes"]

    async def available_offerings(self) -> dict[str, Offering]:
        """The offerings this spawner's user may take, by slug."""
        catalog = build_catalog(self.catalog_config, await self.cluster_nodes())
        return allowed(catalog, self.requester())

    def _default_slug(self, offerings: dict[str, Offering]) -> str | None:
        if self.default_offering and self.default_offering in offerings:
            return self.default_offering
        cpu = [slug for slug, o in offerings.items() if not o.is_gpu]
        return cpu[0] if cpu else next(iter(offerings), None)

    async def resolve_choice(self, user_options: dict[str, Any]) -> Choice:
        """Validate ``user_options`` against what this user may take now (raises :class:`ChoiceError`)."""
        try:
            offerings = await self.available_offerings()
        except OfferingConfigError as exc:
            self.log.error("GPUSpawner configuration error: %s", exc)
            raise ChoiceError("This hub's GPU options are misconfigured; please tell your administrator.") from None
        return parse_choice(user_options, offerings, self._default_slug(offerings))

    async def load_user_options(self) -> None:
        """Apply the chosen offering on top of the admin's config (and KubeSpawner's profile, if any)."""
        self._restore_baseline()
        await super().load_user_options()
        options = {k: v for k, v in (self.user_options or {}).items() if k != RECORD_KEY}
        choice = await self.resolve_choice(options)
        self.apply_choice(choice)

    def apply_choice(self, choice: Choice) -> None:
        """Set KubeSpawner's pod settings for ``choice`` (on top of what is already set)."""
        changes = pod_changes(choice.offering, choice.count)
        self.extra_resource_limits = {**self.extra_resource_limits, **changes.limits}
        # Kubernetes requires requests == limits for extended resources; set both explicitly.
        self.extra_resource_guarantees = {**self.extra_resource_guarantees, **changes.limits}
        self.node_selector = {**self.node_selector, **changes.node_selector}
        self.tolerations = merge_tolerations(self._sorted_dict_values(self.tolerations), changes.tolerations)
        self.environment = {**self.environment, **changes.env}
        self.extra_labels = {**self.extra_labels, **changes.labels}
        self.extra_annotations = {**self.extra_annotations, **changes.annotations}
        if changes.command_prefix:
            self.cmd = [*changes.command_prefix, *(self.cmd or ["jupyterhub-singleuser"])]
        self.choice = choice
        self.user_options = {**choice.as_user_options(), **self._passthrough_options(), RECORD_KEY: self.record()}
        self.log.info(
            "%s: offering %s x%d -> limits %s, selector %s",
            self._log_name, choice.offering.slug, choice.count, changes.limits, changes.node_selector,
        )

    def _passthrough_options(self) -> dict[str, Any]:
        """Options that are not gpuspawner's (e.g. KubeSpawner's ``profile``) are kept as they were."""
        ours = {"offering", "count", RECORD_KEY}
        return {k: v for k, v in (self.user_options or {}).items() if k not in ours}

    def record(self, url: str | None = None) -> dict[str, Any]:
        """What other services (the culler, the inventory) may read about this server's GPU."""
        assert self.choice is not None
        offering = self.choice.offering
        return {
            "offering": offering.slug,
            "kind": offering.kind.value,
            "count": self.choice.count,
            "resources": {k: str(v) for k, v in offering.limits_for(self.choice.count).items()},
            "pod": self.pod_name,
            "namespace": self.namespace,
            "url": url,
        }

    async def _start(self):
        url = await super()._start()
        if self.choice is not None:
            record = self.record(url=f"{url.rstrip('/')}{self.server.base_url}" if url else None)
            self.user_options = {**self.user_options, RECORD_KEY: record}
            if self.orm_spawner is not None:
                # The hub's REST API serves orm_spawner.user_options; the hub commits after start returns.
                self.orm_spawner.user_options = dict(self.user_options)
        return url

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.choice is not None:
            state[RECORD_KEY] = self.record()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._saved_record = state.get(RECORD_KEY)

    def clear_state(self) -> None:
        super().clear_state()
        self.choice = None
        self._saved_record = None


_NODE_CACHE: dict[str, Any] = {}
