"""Time to an answer for an impossible GPU request: plain KubeSpawner vs GPUSpawner.

Both ask the devcluster for a MIG 3g.20gb slice while another team's pod holds the
only one. KubeSpawner creates the pod and waits for it to run until start_timeout
(its default is 60 s; zero-to-jupyterhub sets 300 s); GPUSpawner refuses from its
inventory, and when only the scheduler can tell (a request nothing counts), as soon
as the scheduler marks the pod Unschedulable. Printed side by side; nothing asserted.

    python -m bench.failfast_bench [--kubespawner-timeout 30]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from bench.devcluster import running_devcluster

SLICE = "mig-nvidia-a100-sxm4-40gb-3g-20gb"


async def run(timeout: int) -> None:
    from jupyterhub.objects import Hub, Server
    from traitlets.config import Config

    from gpuspawner.core.model import DEFAULT_GPU_TOLERATION

    async with running_devcluster() as cluster:
        kube = cluster.client()
        kube.request(
            "POST",
            "/api/v1/namespaces/default/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "other-team"},
                "spec": {
                    "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.20gb": "1"}}}],
                    "tolerations": [dict(DEFAULT_GPU_TOLERATION)],
                },
            },
        )
        while kube.request("GET", "/api/v1/namespaces/default/pods/other-team")["status"].get("phase") != "Running":
            await asyncio.sleep(0.1)

        from kubespawner import KubeSpawner

        from gpuspawner.spawner import GPUSpawner

        class User:
            def __init__(self, name):
                self.name, self.id, self.url, self.admin, self.groups = name, 1, f"/user/{name}/", False, []
                self.server = Server(base_url=f"/user/{name}/")

        def make(cls, name, **extra):
            config = Config()
            config.KubeSpawner.start_timeout = timeout
            config.KubeSpawner.namespace = "default"
            for key, value in extra.items():
                setattr(config.KubeSpawner, key, value)
            spawner = cls(hub=Hub(), user=User(name), config=config)
            spawner.server = spawner.user.server
            return spawner

        async def time_start(spawner) -> tuple[float, str]:
            started = time.perf_counter()
            try:
                await asyncio.wait_for(spawner.start(), timeout + 5)
                outcome = "started (unexpected)"
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {str(exc)[:110]}"
            took = time.perf_counter() - started
            await spawner.stop(now=True)
            return took, outcome

        plain = make(
            KubeSpawner, "plain", extra_resource_limits={"nvidia.com/mig-3g.20gb": "1"}, tolerations=[dict(DEFAULT_GPU_TOLERATION)]
        )
        gpu = make(GPUSpawner, "gpu")
        gpu.user_options = {"offering": SLICE}
        sched = make(GPUSpawner, "sched")
        sched.offerings = [
            {"slug": "fpga", "kind": "custom", "command_prefix": ["fpga-run"], "node_selector": {"example.org/fpga": "true"}}
        ]
        sched.user_options = {"offering": "fpga"}

        print("# Time to an answer for an impossible request (devcluster, real scheduler)")
        g_took, g_out = await time_start(gpu)
        s_took, s_out = await time_start(sched)
        k_took, k_out = await time_start(plain)
        print(f"KubeSpawner (start_timeout={timeout}s): {k_took:7.2f} s  {k_out}")
        print(f"GPUSpawner, inventory refusal:        {g_took:7.3f} s  {g_out}")
        print(f"GPUSpawner, scheduler refusal:        {s_took:7.3f} s  {s_out}")
        print(
            f"ratio KubeSpawner : GPUSpawner = {k_took / g_took:,.0f}x (inventory), {k_took / s_took:,.0f}x (scheduler); "
            f"with z2jh's start_timeout of 300 s KubeSpawner would wait {300 / timeout:.0f}x longer still"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubespawner-timeout", type=int, default=30)
    args = parser.parse_args(argv)
    asyncio.run(run(args.kubespawner_timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
