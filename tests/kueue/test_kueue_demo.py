"""The demo with the real Kueue (`make demo KUEUE=1`, gpuspawner/tools/demokueue.py): its own stack
(devcluster with Kueue, JupyterHub behind configurable-http-proxy), as `running_demo(kueue=True)`
starts it.

* the ClusterQueue `gpuspawner kueue` wrote for the demo hub's offerings (reviewed down to 2 GPUs
  of each kind per flavor) is Active;
* the batch team's Job, through its own LocalQueue on the same ClusterQueue, is admitted (one
  H100 GPU) and its pod bound to the H100 node;
* the spawn page, as researcher1 sees it, counts the H100 offering with the queue's words: the
  node has 3 free (another team's plain pods hold 4 of 8, the batch Job 1), the queue 2 less
  the batch Job's 1.

The demo never touches this process's KUBECONFIG or kubernetes_asyncio's default kubeconfig,
which the session cluster of tests/kueue/conftest.py set for the other tests here.
"""

from __future__ import annotations

import html
import os
import time

import pytest
from kubernetes_asyncio.config import kube_config

from gpuspawner.devcluster.ports import free_port
from gpuspawner.names.kueuenames import API_VERSION
from gpuspawner.tools import demokueue
from gpuspawner.tools.demo import running_demo
from tests.conftest import wait_for
from tests.e2e.test_budgets import spawn_page
from tests.kueue.test_kueue_devcluster import condition

pytestmark = pytest.mark.cluster
H100 = "gpu-nvidia-h100-80gb-hbm3"


@pytest.fixture(scope="module")
def demo():
    before = os.environ.get("KUBECONFIG"), kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    with running_demo(port=free_port(), hub_port=free_port(), culler=False, quiet=True, kueue=True) as running:
        yield running
    assert (os.environ.get("KUBECONFIG"), kube_config.KUBE_CONFIG_DEFAULT_LOCATION) == before


def job_workload(kube) -> dict | None:
    workloads = kube.request("GET", f"/apis/{API_VERSION}/namespaces/{demokueue.BATCH_NAMESPACE}/workloads")["items"]
    return next(
        (w for w in workloads if any(o.get("name") == demokueue.BATCH_JOB for o in w["metadata"].get("ownerReferences") or [])), None
    )


def job_pod_node(kube) -> str | None:
    pods = kube.request("GET", f"/api/v1/namespaces/{demokueue.BATCH_NAMESPACE}/pods?labelSelector=job-name%3D{demokueue.BATCH_JOB}")
    return next((p["spec"].get("nodeName") for p in pods["items"] if p["spec"].get("nodeName")), None)


def h100_row(page: str) -> str:
    """The H100 offering's part of the spawn page, as text."""
    start = page.index(H100)
    return html.unescape(page[start : start + 4000])


def test_the_demo_with_kueue_shows_the_batch_job_competing_for_the_queue(demo):
    kube = demo.cluster.client()
    assert demo.kueue is not None and demo.kueue.hub_queues == ["demo"]
    assert demokueue.cluster_queue_active(kube)
    stored = kube.request("GET", f"/apis/{API_VERSION}/clusterqueues/{demokueue.CLUSTER_QUEUE}")
    h100 = [f for g in stored["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == H100]
    assert h100 == [{"name": H100, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "2"}]}], h100

    workload = wait_for(
        lambda: (w := job_workload(kube)) and (condition(w, "Admitted") or {}).get("status") == "True" and w,
        "the batch Job admitted",
        timeout=60,
    )
    assert workload["status"]["admission"]["clusterQueue"] == demokueue.CLUSTER_QUEUE
    assert workload["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == H100
    assert wait_for(lambda: job_pod_node(kube), "the batch Job's pod bound", timeout=60) == "gpu-h100-8x"

    words = "3 free on the nodes; your queue 'demo' allows 1 more"
    deadline = time.monotonic() + 60  # the hub's watch sees the Job's reservation
    while words not in (row := h100_row(spawn_page(demo, "researcher1"))) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert words in row, row
