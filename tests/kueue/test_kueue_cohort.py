"""Kueue's whole queue as the hub sees it, on the real Kueue (v0.17.0, the session devcluster of
tests/kueue) (issue #38):

* **Borrowing.** A ClusterQueue of 1 H100 GPU in a cohort whose other queue lends 2: the spawn
  page says the queue allows 3 more (2 by borrowing), Kueue admits three servers of admission
  ``block`` (the last two by borrowing), the page agrees at each step, and only the fourth is
  refused, in the page's words.
* **The place.** Another namespace's same-named LocalQueue on the same ClusterQueue holds a
  pod beside the hub's held spawn: the spawn says the ClusterQueue's place (of 2) with its
  LocalQueue's (1 of 1) beside it, as Kueue's ClusterQueue view orders them, though Kueue
  v0.17.0's own LocalQueue numbers count the other namespace's workload too.
* **Who waits.** A batch Job held for the same H100 flavor (another namespace, another
  LocalQueue on the same ClusterQueue) is counted as waiting for the H100 offering, from the
  visibility API, and published on the hub's metrics for the culler; a Job for another
  flavor's nodes is not.
"""

from __future__ import annotations

import asyncio
import html
import secrets
import time

import pytest
from prometheus_client import generate_latest

from gpuspawner.hub import kueue as hubkueue
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.kueuevisibility import KueueWaiting
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names.kueuenames import QUEUE_LABEL
from gpuspawner.names.vocabulary import KUEUE_WORKLOADS_WAITING
from tests.conftest import fresh_namespace, wait_for
from tests.integration.test_spawner import pod_of
from tests.kueue.test_kueue_devcluster import GPU_TOLERATION, H100, cluster_queue, condition, gpu_pod, local_queue, queues, workload_of
from tests.kueue.test_kueue_spawn import spawner_in

pytestmark = pytest.mark.cluster
OFFERING = "gpu-nvidia-h100-80gb-hbm3"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta2"


@pytest.fixture(autouse=True)
async def own_watch(monkeypatch):
    """The hub's watches of this test's own (the process's inventory and reader of Kueue's queue
    are one per API server, and watch the LocalQueues of the namespace that first asked),
    stopped at its end."""
    monkeypatch.setattr(Inventory, "_instances", {})
    monkeypatch.setattr(KueueWaiting, "_instances", {})
    yield
    for waiting in KueueWaiting._instances.values():
        if waiting._task is not None:
            waiting._task.cancel()
    for inventory in Inventory._instances.values():
        await inventory.stop()


@pytest.fixture
def other_ns(kube):
    """A second namespace (another team's, another hub's)."""
    yield from fresh_namespace(kube, f"ko-{secrets.token_hex(3)}")


def active(kube, name: str) -> bool:
    status = kube.request("GET", f"{KUEUE}/clusterqueues/{name}").get("status") or {}
    return any(c["type"] == "Active" and c["status"] == "True" for c in status.get("conditions") or [])


