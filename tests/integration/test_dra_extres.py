"""A plain ``nvidia.com/gpu`` offering served by DRA devices (the extended-resource mapping), and
a DRA device that must be prepared before its pod binds (binding conditions), on the real
control plane: the simulated NVIDIA driver publishes a node labelled like an H100 node but with
no ``nvidia.com/gpu`` in its allocatable (``dradriver.EXTRES_NODE``; the ``gpu.nvidia.com``
class maps ``nvidia.com/gpu``), and an A10 whose device has binding conditions
(``dradriver.ATTACHED_NODE``). The real kube-scheduler makes the claim of a plain pod and waits
in PreBind for the device's condition; the test plays the driver that sets it.
"""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest
from jupyterhub.objects import Hub
from traitlets.config import Config

from gpuspawner.core.noticewords import READY_WORDS, preparing_words
from gpuspawner.devcluster.dradriver import (
    ATTACHED_NODE,
    BOUND_CONDITION,
    DRA_NODES,
    EXTRES_NODE,
    SimulatedDriver,
    node_devices,
    resource_slices,
)
from gpuspawner.dra.extres import EXTENDED_CLAIM_ANNOTATION
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names import dranames as dn
from gpuspawner.spawner import GPUSpawner
from tests.conftest import wait_for
from tests.integration.test_dra_spawn import User, nothing_left
from tests.unit.test_dra_alternatives import ENTRY

pytestmark = pytest.mark.cluster

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
OFFERINGS = [
    # A device-plugin offering as an admin writes it; on this cluster only the DRA node is labelled for it.
    {
        "slug": "h100-plain",
        "kind": "full",
        "display_name": "H100 (plain request)",
        "resources": {"nvidia.com/gpu": 1},
        "node_selector": {"gpuspawner.io/dra": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "counts": [1, 2],
    },
    {"slug": "a10-attached", "kind": "full", "display_name": "A10 (attached on demand)", "product": "NVIDIA A10", "dra": {}},
    ENTRY,  # "this, or else that": a MIG 3g.20gb, or a 2g.10gb if none is free (tests.unit.test_dra_alternatives)
]


@pytest.fixture(scope="module")
def mapped_driver(kube):
    driver = SimulatedDriver(kube, (EXTRES_NODE, ATTACHED_NODE, DRA_NODES[2]))
    driver.install()
    try:
        yield driver
    finally:
        driver.uninstall()


def make_spawner(devcluster, namespace: str) -> GPUSpawner:
    os.environ["KUBECONFIG"] = str(devcluster.kubeconfig)
    config = Config()
    config.KubeSpawner.namespace = namespace
    config.KubeSpawner.start_timeout = 120
    config.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
    config.GPUSpawner.discover_offerings = False
    config.GPUSpawner.offerings = OFFERINGS
    config.GPUSpawner.inventory_ready_timeout = 60.0
    spawner = GPUSpawner(hub=Hub(), user=User(f"u{secrets.token_hex(3)}"), config=config)
    spawner.server = spawner.user.server
    return spawner


async def free_of(spawner: GPUSpawner, slug: str, want: int) -> int | None:
    offering = next(o for o in await spawner.catalog() if o.slug == slug)
    for _ in range(300):
        free = spawner.availability(offering).free
        if free == want:
            break
        await asyncio.sleep(0.1)
    return free


async def test_a_plain_gpu_request_on_a_dra_node_gets_the_schedulers_claim_counted_once_and_recorded(
    devcluster, kube, mapped_driver, namespace
):
    spawner = make_spawner(devcluster, namespace)
    assert await free_of(spawner, "h100-plain", 2) == 2  # the DRA node's two H100s, though its allocatable has none
    spawner.user_options = {"offering": "h100-plain", "count": 1}
    await spawner.start()
    try:
        pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{spawner.pod_name}")
        assert pod["spec"]["nodeName"] == EXTRES_NODE.name and "resourceClaims" not in pod["spec"]
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = kube.request("GET", CLAIMS.format(ns=namespace) + f"/{name}")
        assert claim["metadata"]["annotations"][EXTENDED_CLAIM_ANNOTATION] == "true"
        assert [(o["kind"], o["name"]) for o in claim["metadata"]["ownerReferences"]] == [("Pod", spawner.pod_name)]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["request"].startswith("container-") and result["pool"] == EXTRES_NODE.name
        uuids = {d["name"]: d["attributes"][dn.ATTR_UUID]["string"] for d in node_devices(EXTRES_NODE)}
        (recorded,) = spawner.user_options["gpuspawner"]["devices"]
        assert (recorded["device"], recorded["uuid"]) == (result["device"], uuids[result["device"]])
        # One GPU taken, counted once: the claim's device (not also the pod's nvidia.com/gpu request).
        assert await free_of(spawner, "h100-plain", 1) == 1
    finally:
        await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}
    assert await free_of(spawner, "h100-plain", 2) == 2


