"""Which devices Dynamic Resource Allocation gave a pod, read from the cluster's own objects. Pure.

The scheduler writes a claim's allocation into ``status.allocation.devices.results[]``
(``driver``, ``pool``, ``device``); the device's identity -- the GPU's UUID, a MIG device's
parent UUID and profile -- is in the driver's ResourceSlice of that pool. The spawner records
both at start (``vocabulary.RECORD_DEVICES``) so that the culler, which reads the hub and
Prometheus but not Kubernetes, can match the pod's GPUs to dcgm-exporter's series
(``UUID``, ``GPU_I_PROFILE``) exactly as it does for device-plugin GPUs. Only the cluster's
objects are read here, never anything the pod says about itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuspawner.names.dranames import ATTR_PARENT_UUID, ATTR_PROFILE, ATTR_TYPE, ATTR_UUID, TYPE_MIG
from gpuspawner.names.vocabulary import CLAIM_NAME, DEVICE_DRIVER, DEVICE_MIG_PROFILE, DEVICE_NAME, DEVICE_POOL, DEVICE_REQUEST, DEVICE_UUID


def pod_claim_name(pod: Mapping[str, Any]) -> str | None:
    """The name of the pod's GPU ResourceClaim: a shared one it names (``spec.resourceClaims[]
    .resourceClaimName``), or the one Kubernetes made for it from its template
    (``status.resourceClaimStatuses``); None while that has not been made."""
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        if ref.get("name") == CLAIM_NAME and ref.get("resourceClaimName"):
            return str(ref["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        if status.get("name") == CLAIM_NAME and status.get("resourceClaimName"):
            return str(status["resourceClaimName"])
    return None


def allocation_results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The claim's allocated devices (``status.allocation.devices.results``); empty while unallocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or ())


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str | None:
    """An attribute's value, published unqualified or qualified with the driver's domain."""
    value = attributes.get(name, attributes.get(f"{driver}/{name}"))
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


def _devices_by_name(slices: Iterable[Mapping[str, Any]], driver: str, pool: str) -> dict[str, Mapping[str, Any]]:
    """The devices of ``driver``'s pool ``pool`` in its newest generation (older ones are stale)."""
    mine = [s.get("spec") or {} for s in slices]
    mine = [s for s in mine if s.get("driver") == driver and (s.get("pool") or {}).get("name") == pool]
    newest = max(((s.get("pool") or {}).get("generation") or 0 for s in mine), default=0)
    return {str(d.get("name")): d for s in mine if ((s.get("pool") or {}).get("generation") or 0) == newest for d in s.get("devices") or ()}


def allocated_devices(claim: Mapping[str, Any], slices: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """One record entry per allocated device of ``claim``: driver, pool, device name, and,
    where the pool's ResourceSlice says so, the GPU's UUID (a MIG device: its parent's)
    and MIG profile. A device the slices do not list keeps only its name."""
    slices = list(slices)
    out = []
    for result in allocation_results(claim):
        driver, pool, name = str(result.get("driver", "")), str(result.get("pool", "")), str(result.get("device", ""))
        entry = {DEVICE_DRIVER: driver, DEVICE_POOL: pool, DEVICE_NAME: name}
        if result.get("request"):
            entry[DEVICE_REQUEST] = str(result["request"])
        device = _devices_by_name(slices, driver, pool).get(name)
        attributes = (device or {}).get("attributes") or {}
        mig = _attribute(attributes, driver, ATTR_TYPE) == TYPE_MIG
        uuid = _attribute(attributes, driver, ATTR_PARENT_UUID if mig else ATTR_UUID)
        if uuid:
            entry[DEVICE_UUID] = uuid
        profile = _attribute(attributes, driver, ATTR_PROFILE) if mig else None
        if profile:
            entry[DEVICE_MIG_PROFILE] = profile
        out.append(entry)
    return out
