"""Partitionable devices (dynamic MIG): counter sets, and how many more devices of an offering the scheduler can allocate. Pure.

Kubernetes' partitionable devices (``resource.k8s.io/v1``, KEP 4815; beta and on by default
since 1.36): a pool publishes *counter sets* (``spec.sharedCounters``, in slices of their own:
a slice holds devices or counter sets, never both) and each device says what it takes from
them when allocated (``consumesCounters``). NVIDIA's driver with ``DynamicMIG`` publishes one
counter set per GPU (``gpu-<minor>-counter-set``: ``multiprocessors``, ``copy-engines``,
``decoders``, ``encoders``, ``jpeg-engines``, ``ofa-engines``, ``memory`` and one
``memory-slice-<i>`` of 1 per memory slice) and every MIG placement that could be made
(``gpu-<minor>-mig-<profile>-<GI profile id>-<start>``), each taking its profile's engines,
memory and the memory slices of its placement; on GPUs that can leave MIG mode without a reset
the whole GPU too, taking all of it. Placements overlap, so one device taken is not one unit
gone: a 3g.20gb at memory slices 4-7 leaves room for 1g.5gb at 0-3 but no 4g.20gb.

:func:`placeable` counts as kube-scheduler's allocator does (``k8s.io/dynamic-resource-allocation``
``structured/internal/*/allocator_*.go``, ``checkAvailableCounters``): a pool's counters are its
counter sets less what its allocated devices take; a device fits when it is not allocated and,
once its own take is added, no counter of any of the pool's counter sets is below zero. One
device at a time, each claim of one offering taking the first that fits, until none does.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpuspawner.core.quantity import QuantityError, parse_quantity
from gpuspawner.dra.slices import Device, DeviceKey

#: Counters of one pool: counter set name -> counter name -> amount.
Counters = dict[str, dict[str, Fraction]]
#: What one device takes: counter set name -> counter name -> amount.
Take = Mapping[str, Mapping[str, Fraction]]


@dataclass(frozen=True)
class PoolCounters:
    """The counter sets of one pool's current generation and what each of its devices takes."""

    sets: Mapping[str, Mapping[str, Fraction]]
    takes: Mapping[str, Take] = field(default_factory=dict)
    #: Devices that may be allocated to several claims (``allowMultipleAllocations``): not counted here.
    multiple: frozenset[str] = frozenset()
    #: Why the allocator takes nothing from this pool (a take from a counter set or counter it lacks, a counter
    #: set named twice: ``validateDeviceCounterConsumption``, ``getAndValidateCounterSets``), or None.
    invalid: str | None = None


def _amounts(counters: Mapping[str, Any] | None) -> dict[str, Fraction]:
    out = {}
    for name, counter in (counters or {}).items():
        try:
            out[name] = parse_quantity((counter or {}).get("value", "0"))
        except QuantityError:
            out[name] = Fraction(0)
    return out


def pool_counters(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], PoolCounters]:
    """Each pool's counter sets and devices' takes, from its highest generation's slices
    (older slices are being replaced, as :func:`gpuspawner.dra.slices.build_pools` keeps them)."""
    newest: dict[tuple[str, str], int] = {}
    slices = list(slices)
    for raw in slices:
        spec = raw.get("spec") or {}
        key = (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
        newest[key] = max(newest.get(key, 0), int((spec.get("pool") or {}).get("generation") or 0))
    sets: dict[tuple[str, str], dict[str, Mapping[str, Fraction]]] = defaultdict(dict)
    invalid: dict[tuple[str, str], str] = {}
    takes: dict[tuple[str, str], dict[str, Take]] = defaultdict(dict)
    multiple: dict[tuple[str, str], set[str]] = defaultdict(set)
    for raw in slices:
        spec = raw.get("spec") or {}
        key = (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))
        if int((spec.get("pool") or {}).get("generation") or 0) != newest[key]:
            continue
        for counter_set in spec.get("sharedCounters") or []:
            name = counter_set.get("name", "")
            if name in sets[key]:
                invalid.setdefault(key, f"duplicate counter set name {name}")
            sets[key][name] = _amounts(counter_set.get("counters"))
        for device in spec.get("devices") or []:
            name = device.get("name", "")
            if device.get("allowMultipleAllocations"):
                multiple[key].add(name)
            if device.get("consumesCounters"):
                takes[key][name] = {c.get("counterSet", ""): _amounts(c.get("counters")) for c in device["consumesCounters"]}
    for key, pool_takes in takes.items():
        for take in pool_takes.values():
            for set_name, counters in take.items():
                available = sets.get(key, {}).get(set_name)
                missing = (
                    f"counter set {set_name} not found"
                    if available is None
                    else next((f"counter {c} not found in counter set {set_name}" for c in counters if c not in available), None)
                )
                if missing:
                    invalid.setdefault(key, missing)
    return {
        key: PoolCounters(sets.get(key, {}), takes.get(key, {}), frozenset(multiple.get(key, ())), invalid.get(key))
        for key in set(sets) | set(takes) | set(multiple)
    }


def partitionable(devices: Sequence[Device], pools: Mapping[tuple[str, str], PoolCounters]) -> bool:
    """Whether any of ``devices`` is in a pool with counter sets or takes and none is multi-allocatable
    (so :func:`placeable` counts them)."""
    found = False
    for device in devices:
        pool = pools.get((device.driver, device.pool))
        if pool is None:
            continue
        if device.name in pool.multiple:
            return False
        found = found or bool(pool.takes or pool.sets)
    return found


def _left(pool: PoolCounters, taken: Counter[DeviceKey], driver: str, pool_name: str) -> Counters:
    """A pool's counters less what its allocated (and reserved) devices take; may go below zero."""
    left = {name: dict(counters) for name, counters in pool.sets.items()}
    for device, take in pool.takes.items():
        if taken[(driver, pool_name, device)]:
            _spend(left, take)
    return left


def _spend(left: Counters, take: Take) -> None:
    for set_name, counters in take.items():
        available = left.get(set_name)
        if available is None:
            continue  # API validation rejects a take from a set the pool lacks; the allocator skips it
        for name, amount in counters.items():
            if name in available:
                available[name] -= amount


def _fits(left: Counters, take: Take) -> bool:
    """The allocator's test: with ``take`` spent, no counter of any of the pool's sets is below zero."""
    for set_name, available in left.items():
        spent = take.get(set_name) or {}
        if any(amount - spent.get(name, 0) < 0 for name, amount in available.items()):
            return False
    return True


def placeable(devices: Sequence[Device], pools: Mapping[tuple[str, str], PoolCounters], taken: Counter[DeviceKey]) -> list[Device]:
    """The devices that successive one-device claims of ``devices`` would get, in order, until none fits.

    Devices of one MIG profile take the same amounts from disjoint memory slices, so how many
    fit does not depend on the order the allocator tries them in.
    """
    left: dict[tuple[str, str], Counters] = {}
    out = []
    for device in devices:
        if taken[device.key]:
            continue
        pool = pools.get((device.driver, device.pool))
        if pool is not None and pool.invalid:
            continue  # the allocator skips an invalid pool, all of its devices
        take = pool.takes.get(device.name) if pool is not None else None
        if pool is None or take is None:
            out.append(device)  # takes no counters: free when not allocated
            continue
        counters = left.get((device.driver, device.pool))
        if counters is None:
            counters = left[(device.driver, device.pool)] = _left(pool, taken, device.driver, device.pool)
        if _fits(counters, take):
            _spend(counters, take)
            out.append(device)
    return out
