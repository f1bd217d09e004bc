"""`gpuspawner kueue`'s YAML (gpuspawner/capacity/kueueyaml.py): one ResourceFlavor per placement,
a ClusterQueue whose resource groups keep Kueue's rules, LocalQueues for the mapping's queues.

The real Kueue accepts it in tests/kueue/test_kueue_cli.py; here, the shapes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from gpuspawner.capacity.counts import availability
from gpuspawner.capacity.kueueyaml import CPU_FLAVOR, allocatable_totals, kueue_documents, render
from gpuspawner.core.model import CPU_OFFERING, DeviceClaim, Offering
from gpuspawner.devcluster.nodes import standard_nodes
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.discovery import discover

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def offering(slug: str, resources: dict[str, int], selector: dict[str, str], **kw) -> Offering:
    return Offering(
        slug=slug,
        kind=kw.pop("kind", Kind.FULL),
        display_name=slug,
        resources=resources,
        node_selector=selector,
        tolerations=kw.pop("tolerations", (GPU_TOLERATION,)),
        **kw,
    )


def documents(offerings, capacities=None, **kw):
    kw.setdefault("cluster_queue", "gpuspawner")
    kw.setdefault("namespace", "hub")
    kw.setdefault("local_queues", ["gpu"])
    return kueue_documents(offerings, capacities or {}, **kw)


def by_kind(docs, kind):
    return [d.body for d in docs if d.body["kind"] == kind]


def cluster_queue(docs):
    (cq,) = by_kind(docs, "ClusterQueue")
    return cq


def check_kueue_rules(cq: dict, flavor_names: set[str]) -> None:
    """What Kueue's ClusterQueue validation demands (clusterqueue_types.go, clusterqueue_webhook.go)."""
    groups = cq["spec"]["resourceGroups"]
    assert 1 <= len(groups) <= 16
    resources = [r for g in groups for r in g["coveredResources"]]
    assert len(resources) == len(set(resources)), "a resource in two groups"
    flavors = [f["name"] for g in groups for f in g["flavors"]]
    assert len(flavors) == len(set(flavors)), "a flavor in two groups"
    assert set(flavors) == flavor_names, "every flavor of the queue is a ResourceFlavor written here"
    for group in groups:
        assert 1 <= len(group["coveredResources"]) <= 64 and 1 <= len(group["flavors"]) <= 64
        for flavor in group["flavors"]:
            assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
            assert all(int(r["nominalQuota"].rstrip("Gim")) >= 0 for r in flavor["resources"])


@pytest.fixture(scope="module")
def standard():
    nodes = standard_nodes()
    offerings = [CPU_OFFERING, *discover(nodes)]
    capacities = {o.slug: availability(o, nodes, []).capacity for o in offerings}
    return nodes, offerings, capacities


