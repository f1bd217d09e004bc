"""The full list of offerings a hub shows: configured + discovered + overrides. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from gpuspawner.core.model import CPU_OFFERING, Offering
from gpuspawner.core.settingskey import SettingsKey
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.config import offerings_from_config
from gpuspawner.offerings.discovery import DEFAULT_VGPU_CLASS_LABELS, discover
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.offerings.overrides import apply_overrides

#: GPUSpawner trait -> CatalogConfig field.
TRAITS = {
    "offerings": "offerings",
    "offering_overrides": "overrides",
    "discover_offerings": "discover",
    "include_cpu_offering": "include_cpu",
    "vgpu_class_labels": "vgpu_class_labels",
}


@dataclass(frozen=True)
class CatalogConfig:
    """The admin's settings that decide which offerings exist (see GPUSpawner's traits)."""

    offerings: Sequence[Mapping[str, Any]] = ()
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    discover: bool = True
    include_cpu: bool = True
    vgpu_class_labels: Sequence[str] = DEFAULT_VGPU_CLASS_LABELS

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> CatalogConfig:
        """From GPUSpawner's settings by trait name (a spawner's, or a loaded config's section)."""
        return cls(**{field: settings[trait] for trait, field in TRAITS.items() if trait in settings})

    def configured(self) -> list[Offering]:
        """The admin's own offerings, validated (raises :class:`OfferingConfigError`; a wrong
        setting is parsed, and refused, every time)."""
        return list(_configured(SettingsKey((self.offerings, self.overrides, tuple(self.vgpu_class_labels)))))

    def needs_inventory(self) -> bool:
        """Whether this hub needs the cluster-wide watch of Nodes and Pods: to discover
        offerings, or to count the free units of a configured offering that asks for a
        Kubernetes resource. Otherwise nothing is watched (a stock zero-to-jupyterhub hub
        may not list nodes or pods outside its namespace).
        Raises :class:`OfferingConfigError` if the offerings are wrong."""
        return self.discover or any(o.takes_units for o in self.configured())


@lru_cache(maxsize=64)
def _configured(settings: SettingsKey) -> tuple[Offering, ...]:
    """:meth:`CatalogConfig.configured`, parsed once per settings: a spawn page view builds the
    catalog (and checks the settings) several times, and the settings change only with the hub's
    config or a hook's per-user traits (each a key of its own). An error is not kept."""
    offerings, overrides, vgpu_class_labels = settings.value
    configured = offerings_from_config(list(offerings), vgpu_class_labels)
    # Overrides are validated even when no discovered slug matches yet.
    apply_overrides([], overrides)
    return tuple(configured)


def merge(configured: list[Offering], discovered: list[Offering]) -> list[Offering]:
    """Configured offerings first, then discovered ones whose slug is not configured."""
    taken = {o.slug for o in configured}
    return [*configured, *(o for o in discovered if o.slug not in taken)]


def gpu_offerings_in_play(catalog: Iterable[Offering]) -> bool:
    """Whether the hub offers anything but the built-in "No GPU" choice: a configured
    offering, a discovered one, or a CPU offering the admin changed.

    Without, GPUSpawner is KubeSpawner: its spawn page, user_options, pod and state are
    KubeSpawner's own (docs/kubespawner-compat.md).
    """
    return any(o != CPU_OFFERING for o in catalog)


def build_catalog(
    config: CatalogConfig,
    nodes: Iterable[Mapping[str, Any]] | None = None,
    discovered: list[Offering] | None = None,
) -> list[Offering]:
    """Every offering, in display order.

    Discovered offerings come from ``discovered`` (the inventory keeps them) or are
    computed from ``nodes``; neither is needed when discovery is off.
    """
    offerings = config.configured()
    if config.discover:
        if discovered is None and nodes is not None:
            discovered = discover(nodes, config.vgpu_class_labels)
        offerings = merge(offerings, discovered or [])
    offerings = distinct_names(apply_overrides(offerings, config.overrides))
    if config.include_cpu and not any(o.kind is Kind.CPU for o in offerings):
        offerings = [CPU_OFFERING, *offerings]
    if not offerings:
        raise OfferingConfigError(
            "GPUSpawner has nothing to offer: no offerings configured, none discovered, and the CPU option is off. "
            "Set c.GPUSpawner.offerings or c.GPUSpawner.include_cpu_offering = True."
        )
    return offerings


def distinct_names(offerings: list[Offering]) -> list[Offering]:
    """Offerings whose cards would carry the same name, each told apart in brackets: "(DRA)" beside
    "(device plugin)" (an A100's MIG 1g.5gb both ways), and among several of one way what differs:
    the resource (``nvidia.com/gpu.shared`` beside ``-SHARED`` product nodes' ``nvidia.com/gpu``), the
    node selector, the device class or driver; the slug where nothing else does."""
    groups: dict[str, list[Offering]] = {}
    for offering in offerings:
        groups.setdefault(offering.display_name, []).append(offering)
    renamed: dict[int, Offering] = {}
    for name, group in groups.items():
        if len(group) < 2:
            continue
        both_ways = len({o.claim is None for o in group}) > 1
        for offering in group:
            alike = [o for o in group if (o.claim is None) == (offering.claim is None)]
            words = ["DRA" if offering.claim is not None else "device plugin"] if both_ways else []
            if len(alike) > 1:
                words.append(_difference(offering, alike))
            renamed[id(offering)] = replace(offering, display_name=f"{name} ({', '.join(words)})")
    return [renamed.get(id(o), o) for o in offerings]


def _difference(offering: Offering, alike: list[Offering]) -> str:
    """What tells ``offering`` from the others of ``alike`` (all served the same way), in the fewest words."""
    others = [o for o in alike if o is not offering]

    def unique(word: Callable[[Offering], str]) -> str:
        mine = word(offering)
        return mine if mine and all(word(o) != mine for o in others) else ""

    candidates: list[Callable[[Offering], str]] = [
        lambda o: ", ".join(sorted(o.resources)),
        lambda o: ", ".join(f"{k}={v}" for k, v in sorted(o.node_selector.items()) if all(p.node_selector.get(k) != v for p in others)),
        lambda o: o.claim.device_class if o.claim is not None else "",
    ]
    return next((found for word in candidates if (found := unique(word))), offering.slug)
