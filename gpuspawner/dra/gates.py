"""Which Kubernetes release keeps which field of a ResourceClaim's spec. Pure.

An API server whose feature gate for a DRA field is off does not refuse the field: it drops it
from what it stores (``dropDisabledFields`` in each resource's strategy), and the claim would
then ask for something else than the offering says -- a whole GPU instead of a share of its
memory. :func:`dropped` compares what the hub sent with what the API server stored, and
:func:`needs` says which feature and release each dropped field needs (docs/dra.md, "Which
Kubernetes and driver each feature needs": the releases are where the gate is on by default,
from k8s.io/kubernetes' pkg/features/kube_features.go).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: a field of a claim's device request -> (the feature, its Kubernetes feature gate, the first
#: release where it is on by default)
FIELD_FEATURES: dict[str, tuple[str, str, str]] = {
    "firstAvailable": ("alternatives in one request (prioritized list)", "DRAPrioritizedList", "1.34"),
    "adminAccess": ("admin access to devices", "DRAAdminAccess", "1.34"),
    "capacity": ("a share of a device's capacity (consumable capacity)", "DRAConsumableCapacity", "1.36"),
    "tolerations": ("device taint tolerations", "DRADeviceTaints", "1.36"),
}


def dropped(sent: Any, stored: Any, path: str = "") -> list[str]:
    """The paths (``devices.requests[0].exactly.capacity``) of the fields of ``sent`` that
    ``stored`` lacks; fields the API server added (defaults) and changed values do not count."""
    if isinstance(sent, Mapping):
        if not isinstance(stored, Mapping):
            return [path] if sent else []
        missing: list[str] = []
        for key, value in sent.items():
            here = f"{path}.{key}" if path else str(key)
            if key not in stored:
                if value not in (None, {}, []):
                    missing.append(here)
            else:
                missing.extend(dropped(value, stored[key], here))
        return missing
    if isinstance(sent, list) and isinstance(stored, list):
        return [
            p for i, item in enumerate(sent) for p in (dropped(item, stored[i], f"{path}[{i}]") if i < len(stored) else [f"{path}[{i}]"])
        ]
    return []


def needs(paths: list[str]) -> str:
    """What the dropped fields ``paths`` need, in words: "a share of a device's capacity
    (consumable capacity; gate DRAConsumableCapacity, on by default from Kubernetes 1.36)"."""
    words = []
    for path in paths:
        field = path.rsplit(".", 1)[-1].split("[", 1)[0]
        if field in FIELD_FEATURES:
            feature, gate, release = FIELD_FEATURES[field]
            words.append(f"{feature}: gate {gate}, on by default from Kubernetes {release}")
        else:
            words.append(f"{path}: a field this API server does not keep")
    return "; ".join(dict.fromkeys(words))
