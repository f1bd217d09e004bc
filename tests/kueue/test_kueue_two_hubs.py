"""Two hubs in two namespaces sharing one ClusterQueue on the real Kueue (v0.17.0; issue #27):
together they never hold more than its quota, under 20 concurrent spawns from each; a Kueue
restart in the middle loses no notebook and leaves no gated pod behind.

Each "hub" is a set of GPUSpawner objects in this test's process with a hub identity of its
own (``hub_id``), in a namespace of its own, its GPU offerings mapped to a LocalQueue there
(``kueue_queues``); both LocalQueues point to one ClusterQueue with 4 of the H100 node's 8
GPUs, so Kueue, not the nodes, is what limits them. (In one process the two share what a hub
process keeps per API server, its inventory of nodes and pods; with admission ``warn`` neither
is refused by its counts. Two real hubs are two processes.) All 40 spawns start at once (admission
``warn``: the hub lets Kueue hold them) and each server stops shortly after it starts, so the
held ones are admitted in turn. A thread lists the pods of both namespaces in one request every
0.2 s: bound, non-terminating GPU pods never hold more than the quota at any sample.

In the middle, with the quota full and the rest held, Kueue's controller is stopped and started
again: a spawn while it is down gets the 503 naming Kueue; afterwards the four servers that were
running still run (their pods the same, by UID), and the held spawns are admitted as before.
At the end every spawn has started and stopped, and neither namespace holds a pod, gated or not.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pytest

from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names.kueuenames import ADMISSION_GATE, QUEUE_LABEL
from gpuspawner.names.vocabulary import LABEL_HUB
from gpuspawner.spawner import GPUSpawner
from tests.conftest import fresh_namespace, wait_for
from tests.integration.test_spawner import make_spawner
from tests.kueue.test_kueue_devcluster import local_queue, queues

pytestmark = pytest.mark.cluster
H100 = "gpu-nvidia-h100-80gb-hbm3"
GPU = "nvidia.com/gpu"
QUOTA = 4  # of the H100 node's 8 GPUs
SPAWNS = 20  # from each hub, all at once
#: Servers that have come and gone before Kueue is restarted.
BEFORE_RESTART = 12
#: Seconds a server runs before it stops (so that the sampler sees it).
HOLD = 0.5
#: Long enough for the last held spawn's turn: Kueue, not KubeSpawner's timeout, decides when it starts.
START_TIMEOUT = 400


@pytest.fixture
def ns_a(kube):
    yield from fresh_namespace(kube, f"k2a-{secrets.token_hex(3)}")


@pytest.fixture
def ns_b(kube):
    yield from fresh_namespace(kube, f"k2b-{secrets.token_hex(3)}")


def shared_queue(kube, ns_a: str, ns_b: str) -> None:
    """ClusterQueue ``cq-<ns_a>`` with QUOTA H100 GPUs, and LocalQueue ``ml-course`` pointing to it in both namespaces."""
    queues(kube, ns_a, gpus=QUOTA)
    local_queue(kube, ns_b, f"cq-{ns_a}")


def hub_spawner(cluster, ns: str, hub_id: str) -> GPUSpawner:
    spawner = make_spawner(cluster, ns, hub_id=hub_id, kueue_queues={"default": "ml-course"}, admission="warn")
    spawner.start_timeout = START_TIMEOUT
    spawner.user_options = {"offering": H100}
    return spawner


def gpus(pod: dict) -> int:
    return sum(int((c.get("resources") or {}).get("limits", {}).get(GPU, 0)) for c in pod["spec"]["containers"])


def holds_gpus(pod: dict) -> bool:
    """Bound to a node, not being deleted, not finished: its GPUs are taken."""
    return bool(
        pod["spec"].get("nodeName")
        and not pod["metadata"].get("deletionTimestamp")
        and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    )


def gated(pod: dict) -> bool:
    return any(g["name"] == ADMISSION_GATE for g in pod["spec"].get("schedulingGates") or ())


class Sampler(threading.Thread):
    """Every ``every`` seconds, the GPUs that bound pods of ``namespaces`` hold together, from
    one list of the queued pods of all namespaces (one snapshot of the API server's)."""

    def __init__(self, kube, namespaces: tuple[str, ...], every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.kube, self.namespaces, self.every = kube, namespaces, every
        self.samples: list[tuple[int, dict[str, int]]] = []  # (GPUs held, namespace -> GPUs held)
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                pods = self.kube.request("GET", f"/api/v1/pods?labelSelector={QUEUE_LABEL}")["items"]
            except Exception as exc:  # noqa: BLE001 - kept, and the test fails on it
                self.errors.append(repr(exc))
            else:
                by_ns = dict.fromkeys(self.namespaces, 0)
                for pod in pods:
                    if pod["metadata"]["namespace"] in by_ns and holds_gpus(pod):
                        by_ns[pod["metadata"]["namespace"]] += gpus(pod)
                self.samples.append((sum(by_ns.values()), by_ns))
            self.done.wait(self.every)


@dataclass
class Hubs:
    """The spawns of both hubs and where each one is."""

    where: dict[GPUSpawner, str] = field(default_factory=dict)  # starting, running, stopping, stopped, refused
    refusals: dict[GPUSpawner, str] = field(default_factory=dict)
    flowing: asyncio.Event = field(default_factory=asyncio.Event)  # set: running servers stop after HOLD

    def count(self, where: str) -> int:
        return sum(1 for w in list(self.where.values()) if w == where)

    def running(self) -> list[GPUSpawner]:
        return [s for s, w in list(self.where.items()) if w == "running"]

    async def life(self, spawner: GPUSpawner) -> None:
        self.where[spawner] = "starting"
        try:
            url = await spawner.start()
        except SpawnRefused as exc:
            self.where[spawner], self.refusals[spawner] = "refused", str(exc)
            return
        address = urlparse(url)
        spawner.server.ip, spawner.server.port = address.hostname, address.port  # as JupyterHub's User.spawn does
        self.where[spawner] = "running"
        while not self.flowing.is_set():
            await self.flowing.wait()
        self.where[spawner] = "stopping"
        await asyncio.sleep(HOLD)
        await spawner.stop(now=True)
        self.where[spawner] = "stopped"


async def pod_now(kube, spawner: GPUSpawner) -> dict:
    return await asyncio.to_thread(kube.request, "GET", f"/api/v1/namespaces/{spawner.namespace}/pods/{spawner.pod_name}")


async def test_two_hubs_sharing_one_cluster_queue_never_hold_more_than_its_quota(cluster, kube, ns_a, ns_b):
    shared_queue(kube, ns_a, ns_b)
    hubs = Hubs()
    hubs.flowing.set()
    spawners = [hub_spawner(cluster, ns, hub_id) for ns, hub_id in ((ns_a, "hub-a"), (ns_b, "hub-b")) for _ in range(SPAWNS)]
    sampler = Sampler(kube, (ns_a, ns_b))
    sampler.start()
    lives = asyncio.gather(*(hubs.life(s) for s in spawners), return_exceptions=True)
    try:
        # Some servers come and go; then the quota fills up and stays full, the rest held by Kueue.
        await asyncio.to_thread(wait_for, lambda: hubs.count("stopped") >= BEFORE_RESTART, "servers coming and going", timeout=180)
        hubs.flowing.clear()
        await asyncio.to_thread(
            wait_for,
            lambda: len(hubs.running()) == QUOTA and not hubs.count("stopping"),
            f"{QUOTA} servers running, none stopping",
            timeout=120,
        )
        running = hubs.running()
        pods = {s: await pod_now(kube, s) for s in running}
        assert all(pod["metadata"]["labels"][LABEL_HUB] == ("hub-a" if s.namespace == ns_a else "hub-b") for s, pod in pods.items())
        uids = {s: pod["metadata"]["uid"] for s, pod in pods.items()}
        assert hubs.count("starting") == 2 * SPAWNS - hubs.count("stopped") - QUOTA
        held = [s for s, w in list(hubs.where.items()) if w == "starting"]
        assert all([gated(await pod_now(kube, s)) for s in held])  # every spawn left is Kueue's to admit

        kueue = cluster.kueue()
        await asyncio.to_thread(kueue.stop)
        try:
            # Kueue down: a spawn is refused at once with the 503 naming it; the others wait.
            late = hub_spawner(cluster, ns_b, "hub-b")
            with pytest.raises(SpawnRefused) as refused:
                await late.start()
            assert refused.value.status_code == 503, refused.value
            assert str(refused.value).startswith("Kueue, which admits this cluster's servers, is not answering"), refused.value
            assert 'failed calling webhook "mpod.kb.io"' in str(refused.value)
            assert await late.poll() == 1
        finally:
            await asyncio.to_thread(kueue.start)

        # Kueue back: no notebook was lost, none was restarted, and the quota is still full.
        for spawner in running:
            pod = await pod_now(kube, spawner)
            assert pod["metadata"]["uid"] == uids[spawner] and holds_gpus(pod) and not gated(pod), pod["metadata"]["name"]
            assert await spawner.poll() is None
        assert hubs.running() == running

        hubs.flowing.set()  # the held spawns are admitted in turn as the running servers stop
        outcomes = await asyncio.wait_for(lives, START_TIMEOUT + 120)  # (nothing hangs)
    except BaseException:
        lives.cancel()  # the namespaces' fixtures delete what is left
        await asyncio.gather(lives, return_exceptions=True)
        raise
    finally:
        sampler.done.set()
        sampler.join(timeout=10)
    assert not [o for o in outcomes if o is not None], outcomes
    assert not hubs.refusals, hubs.refusals
    assert hubs.count("stopped") == 2 * SPAWNS, hubs.where

    # Together never more than the quota, though the H100 node has room for twice as many.
    assert not sampler.errors, sampler.errors[:3]
    over = [s for s in sampler.samples if s[0] > QUOTA]
    assert not over, over
    assert max(total for total, _ in sampler.samples) == QUOTA  # (the quota was reached: it was what held them)
    assert all(max(by_ns[ns] for _, by_ns in sampler.samples) > 0 for ns in (ns_a, ns_b))  # both hubs ran servers

    # Nothing left behind: no pod in either namespace, gated or not.
    left = [p for ns in (ns_a, ns_b) for p in kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]]
    assert not [p["metadata"]["name"] for p in left if gated(p)]
    assert not left, [p["metadata"]["name"] for p in left]
