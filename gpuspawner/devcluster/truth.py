"""Capacity truth on the real scheduler, over random cluster states of the wide generator.

For each state (a seed): the generator's nodes replace the last state's in one running
devcluster (real kube-apiserver and kube-scheduler, kwok nodes); the pods other users
run are bound to them; a real GPUSpawner, with that state's notebook guarantees,
tolerations and extra offerings, builds its catalog from its own live inventory (list
and watch). Then, offering by offering, pods exactly as the spawner makes them (its
``get_pod_manifest``) are created, a few more than the inventory says are free, and the
real scheduler decides: the offering agrees when the pods it binds equal the free count.

    python -m gpuspawner.devcluster.truth --states 200          # make capacity-truth
    python -m gpuspawner.devcluster.truth --seeds 0-9 --json F  # what CI runs

prints ``K of M offerings agree over N states`` and exits 1 if any disagrees. Every
disagreement is listed with the state's seed, so ``--seeds S`` replays it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.generate import random_cluster
from gpuspawner.devcluster.generate_pods import random_pods

if TYPE_CHECKING:
    from gpuspawner.capacity.index import ClusterIndex
    from gpuspawner.spawner import GPUSpawner

T = TypeVar("T")
NAMESPACES = ("team-a", "team-b", "probe")
#: The notebook pod settings a state draws from: none, zero-to-jupyterhub's 1G default, more.
NOTEBOOKS: list[dict[str, Any]] = [
    {},
    {"mem_guarantee": "1G"},
    {"mem_guarantee": "1G"},
    {"cpu_guarantee": 0.5, "mem_guarantee": "1G"},
    {"cpu_guarantee": 2, "mem_guarantee": "8G"},
    {"mem_limit": "2G"},
]
#: zero-to-jupyterhub's user-pod tolerations (user pools are tainted hub.jupyter.org/dedicated=user).
Z2JH_TOLERATIONS = [
    {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
    {"key": "hub.jupyter.org_dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
]
#: Offerings an admin adds by hand beside the discovered ones.
EXTRA_OFFERINGS = [
    {"slug": "any-whole-gpu", "kind": "full", "display_name": "Any whole GPU"},
    {"slug": "any-shared-gpu", "kind": "shared", "display_name": "Any renamed share"},
    {"slug": "half-v100", "kind": "custom", "display_name": "Half a V100", "resources": {"nvidia.com/vgpu": 500}},
]
MORE = 2  # pods beyond the predicted free count: the scheduler must refuse them


@dataclass
class State:
    seed: int
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    kube: dict[str, Any]
    gpu: dict[str, Any]
    schemes: list[str] = field(default_factory=list)


@dataclass
class Result:
    seed: int
    slug: str
    predicted: int
    placed: int
    retried: bool = False

    @property
    def agrees(self) -> bool:
        return self.predicted == self.placed


def draw_state(seed: int) -> State:
    """The nodes, pods and hub settings of one state, all from ``seed``."""
    from gpuspawner.offerings.discovery import discover

    rng = random.Random(seed)
    generated = random_cluster(rng, prefix=f"s{seed}")
    nodes = [g.manifest for g in generated]
    pods = random_pods(rng, nodes, namespaces=("team-a", "team-b", "kube-system"))
    kube = dict(rng.choice(NOTEBOOKS))
    if rng.random() < 0.4:
        kube["tolerations"] = list(Z2JH_TOLERATIONS)
    gpu: dict[str, Any] = {"offerings": [o for o in EXTRA_OFFERINGS if rng.random() < 0.5]}
    slugs = sorted(o.slug for o in discover(nodes))
    if slugs and rng.random() < 0.3:  # an admin lets one offering onto every node, cordoned ones too
        gpu["offering_overrides"] = {rng.choice(slugs): {"extra_tolerations": [{"operator": "Exists"}]}}
    return State(seed, nodes, pods, kube, gpu, [f"{g.name}: {g.platform} {g.scheme}" for g in generated])


class _User:
    """The parts of JupyterHub's User a spawner reads."""

    def __init__(self, name: str):
        from jupyterhub.objects import Server

        self.name = self.escaped_name = name
        self.id = 1
        self.url = f"/user/{name}/"
        self.admin = False
        self.groups: list[Any] = []
        self.server = Server(base_url=f"/user/{name}/")


