"""The real Kueue on the devcluster (issue #27, its first part): Kueue's controller built from
its Go module (v0.17.0), its CRDs and fail-closed webhooks, on a devcluster of its own.

* A pod labelled with a LocalQueue is gated by Kueue's webhook, gets a Workload, and runs once
  the ClusterQueue's GPU quota admits it; a second one over the quota stays gated, its
  Workload saying why; when the first goes, the second is admitted and scheduled.
* A pod without the label is left alone.
* Kueue down: its webhooks fail closed, so a pod cannot be created in a managed namespace, and
  the API server's answer names Kueue's webhook; Kueue back: it can.

``make kueue-check`` runs these (they need Kueue's controller, a Go build of its own).
"""

from __future__ import annotations

import urllib.error

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
GATE = "kueue.x-k8s.io/admission"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def queues(kube, ns: str, gpus: int) -> None:
    """A ResourceFlavor for the H100 nodes, a ClusterQueue with ``gpus`` of them, a LocalQueue in ``ns``."""
    kube.request(
        "POST",
        "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"h100-{ns}"},
            "spec": {"nodeLabels": H100},
        },
    )
    cluster_queue(kube, f"cq-{ns}", f"h100-{ns}", gpus)
    local_queue(kube, ns, f"cq-{ns}")


def cluster_queue(kube, name: str, flavor: str, gpus: int, cohort: str = "") -> None:
    """ClusterQueue ``name`` for every namespace: ``gpus`` GPUs of ``flavor`` (and cpu and memory
    to spare), in ``cohort`` where one is given."""
    resources = [
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "memory", "nominalQuota": "512Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
    ]
    group = {"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{"name": flavor, "resources": resources}]}
    spec = {"namespaceSelector": {}, "resourceGroups": [group], **({"cohortName": cohort} if cohort else {})}
    kube.request(
        "POST",
        "/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec},
    )


def local_queue(kube, ns: str, cluster_queue: str, name: str = "ml-course") -> None:
    """LocalQueue ``name`` in ``ns``, on ClusterQueue ``cluster_queue``."""
    kube.request(
        "POST",
        f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": name}, "spec": {"clusterQueue": cluster_queue}},
    )


def gpu_pod(name: str, queue: str | None = "ml-course") -> dict:
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"},
                    },
                }
            ],
            "tolerations": [GPU_TOLERATION],
            "nodeSelector": H100,
        },
    }


def pod(kube, ns, name):
    return kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


def gates(kube, ns, name) -> list[str]:
    return [g["name"] for g in pod(kube, ns, name)["spec"].get("schedulingGates") or []]


def workload_of(kube, ns, name) -> dict | None:
    for wl in kube.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]:
        if any(o.get("name") == name and o.get("kind") == "Pod" for o in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def condition(wl: dict | None, kind: str) -> dict | None:
    return next((c for c in ((wl or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def test_kueue_gates_a_pod_until_its_queue_admits_it(kube, ns):
    queues(kube, ns, gpus=1)
    created = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("first"))
    # Kueue's webhook gated it at creation: the API server's answer is the pod as stored (a GET
    # afterwards may find it admitted and ungated already, a few milliseconds later on a warm Kueue)
    assert GATE in [g["name"] for g in created["spec"].get("schedulingGates") or []]
    wait_for(lambda: (condition(workload_of(kube, ns, "first"), "Admitted") or {}).get("status") == "True", "first admitted", timeout=60)
    wait_for(lambda: pod(kube, ns, "first")["spec"].get("nodeName"), "first scheduled", timeout=60)
    assert GATE not in gates(kube, ns, "first")

    # over the quota: gated, and its Workload says why
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("second"))
    pending = wait_for(
        lambda: (c := condition(workload_of(kube, ns, "second"), "QuotaReserved")) and c["status"] == "False" and c,
        "second's workload pending",
        timeout=60,
    )
    assert pending["message"].startswith("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu"), pending
    assert GATE in gates(kube, ns, "second") and not pod(kube, ns, "second")["spec"].get("nodeName")

    # a pod without a queue is not Kueue's
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("plain", queue=None))
    assert gates(kube, ns, "plain") == []

    # the first goes: the second is admitted and scheduled
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/first?gracePeriodSeconds=0")
    wait_for(lambda: pod(kube, ns, "second")["spec"].get("nodeName"), "second scheduled once first is gone", timeout=90)


def test_kueue_down_its_webhooks_fail_closed(cluster, kube, ns):
    kueue = cluster.kueue()
    kueue.stop()
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            kube.request("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("while-down", queue=None))
        body = refused.value.read().decode()
        assert refused.value.code == 500 and "mpod.kb.io" in body and "failed calling webhook" in body, body
    finally:
        kueue.start()
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("after", queue=None))
