"""Nodes + pods -> capacity / allocated / free per offering, counted as the scheduler counts.

free = allocatable - requests of every non-terminal pod bound to the node (all namespaces),
init containers as Kubernetes computes them, on nodes the offering selects and tolerates
and that are not cordoned.
"""

from __future__ import annotations

import pytest

from gpuspawner.capacity.counts import availability, node_serves, units
from gpuspawner.core.fit import PODS, NodeFacts, holds_resources, pod_requests, used_by_node
from gpuspawner.core.model import CPU_OFFERING, UNCOUNTED, Availability
from gpuspawner.devcluster.nodes import standard_nodes
from gpuspawner.names.nvidia import GPU, PRODUCT_LABEL
from gpuspawner.names.selectors import tolerates
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.offerings.discovery import discover

H100 = "NVIDIA-H100-80GB-HBM3"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
SKU_TAINT = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}


#: What every node also advertises (a real node always lists pods, cpu and memory).
HOST = {"cpu": "32", "memory": "256Gi", "pods": "110"}


def node(name, allocatable, labels=None, taints=(), unschedulable=False, capacity=None):
    allocatable = {**HOST, **allocatable}
    return {
        "metadata": {"name": name, "labels": dict({PRODUCT_LABEL: H100} if labels is None else labels)},
        "spec": {"taints": list(taints), "unschedulable": unschedulable},
        "status": {"allocatable": allocatable, "capacity": dict(capacity or allocatable)},
    }


def res(limits=None, requests=None):
    out = {}
    if limits is not None:
        out["limits"] = dict(limits)
    if requests is not None:
        out["requests"] = dict(requests)
    return out


def pod(node_name, *containers, init=(), phase="Running", namespace="jupyterhub", name="p", overhead=None):
    """containers/init: dicts of limits (str quantities), or (limits, requests) pairs, or full container dicts."""

    def container(c, i, prefix):
        if isinstance(c, tuple):
            return {"name": f"{prefix}{i}", "resources": res(*c)}
        if "resources" in c or "restartPolicy" in c:
            return {"name": f"{prefix}{i}", **c}
        return {"name": f"{prefix}{i}", "resources": res(c)}

    spec = {"containers": [container(c, i, "c") for i, c in enumerate(containers)]}
    if init:
        spec["initContainers"] = [container(c, i, "i") for i, c in enumerate(init)]
    if node_name:
        spec["nodeName"] = node_name
    if overhead:
        spec["overhead"] = overhead
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec, "status": {"phase": phase}}


def full(slug="h100", **extra):
    return offering_from_config({"slug": slug, "kind": "full", "product": H100, "counts": [1, 2, 4, 8], **extra}, 0)


def gpu(n):
    return {GPU: str(n)}


# ------------------------------------------------------------------------ free counting


def test_free_is_allocatable_minus_requests_of_pods_in_all_namespaces():
    nodes = [node("h", gpu(8), taints=[GPU_TAINT])]
    pods = [
        pod("h", gpu(2), namespace="jupyterhub", name="a"),
        pod("h", gpu(3), namespace="ml-training", name="b"),  # not the hub's namespace: still counts
        pod("h", {"cpu": "2", "memory": "4Gi"}, namespace="kube-system", name="c"),  # no GPU
    ]
    assert availability(full(), nodes, pods) == Availability(capacity=8, allocated=5, free=3, largest_free=3, nodes=("h",))


@pytest.mark.parametrize(
    "phase, counted", [("Running", True), ("Pending", True), ("Unknown", True), (None, True), ("Succeeded", False), ("Failed", False)]
)
def test_terminal_pods_do_not_count(phase, counted):
    p = pod("h", gpu(4), phase=phase)
    if phase is None:
        p["status"] = {}
    assert holds_resources(p) is counted
    a = availability(full(), [node("h", gpu(8))], [p])
    assert a.free == (4 if counted else 8)


def test_unbound_pods_do_not_count():
    pending_unbound = pod(None, gpu(8), phase="Pending")
    assert not holds_resources(pending_unbound)
    assert availability(full(), [node("h", gpu(8))], [pending_unbound]).free == 8


def test_pods_on_other_nodes_do_not_count():
    a = availability(full(), [node("h1", gpu(8)), node("h2", gpu(8))], [pod("h2", gpu(8)), pod("elsewhere", gpu(8))])
    assert (a.capacity, a.free, a.largest_free, a.nodes) == (16, 8, 8, ("h1", "h2"))