def test_one_flavor_per_placement_with_the_offerings_own_labels_and_tolerations(standard):
    nodes, offerings, capacities = standard
    docs = documents(offerings, capacities, cpu_memory=allocatable_totals(nodes))
    flavors = {f["metadata"]["name"]: f["spec"] for f in by_kind(docs, "ResourceFlavor")}
    assert all(DNS_SUBDOMAIN.match(name) and len(name) <= 63 for name in flavors)
    assert flavors[CPU_FLAVOR] == {}
    # the three MIG profiles of one A100 share its nodes: one flavor, named after their common words
    assert flavors["mig-nvidia-a100-sxm4-40gb"] == {
        "nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
        "tolerations": [GPU_TOLERATION],
    }
    # the renamed T4 share: its own flavor, with its own toleration of CERN's taint
    t4 = flavors["shared-tesla-t4-time-slicing-4x"]
    assert t4["nodeLabels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert {"key": "node-role.kubernetes.io/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in t4["tolerations"]
    assert flavors["gpu-nvidia-h100-80gb-hbm3"]["nodeLabels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    gpu_offerings = [o for o in offerings if o.is_gpu]
    assert len(flavors) == 1 + len({(tuple(sorted(o.node_selector.items())), str(o.tolerations)) for o in gpu_offerings})
    check_kueue_rules(cluster_queue(docs), set(flavors))


def test_resource_groups_follow_shared_resources_and_quota_is_the_capacity_now(standard):
    nodes, offerings, capacities = standard
    cq = cluster_queue(documents(offerings, capacities, cpu_memory=allocatable_totals(nodes)))
    groups = {
        tuple(g["coveredResources"]): {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in g["flavors"]}
        for g in cq["spec"]["resourceGroups"]
    }
    assert cq["spec"]["resourceGroups"][0]["coveredResources"] == ["cpu", "memory"]
    cpu = groups[("cpu", "memory")][CPU_FLAVOR]
    assert cpu == {"cpu": str(32 * len(nodes)), "memory": f"{256 * len(nodes)}Gi"}
    mig = groups[("nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb")]
    assert mig == {
        "mig-nvidia-a100-sxm4-40gb": {"nvidia.com/mig-1g.5gb": "2", "nvidia.com/mig-2g.10gb": "1", "nvidia.com/mig-3g.20gb": "1"}
    }
    assert groups[("nvidia.com/gpu.shared",)] == {"shared-tesla-t4-time-slicing-4x": {"nvidia.com/gpu.shared": "4"}}
    whole = groups[("nvidia.com/gpu",)]
    assert whole["gpu-nvidia-h100-80gb-hbm3"] == {"nvidia.com/gpu": "8"}
    assert whole["shared-tesla-t4-shared-time-slicing-4x"] == {"nvidia.com/gpu": "4"}


def test_flavors_sharing_one_resource_join_groups_and_list_zero_for_what_they_lack():
    a = offering("a", {"nvidia.com/gpu": 1, "example.com/fpga": 1}, {"pool": "a"})
    b = offering("b", {"nvidia.com/gpu": 2}, {"pool": "b"})
    c = offering("c", {"example.com/other": 1}, {"pool": "c"})
    cq = cluster_queue(documents([a, b, c], {"a": 3, "b": 2, "c": None}))
    groups = cq["spec"]["resourceGroups"]
    assert [g["coveredResources"] for g in groups] == [["cpu", "memory"], ["nvidia.com/gpu", "example.com/fpga"], ["example.com/other"]]
    assert groups[1]["flavors"] == [
        {"name": "a", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "3"}, {"name": "example.com/fpga", "nominalQuota": "3"}]},
        # 2 units of 2 GPUs each; no FPGA on its nodes
        {"name": "b", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "4"}, {"name": "example.com/fpga", "nominalQuota": "0"}]},
    ]
    assert groups[2]["flavors"] == [{"name": "c", "resources": [{"name": "example.com/other", "nominalQuota": "0"}]}]
    check_kueue_rules(cq, {CPU_FLAVOR, "a", "b", "c"})


def test_unknown_capacity_is_zero_and_said():
    docs = documents([offering("a100", {"nvidia.com/gpu": 1}, {"pool": "a100"})], {"a100": None})
    (comment,) = [d.comment for d in docs if d.body["kind"] == "ClusterQueue"]
    assert "0 where unknown: a100/nvidia.com/gpu." in comment
    assert "unavailable in ClusterQueue" in comment and "excludeResourcePrefixes" in comment


def test_dra_and_cpu_offerings_get_no_flavor_and_dra_is_said():
    dra = Offering(slug="dra-a100", kind=Kind.FULL, display_name="A100 (DRA)", claim=DeviceClaim(device_class="gpu.nvidia.com"))
    bare = Offering(slug="wrapper", kind=Kind.SHARED, display_name="wrapped")  # command prefix only
    docs = documents([CPU_OFFERING, dra, bare, offering("h100", {"nvidia.com/gpu": 1}, {"pool": "h100"})], {"h100": 1})
    assert [f["metadata"]["name"] for f in by_kind(docs, "ResourceFlavor")] == [CPU_FLAVOR, "h100"]
    (comment,) = [d.comment for d in docs if d.body["kind"] == "ClusterQueue"]
    assert "Not quota'd: dra-a100: a DRA offering (ResourceClaim of class gpu.nvidia.com)" in comment
    assert "Not quota'd: wrapper:" in comment


def test_flavor_names_stay_unique_and_valid():
    long = "x" * 61
    offerings = [
        offering(f"{long}-a", {"nvidia.com/gpu": 1}, {"pool": "1"}),
        offering(f"{long}-a", {"nvidia.com/gpu": 1}, {"pool": "2"}),  # a config offering of the same slug elsewhere
        offering("default-flavor", {"nvidia.com/gpu": 1}, {"pool": "3"}),
        offering("ab-one", {"nvidia.com/gpu": 1}, {"pool": "4"}),
        offering("cd-two", {"nvidia.com/gpu.shared": 1}, {"pool": "4"}),  # no words in common: the first slug
    ]
    names = [f["metadata"]["name"] for f in by_kind(documents(offerings), "ResourceFlavor")]
    assert len(names) == len(set(names)) == 5
    assert names[3] == "default-flavor-2" and names[4] == "ab-one"
    assert all(DNS_SUBDOMAIN.match(n) and len(n) <= 63 for n in names), names


