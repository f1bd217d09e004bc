"""`gpuspawner kueue` against the real Kueue (v0.17.0) on a devcluster of its own (issue #27).

The command reads the live cluster (the devcluster's standard GPU nodes) and a
jupyterhub_config.py with a queue mapping, and writes ResourceFlavors, a ClusterQueue and
LocalQueues. Applied server-side as they are:

* Kueue's webhooks and the CRDs' validation accept every object, and the ClusterQueue is Active;
* a pod labelled with a generated LocalQueue asking for a MIG 1g.5gb slice is admitted in the
  A100's flavor (its Workload's podSetAssignments) and bound to the A100 MIG node; a time-sliced
  T4 share in the T4's own flavor, on the T4 node;
* a slice over the quota (the two 1g.5gb slices the cluster has now) stays gated, its
  Workload saying which quota it lacks.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
import yaml

from tests.conftest import fresh_namespace, wait_for
from tests.kueue.test_kueue_devcluster import condition, pod, workload_of

pytestmark = pytest.mark.cluster
API = "/apis/kueue.x-k8s.io/v1beta2"
GATE = "kueue.x-k8s.io/admission"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
MIG_FLAVOR = "mig-nvidia-a100-sxm4-40gb"
T4_FLAVOR = "shared-tesla-t4-time-slicing-4x"


@pytest.fixture(scope="module")
def ns(kube):
    yield from fresh_namespace(kube, f"kcli-{secrets.token_hex(3)}")


@pytest.fixture(scope="module")
def applied(cluster, kube, ns, tmp_path_factory):
    """Run `gpuspawner kueue` on the live cluster, apply what it writes server-side; its documents."""
    folder = tmp_path_factory.mktemp("kueue-cli")
    config = folder / "jupyterhub_config.py"
    config.write_text(
        f'c.KubeSpawner.namespace = {ns!r}\nc.GPUSpawner.kueue_queues = {{"default": "gpu", "groups": {{"ml-course": "ml-course"}}}}\n'
    )
    out = folder / "kueue.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "gpuspawner.tools.cli", "kueue", "--config", str(config), "--cluster-queue", "hub-gpus", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )
    assert done.returncode == 0, done.stderr
    documents = list(yaml.safe_load_all(out.read_text()))
    for doc in documents:
        name, kind = doc["metadata"]["name"], doc["kind"]
        where = f"/namespaces/{doc['metadata']['namespace']}" if kind == "LocalQueue" else ""
        path = f"{API}{where}/{kind.lower()}s/{name}?fieldManager=gpuspawner-kueue-test&force=true"
        kube.apply(path, yaml.safe_dump(doc))
    return documents


def cq_active(kube, name: str) -> dict | None:
    conditions = (kube.request("GET", f"{API}/clusterqueues/{name}").get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Active" and c["status"] == "True"), None)


def pod_for(name: str, queue: str, limits: dict, selector: dict, tolerations: list) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {**limits, "cpu": "1", "memory": "1Gi"}},
                }
            ],
            "tolerations": tolerations,
            "nodeSelector": selector,
        },
    }


def mig_pod(name: str) -> dict:
    return pod_for(name, "gpu", {"nvidia.com/mig-1g.5gb": "1"}, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, [GPU_TOLERATION])


def admitted(kube, ns, name) -> dict | None:
    wl = workload_of(kube, ns, name)
    return wl if (condition(wl, "Admitted") or {}).get("status") == "True" else None


def test_kueue_accepts_the_generated_objects_and_the_queue_is_active(kube, ns, applied):
    kinds = [d["kind"] for d in applied]
    assert kinds.count("ClusterQueue") == 1 and kinds.count("LocalQueue") == 2
    assert MIG_FLAVOR in {d["metadata"]["name"] for d in applied if d["kind"] == "ResourceFlavor"}
    active = wait_for(lambda: cq_active(kube, "hub-gpus"), "ClusterQueue hub-gpus Active", timeout=60)
    assert active["reason"] == "Ready", active
    for queue in ("gpu", "ml-course"):
        lq = kube.request("GET", f"{API}/namespaces/{ns}/localqueues/{queue}")
        assert lq["spec"]["clusterQueue"] == "hub-gpus"
    # what was applied is what is stored: the quotas as the command wrote them
    (written,) = [d for d in applied if d["kind"] == "ClusterQueue"]
    stored = kube.request("GET", f"{API}/clusterqueues/hub-gpus")
    assert [g["coveredResources"] for g in stored["spec"]["resourceGroups"]] == [
        g["coveredResources"] for g in written["spec"]["resourceGroups"]
    ]


def test_a_mig_slice_is_admitted_in_its_flavor_and_one_over_the_quota_stays_gated(kube, ns, applied):
    wait_for(lambda: cq_active(kube, "hub-gpus"), "ClusterQueue hub-gpus Active", timeout=60)
    for name in ("slice-1", "slice-2"):  # the cluster has two 1g.5gb slices now: the quota is 2
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", mig_pod(name))
    for name in ("slice-1", "slice-2"):
        wl = wait_for(lambda name=name: admitted(kube, ns, name), f"{name} admitted", timeout=60)
        (assignment,) = wl["status"]["admission"]["podSetAssignments"]
        assert wl["status"]["admission"]["clusterQueue"] == "hub-gpus"
        assert assignment["flavors"] == {"cpu": "default-flavor", "memory": "default-flavor", "nvidia.com/mig-1g.5gb": MIG_FLAVOR}
        node = wait_for(lambda name=name: pod(kube, ns, name)["spec"].get("nodeName"), f"{name} bound", timeout=60)
        assert node == "gpu-a100-mig"

    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", mig_pod("slice-3"))
    pending = wait_for(
        lambda: (c := condition(workload_of(kube, ns, "slice-3"), "QuotaReserved")) and c["status"] == "False" and c,
        "slice-3's workload pending",
        timeout=60,
    )
    assert f"insufficient unused quota for nvidia.com/mig-1g.5gb in flavor {MIG_FLAVOR}" in pending["message"], pending
    third = pod(kube, ns, "slice-3")
    assert GATE in [g["name"] for g in third["spec"].get("schedulingGates") or []] and not third["spec"].get("nodeName")


def test_a_time_sliced_t4_share_is_admitted_in_its_own_flavor(kube, ns, applied):
    wait_for(lambda: cq_active(kube, "hub-gpus"), "ClusterQueue hub-gpus Active", timeout=60)
    t4 = pod_for(
        "t4-share",
        "ml-course",
        {"nvidia.com/gpu.shared": "1"},
        {"nvidia.com/gpu.product": "Tesla-T4"},
        [GPU_TOLERATION, {"key": "node-role.kubernetes.io/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    )
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", t4)
    wl = wait_for(lambda: admitted(kube, ns, "t4-share"), "t4-share admitted", timeout=60)
    assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu.shared"] == T4_FLAVOR
    assert wait_for(lambda: pod(kube, ns, "t4-share")["spec"].get("nodeName"), "t4-share bound", timeout=60) == "gpu-t4-ts-renamed"
