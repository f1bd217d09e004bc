"""The spawn page at 1,000 GPU nodes and 200 offerings, next to KubeSpawner's profile-list
page with 200 profiles: time per render and HTML size, in one run.

Both are real spawners on the devcluster's real API server (1,000 simulated GPU nodes
of every node class, and the standard ones). GPUSpawner's page holds every offering with
its live free count from the inventory (discovered offerings, plus configured ones to
reach 200); KubeSpawner's holds 200 profiles that set the same kind of GPU limits, node
selector and toleration. Nothing asserted.

    python -m bench.page_bench [--nodes 1000] [--offerings 200] [--renders 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from bench.devcluster import running_devcluster


async def run(n_nodes: int, n_offerings: int, renders: int) -> None:
    from jupyterhub.objects import Hub
    from traitlets.config import Config

    from gpuspawner.devcluster.nodes import many_nodes, standard_nodes

    started = time.perf_counter()
    async with running_devcluster([*standard_nodes(), *many_nodes(n_nodes)]):
        print(f"devcluster with {n_nodes} extra GPU nodes up in {time.perf_counter() - started:.0f}s")
        from kubespawner import KubeSpawner

        from gpuspawner.spawner import GPUSpawner

        class User:
            name = escaped_name = "alice"
            id = 1
            url = "/user/alice/"
            admin = False
            groups: list = []

        def make(cls: type, **traits):
            config = Config()
            config.KubeSpawner.namespace = "default"
            for key, value in traits.items():
                setattr(config.KubeSpawner, key, value)
            return cls(hub=Hub(ip="127.0.0.1", port=8081), user=User(), config=config)

        probe = make(GPUSpawner)
        await probe.inventory.wait_ready(300)
        discovered = len(await probe.catalog())
        extra = [
            {
                "slug": f"site-{i}",
                "kind": "custom",
                "display_name": f"Site accelerator {i}",
                "resources": {"nvidia.com/gpu": 1},
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            }
            for i in range(max(0, n_offerings - discovered))
        ]
        gpu = make(GPUSpawner, offerings=extra)
        offerings = len(await gpu.catalog())
        profiles = [
            {
                "display_name": f"Profile {i}",
                "slug": f"p{i}",
                "description": "One whole GPU of a kind",
                "kubespawner_override": {
                    "extra_resource_limits": {"nvidia.com/gpu": "1"},
                    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                },
            }
            for i in range(offerings)
        ]
        plain = make(KubeSpawner, profile_list=profiles)

        async def timed(render) -> tuple[list[float], int]:
            html = await render()
            times = []
            for _ in range(renders):
                begun = time.perf_counter()
                html = await render()
                times.append(time.perf_counter() - begun)
            return times, len(html.encode())

        async def kubespawner_page() -> str:
            # KubeSpawner renders a static profile_list once (its options_form default) and then
            # serves that string; timed here is that render, as a callable profile_list does per view.
            return plain._render_options_form(profiles)

        ours, our_size = await timed(gpu.get_options_form)
        theirs, their_size = await timed(kubespawner_page)
        print(f"# spawn page, {offerings} offerings over {n_nodes} GPU nodes; {renders} renders each")
        print(f"GPUSpawner (live free counts): median {statistics.median(ours) * 1e3:6.1f} ms, {our_size / 1024:6.1f} KiB")
        print(f"KubeSpawner profile list:      median {statistics.median(theirs) * 1e3:6.1f} ms, {their_size / 1024:6.1f} KiB")
        print(
            f"ratio GPUSpawner : KubeSpawner = {statistics.median(ours) / statistics.median(theirs):.2f}x time, "
            f"{our_size / their_size:.2f}x size"
        )
        await probe.inventory.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--offerings", type=int, default=200)
    parser.add_argument("--renders", type=int, default=50)
    args = parser.parse_args(argv)
    asyncio.run(run(args.nodes, args.offerings, args.renders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
