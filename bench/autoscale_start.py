"""Spawn to ready on a scale-from-zero GPU pool, and the answer on a pool that cannot grow:
GPUSpawner vs plain KubeSpawner with the same pod, both waiting for the real Karpenter.

The devcluster runs with its CPU node only and the real Karpenter (its kwok cloud provider,
``gpuspawner devcluster build --karpenter``): the H100 pool (``gpu-h100``) starts at zero nodes
and its node registers ``--boot`` after Karpenter asks for it (a cloud's boot time, the kwok
provider's ``nodeRegistrationDelay``). Both spawners start the same notebook pod: GPUSpawner by
the pool's offering, which its inventory discovered from the NodePool; KubeSpawner configured
with that offering's limits, node selection, affinity and tolerations (``pod.podspec.pod_changes``,
as ``bench/start_bench.py`` does). Both are the spawner objects a hub makes, in this process,
timed from ``start()`` to its return (the pod running with its IP: what the hub then waits on,
the server's HTTP answer, is the same for both and not timed).

1. **Spawn to ready, from zero nodes**: each repeat starts both in turn (the order alternated),
   each on an empty pool: after each stop the pool's NodeClaims are deleted and the next start
   waits until Karpenter has removed the node.
2. **A pool that cannot grow**: with the pool's ``limits.nodes`` at 0, GPUSpawner's inventory
   reads the limit and refuses at once; with a limit the hub does not read (``nvidia.com/gpu: 0``)
   Karpenter refuses, and GPUSpawner refuses on Karpenter's event on the pod; KubeSpawner creates
   the pod either way and waits for it until ``start_timeout`` (``--kubespawner-timeout``; its
   default 60 s, zero-to-jupyterhub's 300 s).

Each figure: median [min - max] over the repeats, with the failures (a start that should have
come up and did not, or a refusal that did not come) counted and their words printed, and the
machine's load average. Nothing is asserted.

    python -m bench.autoscale_start [--repeats 3] [--boot 20s] [--kubespawner-timeout 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

from bench.devcluster import kubespawner_traits, running_devcluster
from bench.scale.__main__ import spread

H100 = "gpu-nvidia-h100-80gb-hbm3"
POOL_NODES = "/api/v1/nodes?labelSelector=karpenter.sh/nodepool%3Dgpu-h100"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def row(label: str, times: list[float], failures: list[str], scale: float = 1.0) -> str:
    """One side's figure: median [min - max] of ``times`` (seconds, times ``scale``), and its failures."""
    return f"{label:<52} {spread([t * scale for t in times]):>24}   failures {len(failures)}/{len(times) + len(failures)}"


