"""The hub's free counts against the real scheduler, after a storm.

A recount from a fresh list (``__main__.recount``) checks the hub against the project's own
counting; this asks the real kube-scheduler. For each GPU offering whose free count the hub
gives is small enough to fill (``limit``): that many pods and two more, each asking for one unit
with the offering's node selection, affinity and tolerations (what KubeSpawner's profile of it,
and GPUSpawner's pod, carry), are created in a namespace of their own; the offering agrees when
the scheduler binds exactly as many as the hub said were free and marks the rest unschedulable.
The pods are deleted before the next offering, so each sees the cluster as the hub counted it
(the churn is paused meanwhile). Offerings with more free units than ``limit`` are named as
not checked, never counted as agreeing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.scale import churn
from bench.scale.storm import Hub, parse_free

NAMESPACE = "team-truth"
MORE = 2  # pods beyond the hub's free count: the scheduler must refuse them


def truth_pod(name: str, profile: dict[str, Any]) -> dict[str, Any]:
    """One unit of ``profile``'s offering, as a notebook pod asks for it (no CPU or memory
    guarantees: the benchmark's hubs set none)."""
    override = profile["kubespawner_override"]
    limits = {k: "1" for k in override.get("extra_resource_limits") or {}}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook", "resources": {"limits": limits, "requests": limits}}],
        "tolerations": list(override.get("tolerations") or []),
    }
    if override.get("node_selector"):
        spec["nodeSelector"] = dict(override["node_selector"])
    if override.get("node_affinity_required"):
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": override["node_affinity_required"]}}
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"truth": "1"}}, "spec": spec}


def verdicts(kube: churn.Conn) -> tuple[int, int]:
    """(bound, unschedulable) of the truth pods now."""
    status, listed = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=truth%3D1")
    if status != 200:
        return 0, 0
    bound = refused = 0
    for pod in listed.get("items", []):
        if (pod.get("spec") or {}).get("nodeName"):
            bound += 1
        elif any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (pod.get("status") or {}).get("conditions") or []
        ):
            refused += 1
    return bound, refused


def fill(kube: churn.Conn, slug: str, profile: dict[str, Any], count: int, timeout: float = 180.0) -> int | None:
    """Create ``count`` pods of ``profile`` and wait for the scheduler's verdict on each: how
    many it bound (None when it had not decided on all of them within ``timeout``). The pods
    are deleted again, and gone, before this returns."""
    try:
        for i in range(count):
            status, _ = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", truth_pod(f"{slug[:40]}-{i}", profile))
            if status not in (200, 201):
                return None
        deadline = time.monotonic() + timeout
        while True:
            bound, refused = verdicts(kube)
            if bound + refused >= count:
                return bound
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?gracePeriodSeconds=0")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, listed = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
            if status == 200 and not listed.get("items"):
                break
            time.sleep(0.2)


async def settled_counts(hub: Hub, slugs: list[str]) -> dict[str, float | None]:
    """The hub's free count of each offering, once two scrapes a second apart agree (the last
    deletions and binds have reached its watch)."""
    before: dict[str, float | None] = {}
    for _ in range(60):
        text = await hub.metrics()
        now = {slug: parse_free(text, slug) for slug in slugs}
        if now == before:
            return now
        before = now
        await asyncio.sleep(1.0)
    return before


async def scheduler_check(hub: Hub, state: Any, churner: churn.Churn, profiles: list[dict], limit: int = 40) -> dict[str, Any]:
    """Every GPU offering with at most ``limit`` free units, filled on the real scheduler.

    Returns {"checked": n, "agree": n, "wrong": [...], "unchecked": [slug, ...]}."""
    gpu = {p["slug"]: p for p in profiles if (p["kubespawner_override"].get("extra_resource_limits") or {}) and p["slug"] != "h100-x16"}
    churner.pause()
    churn.ensure_namespaces(state, [NAMESPACE])
    kube = churn.Conn(state)
    out: dict[str, Any] = {"checked": 0, "agree": 0, "wrong": [], "unchecked": []}
    try:
        for slug, profile in sorted(gpu.items()):
            said = (await settled_counts(hub, [slug]))[slug]
            if said is None or said > limit:
                out["unchecked"].append(slug)
                continue
            bound = await asyncio.to_thread(fill, kube, slug, profile, int(said) + MORE)
            out["checked"] += 1
            if bound == said:
                out["agree"] += 1
            else:
                out["wrong"].append(f"{slug}: the hub says {said:g} free, the scheduler bound {bound} of {int(said) + MORE}")
        return out
    finally:
        churner.resume()
