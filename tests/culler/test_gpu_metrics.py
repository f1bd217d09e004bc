"""The GPU view, answered by the REAL Prometheus scraping dcgm-exporter stand-ins that
serve the exporter's real rows (tests/culler/data/): one Prometheus for the module,
every device set up once, then each test reads the culler's own query's answer.

A few tests change a device and wait (for a condition, never a fixed time) until
Prometheus has seen it: activity leaving a short window, a pod's series going stale.
The pure parsing rules are tested on hand-built answers at the end.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.culler.gpu_metrics import parse_query_response, unavailable
from gpuspawner.culler.gpu_query import ENGINE, FB_USED, SERIES_LABEL, UTIL, GpuQuerySettings, build_query
from gpuspawner.names.vocabulary import (
    BUDGET_REMAINING,
    BUDGET_SPEND_RATE,
    COST_BUDGET_REMAINING,
    COST_BUDGET_SPEND_RATE,
    KUEUE_WORKLOADS_WAITING,
    PROBE_DEVICE_TOTAL,
    PROBE_POD_MEMORY,
    PROBE_POD_SM_UTIL,
    SPAWNS_WAITING,
)
from tests.culler.culler_fakes import A100_DOCS, H100_MIG, MIXED_LOWER, SHARED_A100, reference, template
from tests.culler.culler_prom import Telemetry, pod_labels

S = GpuQuerySettings()
MPS = "model-playground-stg"
EMBED = "text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"  # H100 MIG 1g.10gb, idle
TTS = "tts-predictor-00011-deployment-5554f75554-8j8pl"  # H100 MIG, engine busy only
OLLAMA = "ollama-76f687f4cd-xcvvp"  # GPUs 1-3 of the same H100 node, one pod
SHARE_A = ("default", "gpu-burn-deployment-1-85dc8ff699-clvh5")  # two pods time-slicing one A100
SHARE_B = ("vllm-inference", "vllm-medgemma-4b-it-d599b4c99-f95nk")
TRITON = ("default", "triton-server-f7cb5d77-95xcf")  # A30 MIG, scraped through a Service


def rtx(pod: str, gpu: str = "1") -> dict[str, str]:
    """The RTX 2000 Ada of PR 736 (a whole GPU without PROF metrics) given to ``pod``."""
    return pod_labels(dict(template(MIXED_LOWER, "DCGM_FI_DEV_FB_FREE", 0), gpu=gpu), pod, "jhub")


def a100(pod: str) -> dict[str, str]:
    """A whole A100 (PR 432's row without its time-slicing ``vgpu`` label) given to ``pod``."""
    base = {k: v for k, v in template(SHARED_A100, FB_USED, 0).items() if k != "vgpu"}
    return pod_labels(dict(base, UUID=f"GPU-{pod}"), pod, "jhub")


def world_devices(t: Telemetry) -> None:
    for i in range(3):  # the three MIG instances of issue 512: no FB_* rows on H100 MIG
        row = template(H100_MIG, ENGINE, i)
        t.put(f"h100-mig-{i}", row, engine=0.35 if row.get("pod") == TTS else 0.0, util=0.0)
    for i in (2, 3, 4):  # the ollama pod's three whole GPUs
        t.put(f"ollama-{i}", template(H100_MIG, "DCGM_FI_DEV_MEMORY_TEMP", i), engine=0.0, fb_used=1000.0)
    for i in range(2):  # time-slicing: dcgm-exporter copies the device's values onto both pods
        t.put(f"shared-{i}", template(SHARED_A100, FB_USED, i), engine=0.0, fb_used=15866.0)
    t.put("triton", template(MIXED_LOWER, "DCGM_FI_DEV_FB_FREE", 1), exported=True, engine=0.0, fb_used=3800.0)
    t.put("tts-exported", dict(template(H100_MIG, ENGINE, 2), pod="tts-exported"), exported=True, engine=0.5)
    t.put("rtx-idle", rtx("jupyter-rtx"), util=0.0, fb_used=7000.0)  # GPU_UTIL fallback
    t.put("util-busy", a100("jupyter-util-busy"), engine=0.0, util=12.0)
    t.put("mig-util-only", pod_labels(template(MIXED_LOWER, "DCGM_FI_DEV_FB_FREE", 1), "jupyter-mig-util", "jhub"), util=0.0)
    for n, (name, labels, value) in enumerate(reference(A100_DOCS)):  # no pod labels at all
        if name in (ENGINE, UTIL, FB_USED):
            t.put(f"docs-{n}", labels, **{{ENGINE: "engine", UTIL: "util", FB_USED: "fb_used"}[name]: value})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    t = Telemetry(tmp_path_factory.mktemp("telemetry")).start()
    try:
        world_devices(t)
        t.wait_view(
            S,
            lambda v: v.for_pod(MPS, EMBED).idle and v.for_pod(*TRITON).idle and v.for_pod("jhub", "jupyter-rtx").idle,
            "4 samples of every device",
        )
        yield t
    finally:
        t.stop()


@pytest.fixture(scope="module")
def view(world):
    return world.view(S)


# -- the reference data itself --------------------------------------------------
def test_reference_scrapes_have_the_rows_the_tests_rely_on():
    h100 = reference(H100_MIG)
    assert [r[1].get("GPU_I_ID") for r in h100 if r[0] == ENGINE] == ["7", "8", "9"]
    assert "pod" not in template(H100_MIG, ENGINE, 1)  # the unallocated instance
    assert all("Hostname" in r[1] for r in h100)
    shared = reference(SHARED_A100)
    assert [r[2] for r in shared if r[0] == FB_USED] == [15866.0, 15866.0]
    lower = reference(MIXED_LOWER)
    assert all("hostname" in r[1] and "Hostname" not in r[1] for r in lower)
    docs = reference(A100_DOCS)
    assert not any("pod" in r[1] for r in docs)
    assert not any(r[0] in (FB_USED, UTIL) and "GPU_I_ID" in r[1] for r in docs)


def test_prometheus_stores_the_standins_rows_with_their_labels(world):
    up = {r["metric"]["job"]: r["value"][1] for r in world.prom.query("up")}
    assert up == {"dcgm-exporter": "1", "nvidia-dcgm-exporter": "1"}
    row = template(H100_MIG, ENGINE, 0)
    [stored] = world.prom.query(f'{ENGINE}{{pod="{EMBED}"}}')
    assert {k: v for k, v in stored["metric"].items() if k not in ("__name__", "job", "instance")} == row
    # through the Service, Prometheus renamed the exporter's pod labels
    [renamed] = world.prom.query(f'{ENGINE}{{exported_pod="{TRITON[1]}"}}')
    assert renamed["metric"]["pod"] == "nvidia-dcgm-exporter-7xk2p"
    assert renamed["metric"]["exported_namespace"] == "default"


# -- the query ---------------------------------------------------------------------
def test_query_is_one_expression_over_the_exporter_and_probe_metrics():
    q = build_query(GpuQuerySettings(window_s=300, selector='exported_namespace="jhub"'))
    parts = q.split(" or ")
    assert len(parts) == 19  # (the waiting spawns' own "or" splits one part in two)
    # activity: mean (what is judged), max (what is shown) and samples; memory: now and samples
    for metric, n in ((ENGINE, 3), (UTIL, 3), (FB_USED, 2), (PROBE_POD_MEMORY + "{", 1), (PROBE_POD_SM_UTIL, 3)):
        assert sum(metric in p for p in parts) == n, metric
    assert sum(f"avg_over_time({m}" in p for p in parts for m in (ENGINE, UTIL, PROBE_POD_SM_UTIL)) == 3
    # the probe's device rows carry no pod labels: which devices it covers, unfiltered
    assert sum(PROBE_DEVICE_TOTAL in p for p in parts) == 1
    # the waiting spawns: the hubs' own queues plus Kueue's pending workloads, once per ClusterQueue,
    # which the exporter's selector does not filter
    waiting = f"sum by (offering, name) ({SPAWNS_WAITING} or max by (offering, name, cluster_queue) ({KUEUE_WORKLOADS_WAITING}))"
    assert q.count(waiting) == 1
    # the hub's GPU-hour budgets: the least left and the most spent per user, unfiltered too
    assert sum(f"min by (user, name) ({BUDGET_REMAINING})" in p for p in parts) == 1
    assert sum(f"max by (user, name) ({BUDGET_SPEND_RATE})" in p for p in parts) == 1
    # and their cost budgets, the same way
    assert sum(f"min by (user, name) ({COST_BUDGET_REMAINING})" in p for p in parts) == 1
    assert sum(f"max by (user, name) ({COST_BUDGET_SPEND_RATE})" in p for p in parts) == 1
    assert q.count('{exported_namespace="jhub"}') == 12
    assert q.count("[300s]") == 10  # FB_USED and the probe's memory "now" are instant selectors
    assert all(f'"{SERIES_LABEL}"' in p for p in q.replace(waiting, "").split(" or "))


def test_query_without_selector_has_no_empty_braces():
    assert "{}" not in build_query(GpuQuerySettings())


def test_the_query_is_accepted_by_prometheus_and_a_bad_selector_says_why(world):
    assert world.view(GpuQuerySettings(window_s=300, selector='exported_namespace="default"')).available
    bad = world.view(GpuQuerySettings(selector='pod=~"x'))
    assert not bad.available and "bad_data" in bad.error and "parse error" in bad.error


def test_selector_filters_series(world):
    v = world.view(GpuQuerySettings(selector=f'namespace="{MPS}"'))
    assert set(v.pods) == {(MPS, EMBED), (MPS, TTS)}


# -- a keep-alive (issue #25) ------------------------------------------------------
def test_a_keep_alive_burst_is_no_gpu_use_in_the_real_prometheus(world):
    """One burst of full engine activity, then nothing: the window still holds the 1.0 (its
    max), but its mean, as the real Prometheus computes it, is far below the threshold."""
    labels = {k: v for k, v in template(SHARED_A100, FB_USED, 0).items() if k != "vgpu"}
    labels.update(pod="jupyter-keepalive", namespace="jhub", container="notebook", UUID="GPU-keepalive")
    world.put("keepalive", labels, engine=1.0, fb_used=500.0)
    world.wait_view(S, lambda v: v.for_pod("jhub", "jupyter-keepalive").active, "the burst seen")
    world.put("keepalive", labels, engine=0.0, fb_used=500.0)
    quiet = world.wait_view(S, lambda v: v.for_pod("jhub", "jupyter-keepalive").idle, "the burst averaged away", timeout=300)
    pod = quiet.for_pod("jhub", "jupyter-keepalive")
    assert "GR_ENGINE_ACTIVE max 1.00" in pod.reason and "below gpu_engine_threshold 0.05" in pod.reason, pod.reason
    world.remove_pod("jupyter-keepalive")


# -- MIG ------------------------------------------------------------------------
def test_h100_mig_instances_idle_and_unallocated_instance_ignored(view):
    assert view.available
    assert not [k for k in view.pods if k[1] in ("", None)]
    pod = view.for_pod(MPS, EMBED)
    assert pod.idle
    assert "gsrh100-074/gpu0/GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77/mig7(1g.10gb)" in pod.reason
    # as in dcgm-exporter issue 512, no FB_* rows for the MIG instances: memory unknown
    assert pod.memory_mib is None


def test_mig_busy_by_engine_activity_only(view):
    # GPU_UTIL reads 0 on a MIG instance whatever it does; GR_ENGINE_ACTIVE says busy
    pod = view.for_pod(MPS, TTS)
    assert pod.active and "GR_ENGINE_ACTIVE max 0.35" in pod.reason


def test_gpu_util_reads_zero_on_mig_and_is_never_taken_as_idleness(view):
    pod = view.for_pod("jhub", "jupyter-mig-util")
    assert pod.state == "unknown"
    assert "not read on MIG" in pod.reason


# -- whole and shared GPUs -----------------------------------------------------------
def test_whole_gpu_without_engine_metric_falls_back_to_gpu_util(view):
    pod = view.for_pod("jhub", "jupyter-rtx")
    assert pod.idle and "GPU_UTIL max 0%" in pod.reason
    assert pod.memory_mib == 7000.0


def test_engine_idle_but_gpu_util_busy_is_activity(view):
    pod = view.for_pod("jhub", "jupyter-util-busy")
    assert pod.active and "GPU_UTIL max 12%" in pod.reason


def test_time_sliced_pods_sharing_one_gpu_are_idle_holding_its_memory(view):
    # dcgm-exporter PR 432: both pods show the device's 15866 MiB
    a, b = view.for_pod(*SHARE_A), view.for_pod(*SHARE_B)
    assert a.memory_mib == b.memory_mib == 15866.0
    assert a.idle and b.idle
    assert a.devices[0].device == b.devices[0].device  # one GPU


def test_multi_gpu_pod_is_idle_only_when_every_gpu_is(view):
    pod = view.for_pod(template(H100_MIG, "DCGM_FI_DEV_MEMORY_TEMP", 2)["namespace"], OLLAMA)
    assert pod.idle and len(pod.devices) == 3 and pod.memory_mib == 3000.0


# -- label spellings -----------------------------------------------------------------
def test_lowercase_hostname_and_exported_pod_labels(view):
    pod = view.for_pod(*TRITON)
    assert pod.idle and pod.memory_mib == 3800.0
    assert pod.devices[0].device.startswith("dcgm-exporter-wwwjh/gpu2/GPU-63bc0b91")
    assert pod.devices[0].mig
    # the exporter's own pod is not a notebook
    assert view.for_pod("gpu-operator", "nvidia-dcgm-exporter-7xk2p").state == "unknown"


def test_pod_and_exported_pod_series_side_by_side(view):
    assert view.for_pod(MPS, EMBED).idle  # scraped directly
    assert view.for_pod(MPS, "tts-exported").active  # scraped through the Service


def test_pod_looked_up_without_namespace(view):
    assert view.for_pod(None, EMBED).idle


def test_docs_scrape_without_pod_labels_gives_no_pods(view):
    assert "no dcgm-exporter series" in view.for_pod("jhub", "jupyter-alice").reason
    docs_uuids = {labels["UUID"] for _, labels, _ in reference(A100_DOCS)}
    assert not any(uuid in d.device for uuid in docs_uuids for p in view.pods.values() for d in p.devices)


# -- samples and unknowns -----------------------------------------------------------
def test_too_few_samples_is_unknown(world):
    pod = world.view(GpuQuerySettings(min_samples=10**6)).for_pod(MPS, EMBED)
    assert pod.state == "unknown" and "/1000000 samples" in pod.reason


def test_activity_counts_however_few_samples(world):
    assert world.view(GpuQuerySettings(min_samples=10**6)).for_pod(MPS, TTS).active


# -- over time: windows and staleness --------------------------------------------------
def test_activity_older_than_the_window_is_not_seen(world):
    world.put("was-busy", a100("jupyter-was-busy"), engine=0.9)
    world.settle()
    world.put("was-busy", a100("jupyter-was-busy"), engine=0.0)
    short = GpuQuerySettings(window_s=5, min_samples=3)
    # the 0.9 samples leave the 5 s window: idle, once Prometheus has 3 quiet samples
    world.wait_view(short, lambda v: v.for_pod("jhub", "jupyter-was-busy").idle, "the busy samples to leave the window")
    # the 10 minute window still holds them
    pod = world.view(S).for_pod("jhub", "jupyter-was-busy")
    assert pod.active and "GR_ENGINE_ACTIVE max 0.90" in pod.reason


def test_series_of_a_stopped_pod_go_stale_and_its_memory_is_not_held(world):
    world.put("gone", rtx("jupyter-gone", gpu="3"), util=0.0, fb_used=15866.0)
    world.wait_view(S, lambda v: (p := v.for_pod("jhub", "jupyter-gone")).idle and p.memory_mib == 15866.0, "4 samples")
    world.remove_pod("jupyter-gone")
    world.settle()
    # Prometheus marked the series stale: no "now" value for FB_USED...
    assert world.prom.query(f'{FB_USED}{{pod="jupyter-gone"}}') == []
    pod = world.view(S).for_pod("jhub", "jupyter-gone")
    assert pod.memory_mib is None
    # ...while the window still holds its samples
    assert pod.devices[0].util_samples >= 4


def test_nan_samples_are_ignored():
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {
                        SERIES_LABEL: f"{ENGINE}:max",
                        "pod": "p",
                        "namespace": "n",
                        "gpu": "0",
                    },
                    "value": [1.0, "NaN"],
                },
                {
                    "metric": {
                        SERIES_LABEL: f"{ENGINE}:count",
                        "pod": "p",
                        "namespace": "n",
                        "gpu": "0",
                    },
                    "value": [1.0, "40"],
                },
            ],
        },
    }
    pod = parse_query_response(body, S).for_pod("n", "p")
    assert pod.state == "unknown"


