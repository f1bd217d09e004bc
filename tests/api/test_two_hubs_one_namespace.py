"""Two real hubs in ONE namespace with the SAME user names (issue 38, "Two hubs in one namespace
delete each other's running pods"): nothing of one hub is deleted or counted by the other.

Each hub is a real JupyterHub process (tests/api/gpuhub.py) with its own sqlite database, on the
session's devcluster; their pods are really served (gpuspawner.devcluster.podrunner), so servers
become ready and stay running until stopped. Without ``hub_id`` each hub derives its identity and
keeps it in its database; GPUSpawner's default pod name carries it, so both hubs' ``researcher1``
run side by side. With one explicit ``pod_name_template`` for both (the names collide), the second
spawn is refused 409 naming the other hub, and the first hub's pod is left running.
"""

from __future__ import annotations

import pytest

from gpuspawner.devcluster.podrunner import PodRunner
from tests.api.gpuhub import MIG1, GPUHub
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
USER = "researcher1"  # the same name on both hubs (both load the same users and groups)
SERVED = "c.KubeSpawner.cmd = ['jupyterhub-singleuser']  # the pod runner starts it on the pod's IP\n"


def ready(hub: GPUHub, server: str = "") -> bool:
    return bool((hub.user_model(USER).get("servers") or {}).get(server, {}).get("ready"))


def record(hub: GPUHub, server: str = "") -> dict:
    """The server's GPU record (offering, pod, ...) as the hub's REST API serves it."""
    return hub.user_model(USER)["servers"][server]["user_options"]["gpuspawner"]


def live(hub: GPUHub) -> dict[str, dict]:
    """Every live notebook pod of USER in the namespace, whichever hub made it, by name."""
    return {p["metadata"]["name"]: p for p in hub.pods(USER)}


@pytest.fixture
def two_hubs(devcluster, kube, namespace, tmp_path, request):
    """Two hubs (``request.param``: each one's extra config) in ``namespace``, pods served."""
    configs = request.param
    runner = PodRunner(kube, root=tmp_path / "pods")
    hubs = [
        GPUHub(tmp_path / name, devcluster, namespace, http_timeout=120, slow_spawn_timeout=30.0, extra_config=SERVED + extra)
        for name, extra in configs
    ]
    runner.start()
    try:
        for hub in hubs:
            hub.start()
        yield hubs
    finally:
        for hub in hubs:
            hub.stop()  # (cleanup_servers: the hub stops its servers; the namespace fixture removes what is left)
        runner.stop()


QUOTA_OF_ONE = "c.GPUSpawner.user_quota = {'total': 1}\n"


@pytest.mark.parametrize("two_hubs", [[("a", QUOTA_OF_ONE), ("b", QUOTA_OF_ONE)]], indirect=True, ids=["no-hub-id"])
def test_without_hub_id_both_hubs_users_of_one_name_run_and_neither_deletes_or_counts_the_others(two_hubs):
    a, b = two_hubs
    for hub in (a, b):
        answer = hub.api("POST", hub.server_path(USER), {"offering": MIG1})
        assert answer.status in (201, 202), answer
    for hub in (a, b):
        wait_for(lambda hub=hub: ready(hub), "both hubs' servers to be ready", timeout=180)
    pod_a, pod_b = record(a)["pod"], record(b)["pod"]
    pods = live(a)
    assert set(pods) == {pod_a, pod_b} and pod_a != pod_b  # two pods, neither deleted by the other's spawn
    hub_a, hub_b = (pods[p]["metadata"]["labels"]["gpuspawner.io/hub"] for p in (pod_a, pod_b))
    assert hub_a != hub_b and hub_a.startswith(f"{a.namespace}.") and hub_b.startswith(f"{b.namespace}.")
    for pod in (pod_a, pod_b):  # GPUSpawner's default name: KubeSpawner's with six characters of the identity
        assert pod.startswith(f"jupyter-{USER}-") and len(pod) == len(f"jupyter-{USER}-") + 6

    # Quotas: each hub counts its own user's slice only. A's second is over A's quota of one ...
    over = a.api("POST", a.server_path(USER, "two"), {"offering": MIG1})
    assert over.status == 429 and "already hold 1" in over.message, over
    # ... while B's researcher1 (holding one slice on B, none of A's counted) is refused for B's own one only.
    also = b.api("POST", b.server_path(USER, "two"), {"offering": MIG1})
    assert also.status == 429 and "already hold 1" in also.message, also

    # A's stop deletes A's pod only.
    stopped = a.api("DELETE", a.server_path(USER))
    assert stopped.status in (202, 204), stopped
    wait_for(lambda: pod_a not in live(a) and not ready(a), "A's server and pod to be gone", timeout=120)
    assert set(live(b)) == {pod_b} and ready(b)


SAME_NAMES = "c.KubeSpawner.pod_name_template = 'jupyter-{user_server}'  # both hubs: the names collide\n"


@pytest.mark.parametrize(
    "two_hubs",
    [
        [("a", SAME_NAMES + "c.GPUSpawner.hub_id = 'staging'\n"), ("b", SAME_NAMES + "c.GPUSpawner.hub_id = 'production'\n")],
        [("a", SAME_NAMES), ("b", SAME_NAMES)],
    ],
    indirect=True,
    ids=["configured-hub-ids", "no-hub-id"],
)
def test_a_pod_name_another_hubs_pod_holds_is_refused_409_and_that_pod_is_left_running(two_hubs):
    a, b = two_hubs
    answer = a.api("POST", a.server_path(USER), {"offering": MIG1})
    assert answer.status in (201, 202), answer
    wait_for(lambda: ready(a), "A's server to be ready", timeout=180)
    name = f"jupyter-{USER}"
    first = live(a)[name]
    holder = first["metadata"]["labels"]["gpuspawner.io/hub"]

    refused = b.api("POST", b.server_path(USER), {"offering": MIG1})
    assert refused.status == 409, refused
    assert f"{b.namespace}/{name} is taken by a pod of the hub '{holder}'" in refused.message, refused.message
    assert "c.GPUSpawner.hub_id" in refused.message and "pod_name_template" in refused.message
    assert "Found existing pod" not in b.log_text()  # KubeSpawner's delete-and-retry never ran
    # A's pod is the very same one, still running and ready; B has no server and made nothing.
    assert live(a)[name]["metadata"]["uid"] == first["metadata"]["uid"] and ready(a)
    model = (b.user_model(USER).get("servers") or {}).get("")
    assert model is None or not model["ready"]
    wait_for(lambda: not (b.user_model(USER).get("servers") or {}).get("", {}).get("pending"), "B's refused spawn to end", timeout=60)
    assert live(a)[name]["metadata"]["uid"] == first["metadata"]["uid"] and ready(a)  # B's cleanup deleted nothing
