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
gpuspawner/capacity/karpenterpools.py, gpuspawner/hub/autoscaler.py).

Then, on the same demo (its culler on, with short timeouts for MIG slices only: a whole GPU is
never stopped for idleness here, so the H100 story above is not disturbed), issue 42's whole
story: from zero GPU nodes a MIG spawn brings a node of the A100 MIG pool up, the notebook sits
idle, the culler warns and then stops it (its action log naming the node), Karpenter's
consolidation removes the emptied node, and `gpuspawner report`, run as the demo prints it, reads
the demo's own NodeClaim record (its hub-managed `nodeclaim-recorder`) and the culler's action
log: the GPU node-hours the pool held, that node let go after the idle reclaim, and what that
saved in GPU node-hours and in money (tools/nodehours.py, tools/nodeclaimlog.py).

Last, a node that goes under a running notebook: the T4 pool's NodeClaim deleted while a notebook
runs there, and the user told why on the home page in Karpenter's words (hub/departures.py)."""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
import urllib.request

import pytest

from gpuspawner.devcluster.karpenter import POOLS, node_pool
from tests.conftest import wait_for
from tests.e2e.demo_stack import demo_with_token, login, spawn_page
from tests.e2e.test_budgets import call

H100 = "gpu-nvidia-h100-80gb-hbm3"
MIG = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
POOL_NODES = "/api/v1/nodes?labelSelector=karpenter.sh/nodepool"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
#: the culler stops an idle MIG slice after a minute, warning 45 s ahead (so that it warns before it
#: stops, whenever it first sees the server); a whole GPU never (0: off), nor anything else here
CULLER_ARGS = (
    "--cull-every=5 --timeout=3600 --kernel-timeout=3600 --kind-timeout=mig=60 --kind-timeout=full=0 "
    "--kind-timeout=shared=3600 --gpu-window=40 --gpu-min-samples=3 --GpuCuller.warn_before_seconds=45"
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    env = {"GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}
    with demo_with_token(tmp_path_factory, "", culler=True, env=env, autoscale=True) as running:
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


@pytest.mark.timeout(900)  # (events only: a node's boot, a minute's idleness, the culler's warning and stop, consolidation)
def test_an_idle_mig_servers_node_goes_after_the_culler_stops_it_and_the_report_shows_the_saving(demo):
    kube = demo.cluster.client()
    assert kube.request("GET", POOL_NODES)["items"] == []  # zero GPU nodes (the H100 story's node is gone)
    assert demo.nodeclaims is not None
    wait_for(lambda: demo.nodeclaims.exists(), "the demo's nodeclaim-recorder service starting its record", timeout=120)
    assert call(demo, "POST", "/users/student1/server", {"offering": MIG})[0] in (201, 202)
    messages, last = progress(demo, "student1")
    assert last.get("ready"), last
    claim = next(m for m in messages if m.startswith("Karpenter is starting a new node for this server: NodeClaim gpu-a100-mig-"))
    name = claim.rsplit(" ", 2)[-2]
    (node,) = [n["metadata"]["name"] for n in kube.request("GET", POOL_NODES)["items"]]
    (pod,) = kube.request("GET", "/api/v1/namespaces/jhub/pods?labelSelector=component%3Dsingleuser-server")["items"]
    assert pod["spec"]["nodeName"] == node
    wait_for(lambda: name in demo.nodeclaims.read_text(), "the recorder writing the new NodeClaim", timeout=60)

    # idle: warned, then stopped by the culler
    wait_for(lambda: not call(demo, "GET", "/users/student1")[1]["servers"], "the culler stopping the idle MIG server", timeout=300)
    log = (demo.state / "jupyterhub.log").read_text()
    warned, stopped = log.find("warned student1: server stop in"), log.find(f"stop server student1 [mig {MIG}] (idle)")
    assert 0 <= warned < stopped, log[-6000:]
    actions = [json.loads(line) for line in demo.action_log.read_text().splitlines() if line.strip()]
    (stop,) = [a for a in actions if a["user"] == "student1" and a["action"] == "server_stopped"]
    assert stop["reason"] == "idle" and stop["nodes"] == [node], stop

    # Karpenter's consolidation removes the emptied node; the recorder writes its deletion
    wait_for(
        lambda: name not in {c["metadata"]["name"] for c in kube.request("GET", NODECLAIMS)["items"]},
        "Karpenter removing the emptied MIG node",
        timeout=240,
        interval=0.5,
    )
    assert kube.request("GET", POOL_NODES)["items"] == []
    wait_for(
        lambda: any(r["metadata"]["name"] == name and "deletionTimestamp" in r["metadata"] for r in records(demo)),
        "the recorder writing the deletion",
        timeout=60,
    )

    # the report the demo prints, as a newcomer runs it
    command = shlex.split(demo.node_hours_command())
    table = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    print(f"$ {demo.node_hours_command()}\n{table}")  # (shown with -s: what a newcomer sees)
    assert "GPU nodes of autoscaled pools (measured from Karpenter's NodeClaims):" in table
    assert "  gpu-a100-mig: 1 node(s), " in table and "1 node(s) let go after an idle reclaim" in table, table
    assert f"      NodeClaim {name} (node {node}): deleted " in table and "after student1's idle server was stopped" in table, table
    rows = json.loads(subprocess.run([*command, "--format", "json"], capture_output=True, text=True, timeout=120, check=True).stdout)
    (mig,) = [r for r in rows if r["pool"] == "gpu-a100-mig"]
    assert mig["gpu_node_hours"] > 0 and mig["cost"] > 0  # held: one GPU node, at the kwok provider's price
    assert mig["released_after_idle_reclaim"] == 1
    (release,) = mig["releases"]
    assert (release["nodeclaim"], release["node"], release["user"]) == (name, node, "student1")
    assert mig["gpu_node_hours_not_held"] > 0 and mig["cost_not_paid"] > 0  # saved: the pool ran a node fewer since


def records(demo) -> list[dict]:
    return [json.loads(line) for line in demo.nodeclaims.read_text().splitlines() if line.strip()]


T4 = "shared-tesla-t4-shared-time-slicing-4x"


@pytest.mark.timeout(900)  # (events only: a node's boot, Karpenter's drain to the node's grace period, the hub's poll)
def test_a_notebook_whose_node_goes_under_it_is_told_why_and_nothing_is_left_behind(demo):
    """Issue 42, a node that vanishes under a running notebook: the T4 pool's NodeClaim is deleted
    while researcher2's notebook runs on its node (as a spot interruption's handler, or an admin, does).
    The notebook's ``karpenter.sh/do-not-disrupt`` keeps it until the node's grace period ends; then
    the real Karpenter deletes the pod, the hub marks the server stopped and its home page says why
    in Karpenter's words, naming the node; the NodeClaim and node go, no pod of the server is left,
    and the page counts the pool as before (no node, a new one starts on demand)."""
    kube = demo.cluster.client()
    pool = node_pool(next(p for p in POOLS if p.name == "gpu-t4-ts"), network=True)
    pool["spec"]["template"]["spec"]["terminationGracePeriod"] = "30s"  # (without one, a protected pod holds its node for ever)
    demo.cluster.karpenter().apply(pool)
    # the hub's watch of NodePools starts with its first catalog: the pool's offering is there once it has listed them
    wait_for(lambda: "a new node starts for you" in card(spawn_page(demo, "researcher2"), T4), "the T4 pool's offering", timeout=120)
    status, answer = call(demo, "POST", "/users/researcher2/server", {"offering": T4})
    assert status in (201, 202), answer
    messages, last = progress(demo, "researcher2")
    assert last.get("ready"), last
    pods = "/api/v1/namespaces/jhub/pods?labelSelector=hub.jupyter.org%2Fusername%3Dresearcher2"
    (pod,) = kube.request("GET", pods)["items"]
    node = pod["spec"]["nodeName"]
    assert pod["metadata"]["annotations"].get("karpenter.sh/do-not-disrupt") == "true"
    (claim,) = [c for c in kube.request("GET", NODECLAIMS)["items"] if (c.get("status") or {}).get("nodeName") == node]
    assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu-t4-ts"

    kube.request("DELETE", f"{NODECLAIMS}/{claim['metadata']['name']}")
    wait_for(
        lambda: not kube.request("GET", pods)["items"], "Karpenter deleting the notebook's pod at the node's grace period", timeout=300
    )
    wait_for(lambda: not call(demo, "GET", "/users/researcher2")[1]["servers"], "the hub marking the server stopped", timeout=180)
    opener, _ = login(demo, "researcher2")
    home = opener.open(f"{demo.url}/hub/home", timeout=60).read().decode()
    said = f"because Karpenter, the cluster&#39;s node autoscaler, ended its node {node}"
    assert said in home or said.replace("&#39;", "'") in home, home[-3000:]
    assert "Please start it again." in home
    print(next(line.strip() for line in home.splitlines() if "ended its node" in line))  # (shown with -s: the user's words)
    wait_for(
        lambda: (
            claim["metadata"]["name"] not in {c["metadata"]["name"] for c in kube.request("GET", NODECLAIMS)["items"]}
            and not kube.request("GET", POOL_NODES)["items"]
        ),
        "the NodeClaim and its node gone",
        timeout=240,
    )
    assert not kube.request("GET", pods)["items"]
    wait_for(
        lambda: card(spawn_page(demo, "researcher2"), T4).count("a new node starts for you") == 1,
        "the pool counted at zero nodes",
        timeout=120,
    )


def card(page: str, slug: str) -> str:
    """The spawn page's card of ``slug`` (its HTML; "" where the page has none)."""
    start = page.find(f'data-slug="{slug}"')
    if start < 0:
        return ""
    return page[start : page.index('<div class="gs-option', start)] if '<div class="gs-option' in page[start:] else page[start:]
