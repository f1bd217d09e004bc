"""The scheduler's filters as plain data: selectors, taints, cordons, pod room, the notebook's own requests.

Each rule is the one kube-scheduler applies (NodeUnschedulable, NodeAffinity, TaintToleration,
NodeResourcesFit) or the API server's admission adds (DefaultTolerationSeconds); the real
scheduler checks the same on generated clusters in tests/integration/test_capacity_truth.py.
"""

from __future__ import annotations

import pytest

from gpuspawner.capacity.counts import Tally, availability, offering_pod
from gpuspawner.core.fit import PODS, NodeFacts, PodSpec, amount, blocked, room
from gpuspawner.names.selectors import (
    DOES_NOT_EXIST,
    EXISTS,
    GT,
    IN,
    LT,
    NOT_IN,
    Req,
    all_of,
    and_terms,
    any_of,
    factor,
    terms_from_k8s,
    terms_match,
    terms_to_k8s,
    with_default_tolerations,
)
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.pod.notebook import Notebook
from gpuspawner.pod.podspec import merge_affinity_terms, pod_changes

GPU = "nvidia.com/gpu"
TS = "nvidia.com/gpu.shared"


def node(name="n", allocatable=None, labels=None, taints=(), unschedulable=False):
    return {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"taints": list(taints), **({"unschedulable": True} if unschedulable else {})},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", **(allocatable or {})}},
    }


def pod(node_name, requests=None, limits=None, name="p"):
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {
        "metadata": {"name": name, "namespace": "other"},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": "Running"},
    }


SHARE = offering_from_config({"slug": "t4", "kind": "shared", "replicas": 8}, 0)  # nvidia.com/gpu.shared: 1
WHOLE = offering_from_config({"slug": "any", "kind": "full"}, 0)


# ---------------------------------------------------------------------- label requirements


@pytest.mark.parametrize(
    "req, labels, expected",
    [
        (Req("a", IN, ("1", "2")), {"a": "2"}, True),
        (Req("a", IN, ("1",)), {}, False),
        (Req("a", NOT_IN, ("1",)), {}, True),  # NotIn holds where the label is absent
        (Req("a", NOT_IN, ("1",)), {"a": "1"}, False),
        (Req("a", EXISTS), {"a": ""}, True),
        (Req("a", DOES_NOT_EXIST), {"a": ""}, False),
        (Req("a", GT, ("1",)), {"a": "2"}, True),
        (Req("a", GT, ("1",)), {"a": "+2"}, True),  # strconv.ParseInt takes a sign
        (Req("a", LT, ("2",)), {"a": "1.5"}, False),  # not an integer: no match
        (Req("a", LT, ("2",)), {}, False),  # Gt/Lt need the label
        (Req("a", "Bogus"), {"a": "1"}, False),
    ],
)
def test_requirement_matches_like_kubernetes(req, labels, expected):
    assert req.matches(labels) is expected


def test_match_fields_name_the_node():
    terms = terms_from_k8s([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])
    assert terms_match(terms, {}, "n1") and not terms_match(terms, {}, "n2")


def test_an_empty_kubernetes_term_matches_no_node():
    assert not terms_match(terms_from_k8s([{}]), {"a": "1"}, "n")


def test_terms_or_and_and():
    a, b, c = Req("a", EXISTS), Req("b", EXISTS), Req("c", EXISTS)
    either = any_of(all_of(a), all_of(b))
    both = and_terms(either, all_of(c))
    assert both == ((a, c), (b, c))
    assert terms_match(both, {"b": "", "c": ""}) and not terms_match(both, {"a": "", "b": ""})
    assert any_of(all_of(a), ()) == ()  # "no constraint" ORed with anything is no constraint


def test_factor_moves_shared_equalities_to_the_node_selector():
    x1, y = Req("x", IN, ("1",)), Req("y", DOES_NOT_EXIST)
    selector, rest = factor(((x1, y, Req("r", IN, ("1",))), (x1, y, Req("r", DOES_NOT_EXIST))))
    assert selector == {"x": "1"}
    assert rest == ((y, Req("r", IN, ("1",))), (y, Req("r", DOES_NOT_EXIST)))


