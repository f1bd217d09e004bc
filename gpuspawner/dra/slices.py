"""ResourceSlices -> devices and pools (``resource.k8s.io/v1``), and the facts of a ResourceClaim. Pure.

A driver publishes each pool (NVIDIA's: one per node, named after it) as
``resourceSliceCount`` slices of one ``generation``. Only the highest generation of a pool
counts (older slices are being replaced); a pool with fewer slices of that generation than
its ``resourceSliceCount`` is *incomplete* (:attr:`Pool.complete`).

An admin's ``DeviceTaintRule`` (``resource.k8s.io/v1`` from Kubernetes 1.37, feature
``DRADeviceTaintRules`` GA and on) adds its one taint to every device its selector matches,
"as if the taint was specified directly in the ResourceSlice": the scheduler's slice tracker
(``k8s.io/dynamic-resource-allocation`` ``resourceslice/tracker``, ``applyPatches``) appends it
to the device's taints where the selector's ``driver``, ``pool`` and ``device`` (each optional)
all match; a rule without ``deviceSelector`` matches nothing (:class:`TaintRule`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.core.cel import device_activation
from gpuspawner.names import dranames as dn

#: A device's identity in claim results: (driver, pool, device name).
DeviceKey = tuple[str, str, str]


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice, as selectors and the counts see it."""

    driver: str
    pool: str
    name: str
    node: str | None
    attributes: Mapping[str, Mapping[str, Any]]
    capacity: Mapping[str, Mapping[str, Any]]
    activation: Any = field(default=None, compare=False, repr=False)
    #: Partitionable (``consumesCounters``, e.g. dynamic MIG): one claim does not simply take
    #: one device; not counted.
    shared_counters: bool = False
    #: ``allowMultipleAllocations``: several claims share it, each consuming some of its
    #: capacity (:mod:`gpuspawner.dra.capacity`).
    multiple: bool = False
    #: ``taints`` (key, value, effect): a NoSchedule or NoExecute one keeps off claims that do not tolerate it.
    taints: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    def attribute(self, name: str) -> Any:
        """An attribute's value (string, int, bool or version text), by short or qualified name."""
        raw = self.attributes.get(name) or self.attributes.get(dn.qualified(name)) or {}
        for kind in ("string", "version", "int", "bool"):
            if kind in raw:
                return raw[kind]
        return None

    def qualified_attribute(self, name: str) -> Any:
        """An attribute by a claim's fully qualified name (``gpu.nvidia.com/parentUUID``: the driver's own domain is implied)."""
        domain, _, short = name.partition("/")
        return self.attribute(short if short and domain == self.driver else name)

    def quantity(self, name: str) -> str | None:
        raw = self.capacity.get(name) or self.capacity.get(dn.qualified(name)) or {}
        value = raw.get("value")
        return None if value is None else str(value)


@dataclass(frozen=True)
class TaintRule:
    """What the counts need of one DeviceTaintRule: its selector (None: any) and its one taint."""

    driver: str | None
    pool: str | None
    device: str | None
    taint: Mapping[str, Any] = field(compare=False)

    @classmethod
    def from_rule(cls, raw: Mapping[str, Any]) -> TaintRule | None:
        """None for a rule that matches no device (no ``deviceSelector``)."""
        spec = raw.get("spec") or {}
        selector = spec.get("deviceSelector")
        if selector is None:
            return None
        return cls(selector.get("driver"), selector.get("pool"), selector.get("device"), dict(spec.get("taint") or {}))

    def matches(self, driver: str, pool: str, device: str) -> bool:
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == device)
        )


@dataclass(frozen=True)
class Pool:
    """The current generation of one driver's pool."""

    driver: str
    name: str
    generation: int
    slice_count: int
    slices_seen: int
    devices: tuple[Device, ...]

    @property
    def complete(self) -> bool:
        return self.slices_seen >= self.slice_count


@dataclass(frozen=True)
class ClaimFacts:
    """What the counts need of one ResourceClaim."""

    devices: tuple[DeviceKey, ...]
    config: tuple[Mapping[str, Any], ...]
    consumers: tuple[str, ...]
    #: Per allocated result of a multi-allocatable device: (device, its ``consumedCapacity``).
    consumed: tuple[tuple[DeviceKey, Mapping[str, str]], ...] = ()

    @classmethod
    def from_claim(cls, claim: Mapping[str, Any]) -> ClaimFacts:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        spec_config = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
        return cls(
            devices=tuple((r.get("driver", ""), r.get("pool", ""), r.get("device", "")) for r in results),
            config=tuple(_opaque(c) for c in spec_config if c.get("opaque")),
            consumers=tuple(str(r.get("name", "")) for r in status.get("reservedFor") or []),
            consumed=tuple(
                ((r.get("driver", ""), r.get("pool", ""), r.get("device", "")), dict(r["consumedCapacity"]))
                for r in results
                if r.get("consumedCapacity")
            ),
        )


def _opaque(config: Mapping[str, Any]) -> Mapping[str, Any]:
    opaque = config.get("opaque") or {}
    return {"driver": opaque.get("driver", ""), "parameters": opaque.get("parameters") or {}}


def slice_devices(raw: Mapping[str, Any], rules: Iterable[TaintRule] = ()) -> tuple[Device, ...]:
    """The devices of one ResourceSlice (``resource.k8s.io/v1``: devices are flat), each with the
    taints of the DeviceTaintRules ``rules`` that match it after its own."""
    spec = raw.get("spec") or {}
    driver = spec.get("driver", "")
    pool = (spec.get("pool") or {}).get("name", "")
    node = spec.get("nodeName")
    out = []
    for dev in spec.get("devices") or []:
        attributes = dev.get("attributes") or {}
        capacity = dev.get("capacity") or {}
        partitioned = bool(dev.get("consumesCounters"))
        activation = device_activation(driver, attributes, capacity)
        name = dev.get("name", "")
        taints = tuple(dict(t) for t in dev.get("taints") or []) + tuple(dict(r.taint) for r in rules if r.matches(driver, pool, name))
        multiple = bool(dev.get("allowMultipleAllocations"))
        out.append(Device(driver, pool, name, node, attributes, capacity, activation, partitioned, multiple, taints))
    return tuple(out)


def build_pools(slices: Iterable[Mapping[str, Any]], rules: Iterable[TaintRule] = ()) -> dict[tuple[str, str], Pool]:
    """Group slices into pools, keeping only each pool's highest generation (its devices tainted by ``rules`` too)."""
    rules = tuple(rules)
    best: dict[tuple[str, str], tuple[int, int, list[Mapping[str, Any]]]] = {}
    for raw in slices:
        spec = raw.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (spec.get("driver", ""), pool.get("name", ""))
        generation = int(pool.get("generation") or 0)
        count = int(pool.get("resourceSliceCount") or 1)
        found = best.get(key)
        if found is None or generation > found[0]:
            best[key] = (generation, count, [raw])
        elif generation == found[0]:
            found[2].append(raw)
            best[key] = (generation, max(found[1], count), found[2])
    return {
        key: Pool(key[0], key[1], gen, count, len(raws), tuple(d for raw in raws for d in slice_devices(raw, rules)))
        for key, (gen, count, raws) in best.items()
    }
