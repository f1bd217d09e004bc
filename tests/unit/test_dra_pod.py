"""A DRA offering's pod side (pure): the ResourceClaimTemplate, the pod's and the container's
references to it, and the allocated devices read back from claim status and ResourceSlices.

The literals are the wire format on purpose: resource.k8s.io/v1 field names, NVIDIA's
driver, device class and attribute names (NVIDIA/k8s-dra-driver-gpu).
"""

from __future__ import annotations

import pytest

from gpuspawner.capacity.allocation import allocated_devices, pod_claim_name
from gpuspawner.core.model import DeviceClaim, Offering
from gpuspawner.dra.claimspec import claim_template, container_claim, pod_claim
from gpuspawner.hub.scheduling import unschedulable_reason
from gpuspawner.names.vocabulary import Kind
from gpuspawner.pod.podspec import pod_changes

SHARING = {
    "driver": "gpu.nvidia.com",
    "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    },
}
H100 = DeviceClaim(
    "gpu.nvidia.com",
    selectors=("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",),
    match_attributes=("gpu.nvidia.com/productName",),
)
DRA_H100 = Offering(slug="dra-h100", kind=Kind.FULL, display_name="H100", counts=(1, 2), claim=H100)


def test_the_template_asks_for_the_users_count_of_the_offerings_devices():
    labels = {"hub.jupyter.org/username": "ann", "gpuspawner.io/offering": "dra-h100"}
    notes = {"hub.jupyter.org/servername": ""}
    template = claim_template(H100, 2, "jupyter-ann", labels, notes)
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
    assert template["metadata"] == {"name": "jupyter-ann", "labels": labels, "annotations": notes}
    assert template["spec"]["metadata"] == {"labels": labels, "annotations": notes}  # copied onto the claim made from it
    assert template["spec"]["spec"] == {
        "devices": {
            "requests": [
                {
                    "name": "gpuspawner-gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "selectors": [{"cel": {"expression": H100.selectors[0]}}],
                    },
                }
            ],
            "constraints": [{"requests": ["gpuspawner-gpu"], "matchAttribute": "gpu.nvidia.com/productName"}],
        }
    }


def test_a_shared_offering_carries_the_drivers_opaque_config_and_nothing_it_does_not_need():
    shared = DeviceClaim("gpu.nvidia.com", config=(SHARING,))
    devices = claim_template(shared, 1, "p", {}, {})["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    assert devices["config"] == [{"requests": ["gpuspawner-gpu"], "opaque": SHARING}]
    assert "constraints" not in devices


def test_a_count_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        claim_template(H100, 0, "p", {}, {})


def test_pod_and_container_point_at_the_template_by_the_same_claim_name():
    assert pod_claim("jupyter-ann") == {"name": "gpuspawner-gpu", "resourceClaimTemplateName": "jupyter-ann"}
    assert container_claim() == {"name": "gpuspawner-gpu"}


def test_a_dra_offering_sets_no_limit_no_selector_and_tells_the_count():
    changes = pod_changes(DRA_H100, 2)
    assert dict(changes.limits) == {} and dict(changes.node_selector) == {} and changes.node_affinity == ()
    # What the spawner reads for the devices: the offering's claim and the user's count, into the template.
    template = claim_template(DRA_H100.claim, 2, "p", {}, {})
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    assert changes.env["GPUSPAWNER_GPU_COUNT"] == "2"


def _slice(node: str, generation: int, devices: list[dict]) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-x"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


GPU0 = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "uuid": {"string": "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "cudaComputeCapability": {"version": "9.0.0"},
    },
    "capacity": {"memory": {"value": "81559Mi"}},
}
MIG = {
    "name": "gpu-0-mig-1g5gb-19-2",
    "attributes": {
        "type": {"string": "mig"},
        "uuid": {"string": "MIG-0e8c5f52-4d5a-5b1e-9a3c-0f2b6c7d8e9f"},
        "parentUUID": {"string": "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"},
        "profile": {"string": "1g.5gb"},
    },
}