async def until(check, what: str, timeout: float = 90):
    """Wait (in the spawner's loop, so that its watches go on) until ``check()`` (a coroutine) is true."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)
    return found


async def test_a_borrowing_cohort_admits_and_the_page_agrees(cluster, kube, ns):
    flavor, cohort = f"h100-{ns}", f"co-{ns}"
    kube.request(
        "POST",
        f"{KUEUE}/resourceflavors",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor}, "spec": {"nodeLabels": H100}},
    )
    cluster_queue(kube, f"mine-{ns}", flavor, 1, cohort)
    cluster_queue(kube, f"lender-{ns}", flavor, 2, cohort)  # nothing of its own runs: it lends its 2
    local_queue(kube, ns, f"mine-{ns}")
    await asyncio.to_thread(wait_for, lambda: active(kube, f"mine-{ns}") and active(kube, f"lender-{ns}"), "both ClusterQueues Active", 60)

    async def page_says(text: str):
        page = html.unescape(await spawner_in(cluster, ns, admission="block")._render_gpu_form())
        return page if text in page else None

    started = []
    try:
        await until(
            lambda: page_says(f"8 free on the nodes; your queue 'ml-course' allows 3 more (2 by borrowing from cohort '{cohort}')"),
            "the page to count the cohort's 2",
        )
        for left in ("2 more by borrowing", "1 more by borrowing"):
            server = spawner_in(cluster, ns, admission="block")
            await server.start()
            started.append(server)
            assert (await pod_of(server))["spec"]["nodeName"]  # Kueue admitted it and the scheduler bound it
            await until(
                lambda left=left: page_says(f"your queue 'ml-course' allows {left} from cohort '{cohort}'"), f"the page to say {left}"
            )
        last = spawner_in(cluster, ns, admission="block")
        await last.start()  # the queue's own GPU is used and one is borrowed: 'block' lets Kueue lend the second
        started.append(last)
        assert (await pod_of(last))["spec"]["nodeName"]

        await until(lambda: page_says("5 free on the nodes; your queue 'ml-course' allows none more"), "the page to say none more")
        reservation = kube.request("GET", f"{KUEUE}/clusterqueues/mine-{ns}")["status"]["flavorsReservation"]
        assert [r["total"] for r in reservation[0]["resources"] if r["name"] == "nvidia.com/gpu"] == [
            "3"
        ]  # Kueue's own books: 1 + 2 borrowed
        refused = spawner_in(cluster, ns, admission="block")
        with pytest.raises(SpawnRefused) as refusal:
            await refused.start()
        assert refusal.value.status_code == 409 and "your queue 'ml-course' allows none more" in str(refusal.value), str(refusal.value)
    finally:
        for server in started:
            await server.stop(now=True)


async def test_the_place_is_the_cluster_queues_with_the_local_queues_beside_it(cluster, kube, ns, other_ns, monkeypatch):
    monkeypatch.setattr(hubkueue.KueueReader, "unserved_until", 0.0)
    monkeypatch.setattr(hubkueue.KueueReader, "cluster_view_until", 0.0)
    queues(kube, ns, gpus=1)
    cq = f"cq-{ns}"
    local_queue(kube, other_ns, cq)  # another namespace's LocalQueue of the same name, on the same ClusterQueue
    running = spawner_in(cluster, ns)
    await running.start()
    held = spawner_in(cluster, ns)
    starting = None
    try:
        kube.request("POST", f"/api/v1/namespaces/{other_ns}/pods", gpu_pod("ahead"))  # waits first
        await asyncio.to_thread(
            wait_for,
            lambda: (condition(workload_of(kube, other_ns, "ahead"), "QuotaReserved") or {}).get("status") == "False",
            "the other team's pod held",
            60,
        )
        starting = asyncio.ensure_future(held.start())

        def kueue_words() -> str | None:
            """The place Kueue's ClusterQueue view gives the held spawn, in the progress' words."""
            items = kube.request("GET", f"{VISIBILITY}/clusterqueues/{cq}/pendingworkloads")["items"]
            ours = [i for i in items if i["metadata"]["namespace"] == ns]
            if len(items) != 2 or len(ours) != 1:
                return None
            return f"(position {ours[0]['positionInClusterQueue'] + 1} of 2 in ClusterQueue {cq}; 1 of 1 in queue ml-course)"

        def agree() -> list[str]:
            words = kueue_words()
            return [m for m in held.spawn_state.messages[-1:] if words and words in m]

        try:
            said = await asyncio.to_thread(wait_for, agree, "the spawn's place as Kueue's ClusterQueue view gives it", 60)
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}; Kueue says {kueue_words()}; the spawn's progress: {held.spawn_state.messages}")
        assert said[0].startswith("Waiting for GPU quota in queue ml-course (position "), said

        # Kueue's ClusterQueue view, as the API server answers it: the other team's pod and ours,
        # each first in its own LocalQueue; v0.17.0 counts both "ml-course" LocalQueues as one
        # (kubernetes-sigs/kueue #14431, fixed in v0.18.6): the second listed gets positionInLocalQueue 1
        items = kube.request("GET", f"{VISIBILITY}/clusterqueues/{cq}/pendingworkloads")["items"]
        assert sorted(i["metadata"]["namespace"] for i in items) == sorted([ns, other_ns]), items
        assert [i["positionInLocalQueue"] for i in items] == [0, 1], items
        # and its LocalQueue view lists the other namespace's workload too (#10672, fixed in v0.17.2)
        mine = kube.request("GET", f"{VISIBILITY}/namespaces/{ns}/localqueues/ml-course/pendingworkloads")["items"]
        assert sorted(i["metadata"]["namespace"] for i in mine) == sorted([ns, other_ns]), mine
    finally:
        if starting is not None:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        for spawner in (running, held):
            await spawner.stop(now=True)


def batch_job(name: str, queue: str, selector: dict[str, str]) -> dict:
    limits = {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "train", "image": "pytorch/pytorch", "resources": {"requests": limits, "limits": limits}}],
                    "nodeSelector": selector,
                    "tolerations": [GPU_TOLERATION],
                }
            },
        },
    }


async def test_a_batch_job_held_for_the_flavor_counts_as_waiting_for_the_offering(cluster, kube, ns, other_ns):
    queues(kube, ns, gpus=1)
    cq = f"cq-{ns}"
    local_queue(kube, other_ns, cq, name="batch")
    running = spawner_in(cluster, ns)
    await running.start()  # the queue's one GPU
    try:
        kube.request("POST", f"/apis/batch/v1/namespaces/{other_ns}/jobs", batch_job("train", "batch", H100))
        # a Job for the A100's nodes: no flavor of this ClusterQueue takes it (Kueue holds it too), and it does not wait for the H100
        kube.request(
            "POST",
            f"/apis/batch/v1/namespaces/{other_ns}/jobs",
            batch_job("elsewhere", "batch", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
        )

        def listed() -> list[str]:
            items = kube.request("GET", f"{VISIBILITY}/clusterqueues/{cq}/pendingworkloads")["items"]
            return [o["name"] for i in items for o in i["metadata"].get("ownerReferences") or []]

        await asyncio.to_thread(wait_for, lambda: "train" in listed(), "the H100 Job pending in the ClusterQueue", 60)
        namespace = None if running.enable_user_namespaces else running.namespace
        waiting = KueueWaiting.shared(running.api, running.inventory, namespace, running.kueue_routing, await running.catalog())

        async def counted():
            counts = await waiting.read_once()
            return counts if counts.get((OFFERING, cq)) else None

        assert await until(counted, "the held Job counted for the H100") == {(OFFERING, cq): 1}
        exposition = generate_latest().decode()
        series = [
            line for line in exposition.splitlines() if line.startswith(KUEUE_WORKLOADS_WAITING + "{") and f'cluster_queue="{cq}"' in line
        ]
        assert len(series) == 1 and f'offering="{OFFERING}"' in series[0] and series[0].endswith(" 1.0"), series
    finally:
        await running.stop(now=True)
