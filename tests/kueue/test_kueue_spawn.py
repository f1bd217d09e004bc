"""GPUSpawner's servers through the real Kueue (v0.17.0, on a devcluster of its own): the
queue mapping on the pod, a spawn Kueue holds saying so in its progress and starting once
admitted, a spawn Kueue can never admit refused in seconds with Kueue's reason, a server Kueue
preempts for a higher-priority one stopped with the reason kept for the home page (its quota
given back when its pod goes, before any stop by the hub), and Kueue
down: a 503 naming it at once, and a stop that Kueue's finalizer would hold forever finished."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuspawner.hub import kueue as hubkueue
from gpuspawner.hub.admitting import reservation_key
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names.kueuenames import ADMISSION_GATE, MANAGED_FINALIZER, PRIORITY_LABEL, QUEUE_LABEL
from gpuspawner.names.vocabulary import STOP_NOTICE_KEY
from gpuspawner.spawner import GPUSpawner
from tests.conftest import wait_for
from tests.integration.test_spawner import User, make_spawner, pod_of
from tests.kueue.test_kueue_devcluster import queues

pytestmark = pytest.mark.cluster
H100 = "gpu-nvidia-h100-80gb-hbm3"
KUEUE = "kueue.x-k8s.io/v1beta2"


def spawner_in(cluster, ns, groups=(), **config) -> GPUSpawner:
    """A spawn through the LocalQueue ml-course; with admission 'warn' (docs/kueue.md) Kueue holds
    what its queue cannot admit yet, where 'block' would refuse it at once."""
    config.setdefault("admission", "warn")
    spawner = make_spawner(cluster, ns, kueue_queues={"default": "ml-course"}, **config)
    spawner.user = User(spawner.user.name, groups=groups)
    spawner.server = spawner.user.server
    spawner.user_options = {"offering": H100}
    return spawner


async def test_a_held_spawn_says_so_and_starts_once_kueue_admits_it(cluster, kube, ns):
    queues(kube, ns, gpus=1)
    first = spawner_in(cluster, ns)
    await first.start()
    try:
        pod = await pod_of(first)
        assert pod["metadata"]["labels"][QUEUE_LABEL] == "ml-course" and PRIORITY_LABEL not in pod["metadata"]["labels"]
        assert pod["spec"]["nodeName"] and not pod["spec"].get("schedulingGates")

        second = spawner_in(cluster, ns)
        starting = asyncio.ensure_future(second.start())
        said = await asyncio.to_thread(
            wait_for, lambda: [m for m in second.spawn_state.messages if m.startswith("Waiting for GPU quota")], "held", timeout=60
        )
        assert said[0].startswith("Waiting for GPU quota in queue ml-course"), said  # (its place, once Kueue lists it)
        assert "Kueue says: couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu" in said[-1], said
        assert not starting.done()
        # held by Kueue, it holds no GPU on the nodes: its reservation in the counts is given back
        assert reservation_key(second) not in Inventory.running(second.api).index.reservations
        assert ADMISSION_GATE in [g["name"] for g in (await pod_of(second))["spec"]["schedulingGates"]]
    finally:
        await first.stop(now=True)
    try:
        await asyncio.wait_for(starting, 90)  # admitted once the first server's quota is back
        assert "Kueue admitted the server in queue ml-course." in second.spawn_state.messages
        assert (await pod_of(second))["spec"]["nodeName"]
    finally:
        await second.stop(now=True)


async def test_a_spawn_kueue_cannot_admit_is_refused_in_seconds_with_its_reason(cluster, kube, ns):
    queues(kube, ns, gpus=2)
    nowhere = make_spawner(cluster, ns, kueue_queues={"default": "no-such-queue"})
    nowhere.user_options = {"offering": H100}
    began = time.monotonic()
    with pytest.raises(SpawnRefused) as refused:
        await nowhere.start()
    assert refused.value.status_code == 409
    assert str(refused.value) == (
        "Kueue cannot admit this server in queue no-such-queue: LocalQueue no-such-queue doesn't exist. Please tell your administrator."
    )
    assert time.monotonic() - began < nowhere.start_timeout
    wait_for(lambda: not kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"], "the refused pod deleted", timeout=30)

    too_big = spawner_in(cluster, ns)
    too_big.user_options = {"offering": H100, "count": "4"}
    with pytest.raises(SpawnRefused) as refused:
        await too_big.start()
    assert str(refused.value).startswith("Kueue can never admit this server in queue ml-course: couldn't assign flavors"), refused.value
    assert "> maximum capacity (2)" in str(refused.value)


async def test_a_preempted_server_is_stopped_with_kueues_reason(cluster, kube, ns):
    queues(kube, ns, gpus=1)
    # A merge patch of the spec alone: a GET and PUT of the whole object races Kueue's own
    # updates of its status (409 Conflict, seen in a run of tests/kueue).
    kube.request("PATCH", f"/apis/{KUEUE}/clusterqueues/cq-{ns}", {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}})
    for name, value in ((f"low-{ns}", 10), (f"high-{ns}", 1000)):
        kube.request(
            "POST",
            f"/apis/{KUEUE}/workloadpriorityclasses",
            {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value},
        )
    priorities = {"students": f"low-{ns}", "staff": f"high-{ns}"}
    low = spawner_in(cluster, ns, groups=["students"], kueue_priority_classes=priorities)
    await low.start()
    assert (await pod_of(low))["metadata"]["labels"][PRIORITY_LABEL] == f"low-{ns}"
    high = spawner_in(cluster, ns, groups=["staff"], kueue_priority_classes=priorities)
    try:
        await asyncio.wait_for(high.start(), 90)  # Kueue stops the low-priority server to admit it
        # its units are back before the hub polls or stops it: the index's watch saw its pod go
        for _ in range(900):
            if reservation_key(low) not in low.quota_ledger.grants:
                break
            await asyncio.sleep(0.1)  # (the inventory's watch runs in this loop)
        assert reservation_key(low) not in low.quota_ledger.grants, "the preempted server's units are still counted"
        status = None
        for _ in range(300):
            status = await low.poll()
            if status is not None:
                break
            await asyncio.sleep(0.2)
        assert status is not None, "the preempted server still polls as running"
        text = low.stop_notice["text"]
        assert text.startswith("Your server was stopped at ") and text.endswith(
            " to make room for a higher-priority job in queue ml-course."
        ), text
        await low.stop(now=True)
        low.clear_state()
        assert low.get_state()[STOP_NOTICE_KEY]["text"] == text  # saved past the stop, for the home page
    finally:
        await high.stop(now=True)


async def test_kueue_down_a_spawn_gets_a_503_at_once_and_a_stop_still_finishes(cluster, kube, ns, monkeypatch):
    queues(kube, ns, gpus=2)
    running = spawner_in(cluster, ns)
    await running.start()
    assert MANAGED_FINALIZER in (await pod_of(running))["metadata"]["finalizers"]
    kueue = cluster.kueue()
    kueue.stop()
    try:
        refused_spawner = spawner_in(cluster, ns)
        began = time.monotonic()
        with pytest.raises(SpawnRefused) as refused:
            await refused_spawner.start()
        assert refused.value.status_code == 503 and time.monotonic() - began < 30
        assert str(refused.value).startswith("Kueue, which admits this cluster's servers, is not answering, so no server can start now")
        assert 'failed calling webhook "mpod.kb.io"' in str(refused.value)
        assert await refused_spawner.poll() == 1

        # The running server's pod keeps Kueue's finalizer with Kueue gone: the stop removes it.
        monkeypatch.setattr(hubkueue, "FINALIZER_GRACE", 2.0)
        await asyncio.wait_for(running.stop(now=True), 60)
        names = [p["metadata"]["name"] for p in kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]]
        assert running.pod_name not in names
    finally:
        kueue.start()