# -- Prometheus errors ----------------------------------------------------------------
def test_error_answers_make_the_view_unavailable():
    err = parse_query_response({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, S)
    assert not err.available and "parse error at char 3" in err.error
    assert not parse_query_response({"status": "success", "data": {"resultType": "matrix"}}, S).available
    assert not parse_query_response(["not", "json", "object"], S).available
    pod = unavailable("connection refused").for_pod("jhub", "jupyter-alice")
    assert pod.state == "unknown" and "connection refused" in pod.reason


# -- properties of the parsing rules (hand-built answers, no Prometheus) ----------------
def answer(devices: list[tuple[bool, list[float], list[float]]], base: dict[str, str]) -> dict:
    """What Prometheus answers the culler's query for these devices' samples: per metric,
    the mean, the max and the count over the window (a device with no samples has no series)."""
    result = []
    for i, (mig, engine, util) in enumerate(devices):
        labels = dict(base, gpu=str(i), UUID=f"GPU-{i}")
        if not mig:
            labels.pop("GPU_I_ID"), labels.pop("GPU_I_PROFILE")
        for metric, values in ((ENGINE, engine), (UTIL, [100 * u for u in util])):
            if values:
                for stat, v in (("avg", sum(values) / len(values)), ("max", max(values)), ("count", len(values))):
                    result.append({"metric": {**labels, SERIES_LABEL: f"{metric}:{stat}"}, "value": [0, str(v)]})
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


samples = st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.01, 0.4, 1.0]), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None)
@given(
    devices=st.lists(st.tuples(st.booleans(), samples, samples), min_size=1, max_size=3),
    min_samples=st.integers(1, 6),
)
def test_idle_only_with_enough_quiet_samples_and_active_on_a_busy_mean(devices, min_samples):
    s = GpuQuerySettings(min_samples=min_samples)
    base = template(H100_MIG, ENGINE, 0)
    pod = parse_query_response(answer(devices, base), s).for_pod(base["namespace"], base["pod"])
    devices = [d for d in devices if d[1] or d[2]]  # a device with no series is not seen
    if not devices:
        assert pod.state == "unknown"
        return

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    # active: a window whose MEAN is above the threshold (5 %), not any sample above 0
    busy = any(mean(engine) > s.engine_threshold or (not mig and 100 * mean(util) > s.util_threshold) for mig, engine, util in devices)
    assert pod.active == busy
    if pod.idle:
        for mig, engine, util in devices:
            assert len(engine) >= min_samples or (not mig and len(util) >= min_samples)
    if not busy and not pod.idle:
        assert pod.state == "unknown"
    assert not math.isnan(pod.memory_mib or 0.0)


