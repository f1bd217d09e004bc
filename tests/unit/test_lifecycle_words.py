"""What a start that ran out of time tells the user it was waiting for (hub.lifecycle), and when
GPUSpawner's own deadline falls (before JupyterHub's start_timeout, whose TimeoutError is wordless)."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from jupyterhub.utils import exponential_backoff
from kubespawner import KubeSpawner

from gpuspawner.core.noticewords import pod_waiting_words
from gpuspawner.hub.lifecycle import kubespawner_gave_up, own_deadline


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


def test_gpuspawners_own_loggers_write_into_the_hubs_log_once_and_leave_a_sites_setup_alone():
    import io
    import logging

    from gpuspawner.hub.hubhooks import hub_log_for_gpuspawner

    ours = logging.getLogger("gpuspawner")
    saved = (list(ours.handlers), ours.level, ours.propagate)
    hub, out = logging.getLogger("test-hub"), io.StringIO()
    handler = logging.StreamHandler(out)
    hub.addHandler(handler)
    hub.setLevel(logging.INFO)
    hub.propagate = False  # as JupyterHub's application logger
    root = logging.getLogger()
    hub_log_for_gpuspawner(root)  # a logger that propagates (the root, say) is left to propagation
    assert not any(h in ours.handlers for h in root.handlers)
    try:
        for h in list(ours.handlers):
            ours.removeHandler(h)
        hub_log_for_gpuspawner(hub)
        hub_log_for_gpuspawner(hub)  # a second spawner adds nothing
        logging.getLogger("gpuspawner.hub.inventory").info("inventory: listed 3 nodes")
        logging.getLogger("gpuspawner.hub.inventory").debug("not at the hub's level")
        assert out.getvalue() == "inventory: listed 3 nodes\n"
        site = logging.StreamHandler(io.StringIO())
        for h in list(ours.handlers):
            ours.removeHandler(h)
        ours.addHandler(site)
        hub_log_for_gpuspawner(hub)
        assert ours.handlers == [site]
        for h in list(ours.handlers):
            ours.removeHandler(h)
        quiet = logging.getLogger("test-quiet-hub")
        quiet.addHandler(logging.NullHandler())  # (traitlets' own logger outside a hub)
        hub_log_for_gpuspawner(quiet)
        assert ours.handlers == []
    finally:
        hub.removeHandler(handler)
        for h in list(ours.handlers):
            ours.removeHandler(h)
        for h in saved[0]:
            ours.addHandler(h)
        ours.setLevel(saved[1])
        ours.propagate = saved[2]


async def test_progress_outlives_kubespawners_events_failing_and_keeps_the_spawns_own_steps():
    """KubeSpawner's event watch cannot start (the API server gone): its generator raises. The
    stream must not end with that error (JupyterHub then never sends the refusal's words): the
    spawn's own steps go on, and the stream ends when JupyterHub stops iterating it."""
    import asyncio
    import logging

    from gpuspawner.hub.lifecycle import progress
    from gpuspawner.hub.spawnstate import SpawnState

    async def events():
        yield {"progress": 10, "message": "pod created"}
        raise ConnectionError("Cannot connect to host 127.0.0.1:6443")

    state = SpawnState()
    state.messages.append("Starting 1 x H100.")
    seen: list[str] = []
    stream = progress(lambda: state, events(), logging.getLogger("test-progress"))
    async for event in stream:
        seen.append(event["message"])
        if event["message"] == "pod created":
            await asyncio.sleep(0.1)  # the events' generator fails meanwhile
            state.messages.append("Waiting for a free GPU.")
        if len(seen) == 3:
            break
    await stream.aclose()
    assert seen == ["Starting 1 x H100.", "pod created", "Waiting for a free GPU."]


async def test_kubespawners_own_wait_running_out_is_told_from_other_failures():
    # KubeSpawner's wait for the pod is jupyterhub.utils.exponential_backoff with start_timeout
    # and its default 10% jitter, so it can give up before GPUSpawner's own deadline.
    source = inspect.getsource(KubeSpawner._start)
    assert "did not start in {self.start_timeout} seconds!" in source
    waited = asyncio.ensure_future(exponential_backoff(lambda: False, "pod jhub/jupyter-ann did not start in 1 seconds!", timeout=0.05))
    await asyncio.gather(waited, return_exceptions=True)
    assert kubespawner_gave_up(waited)

    for failure in (TimeoutError("Could not create pod jhub/jupyter-ann"), RuntimeError("did not start in")):
        other = asyncio.get_running_loop().create_future()
        other.set_exception(failure)
        assert not kubespawner_gave_up(other)
        other.exception()
    cancelled = asyncio.get_running_loop().create_future()
    cancelled.cancel()
    assert not kubespawner_gave_up(cancelled)
