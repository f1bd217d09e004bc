"""``make gpu-check`` (scripts/gpu_check.py) is prepared for a machine with an NVIDIA GPU;
without one it must stop at once, say so and exit 2, and what it would guard is exactly what
the spawner guards."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from gpuspawner.pod.memguard import GuardDefaults, guard_changes, guard_for
from tests.offerings import T4_SHARE
from tests.offerings import offering as canonical

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def test_without_a_gpu_it_stops_clearly_before_anything_else(tmp_path):
    # a PATH without nvidia-smi (this machine has none either way)
    env = {**os.environ, "PATH": str(tmp_path)}
    result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "no NVIDIA GPU here" in result.stderr and result.stdout == ""


def test_a_gpu_that_nvidia_smi_cannot_read_is_no_gpu_either(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2\nexit 9\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "no NVIDIA GPU here" in result.stderr


def test_it_guards_a_share_exactly_as_the_spawner_does():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec and spec.loader
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    offering = canonical(T4_SHARE, memory_mib=16384)
    expected = dict(guard_changes(guard_for(offering, GuardDefaults()), 1, "HOOK").env)
    assert gpu_check.guarded_env(16384, 4) == expected
    assert expected["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.093" and expected["GPUSPAWNER_MEMORY_MIB"] == "1536"