class Harness:
    """Loads states into one devcluster and checks every offering of each against the scheduler."""

    def __init__(self, log: Callable[[str], None]):
        from kubespawner.clients import load_config, shared_client

        load_config()
        self.api = shared_client("CoreV1Api")
        self.log = log
        self.previous_nodes: list[str] = []

    async def setup(self) -> None:
        for name in NAMESPACES:
            await self.api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        for name in (*NAMESPACES, "kube-system"):  # pods may be made only where the default service account is
            await self._until(functools.partial(self._has_service_account, name), f"the service account of {name}")

    async def _has_service_account(self, namespace: str) -> bool:
        accounts = await self.api.list_namespaced_service_account(namespace)
        return any(a.metadata.name == "default" for a in accounts.items)

    async def _until(self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not await check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            await asyncio.sleep(0.05)

    async def _pods(self, namespace: str | None = None) -> list[Any]:
        pods: list[Any] = (await (self.api.list_namespaced_pod(namespace) if namespace else self.api.list_pod_for_all_namespaces())).items
        return pods

    async def _clear(self, namespaces: Iterable[str]) -> None:
        for ns in namespaces:
            await self.api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        for ns in namespaces:
            await self._until(functools.partial(self._empty, ns), f"the pods of {ns} gone")

    async def _empty(self, namespace: str) -> bool:
        return not await self._pods(namespace)

    async def load(self, state: State) -> None:
        """Replace the last state's pods and nodes with this state's."""
        await self._clear(("team-a", "team-b", "kube-system", "probe"))
        for name in self.previous_nodes:
            await self.api.delete_node(name)
        await asyncio.gather(*(self.api.create_node(node) for node in state.nodes))
        await asyncio.gather(*(self.api.create_namespaced_pod(p["metadata"]["namespace"], p) for p in state.pods))
        self.previous_nodes = [n["metadata"]["name"] for n in state.nodes]

    def spawner(self, state: State) -> GPUSpawner:
        from jupyterhub.objects import Hub
        from traitlets.config import Config

        from gpuspawner.spawner import GPUSpawner

        config = Config()
        config.KubeSpawner.namespace = "probe"
        config.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
        for key, value in state.kube.items():
            setattr(config.KubeSpawner, key, value)
        for key, value in state.gpu.items():
            setattr(config.GPUSpawner, key, value)
        spawner = GPUSpawner(hub=Hub(), user=_User(f"truth{state.seed}"), config=config)
        spawner.server = spawner.user.server
        return spawner

    async def check(self, state: State) -> list[Result]:
        from gpuspawner.offerings.choice import Choice

        spawner = self.spawner(state)
        index = spawner.inventory.index
        names = set(self.previous_nodes)
        bound = len(state.pods)
        await self._until(lambda: self._index_at(index, names, bound), "the inventory to see the state")
        results = []
        for offering in await spawner.catalog():
            if not offering.resources:
                continue
            predicted = index.availability(offering).free or 0
            spawner.apply_choice(Choice(offering, 1))
            manifest = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
            placed = await self.place(manifest, predicted + MORE)
            result = Result(state.seed, offering.slug, predicted, placed)
            if not result.agrees:  # a scheduler cache a moment behind the last deletions: once more
                await self._clear(("probe",))
                await self._until(lambda: self._index_at(index, names, bound), "the inventory to settle")
                result = Result(state.seed, offering.slug, predicted, await self.place(manifest, predicted + MORE), retried=True)
            results.append(result)
            await self._clear(("probe",))
            await self._until(lambda: self._index_at(index, names, bound), "the inventory to see the probe pods gone")
        return results

    async def _index_at(self, index: ClusterIndex, names: set[str], pods: int) -> bool:
        return set(index.nodes) == names and len(index.pods) == pods and not index.reservations

    async def place(self, manifest: dict[str, Any], count: int) -> int:
        """Create ``count`` copies of the pod; how many does the scheduler bind?"""
        from gpuspawner.hub.scheduling import unschedulable_reason

        prefix = manifest["metadata"]["name"][:40]
        bodies = []
        for i in range(count):
            body = json.loads(json.dumps(manifest))
            body["metadata"]["name"] = f"{prefix}-{i}"
            bodies.append(body)
        await asyncio.gather(*(self.api.create_namespaced_pod("probe", b) for b in bodies))

        async def settled() -> bool:
            items = await self._pods("probe")
            states = [self.api.api_client.sanitize_for_serialization(p) for p in items]
            return all(s["spec"].get("nodeName") or unschedulable_reason(s) for s in states)

        await self._until(settled, "every probe pod bound or refused")
        items = await self._pods("probe")
        return sum(1 for p in items if p.spec.node_name)


async def run_states(seeds: list[int], log: Callable[[str], None]) -> list[Result]:
    harness = Harness(log)
    await harness.setup()
    results: list[Result] = []
    for n, seed in enumerate(seeds, 1):
        started = time.monotonic()
        state = draw_state(seed)
        await harness.load(state)
        found = await harness.check(state)
        results.extend(found)
        bad = [r for r in found if not r.agrees]
        log(
            f"state {seed} ({n}/{len(seeds)}): {len(state.nodes)} nodes, {len(state.pods)} pods, "
            f"{len(found)} offerings, {len(bad)} disagree, {time.monotonic() - started:.1f}s"
        )
        for r in bad:
            log(
                f"  DISAGREE seed {seed} {r.slug}: inventory free {r.predicted}, scheduler bound {r.placed}"
                + (f" (of {r.predicted + MORE} created)" if r.placed == r.predicted + MORE else "")
            )
            for line in state.schemes:
                log(f"    {line}")
    return results


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def on_devcluster(prefix: str, work: Callable[[DevCluster], Coroutine[Any, Any, T]]) -> T:
    """Run ``work`` on a fresh devcluster of no nodes, with KubeSpawner's clients pointed at it; then stop it."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        cluster = DevCluster(Path(scratch) / "cluster")
        cluster.up(nodes=[], log=lambda msg: print(msg, file=sys.stderr))
        try:
            os.environ.update(cluster.env())
            from kubernetes_asyncio.config import kube_config

            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(cluster.kubeconfig)
            return asyncio.run(work(cluster))
        finally:
            cluster.down(quiet=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuspawner.devcluster.truth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=200, help="states to check, seeds 0..N-1 (default 200)")
    parser.add_argument("--seeds", help="exactly these seeds, e.g. 0-9 or 3,17,40-45")
    parser.add_argument("--json", metavar="FILE", help="also write every offering's result here")
    parser.add_argument("--quiet", action="store_true", help="print only disagreements and the summary")
    args = parser.parse_args(argv)
    seeds = _seeds(args.seeds) if args.seeds else list(range(args.states))
    started = time.monotonic()

    def log(line: str) -> None:
        if not args.quiet or "DISAGREE" in line or line.startswith("    "):
            print(line, flush=True)

    results = on_devcluster("gpuspawner-truth-", lambda cluster: run_states(seeds, log))
    agree = sum(r.agrees for r in results)
    retried = sum(r.retried for r in results)
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "agrees": r.agrees} for r in results], indent=1))
    print(f"{agree} of {len(results)} offerings agree over {len(seeds)} states ({retried} placed twice, {time.monotonic() - started:.0f}s)")
    return 0 if agree == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
