"""`gpuspawner record-nodeclaims` on the real Karpenter (gpuspawner/tools/nodeclaimlog.py): while
it runs, a pending H100 pod makes Karpenter bring up a node of the pool and the NodeClaim is then
deleted; the file it appended gives `gpuspawner report --nodeclaims` that node's life, from its
NodeClaim's creation to the start of its deletion, with its GPUs and the kwok provider's price, in
at most five lines (of Karpenter's many changes of it); a restarted recorder appends nothing it wrote before."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

from gpuspawner.tools import cli, nodehours
from gpuspawner.tools.nodeclaimlog import record
from tests.conftest import wait_for
from tests.karpenter.test_karpenter_devcluster import NODECLAIMS, gpu_pod

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


async def until(check, what: str, timeout: float = 180.0):
    """tests.conftest.wait_for in a thread, so the recorder goes on meanwhile."""
    return await asyncio.to_thread(wait_for, check, what, timeout, 0.5)


async def test_the_record_gives_the_report_each_nodes_life(cluster, kube, ns, tmp_path, capsys):
    path = tmp_path / "nodeclaims.jsonl"
    stop = asyncio.Event()
    recorder = asyncio.ensure_future(record(path, str(cluster.kubeconfig), stop))
    try:
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod("h100", "nvidia.com/gpu", H100))

        def claim_of_the_pod():
            pod = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/h100")
            node = pod["spec"].get("nodeName")
            claims = [c for c in kube.request("GET", NODECLAIMS)["items"] if (c.get("status") or {}).get("nodeName") == node]
            return claims[0] if node and claims else None

        claim = await until(claim_of_the_pod, "the H100 pod on a node of its NodeClaim")
        name = claim["metadata"]["name"]
        await until(lambda: name in path.read_text() and '"nodeName"' in path.read_text(), "the recorder writing the claim and its node")
        kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/h100?gracePeriodSeconds=0")
        kube.request("DELETE", f"{NODECLAIMS}/{name}")
        await until(lambda: name not in {c["metadata"]["name"] for c in kube.request("GET", NODECLAIMS)["items"]}, "the claim gone")
        await until(lambda: "deletionTimestamp" in path.read_text(), "the recorder writing the deletion")
    finally:
        stop.set()
        await asyncio.wait_for(recorder, 30)

    written = nodehours.json_objects(path.read_text(), "record")
    mine = [r for r in written if r["metadata"]["name"] == name]
    # created, priced (launched), its allocatable, its node (registered), deleted: not every status change
    assert 2 <= len(mine) <= 5, "\n".join(json.dumps(m) for m in mine)
    [life] = [x for x in nodehours.node_lives(written) if x.name == name]
    assert life.pool == "gpu-h100" and life.gpus == 8 and life.price == 40.0
    assert life.created == datetime.fromisoformat(claim["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    assert life.deleted is not None and life.created < life.deleted <= datetime.now(UTC)

    # a restarted recorder reads back what it wrote, and appends nothing new for it
    lines = path.read_text().count("\n")
    stop = asyncio.Event()
    again = asyncio.ensure_future(record(path, str(cluster.kubeconfig), stop))
    await asyncio.sleep(3)
    stop.set()
    await asyncio.wait_for(again, 30)
    assert path.read_text().count("\n") == lines

    assert cli.main(["report", "--nodeclaims", str(path), "--since", "1h"]) == 0
    assert "gpu-h100" in capsys.readouterr().out