def test_merge_with_kubespawner_terms_is_every_pairing():
    admin = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]
    ours = any_of(all_of(Req("r", DOES_NOT_EXIST)), all_of(Req("r", IN, ("1",))))
    merged = merge_affinity_terms(admin, ours)
    assert len(merged) == 4
    assert terms_from_k8s(merged) == and_terms(terms_from_k8s(admin), ours)
    assert merge_affinity_terms(admin, ()) == admin
    assert merge_affinity_terms([], ours) == terms_to_k8s(ours)


def test_whole_gpu_pod_carries_its_exclusions():
    changes = pod_changes(WHOLE)
    shared_node = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}
    assert not terms_match(changes.node_affinity, shared_node)
    assert terms_match(changes.node_affinity, {"nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none"})
    assert terms_match(changes.node_affinity, {})  # a node with no GPU labels is whole GPUs to a configured "full"


# ------------------------------------------------------------------------------- taints


def test_api_server_default_tolerations_cover_not_ready_no_execute_only():
    tols = with_default_tolerations([])
    spec = PodSpec(tolerations=())
    no_execute = NodeFacts.from_node(node(taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]))
    both = NodeFacts.from_node(
        node(
            taints=[
                {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
            ]
        )
    )
    assert len(tols) == 2
    assert blocked(spec, no_execute) is None
    assert blocked(spec, both) == "taint node.kubernetes.io/not-ready:NoSchedule not tolerated"
    # a pod that already tolerates everything gets nothing added
    assert with_default_tolerations([{"operator": "Exists"}]) == ({"operator": "Exists"},)


def test_cordoned_node_takes_only_a_pod_that_tolerates_the_cordon():
    cordoned = NodeFacts.from_node(node(unschedulable=True, allocatable={GPU: "2"}))
    assert blocked(PodSpec(), cordoned) == "cordoned"
    assert blocked(PodSpec(tolerations=({"operator": "Exists"},)), cordoned) is None
    assert blocked(PodSpec(tolerations=({"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},)), cordoned) is None
    everything = offering_from_config({"slug": "all", "kind": "full", "tolerations": [{"operator": "Exists"}]}, 0)
    assert availability(everything, [node(unschedulable=True, allocatable={GPU: "2"})], []).free == 2


# ---------------------------------------------------------------------------- room on a node


@pytest.mark.parametrize(
    "value, resource, expected",
    [
        ("500m", "cpu", 500),
        ("0.5", "cpu", 500),
        ("1", "cpu", 1000),
        ("0.0001", "cpu", 1),
        ("1Gi", "memory", 2**30),
        ("1G", "memory", 10**9),
        ("1.5", "memory", 2),
        ("100m", "memory", 1),
        ("4", GPU, 4),
        ("1k", GPU, 1000),
        (2, GPU, 2),
        ("lots", GPU, None),
        (True, GPU, None),
    ],
)
def test_amounts_round_up_like_quantity_value(value, resource, expected):
    assert amount(resource, value) == expected


def test_eight_replicas_on_a_node_with_room_for_three_pods_give_three():
    n = node(allocatable={TS: "8", "pods": "10"})
    others = [pod("n", name=f"d{i}") for i in range(7)]  # daemon pods without requests still take slots
    a = availability(SHARE, [n], others)
    assert (a.capacity, a.allocated, a.free, a.largest_free) == (8, 0, 3, 1)


def test_a_node_with_no_pod_slots_left_has_nothing_free():
    a = availability(SHARE, [node(allocatable={TS: "8", "pods": "2"})], [pod("n", name="a"), pod("n", name="b")])
    assert (a.capacity, a.free, a.largest_free) == (8, 0, 0)


def test_the_memory_guarantee_must_fit_beside_the_other_pods():
    n = node(allocatable={TS: "8", "memory": "4Gi"})
    hog = pod("n", requests={"memory": "2560Mi"})
    z2jh = Notebook.from_settings({"mem_guarantee": "1G"})  # 1 GiB, as KubeSpawner reads "1G"
    assert z2jh.requests == {"memory": 2**30, PODS: 1}
    assert availability(SHARE, [n], [hog]).free == 8
    assert availability(SHARE, [n], [hog], z2jh).free == 1  # 4Gi - 2.5Gi leaves room for one 1Gi notebook


def test_cpu_guarantee_and_limit_as_request():
    n = node(allocatable={TS: "8", "cpu": "4"})
    hog = pod("n", requests={"cpu": "3500m"})
    assert availability(SHARE, [n], [hog], Notebook.from_settings({"cpu_guarantee": 0.25})).free == 2
    # without a guarantee Kubernetes takes the limit as the request
    assert availability(SHARE, [n], [hog], Notebook.from_settings({"cpu_limit": 1})).free == 0
    # with neither, a node overcommitted on cpu still takes the notebook
    assert availability(SHARE, [n], [hog, pod("n", requests={"cpu": "2"}, name="q")]).free == 8


def test_largest_free_needs_room_for_the_notebook_once():
    h100 = offering_from_config({"slug": "h", "kind": "full", "counts": [1, 2, 4, 8]}, 0)
    n = node(allocatable={GPU: "8", "memory": "8Gi"})
    nb = Notebook.from_settings({"mem_guarantee": "4G"})
    a = availability(h100, [n], [pod("n", requests={"memory": "3Gi"})], nb)
    assert (a.free, a.largest_free) == (1, 8)  # one notebook fits: it may take all 8 GPUs
    a = availability(h100, [n], [pod("n", requests={"memory": "5Gi"})], nb)
    assert (a.free, a.largest_free) == (0, 0)


def test_room_counts_the_pod_itself():
    facts = NodeFacts.from_node(node(allocatable={"pods": "3"}))
    assert room({}, facts, {PODS: 1}) == 2
    assert room({"cpu": 1000}, facts, {"cpu": 7500}) == 0
    assert room({"example.com/x": 1}, facts, {}) == 0  # the node has none of it


# ----------------------------------------------------------------------------- the notebook


def test_notebook_from_kubespawner_settings():
    nb = Notebook.from_settings(
        {
            "cpu_guarantee": 0.5,
            "mem_limit": "2G",
            "extra_resource_guarantees": {"ephemeral-storage": "1Gi"},
            "init_containers": [{"name": "init", "resources": {"requests": {"cpu": "2"}}}],
            "extra_containers": [{"name": "side", "resources": {"requests": {"memory": "128Mi"}}}],
            "node_selector": {"pool": "user"},
            "tolerations": {"b": {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"}},
            "node_affinity_required": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}],
        }
    )
    # init container (2 cpu) runs alone: max(2000, 500); memory = 2 GiB limit as request + sidecar
    assert nb.requests == {"cpu": 2000, "memory": 2 * 2**30 + 128 * 2**20, "ephemeral-storage": 2**30, PODS: 1}
    assert nb.node_selector == {"pool": "user"}
    assert nb.tolerations[0]["key"] == "hub.jupyter.org/dedicated"
    assert nb.terms == ((Req("zone", IN, ("a",)),),)
    assert "cpu 2000m" in nb.describe() and "memory 2.12 GiB" in nb.describe()


@pytest.mark.parametrize(
    "settings, problem",
    [
        ({"mem_guarantee": "lots"}, "c.KubeSpawner.mem_guarantee must be bytes or a size such as '1G'"),
        ({"cpu_guarantee": "half"}, "c.KubeSpawner.cpu_guarantee must be a number of CPU cores"),
        ({"node_selector": ["a"]}, "c.KubeSpawner.node_selector must be a dict"),
        ({"tolerations": "all"}, "c.KubeSpawner.tolerations must be a list"),
    ],
)
def test_bad_notebook_settings_name_the_setting(settings, problem):
    with pytest.raises(ValueError, match=problem):
        Notebook.from_settings(settings)


def test_the_notebooks_tolerations_and_selector_join_the_offerings():
    nb = Notebook.from_settings(
        {"tolerations": [{"key": "hub.jupyter.org/dedicated", "operator": "Exists"}], "node_selector": {"pool": "user"}}
    )
    user_pool = node(
        labels={"pool": "user"},
        allocatable={TS: "4"},
        taints=[{"key": "hub.jupyter.org/dedicated", "value": "user", "effect": "NoSchedule"}],
    )
    other = node("o", labels={"pool": "batch"}, allocatable={TS: "4"})
    assert availability(SHARE, [user_pool, other], []).nodes == ("o",)
    assert availability(SHARE, [user_pool, other], [], nb).nodes == ("n",)
    spec = offering_pod(SHARE, nb)
    assert spec.requests == {TS: 1, PODS: 1} and spec.node_selector == {"pool": "user"}
    assert Tally(SHARE, nb).reaches(NodeFacts.from_node(user_pool))
