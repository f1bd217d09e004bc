"""`make demo AUTOSCALE=1`'s story on the real Karpenter: the demo starts with no GPU node, the spawn
page says an H100 is free after a scale-up, a spawn of one brings a node of the H100 pool up and
the notebook runs there on a pod IP of the cluster's own (the pool's startup taint kept its pods
off until the node had a pod network), and when the server stops Karpenter removes the emptied
node (gpuspawner/tools/demo.py, gpuspawner/devcluster/karpenter.py, hub_config/demo_config.py)."""

from __future__ import annotations

import ipaddress

import pytest

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
    assert "free after scale-up, about 1 min" in spawn_page(demo, "researcher1")
    assert call(demo, "POST", "/users/researcher1/server", {"offering": H100})[0] in (201, 202)

    def ready():
        user = call(demo, "GET", "/users/researcher1")[1]
        return (user.get("servers") or {}).get("", {}).get("ready")

    wait_for(ready, "researcher1's H100 server ready on a node Karpenter made", timeout=240, interval=0.5)
    (node,) = kube.request("GET", POOL_NODES)["items"]
    assert node["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu-h100"
    (pod,) = kube.request("GET", "/api/v1/namespaces/jhub/pods?labelSelector=component%3Dsingleuser-server")["items"]
    assert pod["spec"]["nodeName"] == node["metadata"]["name"]
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(node["spec"]["podCIDR"])

    assert call(demo, "DELETE", "/users/researcher1/server")[0] in (202, 204)
    wait_for(lambda: not kube.request("GET", POOL_NODES)["items"], "Karpenter removing the emptied H100 node", timeout=240, interval=0.5)
