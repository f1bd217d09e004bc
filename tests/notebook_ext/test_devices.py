"""GPU figures through the real pynvml, with NVIDIA's library replaced by the stand-in
(nvml_standin.py) and, for "no NVML", this machine's own lack of one."""

from __future__ import annotations

import pynvml
import pytest

from gpuspawner.notebook_ext import nvmldevices as devices_module
from gpuspawner.notebook_ext.nvmldevices import Device, Devices, Unavailable

from .nvml_standin import GIB, MIG_1G_10GB, TWO_H100, Gpu, StandInLib, install, uninstall


@pytest.fixture(autouse=True)
def clean_pynvml():
    uninstall()
    yield
    uninstall()


def test_without_nvidias_library_the_figures_are_unavailable_never_an_error():
    assert Devices().read() == Unavailable("NVIDIA's management library (libnvidia-ml.so.1) is not in this container: no GPU driver here")


def test_a_mig_slice_is_reported_alone_with_no_utilisation():
    install(StandInLib(MIG_1G_10GB))
    assert Devices().read() == [
        Device(0, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-7d1e0000-aaaa-bbbb-cccc-000000000002", int(3.1 * GIB), 10 * GIB, None)
    ]


def test_whole_gpus_with_utilisation():
    install(StandInLib(TWO_H100))
    assert [(d.uuid, d.memory_used_bytes, d.utilization_percent) for d in Devices().read()] == [
        ("GPU-11110000-aaaa-bbbb-cccc-000000000001", 20 * GIB, 87),
        ("GPU-22220000-aaaa-bbbb-cccc-000000000002", 0, 0),
    ]


def test_a_gpu_that_reports_no_utilisation():
    install(StandInLib([Gpu("Tesla T4", "GPU-t4", 16 * GIB, GIB, utilization=None)]))
    (t4,) = Devices().read()
    assert t4.utilization_percent is None and t4.memory_total_bytes == 16 * GIB


def test_a_driver_that_is_not_loaded_is_said_and_retried_later(monkeypatch):
    lib = install(StandInLib(TWO_H100, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    reader = Devices()
    assert reader.read() == Unavailable("NVML did not start: Driver Not Loaded")
    assert reader.read() == Unavailable("NVML did not start: Driver Not Loaded")
    assert lib.calls == ["init"]  # not retried at once
    lib.init_error = pynvml.NVML_SUCCESS
    monkeypatch.setattr(devices_module, "RETRY_SECONDS", 0.0)
    assert len(reader.read()) == 2


def test_an_nvml_error_while_reading_is_unavailable():
    class Lost(StandInLib):
        def nvmlDeviceGetMemoryInfo(self, device, memory):
            return pynvml.NVML_ERROR_GPU_IS_LOST

    install(Lost(TWO_H100))
    assert Devices().read() == Unavailable("NVML could not read the GPU: GPU is lost")


def test_without_nvidia_ml_py(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert Devices().read() == Unavailable("nvidia-ml-py is not installed in this image (pip install 'gpuspawner[notebook]')")
