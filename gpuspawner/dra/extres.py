"""The extended-resource mapping: a plain ``nvidia.com/gpu`` request served by DRA devices. Pure.

Since Kubernetes 1.34 (alpha; beta and on by default in 1.36, GA in 1.37: feature gate
``DRAExtendedResource``) a DeviceClass may name an extended resource
(``spec.extendedResourceName``; NVIDIA's chart sets ``nvidia.com/gpu`` on ``gpu.nvidia.com``),
and every class also serves the implicit name ``deviceclass.resource.kubernetes.io/<class>``.
The scheduler (``pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go``)
then serves a pod that asks for that resource, on a node whose ``status.allocatable`` has none
of it (0 or absent: no device plugin), with devices of the class: it makes a ResourceClaim
for the pod at PreBind (``generateName: <pod>-extended-resources-``, owned by the pod as its
controller, annotation ``resource.kubernetes.io/extended-resource-claim: "true"``; one request
``container-<i>-request-<j>`` per container, ``exactly: {deviceClassName, count}`` and no
selectors) and writes its name into ``pod.status.extendedResourceClaimStatus``. A node with
the resource in its allocatable is the device plugin's: the noderesources plugin counts it
from allocatable there (``shouldDelegateResourceToDRA`` in ``noderesources/fit.go``).

So an offering asking for ``nvidia.com/gpu`` is served by two kinds of nodes, each counted
once: device-plugin nodes from allocatable minus the pods' requests
(:mod:`gpuspawner.capacity.counts`), and DRA nodes from the class's free devices
(:func:`mapped_devices`; a device the scheduler's claim holds is taken like any claimed
device, and the pod's own ``nvidia.com/gpu`` request on such a node is never subtracted
from anything).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpuspawner.core.model import DeviceClaim, Offering
from gpuspawner.dra.capacity import blocked
from gpuspawner.dra.slices import Device, DeviceKey
from gpuspawner.names.vocabulary import Kind


class DraState(Protocol):
    """What this module reads of :class:`gpuspawner.dra.devices.DraState` (which imports this module)."""

    @property
    def classes(self) -> Mapping[str, Any]: ...

    @property
    def class_resources(self) -> Mapping[str, tuple[str, str]]: ...

    @property
    def synced(self) -> bool: ...

    def matching(self, offering: Offering, complete_only: bool = True) -> tuple[Device, ...]: ...

    def taken(self) -> Mapping[DeviceKey, int]: ...


#: The implicit extended resource of every DeviceClass: this prefix and the class's name
#: (``resourceapi.ResourceDeviceClassPrefix``).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
#: The annotation on the claim the scheduler makes (``resourceapi.ExtendedResourceClaimAnnotation``).
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def class_resource(raw: Mapping[str, Any]) -> tuple[str, str]:
    """A DeviceClass's explicit extended resource name (or "") and its creation time."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    return str(spec.get("extendedResourceName") or ""), str(meta.get("creationTimestamp") or "")


def mapped_class(state: DraState, resource: str) -> str | None:
    """The DeviceClass whose devices serve ``resource`` (None: no class maps it).

    Several classes naming one resource: the one created last wins, at the same time the
    name sorting first (resource/v1 ``DeviceClassSpec.extendedResourceName``).
    """
    if resource.startswith(IMPLICIT_PREFIX):
        name = resource[len(IMPLICIT_PREFIX) :]
        return name if name in state.classes else None
    named = [(created, name) for name, (res, created) in state.class_resources.items() if res == resource and name in state.classes]
    if not named:
        return None
    newest = max(created for created, _ in named)
    return min(name for created, name in named if created == newest)


def _class_offering(device_class: str) -> Offering:
    return Offering(
        slug=f"mapped-{device_class.replace('.', '-')}"[:63], kind=Kind.FULL, display_name=device_class, claim=DeviceClaim(device_class)
    )


def mapped_devices(state: DraState, resource: str) -> dict[str, list[Device]] | None:
    """The devices that serve ``resource`` through the mapping, by node (device-plugin nodes left
    out, as :meth:`~gpuspawner.dra.devices.DraState.devices` leaves them out); ``{}`` where no
    class maps it; None where it cannot be known now (DRA objects not listed, or a pool of
    the class's devices incomplete)."""
    device_class = mapped_class(state, resource)
    if device_class is None:
        return {}
    if not state.synced:
        return None
    probe = _class_offering(device_class)
    complete = state.matching(probe)
    if len(complete) != len(state.matching(probe, complete_only=False)):
        return None
    by_node: dict[str, list[Device]] = {}
    for device in complete:
        if device.node:
            by_node.setdefault(device.node, []).append(device)
    return by_node


def free_mapped(state: DraState, devices: list[Device]) -> list[Device]:
    """Those of ``devices`` no claim (nor a spawn's reservation) holds and no taint keeps off: the
    scheduler's claim has no tolerations, so a NoSchedule or NoExecute taint (the slice's own or a
    DeviceTaintRule's) rules the device out."""
    taken = state.taken()
    return [d for d in devices if not taken[d.key] and not blocked(d.taints, ())]


def extended_claim_name(pod: Mapping[str, Any]) -> str | None:
    """The claim the scheduler made for ``pod``'s extended resources (``status.extendedResourceClaimStatus``)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName")
    return str(name) if name else None
