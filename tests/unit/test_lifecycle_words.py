"""What a start that ran out of time tells the user it was waiting for (hub.lifecycle), and when
GPUSpawner's own deadline falls (before JupyterHub's start_timeout, whose TimeoutError is wordless)."""

from __future__ import annotations

import pytest

from gpuspawner.hub.lifecycle import own_deadline, pod_waiting_words


@pytest.mark.parametrize("start_timeout", [5, 20, 40, 120, 300, 3600])
def test_the_own_deadline_falls_before_jupyterhubs_and_not_much_before(start_timeout):
    deadline = own_deadline(start_timeout)
    assert start_timeout / 2 <= deadline < start_timeout
    assert start_timeout - deadline <= 10


def test_a_pod_never_confirmed():
    assert pod_waiting_words(None) == "the cluster had not confirmed its pod yet (the API server answers slowly)"


def test_a_pod_without_a_node_gives_the_schedulers_words():
    pod = {
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}],
        },
    }
    assert pod_waiting_words(pod) == "its pod was still waiting for a node: 0/3 nodes are available"
    assert pod_waiting_words({"spec": {}, "status": {}}) == "its pod was still waiting for a node"


def test_a_container_still_waiting_names_why():
    pod = {
        "spec": {"nodeName": "gpu-1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image x"}}}],
        },
    }
    assert pod_waiting_words(pod) == "its container was still ImagePullBackOff (Back-off pulling image x)"


def test_a_running_pod_whose_notebook_never_answered():
    pod = {"spec": {"nodeName": "gpu-1"}, "status": {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}}
    assert pod_waiting_words(pod) == "its pod was running, but the notebook server in it had not started"
    assert pod_waiting_words({"spec": {"nodeName": "gpu-1"}, "status": {}}) == "its pod was still Pending on node gpu-1"


def test_a_slow_api_server_is_retried_until_the_starts_time_is_up_unless_the_admin_says_otherwise():
    from types import SimpleNamespace

    from gpuspawner.spawner import GPUSpawner

    trait = GPUSpawner.class_traits()["k8s_api_request_retry_timeout"]
    assert GPUSpawner._retry_while_the_start_may_wait(SimpleNamespace(start_timeout=240)) == 240
    # A dynamic default: an admin's c.KubeSpawner.k8s_api_request_retry_timeout still wins.
    assert trait.default_value == 30 and "k8s_api_request_retry_timeout" in GPUSpawner._trait_default_generators
