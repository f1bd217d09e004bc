"""Drop-in compatibility on the devcluster: start, poll and stop with KubeSpawner and with
GPUSpawner (GPU offerings off, then on) leave the same pod on the real API server, the
same state and user_options, and answer poll alike; GPU offerings on add only the
documented differences. A spawner with no Server object starts like KubeSpawner's."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import pytest
from kubespawner import KubeSpawner

from gpuspawner.spawner import GPUSpawner
from tests.compat.harness import GPU_OFF, STAMPS, differing, flat, make_spawner, site_config, undocumented
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

#: Set by the API server, the scheduler and kwok: never the spawner's doing.
SERVER_SET = re.compile(
    r"^pod\.(status|metadata\.(uid|resourceVersion|creationTimestamp|managedFields|generation)|spec\.nodeName)([.\[]|$)"
)
HALF_V100 = {"slug": "half-v100", "kind": "custom", "display_name": "Half a V100", "resources": {"nvidia.com/vgpu": 500}}
MIG_1G = "mig-nvidia-a100-sxm4-40gb-1g-5gb"


def cluster_config(namespace: str, gpu: dict[str, Any] | None):
    """The site's config, schedulable on the devcluster (its nodes carry no site labels)."""
    return site_config(gpu, namespace=namespace, node_selector={}, tolerations=[])


def stored(pod: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flat("pod", pod).items() if not SERVER_SET.match(k)}


async def lifecycle(cls: type, config, kube, user: str, options: dict[str, Any], server: bool = True) -> dict[str, Any]:
    """start -> poll -> stop -> poll, as the hub drives a spawner; what each step left."""
    spawner = make_spawner(cls, config, user, server=server)
    spawner.user_options = dict(options)
    url = await spawner.start()
    if server:  # as the hub records it
        spawner.server.ip, spawner.server.port = urlparse(url).hostname, urlparse(url).port
    namespace = spawner.namespace
    pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{spawner.pod_name}")
    running = await spawner.poll()
    state = spawner.get_state()
    user_options = dict(spawner.user_options)
    await spawner.stop(now=True)
    wait_for(lambda: not kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"], "the pod deleted", timeout=60)
    stopped = await spawner.poll()
    spawner.clear_state()
    return {
        **stored(pod),
        **flat("state", state),
        **flat("user_options", user_options),
        "url": re.sub(r"//[0-9.]+:", "//<pod ip>:", url),
        "url_is_the_pod": url == f"http://{pod['status']['podIP']}:8888",
        "poll.running": running,
        "poll.stopped": stopped,
        "phase": pod["status"].get("phase"),
    }


async def test_start_poll_stop_agree_without_gpu_offerings(devcluster, kube, namespace):
    config = cluster_config(namespace, GPU_OFF)
    options = {"profile": "small"}
    kube_run = await lifecycle(KubeSpawner, config, kube, "erin", options)
    gpu_run = await lifecycle(GPUSpawner, config, kube, "erin", options)
    assert kube_run["url_is_the_pod"] and kube_run["poll.running"] is None and kube_run["poll.stopped"] is not None
    assert differing(kube_run, gpu_run) == STAMPS


@pytest.mark.parametrize("offering, options", [(HALF_V100, {"offering": "half-v100"}), (MIG_1G, {"offering": MIG_1G})])
async def test_start_poll_stop_with_gpu_offerings_differ_only_as_documented(devcluster, kube, namespace, offering, options):
    kube_run = await lifecycle(KubeSpawner, cluster_config(namespace, GPU_OFF), kube, "frank", {"profile": "small"})
    gpu_config = cluster_config(namespace, {"discover_offerings": True, "offerings": [HALF_V100]})
    gpu_run = await lifecycle(GPUSpawner, gpu_config, kube, "frank", {"profile": "small", **options})
    if isinstance(offering, str):  # discovered: its fields as the catalog has them
        probe = make_spawner(GPUSpawner, gpu_config, "frank")
        found = next(o for o in await probe.catalog() if o.slug == offering)
        offering = {
            "resources": found.resources,
            "node_selector": found.node_selector,
            "labels": found.labels,
            "annotations": found.annotations,
            "env": found.env,
        }
    diff = differing(kube_run, gpu_run)
    assert undocumented(diff, offering) == []
    resource = next(iter(offering["resources"]))
    assert f"pod.spec.containers[notebook].resources.limits[{resource}]" in diff
    assert gpu_run["user_options.gpuspawner.url"].startswith("http://")
    assert gpu_run["url_is_the_pod"] and gpu_run["poll.running"] is None and gpu_run["poll.stopped"] == kube_run["poll.stopped"]


@pytest.mark.parametrize("gpu", [GPU_OFF, {"discover_offerings": True}], ids=["gpu-off", "gpu-on"])
async def test_start_without_a_server_object_works_like_kubespawner(devcluster, kube, namespace, gpu):
    """Scripts and tests drive spawners without the hub's Server object; KubeSpawner starts
    then, and so must GPUSpawner (its record then has no URL to name)."""
    config = cluster_config(namespace, GPU_OFF)
    kube_run = await lifecycle(KubeSpawner, config, kube, "gina", {"profile": "small"}, server=False)
    options = {"profile": "small", **({"offering": MIG_1G} if gpu is not GPU_OFF else {})}
    gpu_run = await lifecycle(GPUSpawner, cluster_config(namespace, gpu), kube, "gina", options, server=False)
    assert kube_run["url_is_the_pod"] and gpu_run["url_is_the_pod"]
    assert gpu_run["poll.running"] is None
    if gpu is GPU_OFF:
        assert differing(kube_run, gpu_run) == STAMPS
    else:
        assert gpu_run["user_options.gpuspawner.url"] is None