def test_a_pod_missing_some_of_its_devices_is_unknown():
    from gpuspawner.culler.contract import parse_offering
    from gpuspawner.culler.gpu_metrics import expect_devices

    base = template(H100_MIG, "DCGM_FI_DEV_MEMORY_TEMP", 2)
    # two of the ollama pod's GPUs report, the third does not
    body = answer([(False, [0.0] * 40, []), (False, [0.0] * 40, [])], dict(base, GPU_I_ID="", GPU_I_PROFILE=""))
    pod = parse_query_response(body, S).for_pod(base["namespace"], OLLAMA)
    assert pod.idle and len(pod.devices) == 2
    three = parse_offering({"gpuspawner": {"kind": "full", "resources": {"nvidia.com/gpu": "3"}}})
    assert three.expected_devices == 3
    checked = expect_devices(pod, three.expected_devices)
    assert checked.state == "unknown" and "series for 2 of its 3 devices" in checked.reason
    two = parse_offering({"gpuspawner": {"kind": "full", "resources": {"nvidia.com/gpu": "2"}}})
    assert expect_devices(pod, two.expected_devices).idle
    hami = parse_offering({"gpuspawner": {"kind": "custom", "resources": {"nvidia.com/gpumem": "4000"}}})
    assert hami.expected_devices is None and expect_devices(pod, None).idle


