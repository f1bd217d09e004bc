"""The GPU view on the real dcgm-exporter label formats (tests/culler/data/)."""

from __future__ import annotations

import math

from culler_fakes import (
    A100_DOCS,
    H100_MIG,
    MIXED_LOWER,
    SHARED_A100,
    as_exported,
    reference,
    template,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.culler.gpu_metrics import (
    ENGINE,
    FB_USED,
    SERIES_LABEL,
    UTIL,
    GpuQuerySettings,
    build_query,
    parse_query_response,
    unavailable,
)

S = GpuQuerySettings()


def view(tsdb, s: GpuQuerySettings = S):
    return parse_query_response(tsdb.evaluate(build_query(s)), s)


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


# -- the query ---------------------------------------------------------------------
def test_query_is_one_expression_over_the_three_metrics():
    q = build_query(GpuQuerySettings(window_s=300, selector='exported_namespace="jhub"'))
    parts = q.split(" or ")
    assert len(parts) == 6
    for metric in (ENGINE, UTIL, FB_USED):
        assert sum(metric in p for p in parts) == 2
    assert q.count('{exported_namespace="jhub"}') == 6
    assert q.count("[300s]") == 5  # FB_USED "now" is an instant selector
    assert all(f'"{SERIES_LABEL}"' in p for p in parts)


def test_query_without_selector_has_no_empty_braces():
    assert "{}" not in build_query(GpuQuerySettings())


def test_selector_filters_series(tsdb):
    ours = template(H100_MIG, ENGINE, 0)
    theirs = dict(template(H100_MIG, ENGINE, 2), namespace="other")
    tsdb.add_scrapes(ENGINE, ours, [0.0] * 10)
    tsdb.add_scrapes(ENGINE, theirs, [0.0] * 10)
    s = GpuQuerySettings(selector='namespace="model-playground-stg"')
    assert set(view(tsdb, s).pods) == {("model-playground-stg", ours["pod"])}


# -- MIG ------------------------------------------------------------------------
def test_h100_mig_instances_idle_and_unallocated_instance_ignored(tsdb):
    for i in range(3):
        tsdb.add_scrapes(ENGINE, template(H100_MIG, ENGINE, i), [0.0] * 40)
    v = view(tsdb)
    assert v.available
    assert set(v.pods) == {
        ("model-playground-stg", "text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"),
        ("model-playground-stg", "tts-predictor-00011-deployment-5554f75554-8j8pl"),
    }
    pod = v.for_pod("model-playground-stg", "tts-predictor-00011-deployment-5554f75554-8j8pl")
    assert pod.idle
    assert "gsrh100-074/gpu0/GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77/mig9(1g.10gb)" in pod.reason
    # as in dcgm-exporter issue 512, no FB_* rows for the MIG instances: memory unknown
    assert pod.memory_mib is None


def test_gpu_util_reads_zero_on_mig_and_is_never_taken_as_idleness(tsdb):
    labels = template(H100_MIG, ENGINE, 0)
    tsdb.add_scrapes(UTIL, labels, [0.0] * 40)
    pod = view(tsdb).for_pod(labels["namespace"], labels["pod"])
    assert pod.state == "unknown"
    assert "not read on MIG" in pod.reason


def test_mig_engine_activity_in_the_window_is_activity(tsdb):
    labels = template(H100_MIG, ENGINE, 2)
    tsdb.add_scrapes(ENGINE, labels, [0.0] * 30 + [0.35] + [0.0] * 9)
    pod = view(tsdb).for_pod(labels["namespace"], labels["pod"])
    assert pod.active
    assert "GR_ENGINE_ACTIVE max 0.35" in pod.reason


def test_activity_older_than_the_window_is_not_seen(tsdb):
    labels = template(H100_MIG, ENGINE, 2)
    # 80 samples every 15 s: the 0.9 is 19 minutes old, outside a 10 minute window
    tsdb.add_scrapes(ENGINE, labels, [0.9] + [0.0] * 79)
    assert view(tsdb).for_pod(labels["namespace"], labels["pod"]).idle


# -- whole and shared GPUs -----------------------------------------------------------
def test_whole_gpu_without_engine_metric_falls_back_to_gpu_util(tsdb):
    labels = template(SHARED_A100, FB_USED, 0)
    tsdb.add_scrapes(UTIL, labels, [0.0] * 40)
    tsdb.add_scrapes(FB_USED, labels, [15866.0] * 40)
    pod = view(tsdb).for_pod(labels["namespace"], labels["pod"])
    assert pod.idle and "GPU_UTIL max 0%" in pod.reason
    assert pod.memory_mib == 15866.0


def test_whole_gpu_util_activity(tsdb):
    labels = template(SHARED_A100, FB_USED, 0)
    tsdb.add_scrapes(UTIL, labels, [0.0] * 20 + [35.0] * 20)
    assert view(tsdb).for_pod(labels["namespace"], labels["pod"]).active


def test_engine_idle_but_gpu_util_busy_is_activity(tsdb):
    labels = template(SHARED_A100, FB_USED, 0)
    tsdb.add_scrapes(ENGINE, labels, [0.0] * 40)
    tsdb.add_scrapes(UTIL, labels, [12.0] * 40)
    assert view(tsdb).for_pod(labels["namespace"], labels["pod"]).active


def test_shared_gpu_device_values_are_copied_onto_every_sharing_pod(tsdb):
    # dcgm-exporter PR 432: both pods show the device's 15866 MiB
    for i in range(2):
        labels = template(SHARED_A100, FB_USED, i)
        tsdb.add_scrapes(FB_USED, labels, [15866.0] * 40)
        tsdb.add_scrapes(ENGINE, labels, [0.0] * 40)
    v = view(tsdb)
    a = v.for_pod("default", "gpu-burn-deployment-1-85dc8ff699-clvh5")
    b = v.for_pod("vllm-inference", "vllm-medgemma-4b-it-d599b4c99-f95nk")
    assert a.memory_mib == b.memory_mib == 15866.0
    assert a.idle and b.idle


# -- label spellings -----------------------------------------------------------------
def test_lowercase_hostname_and_exported_pod_labels(tsdb):
    labels = as_exported(template(MIXED_LOWER, "DCGM_FI_DEV_FB_FREE", 1))
    assert labels["pod"] == "nvidia-dcgm-exporter-7xk2p"
    tsdb.add_scrapes(ENGINE, labels, [0.0] * 40)
    tsdb.add_scrapes(FB_USED, labels, [3800.0] * 40)
    v = view(tsdb)
    assert set(v.pods) == {("default", "triton-server-f7cb5d77-95xcf")}
    pod = v.for_pod("default", "triton-server-f7cb5d77-95xcf")
    assert pod.idle and pod.memory_mib == 3800.0
    assert pod.devices[0].device.startswith("dcgm-exporter-wwwjh/gpu2/GPU-63bc0b91")
    assert pod.devices[0].mig
    # the exporter's own pod is not a notebook
    assert v.for_pod("gpu-operator", "nvidia-dcgm-exporter-7xk2p").state == "unknown"


def test_pod_and_exported_pod_series_side_by_side(tsdb):
    direct = template(H100_MIG, ENGINE, 0)
    renamed = as_exported(template(H100_MIG, ENGINE, 2))
    tsdb.add_scrapes(ENGINE, direct, [0.0] * 40)
    tsdb.add_scrapes(ENGINE, renamed, [0.5] * 40)
    v = view(tsdb)
    assert v.for_pod(direct["namespace"], direct["pod"]).idle
    assert v.for_pod(
        "model-playground-stg", "tts-predictor-00011-deployment-5554f75554-8j8pl"
    ).active


def test_pod_looked_up_without_namespace(tsdb):
    labels = template(H100_MIG, ENGINE, 0)
    tsdb.add_scrapes(ENGINE, labels, [0.0] * 40)
    assert view(tsdb).for_pod(None, labels["pod"]).idle


def test_docs_scrape_without_pod_labels_gives_no_pods(tsdb):
    for name, labels, value in reference(A100_DOCS):
        tsdb.add_scrapes(name, labels, [value] * 40)
    v = view(tsdb)
    assert v.available and not v.pods
    assert "no dcgm-exporter series" in v.for_pod("jhub", "jupyter-alice").reason


# -- samples and unknowns -----------------------------------------------------------
def test_too_few_samples_is_unknown(tsdb):
    labels = template(H100_MIG, ENGINE, 0)
    tsdb.add_scrapes(ENGINE, labels, [0.0] * 3)
    pod = view(tsdb).for_pod(labels["namespace"], labels["pod"])
    assert pod.state == "unknown" and "3/4 samples" in pod.reason


def test_activity_counts_however_few_samples(tsdb):
    labels = template(H100_MIG, ENGINE, 0)
    tsdb.add_scrapes(ENGINE, labels, [0.0, 0.6])
    assert view(tsdb).for_pod(labels["namespace"], labels["pod"]).active


def test_multi_gpu_pod_is_idle_only_when_every_gpu_is(tsdb):
    # the ollama pod of dcgm-exporter issue 512: GPUs 1-3, one pod
    rows = [template(H100_MIG, "DCGM_FI_DEV_MEMORY_TEMP", i) for i in (2, 3, 4)]
    assert {r["pod"] for r in rows} == {"ollama-76f687f4cd-xcvvp"}
    for r in rows:
        tsdb.add_scrapes(ENGINE, r, [0.0] * 40)
        tsdb.add_scrapes(FB_USED, r, [1000.0] * 40)
    ns = rows[0]["namespace"]
    pod = view(tsdb).for_pod(ns, "ollama-76f687f4cd-xcvvp")
    assert pod.idle and len(pod.devices) == 3 and pod.memory_mib == 3000.0
    tsdb.clear()
    for i, r in enumerate(rows):
        tsdb.add_scrapes(ENGINE, r, [0.0] * (40 if i else 2))
    assert view(tsdb).for_pod(ns, "ollama-76f687f4cd-xcvvp").state == "unknown"
    tsdb.clear()
    for i, r in enumerate(rows):
        tsdb.add_scrapes(ENGINE, r, [0.0] * 39 + [0.2 if i == 2 else 0.0])
    assert view(tsdb).for_pod(ns, "ollama-76f687f4cd-xcvvp").active


def test_memory_of_a_gone_pod_is_not_held(tsdb):
    labels = template(SHARED_A100, FB_USED, 0)
    # the last sample is older than Prometheus' 5 minute look-back: no "now" value
    tsdb.add_scrapes(FB_USED, labels, [15866.0] * 10, end=__import__("time").time() - 400)
    tsdb.add_scrapes(UTIL, labels, [0.0] * 40)
    assert view(tsdb).for_pod(labels["namespace"], labels["pod"]).memory_mib is None


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
def test_error_answers_make_the_view_unavailable(tsdb):
    err = parse_query_response(
        {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, S
    )
    assert not err.available and "parse error at char 3" in err.error
    assert not parse_query_response(
        {"status": "success", "data": {"resultType": "matrix"}}, S
    ).available
    assert not parse_query_response(["not", "json", "object"], S).available
    pod = unavailable("connection refused").for_pod("jhub", "jupyter-alice")
    assert pod.state == "unknown" and "connection refused" in pod.reason


# -- properties ------------------------------------------------------------------------
samples = st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.01, 0.4, 1.0]), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None)
@given(
    devices=st.lists(st.tuples(st.booleans(), samples, samples), min_size=1, max_size=3),
    min_samples=st.integers(1, 6),
)
def test_idle_only_with_enough_quiet_samples_and_active_on_any_busy_sample(devices, min_samples):
    from culler_fakes import TSDB

    tsdb = TSDB()
    s = GpuQuerySettings(min_samples=min_samples)
    base = template(H100_MIG, ENGINE, 0)
    for i, (mig, engine, util) in enumerate(devices):
        labels = dict(base, gpu=str(i), UUID=f"GPU-{i}")
        if not mig:
            labels.pop("GPU_I_ID"), labels.pop("GPU_I_PROFILE")
        if engine:
            tsdb.add_scrapes(ENGINE, labels, engine)
        if util:
            tsdb.add_scrapes(UTIL, labels, [100 * u for u in util])
    pod = view(tsdb, s).for_pod(base["namespace"], base["pod"])
    devices = [d for d in devices if d[1] or d[2]]  # a device with no series is not seen
    if not devices:
        assert pod.state == "unknown"
        return
    busy = any(
        any(v > 0 for v in engine) or (not mig and any(v > 0 for v in util))
        for mig, engine, util in devices
    )
    assert pod.active == busy
    if pod.idle:
        for mig, engine, util in devices:
            assert len(engine) >= min_samples or (not mig and len(util) >= min_samples)
    if not busy and not pod.idle:
        assert pod.state == "unknown"
    assert not math.isnan(pod.memory_mib or 0.0)