def test_requests_default_to_limits_and_explicit_requests_count():
    limits_only = pod("h", (gpu(2), None))
    requests_only = pod("h", (None, gpu(3)))
    both = pod("h", (gpu(1), gpu(1)))
    assert pod_requests(limits_only) == {GPU: 2, PODS: 1}
    assert pod_requests(requests_only) == {GPU: 3, PODS: 1}
    assert pod_requests(both) == {GPU: 1, PODS: 1}
    assert availability(full(), [node("h", gpu(8))], [limits_only, requests_only, both]).free == 2


def test_app_containers_are_summed():
    assert pod_requests(pod("h", gpu(1), gpu(2), {"cpu": "1"})) == {GPU: 3, "cpu": 1000, PODS: 1}


def test_cpu_memory_and_hugepages_in_scheduler_units():
    # cpu in millicores, memory in bytes, rounded up as Quantity.MilliValue()/Value() do; one pod
    assert pod_requests(pod("h", {"cpu": "500m", "memory": "1Gi", "hugepages-2Mi": "1Gi"})) == {
        "cpu": 500,
        "memory": 2**30,
        "hugepages-2Mi": 2**30,
        PODS: 1,
    }
    assert pod_requests(pod("h", {"cpu": "0.0001", "memory": "1.5k"})) == {"cpu": 1, "memory": 1500, PODS: 1}
    assert pod_requests(pod("h", {"cpu": "2", "memory": "1G"})) == {"cpu": 2000, "memory": 10**9, PODS: 1}


def test_a_pod_without_requests_still_takes_a_pod_slot():
    assert pod_requests(pod("h", {})) == {PODS: 1}


def test_pod_level_cpu_and_memory_requests_replace_the_containers_sum():
    p = pod("h", {"cpu": "1", "memory": "1Gi", GPU: "1"}, {"cpu": "1"})
    p["spec"]["resources"] = {"requests": {"cpu": "3", "memory": "4Gi"}}
    assert pod_requests(p) == {"cpu": 3000, "memory": 4 * 2**30, GPU: 1, PODS: 1}