# -- Dynamic Resource Allocation: a pod's GPUs found by device ------------------------
def dra(uuid: str, profile: str = "", device: str = "gpu-0") -> dict[str, str]:
    """One entry of the spawner's record for a DRA pod (vocabulary.RECORD_DEVICES)."""
    entry = {"driver": "gpu.nvidia.com", "pool": "node-1", "device": device, "uuid": uuid}
    return {**entry, "mig_profile": profile} if profile else entry


A100_DOCS_UUID = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"  # whole GPU and a 1g.5gb instance, no pod labels
H100_MIG_UUID = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"  # three 1g.10gb instances, one busy


def test_a_dra_gpu_is_found_by_its_uuid_even_where_the_exporter_names_no_pod(view):
    gpu = view.for_devices([dra(A100_DOCS_UUID)])
    assert gpu.active and "GR_ENGINE_ACTIVE max 1.00" in gpu.reason and len(gpu.devices) == 1
    assert "mig" not in gpu.devices[0].device  # the whole GPU's series, not its MIG instance's


def test_a_dra_mig_device_is_its_profiles_instance_on_its_parent(view):
    mig = view.for_devices([dra(A100_DOCS_UUID, "1g.5gb", "gpu-0-mig-1g5gb-19-0")])
    assert mig.active and "mig13(1g.5gb)" in mig.reason


