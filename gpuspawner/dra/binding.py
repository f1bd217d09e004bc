"""Binding conditions: a device that must be prepared before the pod binds. Pure.

A driver may publish a device with ``bindingConditions`` (and ``bindingFailureConditions``;
``resource.k8s.io/v1`` Device, feature gates ``DRADeviceBindingConditions`` and
``DRAResourceClaimDeviceStatus``, beta and on by default since Kubernetes 1.36). The
allocation result copies them (``status.allocation.devices.results[].bindingConditions``);
the scheduler's PreBind then waits (polling every 5 s, up to its ``bindingTimeout``, 600 s by
default) until each of them is ``True`` in the claim's ``status.devices[].conditions`` for
that device, and fails the binding if a failure condition is ``True``
(``isClaimReadyForBinding`` in the scheduler's ``dynamicresources.go``). Meanwhile the pod
has no node: :func:`pending` says what the spawn is waiting for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _device_conditions(claim: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, str]:
    """The status conditions (type -> status) the driver set on ``result``'s device."""
    for entry in (claim.get("status") or {}).get("devices") or ():
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == (
            result.get("driver"),
            result.get("pool"),
            result.get("device"),
        ):
            return {str(c.get("type")): str(c.get("status")) for c in entry.get("conditions") or ()}
    return {}


def pending(claim: Mapping[str, Any]) -> list[str]:
    """The binding conditions of the claim's allocated devices that are not ``True`` yet (in order, once each)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    out: list[str] = []
    for result in results:
        conditions = _device_conditions(claim, result)
        for name in result.get("bindingConditions") or ():
            if conditions.get(name) != "True" and name not in out:
                out.append(str(name))
    return out


def failed(claim: Mapping[str, Any]) -> list[str]:
    """The binding failure conditions that are ``True`` (the scheduler gives the binding up)."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    return [str(n) for r in results for n in r.get("bindingFailureConditions") or () if _device_conditions(claim, r).get(n) == "True"]
