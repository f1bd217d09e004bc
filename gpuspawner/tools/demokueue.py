"""The demo with Kueue (``make demo KUEUE=1``, ``python -m gpuspawner.tools.demo --kueue``).

The devcluster comes up with the real Kueue (docs/kueue.md). The demo then does what an admin
would (docs/kueue.md, "Setting it up"):

1. runs ``gpuspawner kueue --config hub_config/demo_config.py`` on the live cluster (the demo
   hub's config, with ``GPUSPAWNER_DEMO_KUEUE=1``: every GPU offering goes to the LocalQueue
   ``demo``): ResourceFlavors, the ClusterQueue ``demo`` and the LocalQueue ``demo``;
2. reviews it (:func:`review`): at most :data:`GPU_QUOTA` servers' worth of each GPU resource
   per flavor (2 of the H100 node's 8 GPUs, 2 MIG 1g.5gb slices, 1000 ``nvidia.com/vgpu`` for
   two halves of a V100 of 500 each, ...), so that the queue, not the nodes, is what runs out; and the batch team's namespace admitted to the same ClusterQueue,
   with a LocalQueue of its own there;
3. applies it server-side, and starts the batch team's Job (:func:`batch_job`): a
   ``batch/v1`` Job labelled ``kueue.x-k8s.io/queue-name``, which Kueue's job integration
   holds suspended until it admits it, taking one H100 GPU of the queue's two.

The H100 offering's row on the spawn page then says "3 free on the nodes; your queue 'demo'
allows 1 more": of the node's 8 GPUs another team's plain pods (not Kueue's) hold 4 and the
batch Job 1; of the queue's 2 the batch Job holds 1.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuspawner.devcluster.build import KEEP_RUNNING
from gpuspawner.devcluster.clusterstate import KubeHTTP
from gpuspawner.names.kueuenames import API_VERSION, QUEUE_LABEL
from gpuspawner.names.nvidia import GPU, PRODUCT_LABEL

#: the ClusterQueue the demo writes (``gpuspawner kueue --cluster-queue``)
CLUSTER_QUEUE = "demo"
#: the most of each GPU resource per flavor the demo's ClusterQueue admits
GPU_QUOTA = 2
#: the batch team competing with the hub's users for the same ClusterQueue
BATCH_NAMESPACE = "batch-team"
BATCH_QUEUE = "batch"
BATCH_JOB = "nightly-training"
H100 = "NVIDIA-H100-80GB-HBM3"
FIELD_MANAGER = "gpuspawner-demo"


@dataclass
class KueueDemo:
    """What the demo set up in Kueue, for its banner and the tests."""

    cluster_queue: str
    hub_queues: list[str]
    documents: list[dict[str, Any]]


def _cli(args: Sequence[str], env: Mapping[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpuspawner.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(env),
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"`gpuspawner {args[0]}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def generate(config: Path, env: Mapping[str, str], out: Path) -> list[dict[str, Any]]:
    """``gpuspawner kueue`` on the live cluster for the demo hub's config (``env`` points it at
    the cluster and sets the demo's variables); its documents, also written to ``out``."""
    _cli(["kueue", "--config", str(config), "--cluster-queue", CLUSTER_QUEUE, "-o", str(out)], env)
    return [doc for doc in yaml.safe_load_all(out.read_text()) if doc]


def unit_amounts(config: Path, env: Mapping[str, str]) -> dict[str, int]:
    """How much of each GPU resource one server of the demo hub's offerings takes (the most
    of any offering: ``nvidia.com/vgpu: 500`` for half a V100; 1 for a GPU or a MIG slice), from
    ``gpuspawner offerings --json`` on the live cluster."""
    return per_unit(json.loads(_cli(["offerings", "--config", str(config), "--json"], env)))


