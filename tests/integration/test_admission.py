"""Admission and fail-fast against the real scheduler: refusals in seconds with the
scheduler's own reason, exactly one winner for the last slice, quotas, no leaks."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC

import pytest

from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.reflector import VerdictPodReflector
from gpuspawner.hub.scheduling import SpawnRefused
from tests.conftest import wait_for
from tests.integration.test_spawner import make_spawner, pod_of

pytestmark = pytest.mark.cluster

T4_SHARED = "shared-tesla-t4-time-slicing-4x"  # 4 units of nvidia.com/gpu.shared on gpu-t4-ts-renamed


def foreign_pod(name: str, limits: dict, node_selector: dict | None = None) -> dict:
    """A GPU pod of someone else (another namespace, not ours): it still uses GPUs."""
    spec = {
        "containers": [{"name": "train", "image": "pytorch", "resources": {"limits": limits}}],
        "tolerations": [{"operator": "Exists"}],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pods(kube, ns):
    return kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]


@pytest.fixture
def other_namespace(kube):
    name = f"team-{time.monotonic_ns() % 100000}"
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.request("DELETE", f"/api/v1/namespaces/{name}/pods?gracePeriodSeconds=0")
    wait_for(lambda: not pods(kube, name), "foreign pods gone", timeout=60)
    kube.request("DELETE", f"/api/v1/namespaces/{name}")


async def inventory_sees(spawner, predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not predicate(spawner.inventory.index):
        if time.monotonic() > deadline:
            pytest.fail(f"inventory never saw {what}")
        await asyncio.sleep(0.05)


def free_of(spawner, slug):
    offering = next(o for o in spawner.inventory.index.discovered() if o.slug == slug)
    return spawner.inventory.index.availability(offering).free


async def test_twenty_spawns_for_three_free_slices(devcluster, kube, namespace, other_namespace):
    # Someone else's training job holds one of the four T4 shares, in another namespace.
    kube.request("POST", f"/api/v1/namespaces/{other_namespace}/pods", foreign_pod("trainer", {"nvidia.com/gpu.shared": "1"}))
    probe = make_spawner(devcluster, namespace)
    await probe.catalog()
    await inventory_sees(probe, lambda idx: free_of(probe, T4_SHARED) == 3, "the foreign pod")

    spawners = [make_spawner(devcluster, namespace) for _ in range(20)]
    for sp in spawners:
        sp.user_options = {"offering": T4_SHARED}
    results = await asyncio.gather(*(sp.start() for sp in spawners), return_exceptions=True)
    started = [sp for sp, r in zip(spawners, results, strict=True) if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, SpawnRefused)]
    others = [r for r in results if not isinstance(r, (str, SpawnRefused))]
    try:
        assert not others, others
        assert len(started) == 3 and len(refused) == 17
        for error in refused:
            assert "is free (0 of 4 free)" in str(error) or "just taken" in str(error), str(error)
        ours = pods(kube, namespace)
        assert len(ours) == 3 and all(p["status"]["phase"] == "Running" for p in ours)
        assert {p["spec"]["nodeName"] for p in ours} == {"gpu-t4-ts-renamed"}
        assert probe.inventory.index.reservations == {}
    finally:
        await asyncio.gather(*(sp.stop(now=True) for sp in started))


async def test_refusal_names_what_is_free_instead_and_creates_no_pod(devcluster, kube, namespace, other_namespace):
    kube.request("POST", f"/api/v1/namespaces/{other_namespace}/pods", foreign_pod("big", {"nvidia.com/mig-3g.20gb": "1"}))
    spawner = make_spawner(devcluster, namespace)
    await spawner.catalog()
    await inventory_sees(spawner, lambda idx: free_of(spawner, "mig-nvidia-a100-sxm4-40gb-3g-20gb") == 0, "the 3g pod")
    spawner.user_options = {"offering": "mig-nvidia-a100-sxm4-40gb-3g-20gb"}
    started = time.monotonic()
    with pytest.raises(SpawnRefused) as info:
        await spawner.start()
    took = time.monotonic() - started
    message = str(info.value)
    assert info.value.status_code == 409  # the REST API's answer: nothing free now
    assert message.startswith("No A100 40GB · MIG 3g.20gb is free (0 of 1 free). Free now: ")
    assert "A100 40GB · MIG 1g.5gb (" in message  # a free slice of the same GPU, with its count
    assert pods(kube, namespace) == []
    print(f"admission refusal took {took:.3f}s")


async def test_scheduler_refusal_fails_the_spawn_in_seconds_and_deletes_the_pod(devcluster, kube, namespace):
    # Nothing counts this offering's capacity (no extended resource), so only the real
    # scheduler can say no: it finds no node with this label.
    impossible = [
        {
            "slug": "fpga",
            "kind": "custom",
            "display_name": "FPGA node",
            "command_prefix": ["run-on-fpga"],
            "node_selector": {"example.org/fpga": "true"},
        }
    ]
    spawner = make_spawner(devcluster, namespace, offerings=impossible)
    spawner.start_timeout = 300
    spawner.user_options = {"offering": "fpga"}
    started = time.monotonic()
    with pytest.raises(SpawnRefused) as info:
        await spawner.start()
    took = time.monotonic() - started
    assert "The scheduler says: 0/11 nodes are available" in str(info.value)
    assert "didn't match Pod's node affinity/selector" in str(info.value)
    assert "preemption" not in str(info.value)
    assert isinstance(spawner.pod_reflector, VerdictPodReflector)  # told by its watch, not polled
    wait_for(lambda: pods(kube, namespace) == [], "the unschedulable pod deleted", timeout=30)
    assert took < spawner.start_timeout
    print(f"scheduler refusal took {took:.2f}s (start_timeout {spawner.start_timeout}s)")


async def test_user_quota_counts_servers_across_the_users_named_servers(devcluster, kube, namespace):
    first = make_spawner(devcluster, namespace, user_quota={"total": 1})
    first.user_options = {"offering": "mig-nvidia-a100-sxm4-40gb-1g-5gb"}
    await first.start()
    try:
        second = make_spawner(devcluster, namespace, user_quota={"total": 1})
        second.user = first.user  # the same user, another named server
        second.pod_name = f"{first.pod_name}--second"
        second.user_options = {"offering": "mig-nvidia-a100-sxm4-40gb-1g-5gb"}
        await inventory_sees(second, lambda idx: any(p.offering for p in idx.pods.values()), "the first server's pod")
        with pytest.raises(SpawnRefused, match=r"Over your quota: you may hold 1 GPUs of any kind at once and already hold 1") as info:
            await second.start()
        assert info.value.status_code == 429
        assert len(pods(kube, namespace)) == 1
        cpu = make_spawner(devcluster, namespace, user_quota={"total": 1})
        cpu.user = first.user
        cpu.pod_name = f"{first.pod_name}--cpu"
        cpu.user_options = {"offering": "cpu"}
        await cpu.start()  # a CPU server is never over a GPU quota
        await cpu.stop(now=True)
    finally:
        await first.stop(now=True)


async def test_queue_waits_for_a_unit_and_then_starts(devcluster, kube, namespace, other_namespace):
    overrides = {"gpu-nvidia-h100-80gb-hbm3": {"admission": "queue", "queue_timeout": 45}}  # (shorter than start_timeout)
    kube.request(
        "POST",
        f"/api/v1/namespaces/{other_namespace}/pods",
        foreign_pod("all-h100", {"nvidia.com/gpu": "8"}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
    )
    spawner = make_spawner(devcluster, namespace, offering_overrides=overrides)
    await spawner.catalog()
    await inventory_sees(spawner, lambda idx: free_of(spawner, "gpu-nvidia-h100-80gb-hbm3") == 0, "all H100s taken")
    spawner.user_options = {"offering": "gpu-nvidia-h100-80gb-hbm3"}
    start = asyncio.ensure_future(spawner.start())
    await asyncio.sleep(1.0)
    assert not start.done() and pods(kube, namespace) == []  # queued, no pod yet
    assert spawner.spawn_state.queue_position == 1
    kube.request("DELETE", f"/api/v1/namespaces/{other_namespace}/pods/all-h100?gracePeriodSeconds=0")
    await asyncio.wait_for(start, 60)
    try:
        assert (await pod_of(spawner))["spec"]["nodeName"] == "gpu-h100-8x"
    finally:
        await spawner.stop(now=True)


async def test_inventory_recovers_after_api_server_and_etcd_restart(devcluster, kube, namespace):
    spawner = make_spawner(devcluster, namespace)
    await spawner.catalog()
    inventory: Inventory = spawner.inventory
    assert inventory.ready
    relists_before = inventory.relists["pods"]
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", foreign_pod("before", {"nvidia.com/mig-2g.10gb": "1"}))
    await inventory_sees(spawner, lambda idx: free_of(spawner, "mig-nvidia-a100-sxm4-40gb-2g-10gb") == 0, "the pod before")

    await asyncio.to_thread(devcluster.restart, ("kube-apiserver", "etcd"), 1.0)
    # Changes made as soon as the API is back, before the inventory has reconnected.
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/before?gracePeriodSeconds=0")
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", foreign_pod("after", {"nvidia.com/mig-1g.5gb": "2"}))
    wait_for(
        lambda: (
            all(p["status"].get("phase") == "Running" for p in pods(kube, namespace))
            and [p["metadata"]["name"] for p in pods(kube, namespace)] == ["after"]
        ),
        "pods settled after restart",
    )
    await inventory_sees(
        spawner,
        lambda idx: (
            free_of(spawner, "mig-nvidia-a100-sxm4-40gb-2g-10gb") == 1 and free_of(spawner, "mig-nvidia-a100-sxm4-40gb-1g-5gb") == 0
        ),
        "the changes made around the outage",
        timeout=60,
    )
    assert inventory.ready and inventory.relists["pods"] > relists_before


async def test_time_window_is_enforced_for_every_kind_on_api_starts(devcluster, kube, namespace):
    from datetime import datetime

    other_day = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[(datetime.now(UTC).weekday() + 3) % 7]
    offerings = [
        {
            "slug": "bitfusion-night",
            "kind": "custom",
            "display_name": "Remote half GPU",
            "command_prefix": ["bitfusion", "run", "-n", "1", "-p", "0.5", "--"],
            "windows": [f"{other_day} 00:00-24:00"],
        }
    ]
    spawner = make_spawner(devcluster, namespace, offerings=offerings, site_timezone="UTC")
    spawner.user_options = {"offering": "bitfusion-night"}  # a REST API start: no form in between
    with pytest.raises(SpawnRefused, match=rf"Remote half GPU is only available {other_day} 00:00-24:00 \(UTC\)") as info:
        await spawner.start()
    assert info.value.status_code == 403
    assert pods(kube, namespace) == []


async def test_a_gpu_is_not_free_when_the_notebook_cannot_fit_beside_it(devcluster, kube, namespace, other_namespace):
    # Someone's job holds all but 512Mi of the T4 node's memory; the hub's notebooks ask for 1G (z2jh's default).
    hog = foreign_pod("hog", {}, {"kubernetes.io/hostname": "gpu-t4-ts-renamed"})
    hog["spec"]["containers"][0]["resources"] = {"requests": {"memory": "261632Mi"}}
    kube.request("POST", f"/api/v1/namespaces/{other_namespace}/pods", hog)
    spawner = make_spawner(devcluster, namespace)
    spawner.mem_guarantee = 2**30
    await spawner.catalog()
    await inventory_sees(spawner, lambda idx: free_of(spawner, T4_SHARED) == 0, "the memory hog")
    offering = next(o for o in spawner.inventory.index.discovered() if o.slug == T4_SHARED)
    assert spawner.inventory.index.availability(offering).capacity == 4  # four shares there, none usable
    spawner.user_options = {"offering": T4_SHARED}
    with pytest.raises(SpawnRefused, match="is free"):
        await spawner.start()
    assert not pods(kube, namespace)  # refused before a pod was made, not left Pending
    small = make_spawner(devcluster, namespace)
    small.mem_guarantee = 256 * 2**20
    await small.catalog()
    assert free_of(small, T4_SHARED) == 2  # two 256Mi notebooks fit in what is left


#: Admitted with a warning (none free now, the admin lets users wait): a pod that waits for a node no
#: node has, until the start's time is up.
WAITS = [
    {
        "slug": "fpga-gpu",
        "kind": "custom",
        "display_name": "GPU on an FPGA node",
        "resources": {"nvidia.com/gpu": 1},
        "node_selector": {"example.org/fpga": "true"},
        "admission": "warn",
    }
]


async def test_a_start_that_runs_out_of_time_says_what_it_waited_for_and_leaves_nothing(devcluster, kube, namespace):
    # Admitted with a warning (none free now, the admin lets users wait), so the scheduler's
    # "no" does not end it: only the time limit does. JupyterHub's own TimeoutError at
    # start_timeout has no message; GPUSpawner's ends the start just before it, with words.
    spawner = make_spawner(devcluster, namespace, offerings=WAITS)
    spawner.start_timeout = 60  # (long enough for the pod to be created and marked unschedulable on a loaded machine)
    spawner.user_options = {"offering": "fpga-gpu"}
    with pytest.raises(SpawnRefused) as info:
        await spawner.start()
    words = str(info.value)
    assert info.value.status_code == 503
    assert words.startswith("Your server did not start within the hub's time limit (60 seconds): its pod was still waiting for a node")
    assert "didn't match Pod's node affinity/selector" in words, words
    assert "Nothing is left running" in words
    wait_for(lambda: pods(kube, namespace) == [], "the waiting pod deleted", timeout=60)


async def test_a_start_jupyterhub_gives_up_on_before_its_own_deadline_still_says_why(devcluster, kube, namespace, monkeypatch):
    # On a hub whose event loop is seconds late (a storm on a small machine), the start's own
    # deadline, which begins a turn or two after JupyterHub's clock, can come after JupyterHub's
    # start_timeout: its wait_for cancels the start. The user must still read why, not an empty
    # "Spawn failed: " (found in a paired storm: an FPGA spawn whose pod creation had timed out once).
    from gpuspawner.hub import lifecycle

    spawner = make_spawner(devcluster, namespace, offerings=WAITS)
    spawner.start_timeout = 20
    monkeypatch.setattr(lifecycle, "own_deadline", lambda start_timeout: start_timeout + 30)  # (as if its turns came late)
    spawner.user_options = {"offering": "fpga-gpu"}
    with pytest.raises(SpawnRefused) as info:
        # JupyterHub's User.spawn, whose clock began seconds before the start's first turn (so before
        # KubeSpawner's own wait for the pod, which would end it with words of its own, can run out)
        await asyncio.wait_for(spawner.start(), timeout=0.8 * spawner.start_timeout)
    words = str(info.value)
    assert info.value.status_code == 503
    assert words.startswith("Your server did not start within the hub's time limit (20 seconds): "), words
    await spawner.stop()  # (JupyterHub stops a server whose start failed)
    wait_for(lambda: pods(kube, namespace) == [], "the waiting pod deleted", timeout=60)
