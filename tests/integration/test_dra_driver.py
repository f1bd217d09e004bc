"""The simulated NVIDIA DRA driver on the real control plane: the real kube-scheduler allocates
its devices to ResourceClaims, and the resourceclaim controller makes claims from templates."""

from __future__ import annotations

import pytest

from gpuspawner.devcluster.dratruth import claim_pod
from gpuspawner.names import dranames as dn
from tests.conftest import wait_for

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


def claim(name: str, device_class: str, selectors: tuple[str, ...] = (), count: int = 1) -> dict:
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {
        "apiVersion": dn.RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def running(kube, ns: str, name: str) -> dict | None:
    pod = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return pod if pod["status"].get("phase") == "Running" else None


def test_classes_and_slices_are_the_drivers(kube, dra_driver, k8s_release):
    classes = {c["metadata"]["name"]: c for c in kube.request("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]}
    assert set(classes) >= {"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"}
    # an API server with DRAExtendedResource off (before 1.36) drops the field it cannot serve
    mapped = "nvidia.com/gpu" if k8s_release >= (1, 36) else None
    assert classes["gpu.nvidia.com"]["spec"].get("extendedResourceName") == mapped
    slices = [s for s in kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"] if s["spec"]["driver"] == "gpu.nvidia.com"]
    by_pool = {s["spec"]["pool"]["name"]: s for s in slices}
    assert set(by_pool) == {"dra-h100", "dra-l4", "dra-a100-mig"}
    mig = {d["name"] for d in by_pool["dra-a100-mig"]["spec"]["devices"]}
    assert mig == {"gpu-0-mig-2g10gb-14-0", "gpu-0-mig-1g5gb-19-2", "gpu-0-mig-1g5gb-19-3", "gpu-0-mig-3g20gb-9-4"}
    h100 = by_pool["dra-h100"]["spec"]["devices"][0]
    assert h100["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert h100["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}


def test_scheduler_allocates_a_simulated_mig_device_and_kwok_runs_the_pod(kube, dra_driver, namespace):
    profile = "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"
    kube.request("POST", CLAIMS.format(ns=namespace), claim("slice", "mig.nvidia.com", (profile,)))
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", claim_pod("nb", {"resourceClaimName": "slice"}))
    pod = wait_for(lambda: running(kube, namespace, "nb"), "the pod with a MIG claim Running", timeout=60)
    assert pod["spec"]["nodeName"] == "dra-a100-mig"
    status = kube.request("GET", CLAIMS.format(ns=namespace) + "/slice")["status"]
    (result,) = status["allocation"]["devices"]["results"]
    assert result["driver"] == "gpu.nvidia.com" and result["pool"] == "dra-a100-mig"
    assert result["device"] in {"gpu-0-mig-1g5gb-19-2", "gpu-0-mig-1g5gb-19-3"}
    assert [r["name"] for r in status["reservedFor"]] == ["nb"]


def test_template_claims_are_made_by_the_resourceclaim_controller(kube, dra_driver, namespace):
    template = {
        "apiVersion": dn.RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-h100"},
        "spec": {
            "spec": claim("x", "gpu.nvidia.com", ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",), count=2)[
                "spec"
            ]
        },
    }
    kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates", template)
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", claim_pod("nb", {"resourceClaimTemplateName": "two-h100"}))
    pod = wait_for(lambda: running(kube, namespace, "nb"), "the pod with a templated claim Running", timeout=60)
    assert pod["spec"]["nodeName"] == "dra-h100"
    (made,) = kube.request("GET", CLAIMS.format(ns=namespace))["items"]
    devices = sorted(r["device"] for r in made["status"]["allocation"]["devices"]["results"])
    assert devices == ["gpu-0", "gpu-1"]


async def _inventory(devcluster):
    from kubespawner.clients import load_config, shared_client

    from gpuspawner.hub.inventory import Inventory

    load_config()
    inventory = Inventory(shared_client("CoreV1Api"))
    inventory.start()
    assert await inventory.wait_ready(60), inventory.last_error
    return inventory


async def _until(check, what: str, timeout: float = 60.0):
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.k8s("1.36", "the extended-resource mapping (DRAExtendedResource: beta and on by default in 1.36, GA in 1.37)")
async def test_the_live_inventory_counts_the_extended_resource_mapping_as_a_taken_dra_gpu(devcluster, kube, dra_driver, namespace):
    """A plain nvidia.com/gpu pod that the scheduler serves with a DRA GPU (the gpu class's
    extendedResourceName) gets a claim the scheduler writes: the inventory counts that L4 taken
    in the DRA offering, and no device-plugin offering ever counts DRA devices."""
    inventory = await _inventory(devcluster)
    try:
        index = inventory.index
        await _until(lambda: index.dra.synced and any(o.slug == "dra-gpu-l4" for o in index.discovered()), "DRA offerings")
        l4 = next(o for o in index.discovered() if o.slug == "dra-gpu-l4")
        assert index.availability(l4).free == 4
        plugin_before = {o.slug: index.availability(o) for o in index.discovered() if o.resources}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plain"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "dra-l4"},
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
        }
        kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        wait_for(lambda: running(kube, namespace, "plain"), "the plain nvidia.com/gpu pod Running on the DRA node", timeout=60)
        (made,) = kube.request("GET", CLAIMS.format(ns=namespace))["items"]
        assert made["status"]["allocation"]["devices"]["results"][0]["pool"] == "dra-l4"
        await _until(lambda: index.availability(l4).free == 3, "the inventory to count the mapped L4 taken")
        assert {o.slug: index.availability(o) for o in index.discovered() if o.resources} == plugin_before
    finally:
        await inventory.stop()
