"""Nodes -> offerings, on label sets written from the NVIDIA device plugin / GFD / GKE conventions.

The T4 label set is the real GFD dump of the CERN webinar (seed 003); the others follow the
documented conventions (docs/architecture.md, "NVIDIA's conventions"). Each kind is checked for the exact resource, node
selector, name and memory discovery derives, and each trap for the offering it must NOT make.
"""

from __future__ import annotations

import copy

import pytest

from gpuspawner.capacity.counts import availability, node_serves
from gpuspawner.core.fit import NodeFacts
from gpuspawner.core.model import DEFAULT_GPU_TOLERATION
from gpuspawner.core.nodeclass import hosts_pods, mig_settled
from gpuspawner.devcluster.nodes import standard_nodes
from gpuspawner.names.nvidia import GPU, GPU_SHARED, PRODUCT_LABEL
from gpuspawner.names.vocabulary import Isolation, Kind
from gpuspawner.offerings.discovery import (
    discover,
    gpu_tolerations,
    memory_mib,
    product_name,
)

DEFAULT_TOL = dict(DEFAULT_GPU_TOLERATION)

#: The real GFD labels of CERN's T4 node (seed 003_c73e9d8f22c9c9f5.txt), verbatim.
SEED_T4_LABELS = {
    "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "54",
    "nvidia.com/cuda.driver-version.revision": "15",
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "54",
    "nvidia.com/cuda.driver.rev": "15",
    "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/gfd.timestamp": "1728992460",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
    "nvidia.com/gpu.count": "1",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.machine": "OpenStack-Compute",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.mode": "compute",
    "nvidia.com/gpu.product": "Tesla-T4",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/vgpu.present": "false",
}
CERN_TAINT = {"key": "node-role.kubernetes.io/gpu", "value": "true", "effect": "NoSchedule"}
GKE_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

A100_MIG_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/gpu.count": "1",
    "nvidia.com/gpu.memory": "40960",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/mig.config": "all-balanced",
    "nvidia.com/mig.config.state": "success",
    "nvidia.com/mig-1g.5gb.count": "2",
    "nvidia.com/mig-1g.5gb.memory": "4864",
    "nvidia.com/mig-2g.10gb.count": "1",
    "nvidia.com/mig-2g.10gb.memory": "9856",
    "nvidia.com/mig-3g.20gb.count": "1",
    "nvidia.com/mig-3g.20gb.memory": "19968",
}
A100_MIG_ALLOC = {
    "cpu": "32",
    "memory": "256Gi",
    "nvidia.com/gpu": "0",
    "nvidia.com/mig-1g.5gb": "2",
    "nvidia.com/mig-2g.10gb": "1",
    "nvidia.com/mig-3g.20gb": "1",
}


#: What every node also advertises (a real node always lists pods, cpu and memory).
HOST = {"cpu": "32", "memory": "256Gi", "pods": "110"}


def node(name, labels, allocatable, taints=(), unschedulable=False, capacity=None):
    allocatable = {**HOST, **allocatable}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"taints": [dict(t) for t in taints], **({"unschedulable": True} if unschedulable else {})},
        "status": {"allocatable": allocatable, "capacity": dict(capacity if capacity is not None else allocatable)},
    }


def t4(**label_changes):
    labels = {**SEED_T4_LABELS, **label_changes}
    return {k: v for k, v in labels.items() if v is not None}


def by_slug(offerings):
    return {o.slug: o for o in offerings}


def only(offerings):
    assert len(offerings) == 1, [o.slug for o in offerings]
    return offerings[0]


# ------------------------------------------------------------------------- whole GPUs


def test_seed_t4_is_one_whole_gpu():
    o = only(discover([node("t4", SEED_T4_LABELS, {"cpu": "4", "nvidia.com/gpu": "1"})]))
    assert o.slug == "gpu-tesla-t4"
    assert o.kind is Kind.FULL
    assert o.display_name == "Tesla T4"
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {PRODUCT_LABEL: "Tesla-T4"}
    assert o.counts == (1,)
    assert o.memory_mib == 15360
    assert o.isolation is Isolation.EXCLUSIVE
    assert o.product == "Tesla-T4"
    assert o.source == "discovered"
    assert o.tolerations == (DEFAULT_TOL,)