def test_several_instances_of_the_profile_count_as_active_if_any_is(view):
    """The claim names a placement, dcgm-exporter a GPU instance id: one of three 1g.10gb
    instances is the pod's, and one of them is busy, so the pod is never called idle."""
    mig = view.for_devices([dra(H100_MIG_UUID, "1g.10gb", "gpu-0-mig-1g10gb-19-0")])
    assert mig.active and mig.reason.startswith("one of ") and "mig9(1g.10gb)" in mig.reason


def test_a_time_sliced_dra_gpu_is_idle_when_its_series_are(view):
    shared = template(SHARED_A100, FB_USED, 0)["UUID"]
    gpu = view.for_devices([dra(shared)])
    assert gpu.idle and gpu.memory_mib == 15866.0


def test_a_dra_device_without_series_or_uuid_is_unknown_and_never_idle(view):
    assert "no dcgm-exporter series for GPU-nowhere" in view.for_devices([dra("GPU-nowhere")]).reason
    assert view.for_devices([{"pool": "node-1", "device": "gpu-3"}]).state == "unknown"
    partly = view.for_devices([dra(template(SHARED_A100, FB_USED, 0)["UUID"]), dra("GPU-nowhere", device="gpu-1")])
    assert partly.state == "unknown" and "node-1/gpu-1: no dcgm-exporter series" in partly.reason
    assert unavailable("connection refused").for_devices([dra(A100_DOCS_UUID)]).state == "unknown"


