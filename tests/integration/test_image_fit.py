"""Images that fit the node, on the devcluster's mixed driver versions (nodes.yaml: the H100 and the
MPS L4 on 570.124.06/CUDA 12.8, the T4s on 535.183.01/CUDA 12.2, the rest on 550.54.15/CUDA 12.4)
with the real kube-scheduler: a pod lands only on a node whose GFD labels meet its image's needs,
a spawn none of whose nodes can run the image is refused at once with the versions in words, the
scheduler refuses in seconds where the hub let a pod through, and a node relabelled after its
driver upgrade takes the next pod. DRA: the claim's semver selectors, accepted and allocated by
the real API server and scheduler."""

from __future__ import annotations

import asyncio
import copy

import pytest

from gpuspawner.dra.claimspec import device_claim_spec
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names.dranames import RESOURCE_API
from tests.conftest import wait_for
from tests.integration import test_dra_spawn as dra
from tests.integration.test_admission import inventory_sees, pods
from tests.integration.test_spawner import make_spawner, pod_of

pytestmark = pytest.mark.cluster

CUDA12 = "quay.io/jupyter/pytorch-notebook:cuda12-2025-01-06"
RULES = {"quay.io/jupyter/pytorch-notebook:cuda12-*": {"min_driver": "570", "min_cuda": "12.8"}}
FITTING = {"gpu-h100-8x", "gpu-l4-mps"}  # the nodes on R570 with CUDA 12.8
#: Four GPUs on one node, wherever they are: the H100 node (two of these), the time-sliced T4 (one),
#: the MPS L4 (one), GKE's MIG node (one, without GFD labels). For a CUDA 12.8 image: H100 and L4 only.
FOUR = [{"slug": "four", "kind": "custom", "display_name": "Four GPUs", "resources": {"nvidia.com/gpu": 4}, "admission": "warn"}]
T4_SHARED = "shared-tesla-t4-time-slicing-4x"
DRIVER_LABELS = (
    "nvidia.com/cuda.driver-version.full",
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
    "nvidia.com/cuda.runtime-version.full",
    "nvidia.com/cuda.runtime-version.major",
    "nvidia.com/cuda.runtime-version.minor",
)


def spawner_for(devcluster, namespace, image: str = CUDA12, **config):
    spawner = make_spawner(devcluster, namespace, image_requirements=RULES, **config)
    spawner.image = image
    return spawner