def claim(*results: dict) -> dict:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


def result(pool: str, device: str) -> dict:
    return {"request": "gpuspawner-gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device}


def test_allocated_devices_name_the_gpu_as_dcgm_exporter_does():
    slices = [_slice("dra-h100", 2, [GPU0]), _slice("dra-h100", 1, [{**GPU0, "attributes": {}}]), _slice("dra-a100", 1, [MIG])]
    got = allocated_devices(claim(result("dra-h100", "gpu-0"), result("dra-a100", "gpu-0-mig-1g5gb-19-2")), slices)
    assert got == [
        {
            "driver": "gpu.nvidia.com",
            "pool": "dra-h100",
            "device": "gpu-0",
            "request": "gpuspawner-gpu",
            "uuid": "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77",
        },
        {
            "driver": "gpu.nvidia.com",
            "pool": "dra-a100",
            "device": "gpu-0-mig-1g5gb-19-2",
            "request": "gpuspawner-gpu",
            "uuid": "GPU-34319582-d595-d1c7-d1d2-179bcfa61660",  # the parent's: dcgm-exporter's UUID label on MIG series
            "mig_profile": "1g.5gb",
        },
    ]


def test_a_device_the_slices_do_not_list_keeps_only_its_name_and_an_unallocated_claim_has_none():
    assert allocated_devices(claim(result("gone", "gpu-3")), []) == [
        {"driver": "gpu.nvidia.com", "pool": "gone", "device": "gpu-3", "request": "gpuspawner-gpu"}
    ]
    assert allocated_devices({"status": {}}, [_slice("dra-h100", 1, [GPU0])]) == []


def test_the_pods_claim_is_found_by_its_name_in_the_pod_status():
    pod = {
        "status": {"resourceClaimStatuses": [{"name": "other"}, {"name": "gpuspawner-gpu", "resourceClaimName": "p-gpuspawner-gpu-x7k2q"}]}
    }
    assert pod_claim_name(pod) == "p-gpuspawner-gpu-x7k2q"
    assert pod_claim_name({"status": {}}) is None
    shared = {"spec": {"resourceClaims": [{"name": "gpuspawner-gpu", "resourceClaimName": "gpuspawner-l4-shared-x2k9f"}]}}
    assert pod_claim_name(shared) == "gpuspawner-l4-shared-x2k9f"  # a shared claim: named in the spec, not in the status


def _unschedulable(message: str) -> dict:
    return {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


@pytest.mark.parametrize(
    "tail",
    [
        " still not schedulable, preemption: 0/14 nodes are available: 14 Preemption is not helpful for scheduling.",
        " no new claims to deallocate, preemption: 0/14 nodes are available: 14 Preemption is not helpful for scheduling.",
        " preemption: 0/14 nodes are available: 14 Preemption is not helpful for scheduling.",
        "",
    ],
)
def test_the_dra_plugins_reason_is_the_schedulers_words_without_what_post_filter_and_preemption_add(tail):
    """kube-scheduler's message for a claim no node can satisfy (seen in the devcluster,
    tests/integration/test_dra_spawn.py): up to 1.36 its DRA post-filter adds "still not
    schedulable,"; 1.37's adds nothing, so preemption's words follow the reason."""
    reason = "0/14 nodes are available: 10 node(s) had untolerated taint(s), 4 cannot allocate all claims."
    assert unschedulable_reason(_unschedulable(reason + tail)) == reason


def test_a_dra_offering_takes_units_so_quotas_and_admission_apply():
    from gpuspawner.capacity.admission import units_held

    assert DRA_H100.takes_units and not Offering(slug="cpu2", kind=Kind.CPU, display_name="x").takes_units
    assert units_held(DRA_H100, {}) == 1  # a bound DRA pod shows no requests: at least one unit