async def test_a_plain_request_the_scheduler_cannot_serve_is_refused_with_its_reason(devcluster, kube, mapped_driver, namespace):
    """The driver republishes the node's pool (a new generation, one of its two slices so far):
    the count is unknown, the spawn goes to the scheduler, and it refuses within seconds."""
    devices = node_devices(EXTRES_NODE)
    first, _second = resource_slices(EXTRES_NODE.name, devices, generation=2, slice_count=2)
    kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", first)
    spawner = make_spawner(devcluster, namespace)
    try:
        assert await free_of(spawner, "h100-plain", None) is None
        spawner.user_options = {"offering": "h100-plain", "count": 1}
        with pytest.raises(SpawnRefused) as refused:
            await spawner.start()
        message = str(refused.value)
        assert refused.value.status_code == 409
        assert "H100 (plain request) cannot run now. The scheduler says: 0/" in message
        assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}
    finally:
        mapped_driver.publish(EXTRES_NODE.name, devices)


async def test_a_device_with_binding_conditions_shows_as_a_progress_step_until_the_driver_prepares_it(
    devcluster, kube, mapped_driver, namespace
):
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = {"offering": "a10-attached"}
    messages: list[str] = []

    async def follow() -> None:
        async for event in spawner.progress():
            messages.append(event["message"])

    starting = asyncio.ensure_future(spawner.start())
    following = asyncio.ensure_future(follow())
    try:
        step = preparing_words([BOUND_CONDITION])
        for _ in range(600):
            if step in messages or starting.done():
                break
            await asyncio.sleep(0.1)
        assert step in messages, messages
        pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{spawner.pod_name}")
        assert not pod["spec"].get("nodeName")  # the scheduler holds it in PreBind
        claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        mapped_driver.set_device_condition(namespace, claim)
        await asyncio.wait_for(starting, 120)
        pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{spawner.pod_name}")
        assert pod["spec"]["nodeName"] == ATTACHED_NODE.name
        wait_for(lambda: READY_WORDS in messages or starting.done(), "the ready step")
    finally:
        following.cancel()
        if not starting.done():
            starting.cancel()
        await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_this_or_else_that_gets_the_second_choice_once_the_first_is_taken_and_says_so(devcluster, kube, mapped_driver, namespace):
    first, second = make_spawner(devcluster, namespace), make_spawner(devcluster, namespace)
    assert await free_of(first, "mig-3g-or-2g", 2) == 2
    # The spawn page names each choice with its own count, not the whole offering's (issue 41: it looked them up by slug).
    assert "MIG 3g.20gb (1 free), or MIG 2g.10gb if none is free (1 free)" in await first.get_options_form()
    first.user_options = second.user_options = {"offering": "mig-3g-or-2g"}
    await first.start()
    try:
        await second.start()
        got = [[d["choice"] for d in s.user_options["gpuspawner"]["devices"]] for s in (first, second)]
        assert got == [["MIG 3g.20gb"], ["MIG 2g.10gb"]]
        assert second.user_options["gpuspawner"]["devices"][0]["request"] == "gpuspawner-gpu/mig-2g-10gb"
        pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{second.pod_name}")
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert "2g.10gb" in env["GPUSPAWNER_CHOICES"]
        assert await free_of(first, "mig-3g-or-2g", 0) == 0
    finally:
        await first.stop(now=True)
        await second.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}
