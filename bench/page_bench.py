"""The spawn page at 1,000 GPU nodes and 200 offerings, next to KubeSpawner's profile-list
page with 200 profiles: time per view (p50 and p99) and HTML size.

Both are real spawners on the devcluster's real API server (1,000 simulated GPU nodes
of every node class, and the standard ones). GPUSpawner's page holds every offering with
its live free count from the inventory (discovered offerings, plus configured ones to
reach 200); KubeSpawner's holds 200 profiles that set the same kind of GPU limits, node
selector and toleration. Nothing asserted.

A view is what JupyterHub asks of each spawner for one load of the spawn page: GPUSpawner's
``get_options_form`` (its cards for this user now, with the live counts), and KubeSpawner's
render of its profile list (what a callable ``profile_list`` costs per view; a static one is
rendered once). Three kinds of view are timed for GPUSpawner: the same user again (nothing
changed), a view after an inventory event (a pod bound on a node of one offering, so that
offering's count moved), and a view by another user each time (other groups: other cards).

The two sides run ``--repeats`` times in alternated order (KubeSpawner first in the odd
repeats, GPUSpawner first in the even ones), in the same process on the same cluster; each
repeat prints both sides' p50 and p99, and the end the median over the repeats with the
spread (lowest to highest) of each ratio.

``--http`` times the whole page as a browser gets it instead: two real JupyterHubs (behind
their configurable-http-proxy, sqlite, the dummy authenticator) on the same cluster, one with
GPUSpawner and the 200 offerings, one with KubeSpawner and the 200 profiles, each page loaded by
``--users`` logged-in users in turn (``GET /hub/spawn/<user>``, JupyterHub's login check and
``spawn.html`` included), the hubs taking turns as above.

    python -m bench.page_bench [--nodes 1000] [--offerings 200] [--renders 200] [--repeats 3]
    python -m bench.page_bench --http [--users 20] [--py-spy .venv/bin/py-spy]

With ``--py-spy`` each hub is sampled while its page is loaded (collapsed stacks, one file per
hub and repeat in the temporary folder, their paths printed): where the time of a page goes.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time

from bench.devcluster import running_devcluster
from bench.scale.hubs import site_offerings, site_profiles


async def run(n_nodes: int, n_offerings: int, renders: int, repeats: int) -> None:
    from jupyterhub.objects import Hub
    from traitlets.config import Config

    from gpuspawner.devcluster.nodes import many_nodes, standard_nodes

    started = time.perf_counter()
    async with running_devcluster([*standard_nodes(), *many_nodes(n_nodes)]) as cluster:
        print(f"devcluster with {n_nodes} extra GPU nodes up in {time.perf_counter() - started:.0f}s")
        from kubespawner import KubeSpawner

        from gpuspawner.spawner import GPUSpawner

        class Group:
            def __init__(self, name: str):
                self.name, self.users = name, []

        def user(i: int):
            class User:
                name = escaped_name = f"user{i}"
                id = i
                url = f"/user/user{i}/"
                admin = False
                groups = [Group(f"group{i % 10}")]

            return User()

        def make(cls: type, who, **traits):
            config = Config()
            config.KubeSpawner.namespace = "default"
            for key, value in traits.items():
                setattr(config.KubeSpawner, key, value)
            return cls(hub=Hub(ip="127.0.0.1", port=8081), user=who, config=config)

        probe = make(GPUSpawner, user(0))
        await probe.inventory.wait_ready(300)
        discovered = len(await probe.catalog())
        extra = site_offerings(n_offerings - discovered)
        gpu = make(GPUSpawner, user(1), offerings=extra)
        others = [make(GPUSpawner, user(i), offerings=extra) for i in range(2, 2 + renders + 1)]
        offerings = len(await gpu.catalog())
        profiles = site_profiles(offerings)
        plain = make(KubeSpawner, user(1), profile_list=profiles)
        mover = _Mover(cluster, gpu)

        async def kubespawner_page() -> str:
            # KubeSpawner renders a static profile_list once (its options_form default) and then
            # serves that string; timed here is that render, as a callable profile_list does per view.
            return plain._render_options_form(profiles)

        turn = iter(range(10**9))

        async def another_user() -> str:
            return await others[next(turn) % len(others)].get_options_form()

        sides = {
            "KubeSpawner profile list": kubespawner_page,
            "GPUSpawner, same user again": gpu.get_options_form,
            "GPUSpawner, after an inventory event": gpu.get_options_form,  # (the event itself untimed)
            "GPUSpawner, another user each view": another_user,
        }
        kube = "KubeSpawner profile list"
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        sizes: dict[str, int] = {}
        print(f"# spawn page, {offerings} offerings over {n_nodes} GPU nodes; {renders} views per side, {repeats} repeats")
        for repeat in range(repeats):
            order = list(sides) if repeat % 2 == 0 else [*list(sides)[1:], kube]
            for name in order:
                times, sizes[name] = await _timed(
                    sides[name], renders, timed_part=name != "GPUSpawner, after an inventory event", mover=mover
                )
                results[name].append((_percentile(times, 50), _percentile(times, 99)))
            line = "; ".join(f"{name}: p50 {p50 * 1e3:.1f} ms p99 {p99 * 1e3:.1f} ms" for name, [*_, (p50, p99)] in results.items())
            print(f"repeat {repeat + 1} ({order[0]} first): {line}")
        _table(results, sizes, kube)
        from gpuspawner.hub.form import _CARDS

        print(f"cards rendered over the run: {_CARDS.renders} (views: {len(sides) - 1} x {renders} x {repeats})")
        await mover.close()
        await probe.inventory.stop()


#: an 8 x H100 node of many_nodes (gpuspawner/devcluster/nodes.py): the pods the benchmark binds go there
H100_NODE = "gpu-h100-8x-00001"


async def run_http(n_nodes: int, n_offerings: int, loads: int, repeats: int, n_users: int, py_spy: str = "") -> None:
    import tempfile
    from pathlib import Path

    from bench.scale.storm import Browser, Hub
    from gpuspawner.capacity.index import ClusterIndex
    from gpuspawner.devcluster.hub import HubProcess
    from gpuspawner.devcluster.nodes import many_nodes, standard_nodes
    from gpuspawner.offerings.catalog import CatalogConfig, build_catalog

    nodes = [*standard_nodes(), *many_nodes(n_nodes)]
    index = ClusterIndex()
    index.replace(nodes=nodes, pods=[])
    discovered = len(build_catalog(CatalogConfig(), discovered=index.discovered()))
    extra = site_offerings(n_offerings - discovered)
    profiles = site_profiles(n_offerings)
    started = time.perf_counter()
    async with running_devcluster(nodes):
        print(f"devcluster with {n_nodes} extra GPU nodes up in {time.perf_counter() - started:.0f}s")
        with tempfile.TemporaryDirectory() as tmp:
            settings = {
                "KubeSpawner profile list": f'c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"\nc.KubeSpawner.profile_list = {profiles!r}\n',
                "GPUSpawner": f'c.JupyterHub.spawner_class = "gpu"\nc.GPUSpawner.discover_offerings = True\nc.GPUSpawner.offerings = {extra!r}\n',
            }
            procs: dict[str, HubProcess] = {}
            hubs: dict[str, Hub] = {}
            try:
                for name, text in settings.items():
                    proc = procs[name] = HubProcess(Path(tmp) / name.split()[0])
                    proc.launch(proc.base_config() + 'c.KubeSpawner.namespace = "default"\n' + text)
                    hubs[name] = Hub(proc.url, "unused")
                browsers: dict[str, list[Browser]] = {}
                for name, hub in hubs.items():
                    await hub.wait_up(600, procs[name].proc)
                    browsers[name] = [Browser(hub.url, f"user{i}") for i in range(n_users)]
                    for browser in browsers[name]:
                        await browser.login()
                deadline = time.monotonic() + 300  # GPUSpawner's inventory has listed the cluster: its page counts
                while not re.search(r"data-gs-avail>\d+ of \d+ free", (await browsers["GPUSpawner"][0].load_form())[1]):
                    if time.monotonic() > deadline:
                        raise RuntimeError("GPUSpawner's page shows no free count after 300 s")
                    await asyncio.sleep(1)
                results: dict[str, list[tuple[float, float]]] = {name: [] for name in hubs}
                sizes: dict[str, int] = {}
                print(f"# spawn page over HTTP, {n_offerings} offerings over {n_nodes} GPU nodes; {loads} loads per hub, {repeats} repeats")
                for repeat in range(repeats):
                    order = list(hubs) if repeat % 2 == 0 else list(hubs)[::-1]
                    for name in order:
                        times = []
                        spy = _spy(py_spy, procs[name], repeat) if py_spy else None
                        for i in range(-n_users, loads):  # each user's first load (its spawner made) untimed
                            begun = time.perf_counter()
                            status, page = await browsers[name][i % n_users].load_form()
                            if status != 200 or "spawn_form" not in page:
                                raise RuntimeError(f"{name}: the spawn page answered {status}: {page[:300]}")
                            if i >= 0:
                                times.append(time.perf_counter() - begun)
                        if spy is not None:
                            spy.send_signal(2)  # py-spy writes what it sampled on SIGINT
                            spy.wait(60)
                        sizes[name] = len(page.encode())
                        results[name].append((_percentile(times, 50), _percentile(times, 99)))
                    line = "; ".join(f"{name}: p50 {p50 * 1e3:.1f} ms p99 {p99 * 1e3:.1f} ms" for name, [*_, (p50, p99)] in results.items())
                    print(f"repeat {repeat + 1} ({order[0]} first): {line}")
                _table(results, sizes, "KubeSpawner profile list")
                for name, proc in procs.items():  # the same loads as the hub timed them (its request log), the proxy left out
                    logged = [float(ms) for ms in re.findall(r"200 GET /hub/spawn/\S+ \(\S+\) ([\d.]+)ms", proc.log_text())]
                    logged = logged[-loads * repeats :]
                    print(
                        f"{name}, in the hub's own request log: p50 {_percentile(logged, 50):.1f} ms, p99 {_percentile(logged, 99):.1f} ms"
                    )
            finally:
                for browser_list in browsers.values() if "browsers" in locals() else ():
                    for browser in browser_list:
                        await browser.session.close()
                for hub in hubs.values():
                    await hub.close()
                for proc in procs.values():
                    proc.end()


def _spy(py_spy: str, proc, repeat: int):
    """py-spy recording ``proc``'s hub (not pausing it) while its page is loaded: collapsed stacks
    in the system's temporary folder, named by the hub and the repeat (printed)."""
    import subprocess
    import tempfile
    from pathlib import Path

    out = Path(tempfile.gettempdir()) / f"page-bench-{proc.tmp.name}-py-spy-{repeat + 1}.txt"
    print(f"py-spy: {out}")
    return subprocess.Popen(
        [py_spy, "record", "--pid", str(proc.proc.pid), "--output", str(out), "--format", "raw", "--rate", "250", "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _table(results: dict[str, list[tuple[float, float]]], sizes: dict[str, int], kube: str) -> None:
    """Each side's p50 and p99 (median over the repeats, lowest-highest), and each GPUSpawner side : KubeSpawner."""
    print()
    print(f"{'':38} {'p50 (median, spread)':>28} {'p99 (median, spread)':>28} {'HTML':>9}")
    for name, values in results.items():
        p50s, p99s = [v[0] for v in values], [v[1] for v in values]
        print(f"{name:38} {_ms(p50s):>28} {_ms(p99s):>28} {sizes[name] / 1024:7.1f} KiB")
    for name, values in results.items():
        if name == kube:
            continue
        ratios50 = [ours[0] / theirs[0] for ours, theirs in zip(values, results[kube], strict=True)]
        ratios99 = [ours[1] / theirs[1] for ours, theirs in zip(values, results[kube], strict=True)]
        print(f"{name} : KubeSpawner = p50 {_ratio(ratios50)}, p99 {_ratio(ratios99)}")


class _Mover:
    """Moves one offering's free count between views: a one-GPU pod bound to a node of it (by
    the benchmark, as the scheduler would) or deleted, then waits until the hub's watch has seen it."""

    def __init__(self, cluster, spawner) -> None:
        self.cluster, self.spawner, self.pod = cluster, spawner, None

    def _free(self) -> int | None:
        offering = next(o for o in self.spawner.catalog_now() if o.slug == "gpu-nvidia-h100-80gb-hbm3")
        return self.spawner.availability(offering).free

    async def move(self) -> None:
        from kubernetes_asyncio.client import V1Binding, V1ObjectMeta, V1ObjectReference

        api = self.spawner.api
        before = self._free()
        if self.pod is None:
            name = f"page-bench-{time.monotonic_ns()}"
            await api.create_namespaced_pod(
                "default",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "schedulerName": "page-bench",  # bound below, not by the scheduler
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                    },
                },
            )
            binding = V1Binding(metadata=V1ObjectMeta(name=name), target=V1ObjectReference(kind="Node", name=H100_NODE))
            await api.create_namespaced_binding("default", binding, _preload_content=False)
            self.pod = name
        else:
            await api.delete_namespaced_pod(self.pod, "default", grace_period_seconds=0)
            self.pod = None
        deadline = time.monotonic() + 60
        while self._free() == before and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        if self.pod is not None:
            await self.spawner.api.delete_namespaced_pod(self.pod, "default", grace_period_seconds=0)