def test_int_and_string_quantities():
    p = pod("h", {"resources": {"limits": {GPU: 2}}}, {"resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}})
    assert pod_requests(p) == {GPU: 2, "nvidia.com/mig-1g.5gb": 1, PODS: 1}


# --------------------------------------------------------------------- init containers


def test_init_container_larger_than_apps_sets_the_request():
    # max(max(init), sum(app)) = max(4, 1)
    assert pod_requests(pod("h", gpu(1), init=[gpu(4), gpu(2)])) == {GPU: 4, PODS: 1}


def test_apps_larger_than_init_set_the_request():
    # init containers run one at a time: max(2, 3), not 2 + 3
    assert pod_requests(pod("h", gpu(2), gpu(1), init=[gpu(2), gpu(1)])) == {GPU: 3, PODS: 1}


def test_restartable_sidecar_init_container_adds_to_apps():
    sidecar = {"restartPolicy": "Always", "resources": res(gpu(1))}
    # sum(app) + sidecars = 2 + 1
    assert pod_requests(pod("h", gpu(2), init=[sidecar])) == {GPU: 3, PODS: 1}


def test_init_container_after_a_sidecar_runs_beside_it():
    sidecar = {"restartPolicy": "Always", "resources": res(gpu(1))}
    # init after the sidecar: 2 + 1 = 3 > app 1 + sidecar 1
    assert pod_requests(pod("h", gpu(1), init=[sidecar, gpu(2)])) == {GPU: 3, PODS: 1}


def test_init_container_before_a_sidecar_does_not_add_it():
    sidecar = {"restartPolicy": "Always", "resources": res(gpu(1))}
    # init first alone: 2; then app 1 + sidecar 1 = 2
    assert pod_requests(pod("h", gpu(1), init=[gpu(2), sidecar])) == {GPU: 2, PODS: 1}


def test_init_containers_count_against_the_node():
    a = availability(full(), [node("h", gpu(8))], [pod("h", gpu(1), init=[gpu(6)])])
    assert a.free == 2 and a.allocated == 6


def test_pod_overhead_of_extended_resources_adds():
    assert pod_requests(pod("h", gpu(1), overhead={"cpu": "250m", "example.com/dev": "1"})) == {
        GPU: 1,
        "example.com/dev": 1,
        "cpu": 250,
        PODS: 1,
    }


# ---------------------------------------------------------------- which nodes are counted


def test_untolerated_taint_excludes_the_node():
    nodes = [node("tainted", gpu(8), taints=[SKU_TAINT]), node("clean", gpu(4))]
    a = availability(full(), nodes, [])
    assert (a.capacity, a.nodes) == (4, ("clean",))
    tolerant = full(extra_tolerations=[{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}])
    assert availability(tolerant, nodes, []).capacity == 12


def test_no_execute_taint_needs_toleration_prefer_no_schedule_does_not():
    soft = node("soft", gpu(2), taints=[{"key": "team", "value": "a", "effect": "PreferNoSchedule"}])
    hard = node("hard", gpu(2), taints=[{"key": "team", "value": "a", "effect": "NoExecute"}])
    assert availability(full(), [soft, hard], []).nodes == ("soft",)


def test_default_toleration_covers_any_nvidia_gpu_taint_value():
    nodes = [
        node("a", gpu(1), taints=[{"key": GPU, "value": "present", "effect": "NoSchedule"}]),
        node("b", gpu(1), taints=[{"key": GPU, "value": "true", "effect": "NoSchedule"}]),
    ]
    assert availability(full(), nodes, []).capacity == 2


def test_default_toleration_does_not_cover_no_execute():
    # {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule} does not tolerate NoExecute
    nodes = [node("a", gpu(1), taints=[{"key": GPU, "value": "present", "effect": "NoExecute"}])]
    assert availability(full(), nodes, []).capacity == 0


def test_node_selector_must_match():
    nodes = [node("h", gpu(8)), node("a", gpu(8), labels={PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}), node("none", gpu(8), labels={})]
    assert availability(full(), nodes, []).nodes == ("h",)


def test_cordoned_node_excluded():
    a = availability(full(), [node("h", gpu(8), unschedulable=True), node("h2", gpu(2))], [])
    assert (a.capacity, a.nodes) == (2, ("h2",))


def test_vm_passthrough_node_excluded():
    n = node("h", gpu(8), labels={PRODUCT_LABEL: H100, "nvidia.com/gpu.workload.config": "vm-passthrough"})
    assert availability(full(), [n], []).capacity == 0


def test_stale_capacity_key_not_counted():
    mig = offering_from_config({"slug": "m", "kind": "mig", "profile": "1g.5gb"}, 0)
    n = node(
        "a", {GPU: "0", "nvidia.com/mig-3g.20gb": "2"}, capacity={GPU: "0", "nvidia.com/mig-1g.5gb": "7", "nvidia.com/mig-3g.20gb": "2"}
    )
    assert availability(mig, [n], []) == Availability(capacity=0, allocated=0, free=0, largest_free=0, nodes=())


def test_zero_allocatable_not_served():
    assert not node_serves(full(), NodeFacts.from_node(node("h", gpu(0))))
    assert node_serves(full(), NodeFacts.from_node(node("h", gpu(1))))


# --------------------------------------------------------------------- units and summary


def test_multi_resource_units_are_the_minimum():
    hami = offering_from_config({"slug": "hami", "kind": "custom", "resources": {"nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30}}, 0)
    n = node("h", {"nvidia.com/gpumem": "16000", "nvidia.com/gpucores": "100"}, labels={})
    assert units(hami, {"nvidia.com/gpumem": 16000, "nvidia.com/gpucores": 100}) == 3
    used = pod("h", {"nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "10"})
    a = availability(hami, [n], [used])
    assert (a.capacity, a.free, a.allocated) == (3, 2, 1)


def test_per_unit_resource_above_one():
    two = offering_from_config({"slug": "pair", "kind": "full", "resources": {GPU: 2}, "node_selector": {}}, 0)
    a = availability(two, [node("h", gpu(7))], [pod("h", gpu(2))])
    assert (a.capacity, a.free) == (3, 2)


def test_overcommitted_node_has_zero_free_not_negative():
    a = availability(full(), [node("h", gpu(2))], [pod("h", gpu(2), name="a"), pod("h", gpu(2), name="b")])
    assert (a.capacity, a.allocated, a.free, a.largest_free) == (2, 2, 0, 0)


def test_largest_free_is_per_node():
    nodes = [node("a", gpu(8)), node("b", gpu(8)), node("c", gpu(4))]
    pods = [pod("a", gpu(7)), pod("b", gpu(3))]
    a = availability(full(), nodes, pods)
    assert (a.capacity, a.allocated, a.free, a.largest_free, a.nodes) == (20, 10, 10, 5, ("a", "b", "c"))


def test_cpu_offering_is_not_counted():
    a = availability(CPU_OFFERING, [node("h", gpu(8))], [])
    assert a is UNCOUNTED and not a.counted
    assert availability(full(), [], []).counted


def test_used_by_node_sums_bound_non_terminal_pods():
    pods = [
        pod("a", gpu(1)),
        pod("a", {"nvidia.com/mig-1g.5gb": "1"}),
        pod("b", gpu(2)),
        pod("b", gpu(5), phase="Failed"),
        pod(None, gpu(9)),
    ]
    assert used_by_node(pods) == {"a": {GPU: 1, "nvidia.com/mig-1g.5gb": 1, PODS: 2}, "b": {GPU: 2, PODS: 1}}


def test_standard_nodes_with_pods_everywhere():
    nodes = standard_nodes()
    found = {o.slug: o for o in discover(nodes)}
    pods = [
        pod("gpu-a100-mig", {"nvidia.com/mig-1g.5gb": "1"}, namespace="a"),
        pod("gpu-a100-mig", {"nvidia.com/mig-3g.20gb": "1"}, namespace="b"),
        pod("gpu-t4-ts-renamed", {"nvidia.com/gpu.shared": "1"}, namespace="c"),
        pod("gpu-t4-ts-renamed", {"nvidia.com/gpu.shared": "1"}, namespace="c", phase="Succeeded"),
        pod("gke-a100-mig-1g", gpu(1), namespace="d"),
        pod("gpu-h100-8x", gpu(4), init=[gpu(6)], namespace="e"),
    ]
    free = {slug: availability(o, nodes, pods).free for slug, o in found.items()}
    assert free == {
        "shared-nvidia-l4-shared-mps-4x": 4,
        "shared-tesla-t4-shared-time-slicing-4x": 4,
        "shared-tesla-t4-time-slicing-4x": 3,
        "mig-nvidia-a100-sxm4-40gb-1g-5gb": 1,
        "mig-gke-nvidia-tesla-a100-1g-5gb": 6,
        "mig-nvidia-a100-sxm4-40gb-2g-10gb": 1,
        "mig-nvidia-a100-sxm4-40gb-3g-20gb": 0,
        "gpu-nvidia-h100-80gb-hbm3": 2,
        "gpu-nvidia-tesla-a100": 1,
        "vgpu-vgpu-type-v100-8g-8gb": 1,
        "vgpu-nvidia-a10-24q": 1,
    }


# ------------------------------------------------------------------------- tolerates()


@pytest.mark.parametrize(
    "toleration, taint, expected",
    [
        # Exists with empty key tolerates every taint (of the effect, if one is given)
        ({"operator": "Exists"}, SKU_TAINT, True),
        ({"operator": "Exists"}, {"key": "x", "value": "y", "effect": "NoExecute"}, True),
        ({"key": "", "operator": "Exists", "effect": "NoSchedule"}, SKU_TAINT, True),
        ({"operator": "Exists", "effect": "NoExecute"}, SKU_TAINT, False),
        # empty key with Equal is not a wildcard
        ({"key": "", "operator": "Equal", "value": "gpu"}, SKU_TAINT, False),
        # key + Exists: any value
        ({"key": "sku", "operator": "Exists"}, SKU_TAINT, True),
        ({"key": "sku", "operator": "Exists", "effect": "NoSchedule"}, SKU_TAINT, True),
        ({"key": "other", "operator": "Exists"}, SKU_TAINT, False),
        # effect must match when given
        ({"key": "sku", "operator": "Exists", "effect": "NoExecute"}, SKU_TAINT, False),
        ({"key": "sku", "operator": "Exists", "effect": "PreferNoSchedule"}, SKU_TAINT, False),
        # Equal compares values; operator defaults to Equal
        ({"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, SKU_TAINT, True),
        ({"key": "sku", "value": "gpu"}, SKU_TAINT, True),
        ({"key": "sku", "operator": "Equal", "value": "cpu"}, SKU_TAINT, False),
        ({"key": "sku", "operator": "Equal"}, SKU_TAINT, False),
        ({"key": "sku", "operator": "Equal"}, {"key": "sku", "effect": "NoSchedule"}, True),  # "" == absent value
        ({"key": "sku", "operator": "Equal", "value": ""}, {"key": "sku", "value": "", "effect": "NoSchedule"}, True),
        # keys are case-sensitive
        ({"key": "SKU", "operator": "Exists"}, SKU_TAINT, False),
    ],
)
def test_tolerates_one(toleration, taint, expected):
    assert tolerates([toleration], taint) is expected


def test_tolerates_any_of_several():
    tols = [{"key": "a", "operator": "Exists"}, {"key": "sku", "operator": "Equal", "value": "gpu"}]
    assert tolerates(tols, SKU_TAINT) is True
    assert tolerates(tols[:1], SKU_TAINT) is False
    assert tolerates([], SKU_TAINT) is False