def test_local_queues_in_the_hub_namespace_and_a_namespace_selector():
    docs = documents([], local_queues=["ml-course", "gpu", "gpu"], namespace="jhub", cluster_queue="shared-gpus")
    assert by_kind(docs, "LocalQueue") == [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": q, "namespace": "jhub"},
            "spec": {"clusterQueue": "shared-gpus"},
        }
        for q in ("gpu", "ml-course")
    ]
    cq = cluster_queue(docs)
    assert cq["metadata"]["name"] == "shared-gpus"
    assert cq["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "jhub"}}


def test_kueue_limits_refused():
    labels = {f"l{i}": "x" for i in range(9)}
    with pytest.raises(ValueError, match="at most 8 node labels"):
        documents([offering("many", {"nvidia.com/gpu": 1}, labels)])
    resources = [offering(f"o{i}", {f"example.com/r{i}": 1}, {"pool": str(i)}) for i in range(16)]
    with pytest.raises(ValueError, match="17 resource groups"):
        documents(resources)


def test_render_is_yaml_with_comments(standard):
    nodes, offerings, capacities = standard
    text = render(documents(offerings, capacities), header="top")
    assert text.startswith("# top\n---\n# The cpu/memory flavor")
    loaded = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in loaded].count("LocalQueue") == 1
    assert loaded == [dict(d.body) for d in documents(offerings, capacities)]


def test_allocatable_totals_skip_cordoned_nodes_and_keep_millicores():
    nodes = [
        {"status": {"allocatable": {"cpu": "1500m", "memory": "1Gi"}}},
        {"status": {"allocatable": {"cpu": "2", "memory": "512Mi"}}},
        {"spec": {"unschedulable": True}, "status": {"allocatable": {"cpu": "64", "memory": "1Ti"}}},
    ]
    assert allocatable_totals(nodes) == ("3500m", "1536Mi")
    assert allocatable_totals([]) == ("0", "0")


def run(*args):
    return subprocess.run([sys.executable, "-m", "gpuspawner.tools.cli", "kueue", *args], capture_output=True, text=True, timeout=60)


def test_cli_writes_the_yaml_for_a_config(tmp_path):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"items": standard_nodes()}))
    config = tmp_path / "jupyterhub_config.py"
    config.write_text('c.KubeSpawner.namespace = "jhub"\nc.GPUSpawner.kueue_queues = {"default": "gpu", "groups": {"ml": "ml-course"}}\n')
    out = tmp_path / "kueue.yaml"
    done = run("--nodes", str(nodes), "--config", str(config), "--cluster-queue", "hub-gpus", "-o", str(out))
    assert done.returncode == 0, done.stderr
    loaded = list(yaml.safe_load_all(out.read_text()))
    assert {(d["metadata"]["name"], d["metadata"]["namespace"]) for d in loaded if d["kind"] == "LocalQueue"} == {
        ("gpu", "jhub"),
        ("ml-course", "jhub"),
    }
    assert [d["metadata"]["name"] for d in loaded if d["kind"] == "ClusterQueue"] == ["hub-gpus"]

    # no namespace anywhere: a one-line error, exit 2
    config.write_text('c.GPUSpawner.kueue_queues = {"default": "gpu"}\n')
    done = run("--nodes", str(nodes), "--config", str(config))
    assert done.returncode == 2 and "give --namespace" in done.stderr and done.stdout == ""
    # a wrong mapping: the mapping's own words
    done = run("--nodes", str(nodes), "--namespace", "jhub", "--config", str(config.with_name("bad.py")))
    assert done.returncode == 2
    config.write_text('c.GPUSpawner.kueue_queues = {"default": "Not A Name"}\n')
    done = run("--nodes", str(nodes), "--namespace", "jhub", "--config", str(config))
    assert done.returncode == 2 and "must be a LocalQueue's name" in done.stderr
    # no mapping: the queue and flavors still, and a warning
    done = run("--nodes", str(nodes), "--namespace", "jhub")
    assert done.returncode == 0 and "names no queue" in done.stderr and "kind: ClusterQueue" in done.stdout