def relabel(kube, node: str, labels: dict) -> None:
    kube.request("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})


def card(page: str, slug: str) -> str:
    """One offering's card on the spawn page, from its opening tag."""
    at = page.index(f'data-slug="{slug}"')
    start = page.rindex("<div", 0, at)
    return page[start : page.index('<div class="gs-option', at)]


def four_of(spawner):
    return next(o for o in spawner.catalog_now() if o.slug == "four")


async def test_pods_land_only_on_nodes_whose_driver_runs_the_image_and_an_upgraded_node_takes_the_next(devcluster, kube, namespace):
    probe = spawner_for(devcluster, namespace, offerings=FOUR)
    await probe.catalog()
    offering = four_of(probe)
    fit, reason = probe.image_fit(offering, CUDA12)
    assert reason == ""
    assert probe.availability(offering).capacity == 5 and probe.availability(fit).capacity == 3
    assert set(probe.availability(fit).nodes) == FITTING

    started = []
    t4 = kube.request("GET", "/api/v1/nodes/gpu-t4-ts-shared")["metadata"]["labels"]
    before = {k: t4[k] for k in DRIVER_LABELS}
    try:
        for _ in range(3):
            spawner = spawner_for(devcluster, namespace, offerings=FOUR)
            spawner.user_options = {"offering": "four"}
            await spawner.start()
            started.append(spawner)
            pod = await pod_of(spawner)
            assert pod["spec"]["nodeName"] in FITTING
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            assert all(
                {"key": "nvidia.com/cuda.driver-version.major", "operator": "Gt", "values": ["569"]} in t["matchExpressions"] for t in terms
            )
        assert sorted(p["spec"]["nodeName"] for p in pods(kube, namespace)) == ["gpu-h100-8x", "gpu-h100-8x", "gpu-l4-mps"]

        # The T4 and GKE's MIG node still have four GPUs free, but cannot run the image. A server that
        # may wait (admission: warn) gets a pod the real scheduler keeps pending: of its 11 nodes only
        # the two full ones could run the image.
        waiting = spawner_for(devcluster, namespace, offerings=FOUR)
        waiting.user_options = {"offering": "four"}
        start = asyncio.ensure_future(waiting.start())

        def verdict():
            pod = next((p for p in pods(kube, namespace) if p["metadata"]["name"] == waiting.pod_name), None)
            conditions = ((pod or {}).get("status") or {}).get("conditions") or ()
            return next((c["message"] for c in conditions if c.get("reason") == "Unschedulable"), None)

        while (message := verdict()) is None:
            assert not start.done(), start
            await asyncio.sleep(0.1)
        assert "2 Insufficient nvidia.com/gpu" in message and "8 node(s) didn't match Pod's node affinity/selector" in message, message

        # The rolling upgrade reaches the T4 node: GFD relabels it, and the waiting pod lands there.
        relabel(
            kube,
            "gpu-t4-ts-shared",
            {
                "nvidia.com/cuda.driver-version.full": "570.124.06",
                "nvidia.com/cuda.driver-version.major": "570",
                "nvidia.com/cuda.driver-version.minor": "124",
                "nvidia.com/cuda.driver-version.revision": "06",
                "nvidia.com/cuda.runtime-version.full": "12.8",
                "nvidia.com/cuda.runtime-version.major": "12",
                "nvidia.com/cuda.runtime-version.minor": "8",
            },
        )
        await asyncio.wait_for(start, 60)
        started.append(waiting)
        assert (await pod_of(waiting))["spec"]["nodeName"] == "gpu-t4-ts-shared"
        await inventory_sees(
            probe, lambda idx: probe.availability(probe.image_fit(four_of(probe), CUDA12)[0]).capacity == 4, "the upgraded T4"
        )
    finally:
        await asyncio.gather(*(sp.stop(now=True) for sp in started))
        relabel(kube, "gpu-t4-ts-shared", before)


async def test_an_offering_none_of_whose_nodes_runs_the_image_is_refused_at_once_and_disabled_on_the_page(devcluster, kube, namespace):
    spawner = spawner_for(devcluster, namespace)
    await spawner.catalog()
    page = await spawner._render_gpu_form()
    words = "needs driver &gt;= 570 and CUDA &gt;= 12.8; these nodes have driver 535.183.01, CUDA 12.2"
    t4, h100 = card(page, T4_SHARED), card(page, "gpu-nvidia-h100-80gb-hbm3")
    assert "gs-disabled" in t4.split(">")[0] and words in t4 and "not for this image" in t4
    assert "gs-disabled" not in h100.split(">")[0] and "8 of 8 free" in h100

    name = next(o.display_name for o in spawner.catalog_now() if o.slug == T4_SHARED)
    spawner.user_options = {"offering": T4_SHARED}
    with pytest.raises(SpawnRefused) as info:
        await spawner.start()
    assert info.value.status_code == 409
    assert str(info.value) == (
        f"{name} cannot run the image {CUDA12}: it needs driver >= 570 and CUDA >= 12.8; these nodes have"
        " driver 535.183.01, CUDA 12.2. Choose another GPU or another image, or ask your hub admin."
    )
    assert pods(kube, namespace) == []

    other = spawner_for(devcluster, namespace, image="quay.io/jupyter/base-notebook:latest")  # needs nothing: as before
    other.user_options = {"offering": T4_SHARED}
    await other.start()
    try:
        assert (await pod_of(other))["spec"]["nodeName"] == "gpu-t4-ts-renamed"
    finally:
        await other.stop(now=True)


async def test_dra_claims_select_devices_by_the_drivers_version_attributes(devcluster, kube, dra_driver, namespace):
    """The DRA simulator's devices run 550.54.15 / CUDA 12.4 (the driver's semver attributes)."""
    spawner = dra.make_spawner(devcluster, namespace)
    spawner.image_requirements = {"old-enough:*": {"min_driver": "550.54", "min_cuda": "12.4", "min_compute": "8.9"}, "new:*": "cuda>=12.8"}
    spawner.image = "old-enough:1"
    spawner.user_options = {"offering": "dra-h100"}
    await spawner.start()
    try:
        template = kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{spawner.pod_name}")
        selectors = [s["cel"]["expression"] for s in template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
        assert "device.attributes['gpu.nvidia.com'].driverVersion.compareTo(semver('550.54.0')) >= 0" in selectors
        assert "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('8.9.0')) >= 0" in selectors
        assert dra.claim_of(kube, namespace, spawner.pod_name)["status"]["allocation"]["devices"]["results"]
    finally:
        await spawner.stop(now=True)

    refused = dra.make_spawner(devcluster, namespace)
    refused.image_requirements = {"new:*": "cuda>=12.8"}
    refused.image = "new:1"
    refused.user_options = {"offering": "dra-h100"}
    with pytest.raises(SpawnRefused, match=r"it needs CUDA >= 12\.8; these GPUs have 12\.4\.0\.") as info:
        await refused.start()
    assert info.value.status_code == 409

    # The scheduler reads the selector as the hub does: a claim for that image gets no device.
    await refused.catalog()
    h100 = next(o for o in refused.catalog_now() if o.slug == "dra-h100")
    fit, _ = refused.image_fit(h100, "new:1")
    claim = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": "needs-cuda-12-8"},
        "spec": copy.deepcopy(device_claim_spec(fit.claim, 1)),
    }
    kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", claim)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "needs-cuda-12-8"},
        "spec": {
            "containers": [{"name": "c", "image": "new:1", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "needs-cuda-12-8"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    def unschedulable():
        status = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/needs-cuda-12-8").get("status") or {}
        return next((c for c in status.get("conditions") or () if c.get("reason") == "Unschedulable"), None)

    condition = wait_for(unschedulable, "the scheduler's verdict on the claim", timeout=30)
    assert "cannot allocate all claims" in condition["message"], condition
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/needs-cuda-12-8?gracePeriodSeconds=0")
    kube.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/needs-cuda-12-8")
