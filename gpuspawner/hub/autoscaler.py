"""What the autoscaler says of a spawn that waits for a new node: Karpenter's refusal, in its words.

A spawn on an autoscaled pool (an offering with ``scalable_nodes``) is admitted while nothing is
free and waits for the node the autoscaler brings up; kube-scheduler marks its pod Unschedulable
at once, which is expected there. Karpenter, where it cannot bring a node up for the pod, says so
in an event on the pod: reason ``FailedScheduling``, component ``karpenter``, message ``Failed to
schedule pod, <why>`` with one ``; ``-separated part per NodePool it tried (Karpenter v1.14.1,
pkg/controllers/provisioning/scheduling/events.go and scheduler.go): "node limits have been
exhausted for nodepool (NodePool=gpu-h100)", "all available instance types exceed limits for
nodepool", "no instance type has enough resources, ...", "incompatible requirements, key ...; key
...".
The spawn is then refused with the parts that concern pools the pod could use (the
"incompatible requirements" of the other pools are left out, unless they are all there is).

The pod's events come from KubeSpawner's event reflector (``events_enabled``, on by default).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from gpuspawner.hub.seam import Spawner

KARPENTER = "karpenter"
_PREFIX = "Failed to schedule pod, "
_OTHER_POOL = "incompatible requirements"
#: how often a waiting spawn looks at its pod's events again (KubeSpawner's event reflector keeps them)
CHECK_SECONDS = 0.5


def karpenter_refusal(events: Iterable[Mapping[str, Any]]) -> str | None:
    """Karpenter's reason it cannot bring a node up for the pod whose ``events`` these are (the
    latest such event), without the parts about pools the pod does not fit anyway; else None."""
    said = None
    for event in events:
        component = (event.get("source") or {}).get("component") or event.get("reportingComponent")
        if event.get("reason") == "FailedScheduling" and component == KARPENTER:
            said = str(event.get("message") or "")
    if not said:
        return None
    parts: list[str] = []
    for part in (p.strip() for p in said.removeprefix(_PREFIX).split("; ")):
        if part.startswith("key ") and parts:  # one pool's incompatible requirements, key after key
            parts[-1] += "; " + part
        elif part:
            parts.append(part)
    mine = [p for p in parts if not p.startswith(_OTHER_POOL)] or parts
    text = "; ".join(mine)
    return text if text.endswith(".") else text + "."


async def karpenter_verdict(spawner: Spawner) -> str:
    """Karpenter's reason as soon as its event on the spawner's pod says it cannot serve it."""
    while True:
        said = karpenter_refusal(spawner.events)
        if said:
            return said
        await asyncio.sleep(CHECK_SECONDS)