def test_of_several_candidate_instances_the_least_sampled_decides_whether_idleness_is_known():
    base = template(H100_MIG, ENGINE, 0)
    body = answer([(True, [0.0] * 10, []), (True, [0.0] * 2, [])], base)
    for item in body["data"]["result"]:  # the same GPU, two instances of one profile
        item["metric"].update(UUID=H100_MIG_UUID, GPU_I_ID=item["metric"]["gpu"], gpu="0")
    parsed = parse_query_response(body, S)
    assert parsed.for_devices([dra(H100_MIG_UUID, "1g.10gb")]).state == "unknown"
    body = answer([(True, [0.0] * 10, []), (True, [0.0] * 4, [])], base)
    for item in body["data"]["result"]:
        item["metric"].update(UUID=H100_MIG_UUID, GPU_I_ID=item["metric"]["gpu"], gpu="0")
    assert parse_query_response(body, S).for_devices([dra(H100_MIG_UUID, "1g.10gb")]).idle


def test_the_contract_carries_a_dra_servers_devices():
    from gpuspawner.culler.contract import parse_offering

    devices = [dra(A100_DOCS_UUID), dra(A100_DOCS_UUID, "1g.5gb")]
    offering = parse_offering({"gpuspawner": {"kind": "full", "resources": {}, "devices": devices}})
    assert offering.devices == tuple(devices) and offering.expected_devices == 2 and offering.problem is None
    broken = parse_offering({"gpuspawner": {"kind": "full", "devices": "gpu-0"}})
    assert broken.devices == () and "is not a list of devices" in broken.problem


def test_memory_reclaimed_from_a_dra_pod_is_read_from_its_devices_series():
    """After a kernel shutdown the DRA pod's GPU keeps its series (the exporter may name no
    pod): what it still holds is its FB_USED, never "gone, so all of it was freed"."""
    import logging

    from gpuspawner.culler.actions import ReclaimTracker
    from gpuspawner.culler.cullmetrics import CullerMetrics

    base = {k: v for k, v in template(SHARED_A100, FB_USED, 0).items() if k not in ("pod", "namespace", "container", "vgpu")}

    def holding(mib: float) -> dict:
        rows = [({**base, SERIES_LABEL: f"{FB_USED}:{stat}"}, value) for stat, value in (("last", mib), ("count", 10))]
        return {"status": "success", "data": {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in rows]}}

    metrics = CullerMetrics()
    tracker = ReclaimTracker(metrics, logging.getLogger("t"))
    tracker.expect(("jhub", "jupyter-ann"), 15866.0, "full", "ann", (dra(base["UUID"]),))
    assert tracker.observe(parse_query_response(holding(3000.0), S)) == {"ann": 12866.0}
    tracker.expect(("jhub", "jupyter-ann"), 15866.0, "full", "ann", (dra("GPU-nowhere"),))
    assert tracker.observe(parse_query_response(holding(3000.0), S)) == {}  # not readable: nothing claimed as freed