def test_seed_t4_with_cern_taint_tolerates_it():
    o = only(discover([node("t4", SEED_T4_LABELS, {"nvidia.com/gpu": "1"}, taints=[CERN_TAINT])]))
    assert o.tolerations == (
        DEFAULT_TOL,
        {"key": "node-role.kubernetes.io/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    )


@pytest.mark.parametrize("gpus, counts", [(1, (1,)), (2, (1, 2)), (3, (1, 2)), (4, (1, 2, 4)), (8, (1, 2, 4, 8)), (16, (1, 2, 4, 8, 16))])
def test_whole_gpu_counts_up_to_the_largest_node(gpus, counts):
    labels = {PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
    o = only(discover([node("h", labels, {"nvidia.com/gpu": str(gpus)})]))
    assert o.counts == counts
    assert o.display_name == "H100 80GB"


def test_whole_gpu_counts_use_the_largest_single_node_not_the_sum():
    labels = {PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}
    o = only(discover([node("a", labels, {GPU: "2"}), node("b", labels, {GPU: "2"}), node("c", labels, {GPU: "1"})]))
    assert o.counts == (1, 2)


@pytest.mark.parametrize(
    "product, name",
    [
        ("NVIDIA-A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100 80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100 80GB"),
        ("Tesla-T4", "Tesla T4"),
        ("Tesla-T4-SHARED", "Tesla T4"),
        ("Tesla-V100-SXM2-16GB", "Tesla V100 16GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100 40GB"),
        ("GRID-V100-8C", "V100 8C"),
        ("nvidia-tesla-a100", "A100 40GB"),
        ("nvidia-l4", "L4"),
        ("NVIDIA-GeForce-RTX-4090", "GeForce RTX 4090"),
    ],
)
def test_product_name(product, name):
    assert product_name(product) == name


# ----------------------------------------------------------------------- MIG, mixed


def test_mig_mixed_balanced_layout():
    offerings = discover([node("a100", A100_MIG_LABELS, A100_MIG_ALLOC, taints=[GKE_TAINT])])
    assert [o.slug for o in offerings] == [
        "mig-nvidia-a100-sxm4-40gb-1g-5gb",
        "mig-nvidia-a100-sxm4-40gb-2g-10gb",
        "mig-nvidia-a100-sxm4-40gb-3g-20gb",
    ]
    one, two, three = offerings
    assert all(o.kind is Kind.MIG and o.isolation is Isolation.HARDWARE for o in offerings)
    assert dict(one.resources) == {"nvidia.com/mig-1g.5gb": 1}
    assert dict(two.resources) == {"nvidia.com/mig-2g.10gb": 1}
    assert dict(three.resources) == {"nvidia.com/mig-3g.20gb": 1}
    assert (one.memory_mib, two.memory_mib, three.memory_mib) == (4864, 9856, 19968)  # from the per-profile GFD labels
    assert three.compute_share == "3/7 of the GPU's compute"
    assert three.display_name == "A100 40GB · MIG 3g.20gb"
    assert dict(three.node_selector) == {PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}
    assert three.tolerations == (DEFAULT_TOL,)
    assert all(o.counts == (1,) for o in offerings)


def test_mig_mixed_zero_whole_gpu_is_not_an_offering():
    offerings = discover([node("a100", A100_MIG_LABELS, A100_MIG_ALLOC)])
    assert not any(o.kind is Kind.FULL for o in offerings)
    assert not any(GPU in o.resources for o in offerings)


def test_mig_mixed_plus_me_profile_uses_dot_me_resource():
    labels = {**A100_MIG_LABELS, PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-1g.10gb.me.memory": "9728"}
    alloc = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb.me": "1", "nvidia.com/mig-1g.10gb": "3"}
    found = by_slug(discover([node("a100", labels, alloc)]))
    assert set(found) == {"mig-nvidia-a100-sxm4-80gb-1g-10gb", "mig-nvidia-a100-sxm4-80gb-1g-10gb-plus-me"}
    me = found["mig-nvidia-a100-sxm4-80gb-1g-10gb-plus-me"]
    assert dict(me.resources) == {"nvidia.com/mig-1g.10gb.me": 1}
    assert me.display_name == "A100 80GB · MIG 1g.10gb+me"  # shown with '+', requested with '.'
    assert me.memory_mib == 9728
    plain = found["mig-nvidia-a100-sxm4-80gb-1g-10gb"]
    assert dict(plain.resources) == {"nvidia.com/mig-1g.10gb": 1}
    # no per-profile memory label, and no A100 80GB in the table of MIG profiles: no figure, never the name's "10gb"
    assert plain.memory_mib is None


def test_mig_plus_me_and_minus_me_profiles_are_distinct_offerings():
    # '+me' -> resource '.me', '-me' stays (docs/architecture.md): two different resources, so two offerings.
    alloc = {"nvidia.com/mig-1g.24gb.me": "1", "nvidia.com/mig-1g.24gb-me": "2"}
    offerings = discover([node("b", {PRODUCT_LABEL: "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"}, alloc)])
    assert sorted(next(iter(o.resources)) for o in offerings) == ["nvidia.com/mig-1g.24gb-me", "nvidia.com/mig-1g.24gb.me"]


@pytest.mark.parametrize("state", ["pending", "rebooting", "failed"])
def test_mig_reconfiguration_not_success_means_no_mig_offerings(state):
    labels = {**A100_MIG_LABELS, "nvidia.com/mig.config.state": state}
    assert discover([node("a100", labels, A100_MIG_ALLOC)]) == []


def test_mig_without_state_label_is_offered():
    labels = {k: v for k, v in A100_MIG_LABELS.items() if k != "nvidia.com/mig.config.state"}
    assert len(discover([node("a100", labels, A100_MIG_ALLOC)])) == 3


def test_mig_pending_keeps_whole_gpus_of_the_node_out_of_mig_only():
    # A node mid-reconfiguration with one MIG-disabled GPU still allocatable: the whole GPU stays
    # an offering, the (stale) MIG resources do not.
    labels = {**A100_MIG_LABELS, "nvidia.com/mig.config.state": "pending"}
    alloc = {**A100_MIG_ALLOC, "nvidia.com/gpu": "1"}
    o = only(discover([node("a100", labels, alloc)]))
    assert o.kind is Kind.FULL and dict(o.resources) == {GPU: 1}


def test_stale_capacity_keys_are_not_offerings():
    # After a MIG reconfiguration status.capacity keeps the old resources; only allocatable counts.
    capacity = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "7", "nvidia.com/mig-3g.20gb": "1"}
    allocatable = {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.20gb": "1"}
    o = only(discover([node("a100", A100_MIG_LABELS, allocatable, capacity=capacity)]))
    assert dict(o.resources) == {"nvidia.com/mig-3g.20gb": 1}


def test_zero_valued_mig_resource_is_not_an_offering():
    alloc = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "0", "nvidia.com/mig-3g.20gb": "2"}
    o = only(discover([node("a100", A100_MIG_LABELS, alloc)]))
    assert o.slug == "mig-nvidia-a100-sxm4-40gb-3g-20gb"


# ---------------------------------------------------------------------- MIG, single


SINGLE_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    "nvidia.com/gpu.count": "7",
    "nvidia.com/gpu.memory": "4864",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "single",
    "nvidia.com/mig.config": "all-1g.5gb",
    "nvidia.com/mig.config.state": "success",
}


def test_mig_single_strategy_is_told_apart_by_product():
    o = only(discover([node("single", SINGLE_LABELS, {"nvidia.com/gpu": "7"}, taints=[GKE_TAINT])]))
    assert o.kind is Kind.MIG
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}
    assert o.display_name == "A100 40GB · MIG 1g.5gb"
    assert o.counts == (1,)  # not a whole GPU: never 2, 4 ...
    assert o.memory_mib == 4864  # single strategy: GFD labels the MIG device's memory as nvidia.com/gpu.memory
    assert o.compute_share == "1/7 of the GPU's compute"


def test_mig_single_pending_is_not_offered():
    labels = {**SINGLE_LABELS, "nvidia.com/mig.config.state": "pending"}
    assert discover([node("single", labels, {"nvidia.com/gpu": "7"})]) == []


def test_mig_single_and_mixed_nodes_of_one_product_both_stay_offered():
    # Same product, same profile, different strategy: the mixed node needs nvidia.com/mig-1g.5gb,
    # the single node plain nvidia.com/gpu with the -MIG- product. Both nodes must be reachable
    # through some offering, whatever order the nodes come in.
    mixed = node("mixed", A100_MIG_LABELS, {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "7"})
    single = node("single", SINGLE_LABELS, {"nvidia.com/gpu": "7"})
    for nodes in ([mixed, single], [single, mixed]):
        offerings = discover(nodes)
        served = {n["metadata"]["name"] for n in nodes for o in offerings if node_serves(o, NodeFacts.from_node(n))}
        assert served == {"mixed", "single"}, [(o.slug, dict(o.resources)) for o in offerings]


# ------------------------------------------------------------------------ GKE, no GFD


GKE_MIG_LABELS = {
    "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
    "cloud.google.com/gke-gpu-partition-size": "1g.5gb",
    "cloud.google.com/gke-nodepool": "a100-mig-pool",
    "cloud.google.com/gke-gpu": "true",
}


def test_gke_mig_partition_without_gfd_labels():
    o = only(discover([node("gke", GKE_MIG_LABELS, {"nvidia.com/gpu": "7"}, taints=[GKE_TAINT])]))
    assert o.slug == "mig-gke-nvidia-tesla-a100-1g-5gb"
    assert o.kind is Kind.MIG
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {
        "cloud.google.com/gke-gpu-partition-size": "1g.5gb",
        "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
    }
    assert o.display_name == "A100 40GB · MIG 1g.5gb (a100-mig-pool)"
    assert o.memory_mib == 4864  # no GFD here: NVIDIA's table of MIG profiles, as on the GFD-labelled A100
    assert o.counts == (1,)
    assert o.tolerations == (DEFAULT_TOL,)


def test_gke_whole_gpu_without_gfd_labels():
    labels = {"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-gpu": "true"}
    o = only(discover([node("gke-l4", labels, {"nvidia.com/gpu": "2"}, taints=[GKE_TAINT])]))
    assert o.slug == "gpu-nvidia-l4"
    assert o.kind is Kind.FULL
    assert o.display_name == "L4"
    assert dict(o.node_selector) == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert o.counts == (1, 2)
    assert o.memory_mib is None  # GKE publishes no memory label; do not invent one


@pytest.mark.parametrize(
    "strategy, isolation, how", [("time-sharing", Isolation.NONE, "time-sliced"), ("mps", Isolation.PARTIAL, "MPS share")]
)
def test_gke_gpu_sharing_without_gfd_labels(strategy, isolation, how):
    labels = {
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
        "cloud.google.com/gke-gpu-sharing-strategy": strategy,
        "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
    }
    o = only(discover([node("gke-t4", labels, {"nvidia.com/gpu": "4"})]))
    assert o.kind is Kind.SHARED
    assert o.isolation is isolation
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {  # 1/4 shares must not land on a node shared 8 ways
        "cloud.google.com/gke-gpu-sharing-strategy": strategy,
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
        "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
    }
    assert o.display_name == f"Tesla T4 · 1/4 {how}"


def test_gke_whole_gpu_offering_does_not_count_partitioned_nodes():
    # A GKE cluster with a whole-A100 pool and a MIG-partitioned A100 pool: both pools carry
    # gke-accelerator=nvidia-tesla-a100 and plain nvidia.com/gpu. The whole-GPU offering must not
    # select (or count) the partition nodes, or a user asking for a whole A100 gets a 1g.5gb slice.
    whole = node("gke-whole", {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}, {GPU: "1"})
    part = node("gke-mig", GKE_MIG_LABELS, {GPU: "7"})
    found = by_slug(discover([whole, part]))
    full = found["gpu-nvidia-tesla-a100"]
    assert full.kind is Kind.FULL
    assert not node_serves(full, NodeFacts.from_node(part))
    assert availability(full, [whole, part], []).capacity == 1


# ------------------------------------------------------------- time-slicing and MPS


def test_time_slicing_renamed_to_gpu_shared():
    # CERN's config: renameByDefault: true, replicas 4 -> nvidia.com/gpu: 0, nvidia.com/gpu.shared: 4
    labels = t4(**{"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    o = only(discover([node("t4", labels, {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "4"}, taints=[CERN_TAINT])]))
    assert o.slug == "shared-tesla-t4-time-slicing-4x"
    assert o.kind is Kind.SHARED
    assert dict(o.resources) == {GPU_SHARED: 1}
    assert dict(o.node_selector) == {
        PRODUCT_LABEL: "Tesla-T4",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }
    assert o.display_name == "Tesla T4 · 1/4 time-sliced"
    assert o.compute_share == "1/4 of the GPU (time-sliced)"
    assert o.isolation is Isolation.NONE
    assert o.memory_mib == 15360  # time-slicing does not split memory
    assert "Memory is not isolated" in o.description
    assert o.counts == (1,)
    assert {"key": "node-role.kubernetes.io/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in o.tolerations
    assert DEFAULT_TOL in o.tolerations  # a .shared request still needs the nvidia.com/gpu toleration


def test_time_slicing_shared_product_suffix():
    labels = t4(**{PRODUCT_LABEL: "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    o = only(discover([node("t4", labels, {"nvidia.com/gpu": "4"})]))
    assert o.kind is Kind.SHARED  # not 4 whole GPUs
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {
        PRODUCT_LABEL: "Tesla-T4-SHARED",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }
    assert o.display_name == "Tesla T4 · 1/4 time-sliced"
    assert "SHARED" not in o.display_name
    assert o.counts == (1,)


def test_shared_suffix_without_replicas_label_is_still_shared():
    labels = t4(**{PRODUCT_LABEL: "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": None, "nvidia.com/gpu.sharing-strategy": None})
    o = only(discover([node("t4", labels, {"nvidia.com/gpu": "4"})]))
    assert o.kind is Kind.SHARED
    assert o.compute_share == "a time-sliced share"
    assert o.display_name == "Tesla T4 · a share time-sliced"


def test_replicas_above_one_without_suffix_is_shared():
    labels = t4(**{"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    o = only(discover([node("t4", labels, {"nvidia.com/gpu": "2"})]))
    assert o.kind is Kind.SHARED and o.compute_share == "1/2 of the GPU (time-sliced)"


def test_mps_splits_memory_and_is_partly_isolated():
    labels = {
        PRODUCT_LABEL: "NVIDIA-L4-SHARED",
        "nvidia.com/gpu.memory": "23034",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "mps",
        "nvidia.com/mps.capable": "true",
    }
    o = only(discover([node("l4", labels, {"nvidia.com/gpu": "4"})]))
    assert o.slug == "shared-nvidia-l4-shared-mps-4x"
    assert o.kind is Kind.SHARED
    assert o.isolation is Isolation.PARTIAL
    assert o.memory_mib == 23034 // 4
    assert o.display_name == "L4 · 1/4 MPS share"
    assert o.compute_share == "1/4 of the GPU (MPS share)"


def test_shared_nodes_with_different_replicas_are_counted_apart():
    # slice-4 and slice-8 configs (nvidia.com/device-plugin.config) on two -SHARED T4 nodes give two
    # offerings (1/4 and 1/8). Each must select and count only its own nodes: a "1/8" user must not
    # land on a "1/4" node, and capacity must not count the other node's replicas.
    four = node(
        "t4-4",
        t4(**{PRODUCT_LABEL: "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}),
        {GPU: "4"},
    )
    eight = node(
        "t4-8",
        t4(**{PRODUCT_LABEL: "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "8", "nvidia.com/gpu.sharing-strategy": "time-slicing"}),
        {GPU: "8"},
    )
    found = by_slug(discover([four, eight]))
    assert set(found) == {"shared-tesla-t4-shared-time-slicing-4x", "shared-tesla-t4-shared-time-slicing-8x"}
    assert availability(found["shared-tesla-t4-shared-time-slicing-4x"], [four, eight], []).nodes == ("t4-4",)
    assert availability(found["shared-tesla-t4-shared-time-slicing-8x"], [four, eight], []).nodes == ("t4-8",)


def test_time_sliced_and_mps_nodes_of_one_product_are_counted_apart():
    base = {PRODUCT_LABEL: "NVIDIA-L4-SHARED", "nvidia.com/gpu.replicas": "4"}
    ts = node("l4-ts", {**base, "nvidia.com/gpu.sharing-strategy": "time-slicing"}, {GPU: "4"})
    mps = node("l4-mps", {**base, "nvidia.com/gpu.sharing-strategy": "mps"}, {GPU: "4"})
    found = by_slug(discover([ts, mps]))
    assert availability(found["shared-nvidia-l4-shared-time-slicing-4x"], [ts, mps], []).nodes == ("l4-ts",)
    assert availability(found["shared-nvidia-l4-shared-mps-4x"], [ts, mps], []).nodes == ("l4-mps",)


# --------------------------------------------------------------------------------- vGPU


def test_vgpu_guest_profile_from_product():
    labels = t4(
        **{
            PRODUCT_LABEL: "NVIDIA-A10-24Q",
            "nvidia.com/vgpu.present": "true",
            "nvidia.com/gpu.memory": "24576",
            "nvidia.com/gpu.family": "ampere",
        }
    )
    o = only(discover([node("a10", labels, {"nvidia.com/gpu": "1"})]))
    assert o.slug == "vgpu-nvidia-a10-24q"
    assert o.kind is Kind.VGPU
    assert o.display_name == "A10 vGPU 24Q"
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {"nvidia.com/vgpu.present": "true", PRODUCT_LABEL: "NVIDIA-A10-24Q"}
    assert o.isolation is Isolation.VM
    assert o.memory_mib == 24576
    assert o.counts == (1,)


def test_vgpu_guest_grid_profile():
    o = only(discover([node("v", {PRODUCT_LABEL: "GRID-V100-8C", "nvidia.com/vgpu.present": "true"}, {GPU: "1"})]))
    assert o.kind is Kind.VGPU and o.display_name == "V100 vGPU 8C"


def test_vgpu_present_false_is_a_whole_gpu():
    o = only(discover([node("t4", SEED_T4_LABELS, {GPU: "1"})]))
    assert SEED_T4_LABELS["nvidia.com/vgpu.present"] == "false"
    assert o.kind is Kind.FULL


def test_site_vgpu_class_label():
    labels = {
        "vgpu.type": "v100-8g-8GB",
        PRODUCT_LABEL: "GRID-V100-8C",
        "nvidia.com/gpu.memory": "8192",
        "nvidia.com/vgpu.present": "false",
    }
    o = only(discover([node("v", labels, {GPU: "1"})]))
    assert o.slug == "vgpu-vgpu-type-v100-8g-8gb"
    assert o.kind is Kind.VGPU
    assert o.display_name == "vGPU class v100-8g-8GB"
    # The product is pinned too: a class's pods must not land on a "-SHARED" (time-sliced) node of the class.
    assert dict(o.node_selector) == {"vgpu.type": "v100-8g-8GB", PRODUCT_LABEL: "GRID-V100-8C"}
    assert o.memory_mib == 8192
    assert o.isolation is Isolation.VM


def test_site_vgpu_class_label_is_configurable():
    labels = {"example.org/gpu-class": "half-v100", PRODUCT_LABEL: "GRID-V100-8C"}
    plain = only(discover([node("v", labels, {GPU: "1"})]))
    assert plain.kind is Kind.FULL  # label not configured: just a GPU
    o = only(discover([node("v", labels, {GPU: "1"})], vgpu_class_labels=("example.org/gpu-class",)))
    assert o.kind is Kind.VGPU
    assert dict(o.node_selector) == {"example.org/gpu-class": "half-v100", PRODUCT_LABEL: "GRID-V100-8C"}


# ------------------------------------------------------------------- nodes offering nothing


def test_cordoned_node_offers_nothing():
    assert discover([node("t4", SEED_T4_LABELS, {GPU: "1"}, unschedulable=True)]) == []


@pytest.mark.parametrize("workload", ["vm-passthrough", "vm-vgpu"])
def test_vm_hosting_nodes_offer_nothing(workload):
    labels = {**SEED_T4_LABELS, "nvidia.com/gpu.workload.config": workload}
    assert discover([node("t4", labels, {GPU: "1"})]) == []


def test_container_workload_node_is_offered():
    labels = {**SEED_T4_LABELS, "nvidia.com/gpu.workload.config": "container"}
    assert only(discover([node("t4", labels, {GPU: "1"})])).slug == "gpu-tesla-t4"


def test_cpu_nodes_and_malformed_quantities_offer_nothing():
    assert discover([node("cpu", {}, {"cpu": "32", "memory": "256Gi", "pods": "110"})]) == []
    assert discover([node("odd", SEED_T4_LABELS, {GPU: "lots"})]) == []
    assert discover([{"metadata": {"name": "bare"}}]) == []


def test_node_facts_read_allocatable_in_scheduler_units():
    facts = NodeFacts.from_node(node("a100", A100_MIG_LABELS, A100_MIG_ALLOC, taints=[GKE_TAINT]))
    assert dict(facts.allocatable) == {
        "nvidia.com/gpu": 0,
        "nvidia.com/mig-1g.5gb": 2,
        "nvidia.com/mig-2g.10gb": 1,
        "nvidia.com/mig-3g.20gb": 1,
        "cpu": 32000,
        "memory": 256 * 2**30,
        "pods": 110,
    }
    assert facts.taints == (GKE_TAINT,)
    assert hosts_pods(facts) and mig_settled(facts.labels)


# ------------------------------------------------------------------- memory label units


@pytest.mark.parametrize(
    "value, mib",
    [
        ("15360", 15360),  # today: MiB
        ("81559", 81559),
        (str(16 * 1024**3), 16384),  # old GFD: bytes
        (str(40 * 1024**3), 40960),
        (str(80 * 1024**3), 81920),
        ("0", None),
        ("-1", None),
        ("", None),
        ("lots", None),
        (None, None),
    ],
)
def test_memory_label_mib_or_bytes(value, mib):
    assert memory_mib(value) == mib


def test_bytes_memory_label_reaches_the_offering():
    labels = t4(**{"nvidia.com/gpu.memory": str(15360 * 1024 * 1024)})
    assert only(discover([node("t4", labels, {GPU: "1"})])).memory_mib == 15360


# -------------------------------------------------------------------------- tolerations


def test_gpu_tolerations_for_known_gpu_taints():
    taints = [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},  # covered by the default Exists
        {"key": "sku", "value": "gpu", "effect": "NoSchedule"},  # AKS
        {"key": "node-role.kubernetes.io/gpu", "value": "true", "effect": "NoExecute"},
        {"key": "sku", "value": "gpu", "effect": "NoSchedule"},  # duplicate
        {"key": "sku", "value": "gpu", "effect": "PreferNoSchedule"},  # soft: not needed
        {"key": "dedicated", "value": "team-a", "effect": "NoSchedule"},  # not a GPU taint: the admin's call
    ]
    assert gpu_tolerations(taints) == (
        DEFAULT_TOL,
        {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/gpu", "operator": "Equal", "value": "true", "effect": "NoExecute"},
    )


def test_discovered_offering_tolerates_every_node_it_spans_in_any_order():
    labels = {PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}
    plain = node("h-plain", labels, {GPU: "8"})
    aks = node("h-aks", labels, {GPU: "8"}, taints=[{"key": "sku", "value": "gpu", "effect": "NoSchedule"}])
    for nodes in ([plain, aks], [aks, plain]):
        o = only(discover(nodes))
        assert availability(o, nodes, []).capacity == 16, o.tolerations


# ------------------------------------------------------------------ the devcluster nodes


def test_standard_nodes_offerings_in_display_order():
    offerings = discover(standard_nodes())
    assert [(o.kind.value, o.slug) for o in offerings] == [
        ("shared", "shared-nvidia-l4-shared-mps-4x"),
        ("shared", "shared-tesla-t4-shared-time-slicing-4x"),
        ("shared", "shared-tesla-t4-time-slicing-4x"),
        ("mig", "mig-gke-nvidia-tesla-a100-1g-5gb"),  # the same 4864 MiB as GFD's label says: by slug
        ("mig", "mig-nvidia-a100-sxm4-40gb-1g-5gb"),
        ("mig", "mig-nvidia-a100-sxm4-40gb-2g-10gb"),
        ("mig", "mig-nvidia-a100-sxm4-40gb-3g-20gb"),
        ("full", "gpu-nvidia-tesla-a100"),  # GKE publishes no memory label: 40 GB from its name, below the H100's
        ("full", "gpu-nvidia-h100-80gb-hbm3"),
        ("vgpu", "vgpu-vgpu-type-v100-8g-8gb"),
        ("vgpu", "vgpu-nvidia-a10-24q"),
    ]


def test_standard_nodes_every_offering_counts_exactly_its_nodes():
    nodes = standard_nodes()
    expected = {
        "shared-nvidia-l4-shared-mps-4x": (4, ("gpu-l4-mps",)),
        "shared-tesla-t4-shared-time-slicing-4x": (4, ("gpu-t4-ts-shared",)),
        "shared-tesla-t4-time-slicing-4x": (4, ("gpu-t4-ts-renamed",)),
        "mig-nvidia-a100-sxm4-40gb-1g-5gb": (2, ("gpu-a100-mig",)),
        "mig-gke-nvidia-tesla-a100-1g-5gb": (7, ("gke-a100-mig-1g",)),
        "mig-nvidia-a100-sxm4-40gb-2g-10gb": (1, ("gpu-a100-mig",)),
        "mig-nvidia-a100-sxm4-40gb-3g-20gb": (1, ("gpu-a100-mig",)),
        "gpu-nvidia-h100-80gb-hbm3": (8, ("gpu-h100-8x",)),
        "gpu-nvidia-tesla-a100": (1, ("gke-a100-whole",)),  # not the partitioned GKE node
        "vgpu-vgpu-type-v100-8g-8gb": (1, ("gpu-v100-vgpu-class",)),
        "vgpu-nvidia-a10-24q": (1, ("gpu-a10-vgpu",)),
    }
    got = {o.slug: (a.capacity, a.nodes) for o in discover(nodes) for a in [availability(o, nodes, [])]}
    assert got == expected


def test_discovery_does_not_mutate_input_nodes():
    nodes = standard_nodes()
    before = copy.deepcopy(nodes)
    discover(nodes)
    assert nodes == before


# ------------------------------------------------- nodes the devcluster does not simulate


def served(offering, nodes):
    return set(availability(offering, nodes, []).nodes)


def test_unlabelled_device_plugin_node_is_an_offering_of_its_own():
    # A plain device-plugin install: nvidia.com/gpu and no GPU labels. Its offering must not
    # select labelled nodes (a whole T4, a time-sliced L4, a MIG-single A100 all serve nvidia.com/gpu).
    bare = node("bare", {}, {GPU: "4"})
    whole = node("t4", SEED_T4_LABELS, {GPU: "1"})
    shared = node(
        "l4",
        {PRODUCT_LABEL: "NVIDIA-L4-SHARED", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
        {GPU: "4"},
    )
    single = node("single", SINGLE_LABELS, {GPU: "7"})
    nodes = [bare, whole, shared, single]
    found = by_slug(discover(nodes))
    plain = found["gpu-unlabelled"]
    assert plain.kind is Kind.FULL and plain.display_name == "GPU (unlabelled nodes)"
    assert "no GPU Feature Discovery labels" in plain.description
    assert served(plain, nodes) == {"bare"}
    assert served(found["gpu-tesla-t4"], nodes) == {"t4"}
    assert {n for o in found.values() for n in served(o, nodes)} == {"bare", "t4", "l4", "single"}


def test_unlabelled_nodes_are_named_by_cloud_labels_when_they_have_them():
    eks = node("eks", {"k8s.amazonaws.com/accelerator": "nvidia-tesla-v100", "node.kubernetes.io/instance-type": "p3.2xlarge"}, {GPU: "1"})
    aks = node(
        "aks",
        {"kubernetes.azure.com/accelerator": "nvidia", "node.kubernetes.io/instance-type": "Standard_NC6s_v3"},
        {GPU: "1"},
        taints=[{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
    )
    found = by_slug(discover([eks, aks]))
    assert found["gpu-nvidia-tesla-v100"].display_name == "Tesla V100"
    assert found["gpu-standard-nc6s-v3"].display_name == "GPU on Standard_NC6s_v3"
    assert served(found["gpu-nvidia-tesla-v100"], [eks, aks]) == {"eks"}
    assert served(found["gpu-standard-nc6s-v3"], [eks, aks]) == {"aks"}  # tolerates AKS's sku=gpu taint


def test_whole_gpu_never_selects_a_time_sliced_node_of_its_product_mid_change():
    # The replicas label is there, the product not yet "-SHARED": the node is a share, and the
    # whole-T4 offering of another node must not land on it.
    whole = node("t4", SEED_T4_LABELS, {GPU: "1"})
    changing = node("t4-ts", t4(**{"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": None}), {GPU: "4"})
    found = by_slug(discover([whole, changing]))
    assert served(found["gpu-tesla-t4"], [whole, changing]) == {"t4"}
    share = next(o for o in found.values() if o.kind is Kind.SHARED)
    assert served(share, [whole, changing]) == {"t4-ts"}
    assert share.slug == "shared-tesla-t4-shared-time-slicing-4x"  # a plain nvidia.com/gpu share


def test_a_node_named_by_gfd_and_one_named_by_gke_are_one_offering():
    gfd = node("l4-gfd", {PRODUCT_LABEL: "NVIDIA-L4", "nvidia.com/gpu.replicas": "1"}, {GPU: "1"})
    gke = node("l4-gke", {"cloud.google.com/gke-accelerator": "nvidia-l4"}, {GPU: "2"})
    o = only(discover([gfd, gke]))
    assert o.slug == "gpu-nvidia-l4" and o.counts == (1, 2)
    assert served(o, [gfd, gke]) == {"l4-gfd", "l4-gke"}
    assert o.node_selector == {}  # the two nodes are told apart by different labels: both in the terms


def test_renamed_and_plain_shares_of_one_product_stay_apart():
    renamed = node(
        "r", t4(**{"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}), {"nvidia.com/gpu.shared": "4"}
    )
    plain = node("p", t4(**{"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}), {GPU: "4"})
    found = by_slug(discover([renamed, plain]))
    assert {o.slug: dict(o.resources) for o in found.values()} == {
        "shared-tesla-t4-time-slicing-4x": {"nvidia.com/gpu.shared": 1},
        "shared-tesla-t4-shared-time-slicing-4x": {GPU: 1},
    }


def test_mig_offering_of_a_settled_node_never_reaches_one_being_reconfigured():
    settled = node("a", A100_MIG_LABELS, A100_MIG_ALLOC)
    pending = node("b", {**A100_MIG_LABELS, "nvidia.com/mig.config.state": "pending"}, A100_MIG_ALLOC)
    for o in discover([settled, pending]):
        assert served(o, [settled, pending]) == {"a"}, o.slug


def test_mig_slices_of_an_unnamed_gpu_stay_off_named_ones():
    named = node("a", A100_MIG_LABELS, A100_MIG_ALLOC)
    unnamed = node("u", {"nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/mig-1g.5gb": "7"})
    found = by_slug(discover([named, unnamed]))
    assert served(found["mig-gpu-1g-5gb"], [named, unnamed]) == {"u"}
    assert served(found["mig-nvidia-a100-sxm4-40gb-1g-5gb"], [named, unnamed]) == {"a"}


def test_mig_single_and_whole_gpus_without_the_strategy_label():
    # Partial labels: the -MIG- product says it is a slice even without nvidia.com/mig.strategy.
    labels = {k: v for k, v in SINGLE_LABELS.items() if k != "nvidia.com/mig.strategy"}
    o = only(discover([node("single", labels, {GPU: "7"})]))
    assert o.kind is Kind.MIG and o.display_name == "A100 40GB · MIG 1g.5gb"


def test_time_sliced_mig_slices_are_shares_not_isolated_slices():
    labels = {
        **SINGLE_LABELS,
        PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
        "nvidia.com/gpu.replicas": "2",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }
    o = only(discover([node("s", labels, {GPU: "14"})]))
    assert o.kind is Kind.SHARED and o.isolation is Isolation.NONE
    assert o.display_name == "A100 40GB MIG 1g.5gb · 1/2 time-sliced"


def test_gpu_taint_with_no_execute_is_tolerated_by_the_offering_of_its_node():
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"}
    n = node("t4", SEED_T4_LABELS, {GPU: "1"}, taints=[taint])
    o = only(discover([n]))
    assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoExecute"} in o.tolerations
    assert served(o, [n]) == {"t4"}


def test_vgpu_class_and_guest_nodes_are_not_whole_gpus_of_their_product():
    klass = node("c", {"vgpu.type": "v100-8g-8GB", PRODUCT_LABEL: "GRID-V100-8C"}, {GPU: "1"})
    plain = node("p", {PRODUCT_LABEL: "GRID-V100-8C"}, {GPU: "1"})
    guest = node("g", {PRODUCT_LABEL: "GRID-V100-8C", "nvidia.com/vgpu.present": "true"}, {GPU: "1"})
    found = discover([klass, plain, guest])
    assert {o.slug: served(o, [klass, plain, guest]) for o in found} == {
        "vgpu-vgpu-type-v100-8g-8gb": {"c"},
        "vgpu-grid-v100-8c": {"g"},
        "gpu-grid-v100-8c": {"p"},
    }


def test_configured_whole_gpu_offering_keeps_off_shared_mig_and_vgpu_nodes():
    from gpuspawner.offerings.config import offering_from_config

    any_gpu = offering_from_config({"slug": "any", "kind": "full"}, 0)
    t4_whole = node("w", SEED_T4_LABELS, {GPU: "1"})
    ts = node(
        "ts",
        t4(**{PRODUCT_LABEL: "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}),
        {GPU: "4"},
    )
    gke_mig = node("gke", GKE_MIG_LABELS, {GPU: "7"})
    guest = node("g", {PRODUCT_LABEL: "NVIDIA-A10-24Q", "nvidia.com/vgpu.present": "true"}, {GPU: "1"})
    site = node("site", {"vgpu.type": "x"}, {GPU: "1"})
    assert served(any_gpu, [t4_whole, ts, gke_mig, guest, site]) == {"w"}
