"""Quotas under concurrency and pods that outlive a stop, on the real hub and control plane.

The demo stack (devcluster, pod runner, real JupyterHub behind a real proxy, GPUSpawner),
driven through the hub's REST API as a script or a hostile user would:

* 20 concurrent named-server spawns by one user get exactly the user's quota;
* two users of one group racing get exactly the group's quota;
* a stop while the API server is down keeps the server "stopping", and ends once the
  API server is back: the pod is gone and the free count is right again (researcher1, whose
  stops retry for ten minutes: however long a loaded machine takes to bring the control
  plane back, the stop outlasts it);
* a stop that gives up (the outage lasts longer than ``stop_retry_timeout``, 20 s for
  researcher2) leaves an orphaned pod, which the hub's reconciler deletes once the cluster
  answers.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuspawner.tools.demo import NAMESPACE
from tests.conftest import wait_for
from tests.e2e.demo_stack import demo_with_token

pytestmark = pytest.mark.cluster

USER_QUOTA = 4
GROUP_QUOTA = 6
STOP_RETRY = 20  # researcher2's: the outage of the give-up test outlasts it
LONG_STOP_RETRY = 600  # everyone else's: longer than any control-plane restart
EXTRA_CONFIG = f"""
c = get_config()
c.GPUSpawner.user_quota = {{"total": {USER_QUOTA}}}
c.GPUSpawner.group_quotas = {{"students": {{"total": {GROUP_QUOTA}, "full": 0}}}}
c.GPUSpawner.stop_retry_timeout = {LONG_STOP_RETRY}


def short_stop_retry(spawner):
    if spawner.user.name == "researcher2":
        spawner.stop_retry_timeout = {STOP_RETRY}


c.Spawner.pre_spawn_hook = short_stop_retry
c.GPUSpawner.orphan_pod_grace_seconds = 5
c.GPUSpawner.orphan_pod_check_seconds = 1
c.KubeSpawner.k8s_api_request_retry_timeout = 5
"""
# What students may take, with room for more than any quota here: 20 units in all.
STUDENT_OFFERINGS = [
    "mig-gke-nvidia-tesla-a100-1g-5gb",
    "shared-tesla-t4-shared-time-slicing-4x",
    "shared-nvidia-l4-shared-mps-4x",
    "shared-tesla-t4-time-slicing-4x",
    "mig-nvidia-a100-sxm4-40gb-1g-5gb",
]
MIG_2G = "mig-nvidia-a100-sxm4-40gb-2g-10gb"  # one on the devcluster, researchers only
H100 = "gpu-nvidia-h100-80gb-hbm3"  # eight, four held by another team


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with demo_with_token(tmp_path_factory, EXTRA_CONFIG, culler=False) as running:
        yield running


def call(demo, method: str, path: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{demo.api_url}{path}", data=data, method=method, headers={"Authorization": f"token {demo.token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else {})
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, {"message": raw.decode(errors="replace")}


def servers(demo, user: str) -> dict:
    return call(demo, "GET", f"/users/{user}")[1]["servers"]


def settled(demo, *users: str) -> bool:
    return all(not s.get("pending") for user in users for s in servers(demo, user).values())


def gpu_pods(demo, user: str | None = None) -> list[dict]:
    selector = "gpuspawner.io/offering" + (f",hub.jupyter.org/username={user}" if user else "")
    pods = demo.cluster.client().request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def free_count(demo, slug: str) -> float | None:
    req = urllib.request.Request(f"{demo.url}/hub/metrics", headers={"Authorization": f"token {demo.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    match = re.search(rf'^gpuspawner_offering_free{{kind="[a-z]+",offering="{re.escape(slug)}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None


def hub_log(demo) -> str:
    return (demo.state / "jupyterhub.log").read_text(errors="replace")


def spawn_all(demo, requests: list[tuple[str, str, str]]) -> list[tuple[int, dict]]:
    """POST every (user, server name, offering) at once, as concurrent REST clients would."""

    def one(req):
        user, name, slug = req
        return call(demo, "POST", f"/users/{user}/servers/{name}", {"offering": slug})

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(one, requests))


def remove_all(demo, *users: str) -> None:
    for user in users:
        for name in servers(demo, user):
            call(demo, "DELETE", f"/users/{user}/servers/{name}", {"remove": True})
    wait_for(lambda: all(servers(demo, u) == {} for u in users), "servers removed", timeout=120)
    wait_for(lambda: not any(gpu_pods(demo, u) for u in users), "pods gone", timeout=120)


def test_twenty_concurrent_spawns_get_exactly_the_users_quota(demo):
    requests = [("student1", f"race{i}", STUDENT_OFFERINGS[i % len(STUDENT_OFFERINGS)]) for i in range(20)]
    answers = spawn_all(demo, requests)
    try:
        wait_for(lambda: settled(demo, "student1"), "every spawn settled", timeout=240, interval=0.5)
        running = servers(demo, "student1")
        assert len(running) == USER_QUOTA and all(s["ready"] for s in running.values()), running
        assert len(gpu_pods(demo, "student1")) == USER_QUOTA
        refused = [(status, body) for status, body in answers if status >= 400]
        assert len(refused) == 20 - USER_QUOTA, answers
        # Over the quota (429); or nothing free (409) when the last slice went to a spawn
        # holding a grant that it then gave back: the quota is never the one that gives.
        assert {status for status, _ in refused} <= {409, 429}, refused
        log = hub_log(demo)
        over, taken = sum(status == 429 for status, _ in refused), sum(status == 409 for status, _ in refused)
        assert log.count("Over your quota") >= over, refused
        assert log.count("is free") + log.count("just taken") >= taken, refused
    finally:
        remove_all(demo, "student1")


def test_two_users_of_a_group_racing_get_exactly_the_groups_quota(demo):
    requests = [(user, f"g{i}", STUDENT_OFFERINGS[i % len(STUDENT_OFFERINGS)]) for i in range(5) for user in ("student1", "student2")]
    spawn_all(demo, requests)
    try:
        wait_for(lambda: settled(demo, "student1", "student2"), "every spawn settled", timeout=240, interval=0.5)
        per_user = {u: len(servers(demo, u)) for u in ("student1", "student2")}
        assert sum(per_user.values()) == GROUP_QUOTA and max(per_user.values()) <= USER_QUOTA, per_user
        assert len(gpu_pods(demo)) == GROUP_QUOTA
        assert "Over the quota of your group 'students'" in hub_log(demo)
    finally:
        remove_all(demo, "student1", "student2")


FREE_AT_START = {MIG_2G: 1, H100: 4}
#: The outage: the control-plane node goes away (API server and scheduler; etcd, kwok and the
#: hub stay). A kube-scheduler that lives through an API server restart here may keep a deleted
#: pod in its cache ("Scheduler cache is corrupted") and never bind the next pod of that name.
CONTROL_PLANE = ["kube-apiserver", "kube-scheduler"]


def spawn_researcher(demo, slug: str, user: str = "researcher1") -> tuple[dict, float]:
    """``user``'s default server on ``slug``; returns its pod and the free count before."""
    before = FREE_AT_START[slug]
    status, body = call(demo, "POST", f"/users/{user}/server", {"offering": slug})
    assert status in (201, 202), body
    wait_for(lambda: servers(demo, user).get("", {}).get("ready"), f"{user}'s server ready", timeout=120)
    wait_for(lambda: free_count(demo, slug) == before - 1, "the GPU counted as used", timeout=60)
    [pod] = gpu_pods(demo, user)
    return pod, before