def per_unit(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Resource -> the most one unit of any offering in ``rows`` (``gpuspawner offerings --json``) asks of it."""
    amounts: dict[str, int] = {}
    for row in rows:
        for resource, value in (row.get("limits") or {}).items():
            amounts[resource] = max(amounts.get(resource, 0), int(value))
    return amounts


def review(
    documents: Sequence[Mapping[str, Any]], gpu_quota: int = GPU_QUOTA, unit: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """The demo's review of what ``gpuspawner kueue`` wrote: each GPU resource's nominal quota
    at most ``gpu_quota`` servers' worth per flavor (``unit``: what one server takes of the
    resource, 1 where not given; cpu and memory as written), the ClusterQueue open to the batch
    team's namespace as well as the hub's, and the batch team's LocalQueue."""
    unit = unit or {}
    reviewed = [copy.deepcopy(dict(doc)) for doc in documents]
    (queue,) = [doc for doc in reviewed if doc["kind"] == "ClusterQueue"]
    spec = queue["spec"]
    for group in spec["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                if resource["name"] not in ("cpu", "memory"):
                    cap = gpu_quota * max(1, unit.get(resource["name"], 1))
                    resource["nominalQuota"] = str(min(int(resource["nominalQuota"]), cap))
    hub_namespace = spec["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    spec["namespaceSelector"] = {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [hub_namespace, BATCH_NAMESPACE]}]
    }
    reviewed.append(
        {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": BATCH_QUEUE, "namespace": BATCH_NAMESPACE},
            "spec": {"clusterQueue": queue["metadata"]["name"]},
        }
    )
    return reviewed


def batch_job() -> dict[str, Any]:
    """The batch team's training Job: one H100 GPU, through its LocalQueue. Kueue's job
    integration suspends it until the ClusterQueue admits it; kwok then keeps its pod Running until the Job is deleted."""
    limits = {GPU: "1", "cpu": "4", "memory": "32Gi"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": BATCH_JOB, "namespace": BATCH_NAMESPACE, "labels": {QUEUE_LABEL: BATCH_QUEUE}},
        "spec": {
            "suspend": True,  # Kueue unsuspends it once admitted
            "backoffLimit": 0,
            "template": {
                # kwok would complete a Job's pod at once (its pod-complete stage): this one keeps running
                "metadata": {"annotations": {KEEP_RUNNING: "true"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "train", "image": "pytorch/pytorch", "resources": {"requests": limits, "limits": limits}}],
                    "nodeSelector": {PRODUCT_LABEL: H100},
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
        },
    }


def _path(doc: Mapping[str, Any]) -> str:
    kind, meta = doc["kind"], doc["metadata"]
    where = f"/namespaces/{meta['namespace']}" if "namespace" in meta else ""
    return f"/apis/{doc['apiVersion']}{where}/{kind.lower()}s/{meta['name']}?fieldManager={FIELD_MANAGER}&force=true"


def cluster_queue_active(kube: KubeHTTP, name: str = CLUSTER_QUEUE) -> bool:
    status = kube.request("GET", f"/apis/{API_VERSION}/clusterqueues/{name}").get("status") or {}
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in status.get("conditions") or [])


def set_up(kube: KubeHTTP, config: Path, env: Mapping[str, str], state: Path, timeout: float = 60.0) -> KueueDemo:
    """Write, review and apply the Kueue objects, wait for the ClusterQueue to be Active, start the batch Job."""
    written = generate(config, env, state / "kueue.yaml")
    documents = review(written, unit=unit_amounts(config, env))
    (state / "kueue-reviewed.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False))
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BATCH_NAMESPACE}})
    for doc in documents:
        kube.apply(_path(doc), json.dumps(doc))
    deadline = time.monotonic() + timeout
    while not cluster_queue_active(kube):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kueue's ClusterQueue {CLUSTER_QUEUE} did not become Active within {timeout:.0f}s; see {state}/kueue.yaml")
        time.sleep(0.3)
    kube.request("POST", f"/apis/batch/v1/namespaces/{BATCH_NAMESPACE}/jobs", batch_job())
    hub_queues = [d["metadata"]["name"] for d in written if d["kind"] == "LocalQueue"]
    return KueueDemo(cluster_queue=CLUSTER_QUEUE, hub_queues=hub_queues, documents=documents)


def banner(kueue: KueueDemo, kubeconfig: Path) -> str:
    """The demo console's lines about Kueue."""
    queues = ", ".join(f"'{q}'" for q in kueue.hub_queues)
    return (
        f"Kueue is on (ClusterQueue '{kueue.cluster_queue}', at most {GPU_QUOTA} servers of each GPU offering per flavor): every GPU\n"
        f"  server goes through the LocalQueue {queues}, admission 'warn' (a spawn the queue allows none of\n"
        "  goes ahead and Kueue holds it). Competing for the same quota: the batch Job\n"
        f"  {BATCH_NAMESPACE}/{BATCH_JOB}, one H100 GPU through LocalQueue '{BATCH_QUEUE}' (so the H100 row says\n"
        f"  how many more the queue allows). Watch: KUBECONFIG={kubeconfig} kubectl get clusterqueues,workloads -A\n"
    )


def hub_env() -> dict[str, str]:
    """What tells hub_config/demo_config.py (and ``gpuspawner kueue`` reading it) that Kueue is on."""
    return {"GPUSPAWNER_DEMO_KUEUE": "1"}
