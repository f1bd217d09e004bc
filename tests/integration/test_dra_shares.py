"""GPU-memory shares and device taints on the real control plane: the simulated NVIDIA DRA driver
publishes L40S GPUs in the ConsumableShares shape (``--consumable-shares=memory``), the real
kube-scheduler allocates amounts of them, kube-controller-manager's device-taint-eviction-controller
evicts the pods of a NoExecute-tainted device, kwok runs the pods. Afterwards nothing the spawner
made is left in the namespace.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from urllib.parse import urlparse

import pytest

from gpuspawner.devcluster.dradriver import DRA_NODES, SHARE_NODES, SimulatedDriver, node_devices
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names.vocabulary import STOP_NOTICE_KEY
from gpuspawner.pod.memguard import JAX_FRACTION
from tests.conftest import installed
from tests.integration import test_dra_spawn as base
from tests.integration.test_dra_spawn import claim_of, make_spawner, nothing_left

pytestmark = pytest.mark.cluster

L40S = "NVIDIA L40S"
SHARES = [
    {"slug": "l40s-40g", "kind": "shared", "display_name": "40 GB of an L40S", "product": L40S, "dra": {"memory": "40Gi"}},
    {
        "slug": "l40s-8g",
        "kind": "shared",
        "display_name": "8 GB of an L40S",
        "product": L40S,
        "dra": {"memory": "8Gi"},
    },
]
NOTHING = {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


@pytest.fixture(scope="module")
def share_driver(kube):
    """The L40S node of SHARE_NODES (two GPUs of 46068 MiB), after the DRA_NODES' pod-network bands."""
    yield from installed(SimulatedDriver(kube, SHARE_NODES, first_index=len(DRA_NODES)))


@pytest.fixture
def spawner_of(devcluster, namespace, monkeypatch):
    monkeypatch.setattr(base, "OFFERINGS", SHARES)
    made = []

    def make(offering: str):
        spawner = make_spawner(devcluster, namespace)
        spawner.user_options = {"offering": offering}
        made.append(spawner)
        return spawner

    yield make


def result_of(kube, namespace: str, spawner) -> dict:
    (result,) = claim_of(kube, namespace, spawner.pod_name)["status"]["allocation"]["devices"]["results"]
    return result


async def free_of(spawner, slug: str, expected: int) -> int | None:
    """The spawner's free count of ``slug`` once its watch shows ``expected`` (waited on for at most 30 s, then returned as it is)."""
    offering = next(o for o in await spawner.catalog() if o.slug == slug)
    for _ in range(300):
        if spawner.availability(offering).free == expected:
            break
        await asyncio.sleep(0.1)
    return spawner.availability(offering).free


async def test_memory_shares_split_a_gpu_refuse_with_the_schedulers_reason_and_leave_nothing(kube, share_driver, namespace, spawner_of):
    first, second, third = spawner_of("l40s-40g"), spawner_of("l40s-40g"), spawner_of("l40s-8g")
    assert await free_of(first, "l40s-8g", 10) == 10  # five 8 GiB shares in each GPU's 46068 MiB
    await first.start()
    try:
        got = result_of(kube, namespace, first)
        assert got["pool"] == "dra-l40s" and got["consumedCapacity"] == {"memory": "40Gi"} and got["shareID"]
        # The guard is sized from the 40 GiB asked of the 46068 MiB GPU: 20480 MiB per process, less 512.
        env = {
            e["name"]: e.get("value")
            for e in kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{first.pod_name}")["spec"]["containers"][0]["env"]
        }
        assert env[JAX_FRACTION] == "0.433"
        assert await free_of(first, "l40s-8g", 5) == 5  # 5108 MiB left on that GPU: none of 8 GiB there
        await second.start()
        assert result_of(kube, namespace, second)["device"] != got["device"]
        assert await free_of(first, "l40s-8g", 0) == 0
        with pytest.raises(SpawnRefused) as refused:  # counted none free: refused before a pod is made
            await third.start()
        assert refused.value.status_code == 409 and "8 GB of an L40S" in str(refused.value) and "free" in str(refused.value)
    finally:
        for spawner in (third, second, first):
            await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == NOTHING


async def test_a_noexecute_device_taint_stops_the_server_and_the_home_page_says_why(kube, share_driver, namespace, spawner_of):
    spawner = spawner_of("l40s-8g")
    address = urlparse(await spawner.start())
    spawner.server.ip, spawner.server.port = address.hostname, address.port  # as JupyterHub's User.spawn does
    try:
        device = result_of(kube, namespace, spawner)["device"]
        taint = {"key": "gpu.nvidia.com/maintenance", "value": "replace", "effect": "NoExecute"}
        spec = replace(SHARE_NODES[0], taints={device: (taint,)})
        share_driver.publish(spec.name, node_devices(spec), generation=2)
        for _ in range(600):  # the eviction controller deletes the pod; kwok finishes it
            if await spawner.poll() is not None:
                break
            await asyncio.sleep(0.1)
        assert await spawner.poll() is not None
        notice = spawner.get_state()[STOP_NOTICE_KEY]["text"]
        assert notice.startswith("Your server was stopped at ")  # the default server: no name
        assert "its GPU was taken out of service" in notice and "NoExecute taint" in notice
        assert await free_of(spawner, "l40s-8g", 5) == 5  # the other GPU's five
        # An admin's DeviceTaintRule (resource.k8s.io/v1, Kubernetes 1.37) on the other GPU: the counts
        # read it as the scheduler does (issue 41), so nothing is free and the spawn is refused before a pod is made.
        other = next(d["name"] for d in node_devices(spec) if d["name"] != device)
        rule = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"drain-{namespace}"},
            "spec": {
                "deviceSelector": {"driver": "gpu.nvidia.com", "pool": spec.name, "device": other},
                "taint": {"key": "gpu.nvidia.com/maintenance", "value": "drain", "effect": "NoSchedule"},
            },
        }
        kube.request("POST", "/apis/resource.k8s.io/v1/devicetaintrules", rule)
        again = spawner_of("l40s-8g")
        try:
            assert await free_of(again, "l40s-8g", 0) == 0
            with pytest.raises(SpawnRefused) as refused:
                await again.start()
        finally:
            kube.request("DELETE", f"/apis/resource.k8s.io/v1/devicetaintrules/drain-{namespace}")
        message = str(refused.value)
        assert refused.value.status_code == 409 and "8 GB of an L40S" in message and "free" in message
        assert await free_of(again, "l40s-8g", 5) == 5  # the rule gone: its GPU's five again
        await again.stop(now=True)
    finally:
        await spawner.stop(now=True)
        share_driver.publish(SHARE_NODES[0].name, node_devices(SHARE_NODES[0]), generation=3)
    assert await nothing_left(kube, namespace) == NOTHING
