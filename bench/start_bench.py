"""GPUSpawner.start() next to KubeSpawner.start() for the same pod, on the devcluster's real
API server and scheduler, in one run.

Both start a notebook pod that asks for one MIG 1g.5gb slice (KubeSpawner configured with
the slice's limits, node selection and tolerations as the offering has them; GPUSpawner by
the offering the user picks), then stop it; the two alternate, so that a noisy machine slows both alike.
Also timed: the answer to a request only the scheduler can refuse (a node label no node
has), which GPUSpawner gets from its pod reflector's watch the moment the scheduler marks
the pod Unschedulable. Medians and 90th percentiles; nothing asserted.

    python -m bench.start_bench [--spawns 50] [--refusals 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from bench.devcluster import kubespawner_traits, running_devcluster

SLICE = "mig-nvidia-a100-sxm4-40gb-1g-5gb"


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(times) * 1000:7.1f} ms, p90 {p90 * 1000:7.1f} ms"


async def run(spawns: int, refusals: int) -> None:
    from jupyterhub.objects import Hub, Server
    from traitlets.config import Config

    async with running_devcluster():
        from kubespawner import KubeSpawner

        from gpuspawner.spawner import GPUSpawner

        class User:
            def __init__(self, name: str):
                self.name, self.id, self.url, self.admin, self.groups = name, 1, f"/user/{name}/", False, []

        def make(cls: type, name: str, **traits):
            config = Config()
            config.KubeSpawner.namespace = "default"
            config.KubeSpawner.start_timeout = 120
            for key, value in traits.items():
                setattr(config.KubeSpawner, key, value)
            spawner = cls(hub=Hub(ip="127.0.0.1", port=8081), user=User(name), config=config)
            spawner.server = Server(base_url=f"/user/{name}/")
            return spawner

        async def timed_start(spawner, options: dict) -> float:
            spawner.user_options = dict(options)
            started = time.perf_counter()
            await spawner.start()
            took = time.perf_counter() - started
            await spawner.stop(now=True)
            return took

        async def timed_refusal(spawner) -> float:
            spawner.user_options = {"offering": "fpga"}
            started = time.perf_counter()
            try:
                await spawner.start()
            except Exception:  # noqa: BLE001 - the refusal is what is timed
                pass
            took = time.perf_counter() - started
            await spawner.stop(now=True)
            return took

        from gpuspawner.pod.podspec import pod_changes

        gpu = make(GPUSpawner, "ada")
        offering = next(o for o in await gpu.catalog() if o.slug == SLICE)
        changes = pod_changes(offering, 1)
        plain = make(KubeSpawner, "ada", **kubespawner_traits(changes))
        await timed_start(plain, {})  # warm both: reflectors, the inventory, API clients
        await timed_start(gpu, {"offering": SLICE})
        kube_times, gpu_times = [], []
        for i in range(spawns):
            first, second = ((plain, {}, kube_times), (gpu, {"offering": SLICE}, gpu_times))[:: 1 if i % 2 == 0 else -1]
            for spawner, options, out in (first, second):
                out.append(await timed_start(spawner, options))

        sched = make(GPUSpawner, "bob")
        sched.offerings = [
            {"slug": "fpga", "kind": "custom", "command_prefix": ["fpga-run"], "node_selector": {"example.org/fpga": "true"}}
        ]
        refusal_times = [await timed_refusal(sched) for _ in range(refusals)]

        print(f"# start() of the same MIG 1g.5gb pod, {spawns} spawns each (devcluster, real API server and scheduler)")
        print(f"KubeSpawner.start():  {summary(kube_times)}")
        print(f"GPUSpawner.start():   {summary(gpu_times)}")
        print(f"ratio GPUSpawner : KubeSpawner (median) = {statistics.median(gpu_times) / statistics.median(kube_times):.2f}x")
        print(f"# a request only the scheduler can refuse, {refusals} times")
        print(f"GPUSpawner, spawn to the scheduler's refusal: {summary(refusal_times)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spawns", type=int, default=50)
    parser.add_argument("--refusals", type=int, default=20)
    args = parser.parse_args(argv)
    asyncio.run(run(args.spawns, args.refusals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
