"""Random pods on a generated cluster: GPU and CPU pods in several namespaces, bound, pending and finished, for the capacity properties and the truth checks."""

from __future__ import annotations

import random
from typing import Any


def random_pods(
    rng: random.Random, nodes: list[dict[str, Any]], namespaces: tuple[str, ...] = ("team-a", "team-b", "kube-system")
) -> list[dict[str, Any]]:
    """Pods other users already run, bound to nodes (as the scheduler or a DaemonSet would have).

    GPU jobs take some of a node's GPU resources, cpu/memory hogs a share of its cpu and
    memory, daemon pods a little of both; all within what the node has (a kubelet refuses
    more). Pods go by ``spec.nodeName``, so they land without the scheduler.
    """
    from gpuspawner.core.fit import NodeFacts

    pods: list[dict[str, Any]] = []
    for raw in nodes:
        facts = NodeFacts.from_node(raw)
        if raw["spec"].get("unschedulable") and rng.random() < 0.5:
            continue
        left = dict(facts.allocatable)
        for _ in range(rng.choice([0, 0, 1, 2, 3, 5])):
            if left.get("pods", 0) <= 1 and rng.random() < 0.7:
                break  # leave the notebook a slot now and then, take the last one sometimes
            if left.get("pods", 0) <= 0:
                break
            gpus = [r for r, v in left.items() if "/" in r and v > 0]
            kind = rng.choice(["gpu", "gpu", "hog", "daemon"]) if gpus else rng.choice(["hog", "daemon"])
            requests: dict[str, str] = {}
            limits: dict[str, str] = {}
            if kind == "gpu":
                resource = rng.choice(gpus)
                amount = rng.randint(1, left[resource])
                limits[resource] = str(amount)
                left[resource] -= amount
                cpu = min(left.get("cpu", 0), rng.choice([500, 1000, 4000]))
                if cpu > 0:
                    requests["cpu"] = f"{cpu}m"
                    left["cpu"] -= cpu
            elif kind == "hog":
                cpu = int(left.get("cpu", 0) * rng.choice([0.5, 0.9, 1.0]))
                mem = int(left.get("memory", 0) * rng.choice([0.3, 0.9, 1.0]))
                if cpu > 0:
                    requests["cpu"] = f"{cpu}m"
                if mem > 0:
                    requests["memory"] = str(mem)
                left["cpu"] = left.get("cpu", 0) - cpu
                left["memory"] = left.get("memory", 0) - mem
            else:
                requests.update({"cpu": "100m", "memory": "128Mi"})
                left["cpu"] = left.get("cpu", 0) - 100
                left["memory"] = left.get("memory", 0) - 128 * 2**20
            left["pods"] = left.get("pods", 0) - 1
            if left.get("cpu", 0) < 0 or left.get("memory", 0) < 0:
                break
            resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{kind}-{len(pods)}", "namespace": rng.choice(namespaces), "labels": {"app": kind}},
                    "spec": {
                        "nodeName": facts.name,
                        "containers": [{"name": "main", "image": "busybox", "resources": resources}],
                        "tolerations": [{"operator": "Exists"}],
                    },
                    "status": {"phase": "Running"},
                }
            )
    return pods
