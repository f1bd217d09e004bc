"""Consumable capacity and device taints, as the scheduler's allocator sees them. Pure.

Kubernetes 1.36 (beta, on by default) lets a device that says ``allowMultipleAllocations:
true`` be allocated to several claims at once, each *consuming* an amount of its capacities
(NVIDIA's driver with ``--consumable-shares=memory``: a claim asks
``capacity.requests.memory: 8Gi`` of a GPU). The allocator
(``k8s.io/dynamic-resource-allocation`` ``structured/internal/incubating/consumable_capacity.go``)
works out, for every capacity of the device:

* the amount the request consumes (``calculateConsumedCapacity``): not requested -> the
  policy's ``default``, else the whole value; requested without a policy -> the request;
  with ``validRange`` -> at least ``min``, rounded up to ``min + n*step``; with
  ``validValues`` -> the smallest valid value at or above it;
* whether that amount breaks the policy (``violatesPolicy``: above ``max``, off the step,
  not a valid value), which rules the device out;
* whether the sum of what the allocated claims consumed (``status.allocation.devices.results[].consumedCapacity``,
  summed per device) plus this amount stays within ``value``.

:func:`fits` counts how many more claims of one request a device takes, by those rules.
Device taints (``spec.devices[].taints``; GA in 1.37): a ``NoSchedule`` or ``NoExecute``
taint keeps a claim off the device unless one of the request's ``tolerations`` tolerates
it (``resourceclaim.ToleratesTaint``), and a NoExecute one has the pod evicted unless a
toleration names effect NoExecute; :func:`blocked` says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from gpuspawner.core.model import Availability, DeviceClaim, Offering
from gpuspawner.core.quantity import QuantityError, parse_quantity
from gpuspawner.dra.slices import ClaimFacts, Device, DeviceKey

#: The taint effects that keep a claim off a device (``None`` and unknown effects do not).
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")

#: Per device: capacity name -> amount consumed by the allocated claims (bytes, units).
Consumed = Mapping[str, Fraction]


def _q(value: Any) -> Fraction | None:
    try:
        return parse_quantity(value) if value is not None else None
    except QuantityError:
        return None


def _short(name: str) -> str:
    """A capacity's name without its driver's domain (``gpu.nvidia.com/memory`` -> ``memory``)."""
    return name.rsplit("/", 1)[-1]


def consumption(request: Mapping[str, str] | None, capacity: Mapping[str, Mapping[str, Any]]) -> dict[str, Fraction] | None:
    """What one claim with capacity ``request`` consumes of each of a device's ``capacity``
    (``spec.devices[].capacity``), or None where the allocator would not take the device
    (a requested capacity it lacks, or an amount its request policy forbids)."""
    request = {_short(k): v for k, v in (request or {}).items()}
    names = {_short(k) for k in capacity}
    if any(name not in names for name in request):
        return None
    out: dict[str, Fraction] = {}
    for name, raw in capacity.items():
        value = _q(raw.get("value"))
        if value is None:
            return None
        policy = raw.get("requestPolicy") or None
        asked = _q(request.get(_short(name))) if _short(name) in request else None
        amount = _amount(asked, value, policy)
        if amount is None or amount < 0 or _violates(amount, policy):
            return None
        out[_short(name)] = amount
    return out


def _amount(asked: Fraction | None, value: Fraction, policy: Mapping[str, Any] | None) -> Fraction | None:
    """``calculateConsumedCapacity``: the amount a request consumes of one capacity."""
    if asked is None:
        default = _q((policy or {}).get("default"))
        return default if default is not None else value
    if policy is None:
        return asked
    valid_range = policy.get("validRange") or None
    if valid_range and valid_range.get("min") is not None:
        low = _q(valid_range["min"])
        if low is None:
            return None
        if asked < low:
            return low
        step = _q(valid_range.get("step"))
        if not step:
            return asked
        n = -((low - asked) // step)  # ceil((asked - low) / step)
        return low + step * n
    values = [v for v in (_q(x) for x in policy.get("validValues") or []) if v is not None]
    if values:
        return next((v for v in values if asked <= v), asked)
    return asked


def _violates(amount: Fraction, policy: Mapping[str, Any] | None) -> bool:
    """``violatesPolicy``: above the range's max or off its step, or not one of the valid values."""
    if not policy:
        return False
    default = _q(policy.get("default"))
    if default is not None and amount == default:
        return False
    valid_range = policy.get("validRange") or None
    if valid_range:
        high = _q(valid_range.get("max"))
        if high is not None and amount > high:
            return True
        step, low = _q(valid_range.get("step")), _q(valid_range.get("min")) or Fraction(0)
        return step is not None and step != 0 and (amount - low) % step != 0
    values = [v for v in (_q(x) for x in policy.get("validValues") or []) if v is not None]
    return bool(values) and amount not in values