def test_a_pod_missing_some_of_its_devices_is_unknown(tsdb):
    from gpuspawner.culler.contract import parse_offering
    from gpuspawner.culler.gpu_metrics import expect_devices

    rows = [template(H100_MIG, "DCGM_FI_DEV_MEMORY_TEMP", i) for i in (2, 3)]
    for r in rows:  # two of the ollama pod's GPUs report, the third does not
        tsdb.add_scrapes(ENGINE, r, [0.0] * 40)
    pod = view(tsdb).for_pod(rows[0]["namespace"], "ollama-76f687f4cd-xcvvp")
    assert pod.idle
    three = parse_offering({"gpuspawner": {"kind": "full", "resources": {"nvidia.com/gpu": "3"}}})
    assert three.expected_devices == 3
    checked = expect_devices(pod, three.expected_devices)
    assert checked.state == "unknown" and "series for 2 of its 3 devices" in checked.reason
    two = parse_offering({"gpuspawner": {"kind": "full", "resources": {"nvidia.com/gpu": "2"}}})
    assert expect_devices(pod, two.expected_devices).idle
    hami = parse_offering(
        {"gpuspawner": {"kind": "custom", "resources": {"nvidia.com/gpumem": "4000"}}}
    )
    assert hami.expected_devices is None and expect_devices(pod, None).idle
