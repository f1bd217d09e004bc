"""`make demo AUTOSCALE=1`'s story on the real Karpenter: the demo starts with no GPU node and no
pool offering in its settings, the hub discovers the H100 pool's offering from its NodePool and the
spawn page says "a new node starts for you, about 1 min", a spawn of one brings a node of the H100 pool up (its
progress says the NodeClaim's steps, launched, registered, initialized, with their times) and
the notebook runs there on a pod IP of the cluster's own (the pool's startup taint kept its pods
off until the node had a pod network), and when the server stops Karpenter removes the emptied
node. With the pool's limit at zero nodes the page says "the pool is at its limit" and a spawn is
refused at once in those words (the hub reads the limit); with a limit the hub does not read (GPUs),
Karpenter refuses and the spawn is refused with Karpenter's own reason, not left waiting
(gpuspawner/tools/demo.py, gpuspawner/devcluster/karpenter.py, hub_config/demo_config.py,
gpuspawner/capacity/karpenterpools.py, gpuspawner/hub/autoscaler.py)."""

from __future__ import annotations

import ipaddress
import json
import urllib.request

import pytest

from gpuspawner.devcluster.karpenter import POOLS, node_pool
from tests.conftest import wait_for
from tests.e2e.demo_stack import demo_with_token, spawn_page
from tests.e2e.test_budgets import call

H100 = "gpu-nvidia-h100-80gb-hbm3"
POOL_NODES = "/api/v1/nodes?labelSelector=karpenter.sh/nodepool"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with demo_with_token(tmp_path_factory, "", culler=False, autoscale=True) as running:
        yield running


def test_an_h100_spawn_brings_a_node_up_and_its_end_lets_it_go(demo):
    kube = demo.cluster.client()
    assert kube.request("GET", POOL_NODES)["items"] == []
    # the hub's watch of NodePools starts with its first catalog: the offering is there once it has listed them
    wait_for(
        lambda: "a new node starts for you, about 1 min" in spawn_page(demo, "researcher1"),
        "the H100 pool's offering at zero nodes",
        timeout=120,
    )
    assert "Up to 4 H100 80GB nodes." in spawn_page(demo, "researcher1")
    assert call(demo, "POST", "/users/researcher1/server", {"offering": H100})[0] in (201, 202)

    messages, last = progress(demo, "researcher1")  # the spawn-pending page's stream, to its end
    assert last.get("ready"), last
    claim = next(m for m in messages if m.startswith("Karpenter is starting a new node for this server: NodeClaim gpu-h100-"))
    name = claim.rsplit(" ", 2)[-2]
    steps = [m for m in messages if m.startswith(f"NodeClaim {name} ")]
    words = [m.split()[2].rstrip(",") for m in steps]  # in order, each once; the last may come after the server is ready
    assert words and words == ["launched", "registered", "initialized"][: len(words)], steps
    assert all(m.endswith(" s after it was created") for m in steps)
    (node,) = kube.request("GET", POOL_NODES)["items"]
    assert node["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu-h100"
    (pod,) = kube.request("GET", "/api/v1/namespaces/jhub/pods?labelSelector=component%3Dsingleuser-server")["items"]
    assert pod["spec"]["nodeName"] == node["metadata"]["name"]
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(node["spec"]["podCIDR"])

    assert call(demo, "DELETE", "/users/researcher1/server")[0] in (202, 204)
    wait_for(lambda: not kube.request("GET", POOL_NODES)["items"], "Karpenter removing the emptied H100 node", timeout=240, interval=0.5)

    full = node_pool(POOLS[0], network=True)  # the H100 pool may have no node at all now
    full["spec"]["limits"] = {"nodes": "0"}
    demo.cluster.karpenter().apply(full)
    wait_for(lambda: "the pool is at its limit" in spawn_page(demo, "researcher1"), "the hub reading the pool's new limit", timeout=120)
    status, answer = call(demo, "POST", "/users/researcher1/server", {"offering": H100})
    assert status == 409, answer
    assert "No H100 80GB is free right now and the pool is at its limit (0 nodes)" in answer["message"]

    no_gpus = node_pool(POOLS[0], network=True)  # a limit the hub does not read: Karpenter's own refusal
    no_gpus["spec"]["limits"] = {"nvidia.com/gpu": "0"}
    demo.cluster.karpenter().apply(no_gpus)
    wait_for(lambda: "a new node starts for you" in spawn_page(demo, "researcher1"), "the hub reading the pool's limit gone", timeout=120)
    status, answer = call(demo, "POST", "/users/researcher1/server", {"offering": H100})
    message = progress(demo, "researcher1")[1]["message"] if status == 202 else str(answer)
    assert "No new node can start for H100 80GB. The autoscaler (Karpenter) says:" in message
    assert "all available instance types exceed limits for nodepool (NodePool=gpu-h100)." in message
    assert "incompatible requirements" not in message  # (the other pools' parts are left out)


def progress(demo, user: str) -> tuple[list[str], dict]:
    """The messages of the server's progress stream (what the spawn-pending page shows) and its
    last event: ``{"failed": True, "message": ...}`` or ``{"ready": True, ...}``."""
    request = urllib.request.Request(f"{demo.api_url}/users/{user}/server/progress", headers={"Authorization": f"token {demo.token}"})
    messages = []
    with urllib.request.urlopen(request, timeout=240) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                if event.get("failed") or event.get("ready"):
                    return messages, event
                messages.append(event.get("message") or "")
    raise AssertionError(f"the progress stream of {user} ended without a result")