def test_a_stop_during_an_api_outage_waits_for_the_pod_to_go(demo):
    pod, before = spawn_researcher(demo, MIG_2G)
    demo.cluster.stop_components(CONTROL_PLANE)
    try:
        status, _ = call(demo, "DELETE", "/users/researcher1/server")
        assert status == 202  # "stopping", never "stopped" while the pod may live
        assert servers(demo, "researcher1")[""]["pending"] == "stop"
        # The stop has failed once and waits to retry; the server is still stopping.
        wait_for(lambda: "could not delete pod jhub/" in hub_log(demo), "the stop's first failure", timeout=120)
        assert servers(demo, "researcher1")[""]["pending"] == "stop"
    finally:
        demo.cluster.start_components(CONTROL_PLANE)
    wait_for(lambda: servers(demo, "researcher1") == {}, "the stop to finish", timeout=300, interval=0.5)
    assert "giving up after" not in hub_log(demo)
    names = [p["metadata"]["name"] for p in gpu_pods(demo, "researcher1")]
    assert pod["metadata"]["name"] not in names
    wait_for(lambda: free_count(demo, MIG_2G) == before, "the free count to be right again", timeout=120)


def test_a_stop_that_gives_up_leaves_an_orphan_the_hub_deletes(demo):
    pod, before = spawn_researcher(demo, H100, "researcher2")
    name = pod["metadata"]["name"]
    demo.cluster.stop_components(CONTROL_PLANE)
    try:
        status, _ = call(demo, "DELETE", "/users/researcher2/server")
        assert status == 202
        # The outage outlasts stop_retry_timeout: the stop gives up and the hub forgets the server.
        wait_for(lambda: servers(demo, "researcher2") == {}, "the stop to give up", timeout=STOP_RETRY + 240, interval=0.5)
        assert "giving up after" in hub_log(demo)
    finally:
        demo.cluster.start_components(CONTROL_PLANE)
    wait_for(
        lambda: name not in [p["metadata"]["name"] for p in gpu_pods(demo, "researcher2")],
        "the orphaned pod deleted",
        timeout=240,
        interval=0.5,
    )
    assert f"deleted orphaned GPU pod {NAMESPACE}/{name}: no server researcher2 in the hub" in hub_log(demo)
    wait_for(lambda: free_count(demo, H100) == before, "the free count to be right again", timeout=120)