async def wait_until(check, what: str, timeout: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await asyncio.to_thread(check)
        if found:
            return found
        await asyncio.sleep(0.5)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")


async def run(repeats: int, boot: str, timeout: int) -> None:
    from jupyterhub.objects import Hub, Server
    from traitlets.config import Config

    from gpuspawner.devcluster.karpenter import POOLS, node_class, node_pool
    from gpuspawner.devcluster.nodes import CLASS_LABEL, standard_nodes

    cpu_only = [n for n in standard_nodes() if n["metadata"]["labels"][CLASS_LABEL] == "cpu"]
    async with running_devcluster(cpu_only, karpenter=True) as cluster:
        kube = cluster.client()
        karpenter = cluster.karpenter()
        karpenter.apply(node_class(boot))
        pool = next(p for p in POOLS if p.name == "gpu-h100")

        from kubespawner import KubeSpawner

        from gpuspawner.pod.podspec import pod_changes
        from gpuspawner.spawner import GPUSpawner

        class User:
            def __init__(self, name: str):
                self.name, self.id, self.url, self.admin, self.groups = name, 1, f"/user/{name}/", False, []

        def make(cls: type, name: str, **traits: Any) -> Any:
            config = Config()
            config.KubeSpawner.namespace = "default"
            config.KubeSpawner.start_timeout = timeout
            for key, value in traits.items():
                setattr(config.KubeSpawner, key, value)
            spawner = cls(hub=Hub(ip="127.0.0.1", port=8081), user=User(name), config=config)
            spawner.server = Server(base_url=f"/user/{name}/")
            return spawner

        gpu = make(GPUSpawner, "ada")

        async def pool_offering() -> Any:
            return next((o for o in await gpu.catalog() if o.slug == H100 and o.pool is not None), None)

        offering = None
        for _ in range(240):  # the inventory's first list of the NodePools
            offering = await pool_offering()
            if offering is not None:
                break
            await asyncio.sleep(0.5)
        if offering is None:
            raise SystemExit("GPUSpawner's inventory never discovered the H100 pool's offering")
        changes = pod_changes(offering, 1)
        plain = make(KubeSpawner, "bob", **kubespawner_traits(changes))
        options = {gpu: {"offering": H100}, plain: {}}
        names = {gpu: "GPUSpawner", plain: "KubeSpawner"}

        async def empty_pool() -> None:
            for claim in (await asyncio.to_thread(kube.request, "GET", NODECLAIMS))["items"]:
                await asyncio.to_thread(kube.request, "DELETE", f"{NODECLAIMS}/{claim['metadata']['name']}")
            await wait_until(
                lambda: not kube.request("GET", POOL_NODES)["items"] and not kube.request("GET", NODECLAIMS)["items"], "an empty pool"
            )
            # GPUSpawner's inventory has seen the node go (so its start waits for a new one, as KubeSpawner's does)
            for _ in range(60):
                found = await pool_offering()
                if found is not None and found.pool is not None and found.pool.nodes == 0:
                    break
                await asyncio.sleep(0.5)

        async def timed(spawner: Any) -> tuple[float, str]:
            """Seconds from start() to its return or its refusal, and "" or the refusal's words."""
            spawner.user_options = dict(options[spawner])
            started = time.perf_counter()
            try:
                await spawner.start()
                outcome = ""
            except Exception as exc:  # noqa: BLE001 - the answer is what is timed
                outcome = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            took = time.perf_counter() - started
            await spawner.stop(now=True)
            return took, outcome

        load_before = load()
        ready: dict[Any, list[float]] = {gpu: [], plain: []}
        not_ready: dict[Any, list[str]] = {gpu: [], plain: []}
        await empty_pool()
        for i in range(repeats):
            for spawner in (gpu, plain) if i % 2 == 0 else (plain, gpu):
                took, outcome = await timed(spawner)
                if outcome:
                    not_ready[spawner].append(outcome)
                else:
                    ready[spawner].append(took)
                print(f"  ready {i + 1}/{repeats} {names[spawner]:<11} {took:7.2f} s {outcome}", flush=True)
                await empty_pool()
        load_ready = load()

        # 2. a pool that cannot grow: the hub reads the node limit; Karpenter reads the GPU limit
        at_limit = node_pool(pool)
        at_limit["spec"]["limits"] = {"nodes": "0"}
        karpenter.apply(at_limit)
        for _ in range(240):
            found = await pool_offering()
            if found is not None and found.pool is not None and found.pool.at_limit:
                break
            await asyncio.sleep(0.5)
        refused: dict[str, list[float]] = {"limit": [], "karpenter": [], "kube": []}
        missed: dict[str, list[str]] = {"limit": [], "karpenter": [], "kube": []}
        words: dict[str, str] = {}

        def note(key: str, took: float, outcome: str) -> None:
            if outcome:
                refused[key].append(took)
                words.setdefault(key, outcome)
            else:
                missed[key].append(f"started after {took:.1f} s")
            print(f"  refusal {key:<9} {took:7.2f} s {outcome}", flush=True)

        for _ in range(repeats):
            note("limit", *await timed(gpu))
        no_gpus = node_pool(pool)
        no_gpus["spec"]["limits"] = {"nvidia.com/gpu": "0"}
        karpenter.apply(no_gpus)
        for _ in range(240):
            found = await pool_offering()
            if found is not None and found.pool is not None and not found.pool.at_limit:
                break
            await asyncio.sleep(0.5)
        for i in range(repeats):
            for spawner in (gpu, plain) if i % 2 == 0 else (plain, gpu):
                note("karpenter" if spawner is gpu else "kube", *await timed(spawner))
                await empty_pool()
        load_after = load()

        print()
        print(f"# Spawn to ready on a scale-from-zero pool (H100 pool, node boot {boot}), {repeats} repeats, order alternated")
        print(f"# load average (1, 5, 15 min): before {load_before}; after the spawns {load_ready}; at the end {load_after}")
        print(f"{'':<52} {'median [min - max] (s)':>24}")
        print(row("KubeSpawner.start() to ready", ready[plain], not_ready[plain]))
        print(row("GPUSpawner.start() to ready", ready[gpu], not_ready[gpu]))
        if ready[plain] and ready[gpu]:
            ratio = statistics.median(ready[gpu]) / statistics.median(ready[plain])
            print(f"ratio GPUSpawner : KubeSpawner (medians) = {ratio:.2f}")
        for spawner in (plain, gpu):
            for outcome in not_ready[spawner]:
                print(f"  {names[spawner]} did not start: {outcome}")
        print()
        print(f"# A pool that cannot grow: the answer, {repeats} repeats")
        print(row(f"KubeSpawner (start_timeout={timeout} s)", refused["kube"], missed["kube"]))
        print(row("GPUSpawner, the hub reads limits.nodes: 0 (ms)", refused["limit"], missed["limit"], 1000))
        print(row("GPUSpawner, Karpenter refuses (nvidia.com/gpu: 0)", refused["karpenter"], missed["karpenter"]))
        if refused["kube"] and refused["limit"] and refused["karpenter"]:
            kube_s = statistics.median(refused["kube"])
            print(
                f"ratio KubeSpawner : GPUSpawner (medians) = {kube_s / statistics.median(refused['limit']):,.0f}x (the hub's limit), "
                f"{kube_s / statistics.median(refused['karpenter']):,.1f}x (Karpenter's refusal)"
            )
        for key, outcome in words.items():
            print(f"  {key}: {outcome}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--boot", default="20s", help="the node's registration delay (a cloud's boot time; default 20s)")
    parser.add_argument("--kubespawner-timeout", type=int, default=60, help="KubeSpawner's start_timeout (its default, 60)")
    args = parser.parse_args(argv)
    asyncio.run(run(args.repeats, args.boot, args.kubespawner_timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
