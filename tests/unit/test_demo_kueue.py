"""The Kueue demo's review of what `gpuspawner kueue` writes, its batch Job, and the kwok stage
that leaves the Job's pod running (tests/kueue/test_kueue_demo.py runs it all on the real Kueue)."""

from __future__ import annotations

import yaml

from gpuspawner.capacity.kueueyaml import kueue_documents
from gpuspawner.core.model import Offering
from gpuspawner.devcluster.build import KEEP_RUNNING, cluster_stages
from gpuspawner.names.vocabulary import Kind
from gpuspawner.tools import demokueue

H100 = Offering(
    slug="gpu-nvidia-h100-80gb-hbm3",
    kind=Kind.FULL,
    display_name="H100",
    resources={"nvidia.com/gpu": 1},
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
)
MIG = Offering(
    slug="mig-a100-1g-5gb",
    kind=Kind.MIG,
    display_name="1g.5gb",
    resources={"nvidia.com/mig-1g.5gb": 1},
    node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
)


def written() -> list[dict]:
    docs = kueue_documents(
        [H100, MIG], {H100.slug: 8, MIG.slug: 1}, cluster_queue="demo", namespace="jhub", local_queues=["demo"], cpu_memory=("64", "256Gi")
    )
    return [dict(d.body) for d in docs]


def quotas(cluster_queue: dict) -> dict[tuple[str, str], str]:
    return {
        (flavor["name"], r["name"]): r["nominalQuota"]
        for group in cluster_queue["spec"]["resourceGroups"]
        for flavor in group["flavors"]
        for r in flavor["resources"]
    }


def test_the_review_caps_gpu_quotas_and_opens_the_queue_to_the_batch_team():
    before = written()
    reviewed = demokueue.review(before)
    (cq,) = [d for d in reviewed if d["kind"] == "ClusterQueue"]
    assert quotas(cq) == {
        ("default-flavor", "cpu"): "64",  # cpu and memory as written
        ("default-flavor", "memory"): "256Gi",
        (H100.slug, "nvidia.com/gpu"): "2",  # 8 on the nodes, 2 for the queue
        (MIG.slug, "nvidia.com/mig-1g.5gb"): "1",  # already under the cap
    }
    assert cq["spec"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["jhub", demokueue.BATCH_NAMESPACE]}]
    }
    queues = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]["clusterQueue"] for d in reviewed if d["kind"] == "LocalQueue"}
    assert queues == {("jhub", "demo"): "demo", (demokueue.BATCH_NAMESPACE, demokueue.BATCH_QUEUE): "demo"}
    # what `gpuspawner kueue` wrote is left as it was
    assert quotas(next(d for d in before if d["kind"] == "ClusterQueue"))[(H100.slug, "nvidia.com/gpu")] == "8"


HALF_V100 = Offering(
    slug="half-v100",
    kind=Kind.CUSTOM,
    display_name="Half a V100",
    resources={"nvidia.com/vgpu": 500},
    node_selector={"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"},
)


def test_the_review_caps_a_fractional_resource_in_servers_not_in_its_units():
    # `make demo KUEUE=1` once capped nvidia.com/vgpu at 2 (units), where one half-V100 server asks 500
    docs = kueue_documents(
        [H100, HALF_V100],
        {H100.slug: 8, HALF_V100.slug: 4},
        cluster_queue="demo",
        namespace="jhub",
        local_queues=["demo"],
        cpu_memory=("64", "256Gi"),
    )
    rows = [{**H100.summary()}, {**HALF_V100.summary()}]  # as `gpuspawner offerings --json` lists them
    assert demokueue.per_unit(rows) == {"nvidia.com/gpu": 1, "nvidia.com/vgpu": 500}
    (cq,) = [d for d in demokueue.review([dict(d.body) for d in docs], unit=demokueue.per_unit(rows)) if d["kind"] == "ClusterQueue"]
    assert quotas(cq)[(HALF_V100.slug, "nvidia.com/vgpu")] == "1000"  # two half-V100 servers, of 2000 on the nodes
    assert quotas(cq)[(H100.slug, "nvidia.com/gpu")] == "2"


def test_the_batch_job_goes_through_its_local_queue_on_the_h100_and_keeps_running():
    job = demokueue.batch_job()
    assert job["apiVersion"] == "batch/v1" and job["metadata"]["namespace"] == demokueue.BATCH_NAMESPACE
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": demokueue.BATCH_QUEUE}
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {KEEP_RUNNING: "true"}
    assert template["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


STAGES = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  selector:
    matchExpressions:
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values: ['Job']
  next:
    statusTemplate: |
      phase: Succeeded
"""


def test_kwok_leaves_a_keep_running_pod_of_a_job_running():
    stages = {d["metadata"]["name"]: d for d in yaml.safe_load_all(cluster_stages(STAGES))}
    assert stages["pod-complete"]["spec"]["selector"]["matchExpressions"][-1] == {
        "key": f'.metadata.annotations["{KEEP_RUNNING}"]',
        "operator": "DoesNotExist",
    }
    assert stages["pod-complete"]["spec"]["next"]["statusTemplate"] == "phase: Succeeded\n"
    assert stages["pod-ready"] == yaml.safe_load(STAGES.split("---")[0])


def test_the_banner_says_kueue_is_on_and_what_competes(tmp_path):
    text = demokueue.banner(demokueue.KueueDemo("demo", ["demo"], []), tmp_path / "kubeconfig")
    assert text.startswith("Kueue is on (ClusterQueue 'demo'")
    assert "LocalQueue 'demo'" in text and "admission 'warn'" in text
    assert f"{demokueue.BATCH_NAMESPACE}/{demokueue.BATCH_JOB}, one H100 GPU through LocalQueue 'batch'" in text