# -- the per-pod probe's series beside dcgm-exporter's (hand-built answers) ------------
SHARED_GPU = {k: v for k, v in template(SHARED_A100, FB_USED, 1).items() if k not in ("pod", "namespace", "container", "vgpu")}


def probe_answer(pods: dict[str, tuple[float | None, list[float] | None]], *, dcgm_engine: float = 0.9, covered: bool = True) -> dict:
    """One shared GPU, busy by dcgm-exporter's count, seen by every pod; per pod the probe's
    memory (bytes, None: no probe row) and SM samples (None: not sampled)."""
    result = []

    def row(labels, metric, stat, value):
        result.append({"metric": {**labels, SERIES_LABEL: f"{metric}:{stat}"}, "value": [0, str(value)]})

    for name, (memory, util) in pods.items():
        labels = dict(SHARED_GPU, pod=name, namespace="jhub")
        row(labels, ENGINE, "max", dcgm_engine)
        row(labels, ENGINE, "count", 10)
        row(labels, FB_USED, "last", 9000)
        row(labels, FB_USED, "count", 10)
        if memory is not None:
            row(labels, PROBE_POD_MEMORY, "last", memory)
        if util is not None:
            row(labels, PROBE_POD_SM_UTIL, "avg", sum(util) / len(util))
            row(labels, PROBE_POD_SM_UTIL, "max", max(util))
            row(labels, PROBE_POD_SM_UTIL, "count", len(util))
    if covered:
        row(SHARED_GPU, PROBE_DEVICE_TOTAL, "last", 80 << 30)
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_without_probe_series_a_shared_gpu_is_judged_on_the_whole_gpu():
    view = parse_query_response(probe_answer({"jupyter-bob": (None, None)}, covered=False), S)
    assert not view.probe
    bob = view.for_pod("jhub", "jupyter-bob", shared=True)
    assert bob.active and bob.memory_mib == 9000


def test_probe_tells_apart_pods_sharing_a_gpu():
    body = probe_answer({"jupyter-ann": (3 << 30, [0.0, 0.9, 0.8, 0.0]), "jupyter-bob": (5 << 30, [0.0] * 6)})
    view = parse_query_response(body, S)
    assert view.probe
    ann, bob = (view.for_pod("jhub", p, shared=True) for p in ("jupyter-ann", "jupyter-bob"))
    assert ann.active and "SM utilisation max 0.90, mean 0.43 (probe)" in ann.reason and ann.memory_mib == 3 * 1024
    assert bob.idle and "the pod's processes idle (probe, 6 samples" in bob.reason and bob.memory_mib == 5 * 1024


def test_probe_idleness_does_not_outweigh_the_device_on_an_unshared_gpu():
    view = parse_query_response(probe_answer({"jupyter-bob": (5 << 30, [0.0] * 6)}), S)
    bob = view.for_pod("jhub", "jupyter-bob", shared=False)
    assert bob.active and "GR_ENGINE_ACTIVE max 0.90" in bob.reason
    assert bob.memory_mib == 5 * 1024  # the pod's own memory, whatever the kind


def test_too_few_probe_samples_on_a_shared_gpu_is_unknown():
    bob = parse_query_response(probe_answer({"jupyter-bob": (5 << 30, [0.0, 0.0])}), S).for_pod("jhub", "jupyter-bob", shared=True)
    assert bob.state == "unknown" and "too few probe samples (2/4)" in bob.reason


def test_a_pod_without_processes_on_a_device_the_probe_covers_holds_nothing():
    bob = parse_query_response(probe_answer({"jupyter-bob": (None, None)}), S).for_pod("jhub", "jupyter-bob", shared=True)
    assert bob.memory_mib == 0.0
    # no probe samples: the shared device's own (busy) activity still counts, never idleness
    assert bob.active