def fits(capacity: Mapping[str, Mapping[str, Any]], used: Consumed, request: Mapping[str, str] | None) -> int | None:
    """How many more claims of ``request`` a multi-allocatable device with ``capacity`` takes,
    where its allocated claims consumed ``used``: 0 if none (or the policy forbids the
    request), None if no end (the request consumes nothing of any capacity)."""
    each = consumption(request, capacity)
    if each is None:
        return 0
    values = {_short(k): _q(v.get("value")) or Fraction(0) for k, v in capacity.items()}
    most: int | None = None
    for name, amount in each.items():
        left = values[name] - used.get(name, Fraction(0))
        if amount == 0:
            if left < 0:
                return 0
            continue
        n = max(int(left // amount), 0)
        most = n if most is None else min(most, n)
    return most


def fits_whole(capacity: Mapping[str, Mapping[str, Any]], request: Mapping[str, str] | None) -> bool:
    """Whether a device taken whole (not multi-allocatable) meets ``request``: each requested
    amount at most its capacity (``CmpRequestOverCapacity`` for a dedicated device)."""
    each = consumption(request, capacity)
    if each is None:
        return False
    values = {_short(k): _q(v.get("value")) or Fraction(0) for k, v in capacity.items()}
    return all(each[name] <= values[name] for name in {_short(k) for k in (request or {})})


def add(into: dict[str, Fraction], amounts: Mapping[str, Any]) -> None:
    """Sum a claim result's ``consumedCapacity`` into ``into``."""
    for name, text in amounts.items():
        amount = text if isinstance(text, Fraction) else _q(text)
        if amount is not None:
            into[_short(name)] = into.get(_short(name), Fraction(0)) + amount


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``resourceclaim.ToleratesTaint``: empty effect or key match all; ``Exists`` any value."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def blocked(taints: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a device with ``taints`` is of no use to a request with ``tolerations``.

    The allocator (``taintPreventsAllocation``) keeps the request off a device with a
    NoSchedule or NoExecute taint none of them tolerates. And kube-controller-manager's device
    taint eviction (``claimEvictionTime`` in pkg/controller/devicetainteviction, 1.36 and 1.37)
    evicts the pod of a claim on a NoExecute-tainted device unless a toleration *with effect
    NoExecute* and no ``tolerationSeconds`` tolerates it: a toleration with no effect lets the
    scheduler allocate the device, and the pod is evicted at once; such a device is not free.
    """
    tolerations = tuple(tolerations)
    for taint in taints:
        effect = taint.get("effect")
        if effect not in BLOCKING_EFFECTS:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return True
        if effect == "NoExecute" and not any(
            t.get("effect") == "NoExecute" and t.get("tolerationSeconds") is None and tolerates(t, taint) for t in tolerations
        ):
            return True
    return False


def trap(taints: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the allocator may give the device to the request and the eviction then take it
    back: a NoExecute taint tolerated only by tolerations without effect NoExecute."""
    tolerations = tuple(tolerations)
    return any(t.get("effect") == "NoExecute" and any(tolerates(x, t) for x in tolerations) and blocked([t], tolerations) for t in taints)


def _units(
    claim: DeviceClaim, device: Device, taken: Counter[DeviceKey], used: Mapping[DeviceKey, Consumed]
) -> tuple[int | None, int | None]:
    """(free, all) claims of ``claim`` one device takes: free now, and with nothing allocated;
    free None (no count) where the device is a :func:`trap`: a claim may land there and be evicted."""
    if trap(device.taints, claim.tolerations):
        return None, None
    if not device.multiple:
        whole = 1 if fits_whole(device.capacity, claim.capacity) else 0
        free = 0 if blocked(device.taints, claim.tolerations) or taken[device.key] else whole
        return free, whole
    total = fits(device.capacity, {}, claim.capacity)
    if blocked(device.taints, claim.tolerations):
        return 0, total
    return fits(device.capacity, used.get(device.key, {}), claim.capacity), total


def capacity_free(
    claim: DeviceClaim, devices: Iterable[Device], taken: Counter[DeviceKey], used: Mapping[DeviceKey, Consumed]
) -> tuple[int, Counter[str | None]] | None:
    """(capacity, free claims per node) of ``claim`` among ``devices`` as the allocator allocates
    them: a device allowing multiple allocations takes as many as its capacity left holds
    (:func:`fits`), any other one claim if nothing holds it; a tainted device none unless the
    claim tolerates the taint (:func:`blocked`). None (no count) where a request consumes nothing
    of a shared device (there is no end to it), or where the scheduler may give the claim a device
    whose NoExecute taint then evicts it (:func:`trap`: how many would stay is the scheduler's luck)."""
    free_by_node: Counter[str | None] = Counter()
    capacity = 0
    for device in devices:
        free, whole = _units(claim, device, taken, used)
        if free is None or whole is None:
            return None
        free_by_node[device.node] += free
        capacity += whole
    return capacity, free_by_node


def placed(
    capacity: int,
    free_by_node: Mapping[str | None, int],
    devices: Iterable[Device],
    most: int,
    room: Mapping[str, int] | None,
    together: Mapping[tuple[str | None, tuple[Any, ...]], int] | None = None,
) -> Availability:
    """An offering's availability from its devices' free units per node, each node's within its
    ``room`` (how many more of the offering's pods it takes; None: no limit). ``largest_free``: the
    most devices one pod (of at most ``most``) gets on one node where the notebook fits at all; with
    ``together`` (free units by node and the values of the claim's ``matchAttribute``s), on one
    node among devices that share those values (a GPU, where several MIG devices must share one)."""

    def limit(node: str | None) -> int | None:
        return None if room is None or node is None else room.get(node, 0)

    free = largest = device_free = 0
    for node, units in free_by_node.items():
        units = max(units, 0)
        device_free += units
        cap = limit(node)
        free += units if cap is None else min(units, cap)
        if cap is None or cap >= 1:
            largest = max(largest, min(units, most))
    if together is not None:
        largest = max((min(n, most) for (node, _), n in together.items() if limit(node) is None or (limit(node) or 0) >= 1), default=0)
    nodes = tuple(sorted({d.node or "" for d in devices}))
    return Availability(capacity=capacity, allocated=max(capacity - device_free, 0), free=free, largest_free=largest, nodes=nodes)


def shared_free(
    offering: Offering,
    devices: tuple[Device, ...],
    taken: Counter[DeviceKey],
    claims: Iterable[ClaimFacts],
    reservations: Iterable[tuple[tuple[DeviceKey, ...], str | None]],
) -> tuple[int, Counter[str | None]]:
    """A shared offering's consumers: ``replicas`` per device, less the claims of its config that
    use it (each with its consumers), a device some other claim holds, and its reservations."""
    claim = offering.claim
    assert claim is not None
    node_of = {d.key: d.node for d in devices}
    config = tuple(claim.config)
    free_by_node: Counter[str | None] = Counter()
    for d in devices:
        free_by_node[d.node] += claim.replicas
    shared_devices: set[DeviceKey] = set()
    for facts in claims:
        mine = [k for k in facts.devices if k in node_of]
        if mine and facts.config == config:
            shared_devices.update(mine)
            free_by_node[node_of[mine[0]]] -= min(max(len(facts.consumers), 1), claim.replicas)
    for k, node in node_of.items():
        if taken[k] and k not in shared_devices:
            free_by_node[node] -= claim.replicas
    reserved = sum(1 for _, slug in reservations if slug == offering.slug)
    for node in sorted(free_by_node, key=lambda n: -free_by_node[n]):  # a reservation's node is not known: the largest
        held = min(max(free_by_node[node], 0), reserved)
        free_by_node[node] = max(free_by_node[node] - held, 0)
        reserved -= held
    return len(devices) * claim.replicas, free_by_node


def share_pick(
    claim: DeviceClaim, devices: Iterable[Device], taken: Counter[DeviceKey], used: Mapping[DeviceKey, Consumed], count: int
) -> tuple[list[Device], dict[str, Fraction] | None] | None:
    """Devices on one node that can take ``count`` claims of ``claim`` now, for a reservation:
    (one shared device, what the claim consumes of it) or (whole devices, None); None if none can."""
    shared: list[Device] = []
    by_node: dict[str | None, list[Device]] = {}
    for device in devices:
        free, _ = _units(claim, device, taken, used)
        if free is None or free > 0:
            (shared if device.multiple else by_node.setdefault(device.node, [])).append(device)
    if shared and count == 1:
        device = shared[0]
        return [device], consumption(claim.capacity, device.capacity) or {}
    best = max(by_node.values(), key=len, default=[])
    return (best[:count], None) if len(best) >= count else None