async def _timed(render, renders: int, timed_part: bool, mover: _Mover) -> tuple[list[float], int]:
    html = await render()
    times = []
    for _ in range(renders):
        if timed_part:
            begun = time.perf_counter()
            html = await render()
            times.append(time.perf_counter() - begun)
        else:  # the inventory event happens untimed, then the view is timed
            await mover.move()
            begun = time.perf_counter()
            html = await mover.spawner.get_options_form()
            times.append(time.perf_counter() - begun)
    return times, len(html.encode())


def _percentile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f} ms ({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})"


def _ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--offerings", type=int, default=200)
    parser.add_argument("--renders", type=int, default=200, help="views per side and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="runs of both sides, in alternated order")
    parser.add_argument("--http", action="store_true", help="the whole page from two real hubs, as a browser loads it")
    parser.add_argument("--users", type=int, default=20, help="--http: logged-in users loading the page in turn")
    parser.add_argument("--py-spy", default="", help="--http: record each hub with this py-spy while its page is loaded (collapsed stacks)")
    args = parser.parse_args(argv)
    if args.http:
        asyncio.run(run_http(args.nodes, args.offerings, args.renders, args.repeats, args.users, args.py_spy))
    else:
        asyncio.run(run(args.nodes, args.offerings, args.renders, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
