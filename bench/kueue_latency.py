"""Spawn to admission with Kueue and without: the same GPUSpawner offering (one whole H100)
through a LocalQueue whose ClusterQueue has quota free, and not through Kueue, on one
devcluster with the real Kueue (v0.17.0), in one run.

Timed: from the start() call to the server's pod being bound to a node (``spec.nodeName``, as
KubeSpawner's pod watch in the same process sees it). Through Kueue that is the pod created
gated, Kueue's Workload made and admitted, the gate lifted, then the scheduler; without, the
scheduler alone. Both pods are made in a namespace Kueue manages, so both pass its pod webhooks
(as every pod there does). Also shown: when start() returned (the pod running and ready). The
two alternate, so that a noisy machine slows both alike. Medians and 90th percentiles; nothing
asserted.

    python -m bench.kueue_latency [--spawns 20]      (make kueue-bench)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from bench.devcluster import running_devcluster
from gpuspawner.names.kueuenames import JOB_UID_LABEL, QUEUE_LABEL

H100 = "gpu-nvidia-h100-80gb-hbm3"
NAMESPACE = "kueue-bench"
QUEUE = "bench"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


def median_p90(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(times), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def queue_objects(kube, gpus: int) -> None:
    """A ResourceFlavor for the H100 node, a ClusterQueue with ``gpus`` of its GPUs, LocalQueue QUEUE in NAMESPACE."""
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    api = "kueue.x-k8s.io/v1beta2"
    kube.request(
        "POST",
        f"{KUEUE}/resourceflavors",
        {
            "apiVersion": api,
            "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        },
    )
    quota = [
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "memory", "nominalQuota": "512Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
    ]
    kube.request(
        "POST",
        f"{KUEUE}/clusterqueues",
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": "bench"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{"name": "h100", "resources": quota}]}
                ],
            },
        },
    )
    kube.request(
        "POST",
        f"{KUEUE}/namespaces/{NAMESPACE}/localqueues",
        {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": QUEUE}, "spec": {"clusterQueue": "bench"}},
    )


async def wait_ready(kube, what: str, check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready after {timeout:.0f}s")
        await asyncio.sleep(0.2)


async def run(spawns: int) -> None:
    from jupyterhub.objects import Hub, Server
    from traitlets.config import Config

    async with running_devcluster(kueue=True) as cluster:
        from gpuspawner.spawner import GPUSpawner

        kube = cluster.client()
        queue_objects(kube, gpus=8)
        await wait_ready(
            kube,
            "the default service account",
            lambda: bool(kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts")["items"]),
        )
        await wait_ready(
            kube,
            "the ClusterQueue",
            lambda: any(
                c["type"] == "Active" and c["status"] == "True"
                for c in kube.request("GET", f"{KUEUE}/clusterqueues/bench").get("status", {}).get("conditions", [])
            ),
        )

        class User:
            def __init__(self, name: str):
                self.name, self.id, self.url, self.admin, self.groups = name, 1, f"/user/{name}/", False, []

        def make(name: str, **traits) -> GPUSpawner:
            config = Config()
            config.KubeSpawner.namespace = NAMESPACE
            config.KubeSpawner.start_timeout = 120
            config.GPUSpawner.inventory_ready_timeout = 60.0
            for key, value in traits.items():
                setattr(config.GPUSpawner, key, value)
            spawner = GPUSpawner(hub=Hub(ip="127.0.0.1", port=8081), user=User(name), config=config)
            spawner.server = Server(base_url=f"/user/{name}/")
            return spawner

        async def bound(spawner: GPUSpawner) -> float:
            """When KubeSpawner's pod watch first sees the server's pod bound to a node."""
            key = f"{NAMESPACE}/{spawner.pod_name}"
            while True:
                reflector = spawner.pod_reflector
                pod = reflector.pods.get(key) if reflector is not None else None
                if pod is not None and (pod.get("spec") or {}).get("nodeName"):
                    return time.perf_counter()
                await asyncio.sleep(0.005)

        def through_kueue(spawner: GPUSpawner) -> bool:
            """Whether the server's pod went through Kueue: its queue label, and Kueue's Workload for it admitted."""
            pod = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{spawner.pod_name}")
            workloads = kube.request(
                "GET", f"{KUEUE}/namespaces/{NAMESPACE}/workloads?labelSelector={JOB_UID_LABEL}={pod['metadata']['uid']}"
            )
            admitted = [c for w in workloads["items"] for c in w.get("status", {}).get("conditions", []) if c["type"] == "Admitted"]
            return pod["metadata"].get("labels", {}).get(QUEUE_LABEL) == QUEUE and [c["status"] for c in admitted] == ["True"]

        async def timed(spawner: GPUSpawner, kueued: bool | None = None) -> tuple[float, float]:
            spawner.user_options = {"offering": H100}
            began = time.perf_counter()
            seen = asyncio.ensure_future(bound(spawner))
            try:
                await spawner.start()
                returned = time.perf_counter()
                at = await asyncio.wait_for(seen, 30)
                if kueued is not None and await asyncio.to_thread(through_kueue, spawner) != kueued:
                    raise RuntimeError(
                        f"{spawner.user.name}'s pod {'did not go' if kueued else 'went'} through Kueue: not what is timed here"
                    )
            finally:
                seen.cancel()
                await spawner.stop(now=True)
            return at - began, returned - began

        through = make("ada", kueue_queues={"default": QUEUE})
        plain = make("bob")
        await timed(plain, kueued=False)  # warm both (reflectors, the inventory, API clients), and check the routes
        await timed(through, kueued=True)
        times: dict[str, tuple[list[float], list[float]]] = {"plain": ([], []), "kueue": ([], [])}
        for i in range(spawns):
            pair = (("plain", plain), ("kueue", through))
            for kind, spawner in pair[:: 1 if i % 2 == 0 else -1]:
                to_bound, to_return = await timed(spawner)
                times[kind][0].append(to_bound)
                times[kind][1].append(to_return)

    rows = (("start() to pod bound", 0), ("start() returned", 1))
    print(f"# spawn to admission, one H100 GPU, {spawns} spawns each (devcluster: real API server, scheduler, Kueue v0.17.0; quota free)")
    print(f"{'':24} {'without Kueue':>25} {'through a LocalQueue':>25} {'ratio':>15}")
    print(f"{'':24} {'median':>12} {'p90':>12} {'median':>12} {'p90':>12} {'median':>7} {'p90':>7}")
    for label, index in rows:
        pm, p9 = median_p90(times["plain"][index])
        km, k9 = median_p90(times["kueue"][index])
        print(f"{label:24} {pm * 1000:9.1f} ms {p9 * 1000:9.1f} ms {km * 1000:9.1f} ms {k9 * 1000:9.1f} ms {km / pm:6.2f}x {k9 / p9:6.2f}x")
    plain_m, kueue_m = statistics.median(times["plain"][0]), statistics.median(times["kueue"][0])
    print(f"Kueue adds {1000 * (kueue_m - plain_m):.1f} ms (median) from start() to the pod bound")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spawns", type=int, default=20)
    args = parser.parse_args(argv)
    asyncio.run(run(args.spawns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
