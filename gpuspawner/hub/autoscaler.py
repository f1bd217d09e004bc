"""What the autoscaler says of a spawn that waits for a new node, in Karpenter's words: the new
node's progress, or why none can start.

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

On the way, Karpenter nominates the pod for a NodeClaim (event ``Nominated``: "Pod should schedule
on: nodeclaim/<name>"); the NodeClaim's conditions ``Launched``, ``Registered`` and
``Initialized`` become True as the node comes (pkg/apis/v1/nodeclaim_status.go), and each is told
with the time since the NodeClaim was created ("NodeClaim gpu-h100-x7k2p registered, 21 s after it
was created"). Reading a NodeClaim needs ``get`` on ``nodeclaims.karpenter.sh`` (the chart's
``karpenter.enabled``); where it is refused, the progress says no more of it (logged once).

The pod's events come from KubeSpawner's event reflector (``events_enabled``, on by default).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpuspawner.hub.kubeapi import custom_api
from gpuspawner.hub.seam import Spawner

KARPENTER = "karpenter"
_PREFIX = "Failed to schedule pod, "
_OTHER_POOL = "incompatible requirements"
#: how often a waiting spawn looks at its pod's events again (KubeSpawner's event reflector keeps them;
#: each look sorts the namespace's events, so not more often)
CHECK_SECONDS = 1.0
#: how often it reads its NodeClaim again, while the node comes
CLAIM_SECONDS = 2.0
#: a NodeClaim's conditions as the node comes, in order, and the word for each
STEPS = (("Launched", "launched"), ("Registered", "registered"), ("Initialized", "initialized"))
_NOMINATED = re.compile(r"nodeclaim/(?P<name>[a-z0-9.-]+)")


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


def nominated_claim(events: Iterable[Mapping[str, Any]]) -> str | None:
    """The NodeClaim Karpenter last nominated the pod of these ``events`` for, if any."""
    name = None
    for event in events:
        component = (event.get("source") or {}).get("component") or event.get("reportingComponent")
        found = (
            _NOMINATED.search(str(event.get("message") or "")) if event.get("reason") == "Nominated" and component == KARPENTER else None
        )
        name = found["name"] if found else name
    return name


def claim_steps(claim: Mapping[str, Any]) -> list[str]:
    """The words of each step the NodeClaim has made, in order: "NodeClaim x launched, 2 s after
    it was created"."""
    meta = claim.get("metadata") or {}
    created = _time(meta.get("creationTimestamp"))
    true = {
        c.get("type"): _time(c.get("lastTransitionTime"))
        for c in (claim.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    out = []
    for condition, word in STEPS:
        if condition not in true:
            break
        at, since = true[condition], ""
        if at is not None and created is not None:
            since = f", {max(0, round((at - created).total_seconds()))} s after it was created"
        out.append(f"NodeClaim {meta.get('name')} {word}{since}")
    return out


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def pod_events(spawner: Spawner) -> list[Mapping[str, Any]]:
    """The events of the pod this start made (none before the pod reflector has it).

    KubeSpawner's ``events`` are those of the pod's name since its start marked the last one; but
    the wait begins as soon as the choice is taken, before that mark, so they may still hold a
    previous pod's of the same name (a spawn Karpenter refused, started again after the admin
    raised the pool's limit, was refused at once in the old words). Only the events whose
    involved object is this pod, by its uid, count."""
    pods = getattr(spawner.pod_reflector, "pods", None) or {}
    pod = pods.get(f"{spawner.namespace}/{spawner.pod_name}") or {}
    uid = (pod.get("metadata") or {}).get("uid")
    if not uid:
        return []
    return [e for e in spawner.events if (e.get("involvedObject") or {}).get("uid") == uid]


async def karpenter_verdict(spawner: Spawner, messages: list[str]) -> str:
    """Karpenter's reason as soon as its event on the spawner's pod says it cannot serve it;
    meanwhile the new node's steps are appended to ``messages`` (the spawn's progress)."""
    told, next_read, claims, announced = 0, 0.0, custom_api(spawner.api), ""
    while True:
        events = pod_events(spawner)
        said = karpenter_refusal(events)
        if said:
            return said
        name = nominated_claim(events) if claims is not None and told < len(STEPS) else None
        if name and time.monotonic() >= next_read:
            next_read = time.monotonic() + CLAIM_SECONDS
            if name != announced:
                messages.append(f"Karpenter is starting a new node for this server: NodeClaim {name} created")
                announced, told = name, 0
            try:
                claim = await claims.get_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", name)
            except Exception as exc:  # refused (no grant), gone, or the API server away: say no more of it
                spawner.log.info("%s: no progress of NodeClaim %s (%s)", spawner.log_name, name, exc)
                claims = None
                continue
            steps = claim_steps(claim)
            messages.extend(steps[told:])
            told = max(told, len(steps))
        await asyncio.sleep(CHECK_SECONDS)
