"""Reproduce a kube-scheduler leak in the extended-resource mapping (docs/dra.md, "The
extended-resource mapping"): on a devcluster with one simulated DRA node of one GPU, a burst of
three plain ``nvidia.com/gpu: 1`` pods (one bound through the scheduler's claim, two refused)
is deleted; then one more plain pod is created. Once the leak has happened, that pod and every
later one is refused with "cannot allocate all claims" though no ResourceClaim exists, and a
pod with a claim of its own is refused too.

    python scripts/extres_leak.py [v1.36.3|v1.37.2] [TRIES]

Prints each refused try and ``<version> refused N of TRIES``; seen on 1.36.3 and 1.37.2.
"""

from __future__ import annotations

import asyncio
import sys

import gpuspawner.devcluster.build as build

build.K8S_VERSION = sys.argv[1] if len(sys.argv) > 1 else build.K8S_VERSION
TRIES = int(sys.argv[2]) if len(sys.argv) > 2 else 20

from gpuspawner.devcluster.dradriver import H100_80GB, DraNode, SimulatedDriver  # noqa: E402
from gpuspawner.devcluster.dratruth_extres import plain_pod  # noqa: E402
from gpuspawner.devcluster.truth import on_devcluster  # noqa: E402
from gpuspawner.hub.scheduling import unschedulable_reason  # noqa: E402

NS = "leak"


async def reproduce(cluster) -> None:
    kube = cluster.client()
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    SimulatedDriver(kube, (DraNode("one-gpu", H100_80GB, 1),)).install()

    def pods() -> list:
        return kube.request("GET", f"/api/v1/namespaces/{NS}/pods")["items"]

    def claims() -> list:
        return kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"]

    async def settle() -> None:
        while not all(p["spec"].get("nodeName") or unschedulable_reason(p) for p in pods()):
            await asyncio.sleep(0.05)

    async def clear() -> None:
        kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods?gracePeriodSeconds=0")
        while pods() or claims():
            await asyncio.sleep(0.05)

    while True:  # the namespace's default service account
        try:
            kube.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")
            break
        except Exception:  # noqa: BLE001 - not there yet
            await asyncio.sleep(0.1)
    refused = 0
    for i in range(TRIES):
        for j in range(3):
            kube.request("POST", f"/api/v1/namespaces/{NS}/pods", plain_pod(f"burst-{i}-{j}", 1, {}))
        await settle()
        await clear()
        kube.request("POST", f"/api/v1/namespaces/{NS}/pods", plain_pod(f"after-{i}", 1, {}))
        await settle()
        (pod,) = pods()
        if not pod["spec"].get("nodeName"):
            refused += 1
            print(f"try {i}: no claim in the API, yet: {unschedulable_reason(pod)}", flush=True)
        await clear()
    print(f"{build.K8S_VERSION} refused {refused} of {TRIES}")


if __name__ == "__main__":
    on_devcluster("gpuspawner-extres-leak-", reproduce)
