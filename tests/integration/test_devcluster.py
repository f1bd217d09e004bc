"""The devcluster behaves like a real GPU cluster for our purposes: the real
scheduler's decisions on the simulated nodes of nodes.yaml."""

from __future__ import annotations

import ipaddress

from gpuspawner.core.model import DEFAULT_GPU_TOLERATION
from gpuspawner.devcluster import build
from tests.conftest import wait_for

GPU_TOLERATION = dict(DEFAULT_GPU_TOLERATION)


def make_pod(name: str, limits: dict, tolerations=(GPU_TOLERATION,), node_selector=None) -> dict:
    spec = {
        "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook", "resources": {"limits": limits}}],
        "tolerations": list(tolerations),
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(kube, ns, pod):
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)


def get(kube, ns, name):
    return kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


def running(kube, ns, name):
    pod = get(kube, ns, name)
    return pod if pod["status"].get("phase") == "Running" and pod["status"].get("podIP") else None


def unschedulable(kube, ns, name):
    pod = get(kube, ns, name)
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
            return cond["message"]
    return None


def test_nodes_are_ready_with_gpu_resources(kube):
    nodes = {n["metadata"]["name"]: n for n in kube.request("GET", "/api/v1/nodes")["items"]}
    assert {"gpu-a100-mig", "gpu-h100-8x", "gpu-t4-ts-renamed", "gke-a100-mig-1g", "cpu-worker"} <= set(nodes)
    for node in nodes.values():
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
        assert not any(t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints") or [])
    a100 = nodes["gpu-a100-mig"]["status"]["allocatable"]
    assert a100["nvidia.com/mig-3g.20gb"] == "1" and a100["nvidia.com/mig-1g.5gb"] == "2"


def test_server_reports_its_real_version(kube):
    version = kube.request("GET", "/version")
    assert version["gitVersion"] == build.K8S_VERSION
    assert version["major"] == "1" and version["minor"] == build.K8S_VERSION.split(".")[1]


def test_the_k8s_marker_skips_a_test_only_on_a_server_older_than_it_needs(k8s_release):
    from tests.conftest import too_old

    major, minor = k8s_release
    assert too_old(k8s_release, f"{major}.{minor + 1}", "a newer feature") == (
        f"a newer feature needs Kubernetes {major}.{minor + 1} or newer; this devcluster runs {major}.{minor}"
    )
    assert too_old(k8s_release, f"{major}.{minor}", "this release's feature") is None
    assert too_old(k8s_release, "1.34", "DRA") is None


def test_mig_slice_schedules_then_second_is_refused_by_the_scheduler(kube, namespace):
    create(kube, namespace, make_pod("mig-a", {"nvidia.com/mig-3g.20gb": "1"}))
    pod = wait_for(lambda: running(kube, namespace, "mig-a"), "first MIG pod Running")
    assert pod["spec"]["nodeName"] == "gpu-a100-mig"
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network("127.0.0.0/8")

    create(kube, namespace, make_pod("mig-b", {"nvidia.com/mig-3g.20gb": "1"}))
    message = wait_for(lambda: unschedulable(kube, namespace, "mig-b"), "second MIG pod Unschedulable")
    assert "Insufficient nvidia.com/mig-3g.20gb" in message
    assert get(kube, namespace, "mig-b")["status"]["phase"] == "Pending"


def test_untolerated_gpu_taint_keeps_pod_off_the_node(kube, namespace):
    create(kube, namespace, make_pod("no-toleration", {"nvidia.com/gpu": "1"}, tolerations=()))
    message = wait_for(lambda: unschedulable(kube, namespace, "no-toleration"), "pod without toleration Unschedulable")
    assert "untolerated taint" in message
    assert not get(kube, namespace, "no-toleration")["spec"].get("nodeName")


def test_product_node_selector_is_honoured(kube, namespace):
    selector = {"nvidia.com/gpu.product": "Tesla-T4-SHARED"}
    create(kube, namespace, make_pod("t4", {"nvidia.com/gpu": "1"}, node_selector=selector))
    pod = wait_for(lambda: running(kube, namespace, "t4"), "T4 pod Running")
    assert pod["spec"]["nodeName"] == "gpu-t4-ts-shared"
    # The same request without the selector may land on any node with nvidia.com/gpu;
    # with a product nobody has, the scheduler says no node matches.
    create(kube, namespace, make_pod("nowhere", {"nvidia.com/gpu": "1"}, node_selector={"nvidia.com/gpu.product": "B200"}))
    message = wait_for(lambda: unschedulable(kube, namespace, "nowhere"), "pod with unmatched selector Unschedulable")
    assert "didn't match Pod's node affinity/selector" in message


def test_deleted_pod_goes_away(kube, namespace):
    create(kube, namespace, make_pod("short", {"nvidia.com/mig-1g.5gb": "1"}))
    wait_for(lambda: running(kube, namespace, "short"), "pod Running")
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/short")

    def names():
        return [p["metadata"]["name"] for p in kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]]

    wait_for(lambda: "short" not in names(), "deleted pod removed by kwok")


def test_every_node_has_a_pod_network_of_this_clusters_own_band(kube):
    """Pod IPs come from the cluster's claimed band (devcluster.podnet), one /24 per node, so a
    notebook here never collides with one of another cluster on this machine."""
    state = kube.state
    assert state.pod_width >= 2
    band = range(state.pod_net, state.pod_net + state.pod_width)
    cidrs = [n["spec"]["podCIDR"] for n in kube.request("GET", "/api/v1/nodes")["items"]]
    assert len(set(cidrs)) == len(cidrs)
    for cidr in cidrs:
        first, second, _, rest = cidr.split(".")
        assert first == "127" and int(second) in band and rest == "0/24", cidr
