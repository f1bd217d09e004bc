"""The probe over the NVML stand-in (the binding's real Python layer, structs and error
classes; only libnvidia-ml is replaced) and a /proc tree laid out as containerd and CRI-O
do: exact metrics per pod, container and device; NVML errors as metrics, never a crash."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuspawner.devcluster.nvmlstandin import GIB, RESERVED, FakeGpu, FakeMig, FakeNvmlLib, FakeProcess, ProcTree, cgroup_line, installed
from gpuspawner.devcluster.ports import free_port
from gpuspawner.probe.collect import ProbeCollector, ProcReader
from gpuspawner.probe.main import server
from gpuspawner.probe.nvml import NvmlReader
from gpuspawner.probe.pods import StaticPods
from gpuspawner.tools.cli import main

MIB = 1 << 20
ANN, BOB, CAT = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222", "33333333-3333-4333-8333-333333333333"
T4 = "GPU-5b9c3a8e-0d1f-4e2a-9b7c-6d5e4f3a2b1c"
H100 = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
MIG_A, MIG_B = "MIG-11a2b3c4-d5e6-5f70-8192-a3b4c5d6e7f8", "MIG-22a2b3c4-d5e6-5f70-8192-a3b4c5d6e7f8"


def cid(n: int) -> str:
    return f"{n:064x}"


def pod(uid: str, ns: str, name: str, containers: dict[str, str], runtime: str = "containerd") -> dict:
    return {
        "metadata": {"uid": uid, "namespace": ns, "name": name},
        "status": {"containerStatuses": [{"name": n, "containerID": f"{runtime}://{c}"} for n, c in containers.items()]},
    }


PODS = [
    pod(ANN, "jhub", "jupyter-ann", {"notebook": cid(1)}),
    pod(BOB, "jhub", "jupyter-bob", {"notebook": cid(2), "sidecar": cid(3)}, runtime="cri-o"),
    # CAT's pod is in a namespace the probe may not list: UID only
]


def node(tmp_path):
    """GPU 0: a T4 shared by time-slicing (ann busy, bob idle with two processes in two
    containers, a host process). GPU 1: an H100 with two MIG instances (cat; and ann),
    whose MIG handles answer NotSupported for processes (read from the parent)."""
    procs = ProcTree(tmp_path / "proc")
    procs.add(101, cgroup_line(ANN, cid(1)))
    procs.add(201, cgroup_line(BOB, cid(2), runtime="cri-o", qos="besteffort"), namespaced=True)
    procs.add(202, cgroup_line(BOB, cid(3), runtime="cri-o", qos="besteffort"), namespaced=True)
    procs.add(301, cgroup_line(CAT, cid(4), driver="cgroupfs", qos="guaranteed"), cgroup_version=1)
    procs.add(102, cgroup_line(ANN, cid(1)))
    procs.add(999, "/system.slice/nvidia-persistenced.service")
    t4 = FakeGpu(
        T4,
        "Tesla T4",
        16 * GIB,
        processes=[
            FakeProcess(101, 3 * GIB, sm_util=87),
            FakeProcess(201, 5 * GIB),
            FakeProcess(202, 1 * GIB),
            FakeProcess(999, 64 * MIB),
            FakeProcess(4242, 128 * MIB),  # exited since NVML listed it: no /proc entry
        ],
    )
    h100 = FakeGpu(
        H100,
        "NVIDIA H100 80GB HBM3",
        80 * GIB,
        migs=[
            FakeMig(MIG_A, "3g.40gb", 2, 0, 40 * GIB, [FakeProcess(301, 20 * GIB)]),
            FakeMig(MIG_B, "1g.10gb", 9, 0, 10 * GIB, [FakeProcess(102, 2 * GIB)]),
        ],
        mig_processes_on_parent_only=True,
    )
    return FakeNvmlLib([t4, h100]), ProcReader(procs.root)


def scrape(collector: ProbeCollector) -> dict[str, dict[tuple, float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def parse(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def rows(metrics, name: str, **match: str) -> dict[tuple, float]:
    return {k: v for k, v in metrics.get(name, {}).items() if all((a, b) in k for a, b in match.items())}


def one(metrics, name: str, **match: str) -> float:
    found = rows(metrics, name, **match)
    assert len(found) == 1, f"{name} {match}: {found}"
    return next(iter(found.values()))


@pytest.fixture
def probe(tmp_path):
    lib, procs = node(tmp_path)
    with installed(lib) as nvml:
        yield lib, ProbeCollector(NvmlReader(nvml), procs, StaticPods(PODS), "gpu-node-1")


def test_time_sliced_gpu_memory_per_pod_and_container(probe) -> None:
    _, collector = probe
    m = scrape(collector)
    mem = "gpuspawner_probe_pod_gpu_memory_bytes"
    assert one(m, mem, pod="jupyter-ann", UUID=T4, container="notebook", namespace="jhub", Hostname="gpu-node-1", gpu="0") == 3 * GIB
    assert one(m, mem, pod="jupyter-bob", UUID=T4, container="notebook") == 5 * GIB
    assert one(m, mem, pod="jupyter-bob", UUID=T4, container="sidecar") == 1 * GIB
    assert one(m, "gpuspawner_probe_device_unattributed_memory_bytes", UUID=T4) == 64 * MIB + 128 * MIB
    used = 3 * GIB + 6 * GIB + 64 * MIB + 128 * MIB + RESERVED
    assert one(m, "gpuspawner_probe_device_memory_used_bytes", UUID=T4, GPU_I_ID="") == used
    assert one(m, "gpuspawner_probe_device_memory_total_bytes", UUID=T4, modelName="Tesla T4") == 16 * GIB
    # SM activity per pod: ann's process sampled busy; bob's had no sample (NVML's NotFound-free idle)
    util = "gpuspawner_probe_pod_sm_utilization_ratio"
    assert one(m, util, pod="jupyter-ann", UUID=T4) == pytest.approx(0.87)
    assert set(rows(m, util, pod="jupyter-bob", UUID=T4).values()) == {0.0}
    assert one(m, "gpuspawner_probe_nvml_up") == 1


def test_mig_instances_read_from_the_parent_when_the_instance_says_not_supported(probe) -> None:
    _, collector = probe
    m = scrape(collector)
    mem = "gpuspawner_probe_pod_gpu_memory_bytes"
    # cat's pod is outside the listed namespaces: labelled by UID only
    assert one(m, mem, UUID=H100, GPU_I_ID="2", GPU_I_PROFILE="3g.40gb", GPU_CI_ID="0", pod_uid=CAT, pod="") == 20 * GIB
    assert one(m, mem, UUID=H100, GPU_I_ID="9", GPU_I_PROFILE="1g.10gb", pod="jupyter-ann") == 2 * GIB
    assert one(m, "gpuspawner_probe_device_memory_total_bytes", UUID=H100, GPU_I_ID="2") == 40 * GIB
    assert rows(m, "gpuspawner_probe_pod_sm_utilization_ratio", UUID=H100) == {}  # NVML samples no MIG processes
    assert rows(m, "gpuspawner_probe_nvml_errors_total") == {}


def test_mig_instances_that_list_their_own_processes(probe) -> None:
    lib, collector = probe
    lib.gpus[1].mig_processes_on_parent_only = False
    m = scrape(collector)
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", UUID=H100, GPU_I_ID="9", pod="jupyter-ann") == 2 * GIB


def test_a_failing_memory_call_is_a_metric_and_a_log_line_and_costs_the_devices_memory_figures_only(probe, caplog) -> None:
    lib, collector = probe
    lib.gpus[0].errors["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST
    with caplog.at_level(logging.WARNING, "gpuspawner.probe"):
        m = scrape(collector)
        scrape(collector)
    assert one(m, "gpuspawner_probe_nvml_errors_total", gpu="0", UUID=T4, call="nvmlDeviceGetMemoryInfo", error="GpuIsLost") == 1
    # the device's figures are absent (not 0); its processes are still listed per pod
    assert rows(m, "gpuspawner_probe_device_memory_total_bytes", UUID=T4) == {}
    assert rows(m, "gpuspawner_probe_device_memory_used_bytes", UUID=T4) == {}
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", pod="jupyter-ann", UUID=T4) == 3 * GIB
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", GPU_I_ID="2") == 20 * GIB
    lost = [r for r in caplog.records if "GpuIsLost" in r.getMessage()]
    assert len(lost) == 1, "logged once when it starts, not at every scrape"
    lib.gpus[0].errors.clear()
    with caplog.at_level(logging.INFO, "gpuspawner.probe"):
        m = scrape(collector)
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", pod="jupyter-ann", UUID=T4) == 3 * GIB
    assert any("succeeds again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("call", "code", "error"),
    [
        ("nvmlDeviceGetComputeRunningProcesses_v3", pynvml.NVML_ERROR_NOT_SUPPORTED, "NotSupported"),
        ("nvmlDeviceGetMaxMigDeviceCount", pynvml.NVML_ERROR_IN_USE, "InUse"),  # MIG being reconfigured
        ("nvmlDeviceGetMigDeviceHandleByIndex", pynvml.NVML_ERROR_INVALID_ARGUMENT, "InvalidArgument"),
        ("nvmlDeviceGetProcessUtilization", pynvml.NVML_ERROR_UNKNOWN, "Unknown"),
        ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST, "GpuIsLost"),
    ],
)
def test_each_failing_call_is_counted_never_raised(probe, call, code, error) -> None:
    lib, collector = probe
    for gpu in lib.gpus:
        gpu.errors[call] = code
    m = scrape(collector)
    assert sum(rows(m, "gpuspawner_probe_nvml_errors_total", call=call.removesuffix("_v3").removesuffix("_v2"), error=error).values()) >= 1
    assert one(m, "gpuspawner_probe_nvml_up") == 1


@pytest.mark.parametrize(
    ("code", "error"),
    [(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "DriverNotLoaded"), (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "LibraryNotFound")],
)
def test_no_driver_is_nvml_down_then_recovers(probe, code, error) -> None:
    lib, collector = probe
    lib.init_error = code
    m = scrape(collector)
    assert one(m, "gpuspawner_probe_nvml_up") == 0
    assert one(m, "gpuspawner_probe_nvml_errors_total", call="nvmlInit", error=error) == 1
    assert rows(m, "gpuspawner_probe_pod_gpu_memory_bytes") == {}
    lib.init_error = 0
    m = scrape(collector)
    assert one(m, "gpuspawner_probe_nvml_up") == 1
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", pod="jupyter-ann", UUID=T4) == 3 * GIB


def test_gpu_without_mig_support_is_not_an_error(probe) -> None:
    _, collector = probe
    m = scrape(collector)
    assert rows(m, "gpuspawner_probe_nvml_errors_total", call="nvmlDeviceGetMigMode") == {}


def test_command_prints_one_scrape(tmp_path, capsys) -> None:
    lib, procs = node(tmp_path)
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"items": PODS}))
    with installed(lib):
        rc = main(["probe", "--once", "--proc", str(procs.root), "--pods", str(pods), "--node", "gpu-node-1"])
    assert rc == 0
    m = parse(capsys.readouterr().out)
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", pod="jupyter-bob", container="sidecar") == 1 * GIB


def test_command_without_nvml_says_so_and_exits_1(tmp_path, capsys) -> None:
    lib, procs = node(tmp_path)
    lib.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with installed(lib):
        rc = main(["probe", "--once", "--proc", str(procs.root)])
    assert rc == 1
    assert "gpuspawner_probe_nvml_up 0.0" in capsys.readouterr().out


def test_command_rejects_a_bad_pod_file(tmp_path, capsys) -> None:
    bad = tmp_path / "pods.json"
    bad.write_text("{not json")
    assert main(["probe", "--once", "--pods", str(bad)]) == 2
    assert "kubectl get pods -o json" in capsys.readouterr().err


# ------------------------------------------------------------------ older drivers, unknown memory, MPS


def test_the_binding_itself_says_library_mismatch_for_an_unversioned_call_an_old_driver_lacks(probe) -> None:
    """The stand-in is only the C library: the real binding's wrapper turns the missing
    symbol into its NVMLLibraryMismatchError (not an NVMLError), as on an old driver."""
    lib, _ = probe
    lib.missing.add("nvmlDeviceGetComputeRunningProcesses_v3")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)


def test_a_driver_without_the_v3_process_call_falls_back_to_v2_and_costs_nothing(probe) -> None:
    lib, collector = probe
    lib.missing.update({"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v3"})
    m = scrape(collector)
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", pod="jupyter-ann", UUID=T4) == 3 * GIB
    assert one(m, "gpuspawner_probe_pod_gpu_memory_bytes", GPU_I_ID="2") == 20 * GIB  # MIG, from the parent
    assert rows(m, "gpuspawner_probe_nvml_errors_total") == {}


@pytest.mark.parametrize(
    ("missing", "lost", "kept"),
    [
        # no process list at all: the per-pod series go, the device's stay
        (
            {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"},
            "gpuspawner_probe_pod_gpu_memory_bytes",
            "gpuspawner_probe_device_memory_total_bytes",
        ),
        # no per-process samples: utilisation goes, memory stays
        ({"nvmlDeviceGetProcessUtilization"}, "gpuspawner_probe_pod_sm_utilization_ratio", "gpuspawner_probe_pod_gpu_memory_bytes"),
        # no MPS client list: the compute processes still count
        (
            {"nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2"},
            "",
            "gpuspawner_probe_pod_gpu_memory_bytes",
        ),
        # a driver from before MIG: not an error at all
        ({"nvmlDeviceGetMigMode"}, "", "gpuspawner_probe_pod_sm_utilization_ratio"),
        # no memory figures: the device's memory goes, the pods' stay
        ({"nvmlDeviceGetMemoryInfo"}, "gpuspawner_probe_device_memory_total_bytes", "gpuspawner_probe_pod_gpu_memory_bytes"),
    ],
)
def test_a_call_an_older_driver_lacks_costs_that_metric_only(tmp_path, missing, lost, kept) -> None:
    lib, procs = node(tmp_path)
    del lib.gpus[1]  # the T4 alone: a driver without MIG support has no MIG GPU either
    lib.missing.update(missing)
    with installed(lib) as nvml:
        m = scrape(ProbeCollector(NvmlReader(nvml), procs, StaticPods(PODS), "gpu-node-1"))
    assert one(m, "gpuspawner_probe_nvml_up") == 1
    if lost:
        assert rows(m, lost, UUID=T4) == {}
    assert rows(m, kept, UUID=T4) != {}
    errors = rows(m, "gpuspawner_probe_nvml_errors_total")
    if "nvmlDeviceGetMigMode" in missing:
        assert errors == {}
    else:
        assert {dict(k)["error"] for k in errors} == {"FunctionNotFound"}
        assert {dict(k)["call"] for k in errors} == {sorted(missing)[0].removesuffix("_v3").removesuffix("_v2")}


def test_memory_nvml_does_not_know_is_absent_not_zero(probe) -> None:
    lib, collector = probe
    t4 = lib.gpus[0]
    t4.processes[0].used_bytes = None  # ann's process (101)
    t4.processes[3].used_bytes = None  # the host's (999)
    m = scrape(collector)
    mem = "gpuspawner_probe_pod_gpu_memory_bytes"
    assert rows(m, mem, pod="jupyter-ann", UUID=T4) == {}
    assert one(m, "gpuspawner_probe_pod_gpu_processes", pod="jupyter-ann", UUID=T4) == 1
    assert one(m, mem, pod="jupyter-bob", UUID=T4, container="notebook") == 5 * GIB
    assert rows(m, "gpuspawner_probe_device_unattributed_memory_bytes", UUID=T4) == {}


def test_mps_client_processes_are_attributed_to_their_pods(tmp_path) -> None:
    procs = ProcTree(tmp_path / "proc")
    server_pod = "44444444-4444-4444-8444-444444444444"
    procs.add(500, cgroup_line(server_pod, cid(9)))  # nvidia-cuda-mps-server, in the device plugin's pod
    procs.add(101, cgroup_line(ANN, cid(1)))
    procs.add(201, cgroup_line(BOB, cid(2), runtime="cri-o", qos="besteffort"))
    l4 = FakeGpu(
        T4,
        "NVIDIA L4",
        24 * GIB,
        processes=[FakeProcess(500, 300 * MIB)],
        mps_processes=[FakeProcess(101, 2 * GIB, sm_util=40), FakeProcess(201, 1 * GIB)],
    )
    with installed(FakeNvmlLib([l4])) as nvml:
        m = scrape(ProbeCollector(NvmlReader(nvml), ProcReader(procs.root), StaticPods(PODS), "gpu-node-1"))
    mem = "gpuspawner_probe_pod_gpu_memory_bytes"
    assert one(m, mem, pod="jupyter-ann") == 2 * GIB and one(m, mem, pod="jupyter-bob") == 1 * GIB
    assert one(m, mem, pod_uid=server_pod) == 300 * MIB
    assert one(m, "gpuspawner_probe_pod_sm_utilization_ratio", pod="jupyter-ann") == pytest.approx(0.4)
    assert rows(m, "gpuspawner_probe_nvml_errors_total") == {}


# ------------------------------------------------------------------ the sample window and two scrapers


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_scrape_does_not_change_what_the_next_scraper_sees(tmp_path) -> None:
    clock = Clock()
    lib, procs = node(tmp_path)
    lib.clock = clock
    with installed(lib) as nvml:
        collector = ProbeCollector(NvmlReader(nvml, clock=clock, window_s=60), procs, StaticPods(PODS), "gpu-node-1")
        util = "gpuspawner_probe_pod_sm_utilization_ratio"
        first, second = scrape(collector), scrape(collector)  # e.g. Prometheus, then the readiness probe or curl
        assert one(first, util, pod="jupyter-ann", UUID=T4) == one(second, util, pod="jupyter-ann", UUID=T4) == pytest.approx(0.87)
        # ann goes idle: her busy samples stay for the window, then leave it
        lib.gpus[0].processes[0].sm_util = 0
        clock.now += 30
        assert one(scrape(collector), util, pod="jupyter-ann", UUID=T4) == pytest.approx(0.87)
        clock.now += 31
        assert one(scrape(collector), util, pod="jupyter-ann", UUID=T4) == 0.0


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_two_scrapers_at_once_see_what_one_would_and_the_readiness_path_touches_no_nvml(tmp_path) -> None:
    clock = Clock()
    lib, procs = node(tmp_path)
    lib.clock = clock
    with installed(lib) as nvml:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ProbeCollector(NvmlReader(nvml, clock=clock), procs, StaticPods(PODS), "gpu-node-1"))
        httpd = server(registry, "127.0.0.1", free_port())
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        try:
            calls = lib.calls
            assert get(base + "/ready") == (200, "ok\n")
            assert lib.calls == calls, "the readiness probe ran no NVML pass"
            assert get(base + "/")[0] == 404
            start = threading.Barrier(2)
            seen: list[dict] = []

            def scraper() -> None:
                start.wait()
                seen.append(parse(get(base + "/metrics")[1]))

            pair = [threading.Thread(target=scraper) for _ in range(2)]
            for t in pair:
                t.start()
            for t in pair:
                t.join()
            util, mem = "gpuspawner_probe_pod_sm_utilization_ratio", "gpuspawner_probe_pod_gpu_memory_bytes"
            for m in seen:
                assert one(m, util, pod="jupyter-ann", UUID=T4) == pytest.approx(0.87)
                assert one(m, mem, pod="jupyter-bob", container="sidecar") == 1 * GIB
            assert rows(seen[0], util) == rows(seen[1], util)
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join()
