"""The memory guard: the exact pod environment, annotation and volume of each kind, the admin's
settings and their errors, the spawn page's words, and the start-up hook run under a real
Python with stand-in frameworks (no GPU here: that the frameworks really keep to the
fraction needs one, and is not checked in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuspawner.capacity.access import Requester
from gpuspawner.capacity.checks import config_problems
from gpuspawner.core.model import UNCOUNTED, GuardSetting
from gpuspawner.core.wording import memory_truth
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.offerings.discovery import discover
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.offerings.overrides import apply_overrides
from gpuspawner.page.cards import option_views
from gpuspawner.pod.memguard import (
    CONTEXT_MIB,
    DEFAULT_KINDS,
    PROCESSES,
    GuardConfigError,
    GuardDefaults,
    guard_changes,
    guard_for,
    guarded_environment,
    path_prefix,
)
from gpuspawner.pod.podspec import pod_changes

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
HOOK = Path(__file__).resolve().parents[2] / "gpuspawner" / "pod" / "memguard_hook.py"
ON = GuardDefaults()
EVERY_KIND = GuardDefaults(kinds=frozenset({Kind.SHARED, Kind.CUSTOM, Kind.MIG, Kind.FULL, Kind.VGPU}))


def node(name, labels, allocatable):
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}, "spec": {}}


def shared(strategy: str):
    labels = {
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.memory": "16384",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": strategy,
    }
    (offering,) = discover([node("t4", labels, {"nvidia.com/gpu.shared": "4"})])
    return offering


def config(**entry):
    return offering_from_config(entry, 0)


def env_of(offering, defaults=ON, count=1):
    guard = guard_for(offering, defaults)
    return None if guard is None else guard_changes(guard, count, "HOOK").env


#: The pod environment of a quarter of a 16 GB GPU: 4096 MiB, cut for two processes of
#: 2048 MiB, each leaving 512 MiB for its CUDA context: a cap of 1536 MiB (0.093 of 16384).
QUARTER = {
    "GPUSPAWNER_MEMORY_FRACTION": "0.093",
    "GPUSPAWNER_MEMORY_MIB": "1536",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.093",
}


def test_a_time_sliced_share_gets_its_quarter_of_the_gpu_for_two_processes_and_their_contexts():
    offering = shared("time-slicing")
    assert (offering.replicas, offering.sharing, offering.memory_mib) == (4, "time-slicing", 16384)
    changes = guard_changes(guard_for(offering, ON), 1, "HOOK SOURCE")
    assert dict(changes.env) == QUARTER
    # two processes, each at its cap with its context, stay within the quarter the page names
    assert PROCESSES * (int(QUARTER["GPUSPAWNER_MEMORY_MIB"]) + CONTEXT_MIB) <= 16384 // 4
    assert PROCESSES * float(QUARTER["XLA_PYTHON_CLIENT_MEM_FRACTION"]) * 16384 + PROCESSES * CONTEXT_MIB <= 16384 // 4
    assert (
        changes.command_prefix
        == path_prefix()
        == (
            "sh",
            "-c",
            'export PYTHONPATH="/opt/gpuspawner/memguard${PYTHONPATH:+:$PYTHONPATH}"; exec "$@"',
            "gpuspawner-memguard",
        )
    )
    assert dict(changes.annotations) == {"gpuspawner.io/memguard-hook": "HOOK SOURCE"}
    assert changes.volumes == (
        {
            "name": "gpuspawner-memguard",
            "downwardAPI": {
                "items": [{"path": "sitecustomize.py", "fieldRef": {"fieldPath": "metadata.annotations['gpuspawner.io/memguard-hook']"}}]
            },
        },
    )
    assert changes.volume_mounts == ({"name": "gpuspawner-memguard", "mountPath": "/opt/gpuspawner/memguard", "readOnly": True},)


def test_an_mps_share_never_asks_for_more_than_the_device_plugins_mps_daemon_gives_a_client():
    offering = shared("mps")
    assert offering.memory_mib == 4096  # one client's limit
    env = env_of(offering)
    assert env == {**QUARTER, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M"}
    # NVIDIA's device plugin (cmd/mps-control-daemon) sets every client's default to the GPU's
    # memory / replicas and 100 / replicas percent: the guard's are the same or tighter
    daemon_mib, daemon_percent = 16384 // 4, 100 // 4
    assert int(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].removeprefix("0=").removesuffix("M")) <= daemon_mib
    assert int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) <= daemon_percent
    assert env_of(offering, count=2)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M,1=2048M"


def test_a_configured_share_is_sized_from_its_replicas_and_the_fraction_is_never_rounded_up():
    offering = config(slug="t4", kind="shared", replicas=3, memory_mib=15360)
    env = env_of(offering)
    # 15360 / 3 = 5120 MiB, 2560 per process, less 512 for its context: 2048 MiB (0.1333... cut to 0.133)
    assert env["GPUSPAWNER_MEMORY_FRACTION"] == "0.133" and env["GPUSPAWNER_MEMORY_MIB"] == "2048"
    # without the GPU's size: 1/replicas for two processes, cut (no room for contexts is known)
    assert env_of(config(slug="t4", kind="shared", replicas=3))["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.166"
    # a tiny share keeps half of each process's part for the framework rather than nothing
    tiny = env_of(config(slug="tiny", kind="shared", replicas=8, memory_mib=4096))
    assert tiny["GPUSPAWNER_MEMORY_MIB"] == "128"


def test_mig_and_whole_gpus_are_unguarded_by_default_and_only_lose_the_up_front_grab_when_switched_on():
    mig = config(slug="mig", kind="mig", profile="1g.10gb")
    full = config(slug="h100", kind="full", memory_mib=81920, counts=[1, 2])
    assert guard_for(mig, ON) is None and guard_for(full, ON) is None
    grab_only = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert env_of(mig, EVERY_KIND) == grab_only  # no hook either: nothing to cap
    assert not guard_changes(guard_for(mig, EVERY_KIND), 1, "HOOK").volumes
    assert env_of(full, EVERY_KIND, count=2) == grab_only


def test_an_admin_fraction_caps_a_whole_gpu_and_turns_its_guard_on():
    full = config(slug="h100", kind="full", memory_mib=81920, memory_guard={"fraction": 0.5})
    env = env_of(full, count=2)
    assert env["GPUSPAWNER_MEMORY_FRACTION"] == "0.5" and env["GPUSPAWNER_MEMORY_MIB"] == "40960"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_a_custom_offering_is_capped_only_where_the_admin_says_how_much():
    assert env_of(config(slug="half", kind="custom", resources={"nvidia.com/vgpu": 500})) == {
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }
    half = config(slug="half", kind="custom", resources={"nvidia.com/vgpu": 500}, memory_mib=8192, memory_guard={"fraction": 0.5})
    env = env_of(half)
    assert env["GPUSPAWNER_MEMORY_FRACTION"] == "0.5" and env["GPUSPAWNER_MEMORY_MIB"] == "8192"


def test_the_admin_turns_the_guard_off_per_offering_and_spawner_wide():
    assert guard_for(config(slug="t4", kind="shared", replicas=4, memory_guard=False), ON) is None
    assert guard_for(shared("time-slicing"), GuardDefaults(kinds=frozenset())) is None
    (off,) = apply_overrides([shared("time-slicing")], {shared("time-slicing").slug: {"memory_guard": False}})
    assert guard_for(off, ON) is None
    (tight,) = apply_overrides([shared("time-slicing")], {shared("time-slicing").slug: {"memory_guard": {"fraction": 0.2}}})
    assert env_of(tight)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"
    assert guard_for(config(slug="cpu2", kind="cpu"), EVERY_KIND) is None


@pytest.mark.parametrize(
    "value, words",
    [
        ("yes", "must be true, false or a dict"),
        ({"fraction": 1.5}, "above 0 and at most 1"),
        ({"fraction": 0}, "above 0 and at most 1"),
        ({"fraction": True}, "above 0 and at most 1"),
        ({"fraction": 0.5, "limit": 3}, "unknown key(s) ['limit']"),
        ({"user_env": "yes"}, "['user_env'] must be true or false"),
    ],
)
def test_a_wrong_memory_guard_names_the_entry_and_the_field(value, words):
    with pytest.raises(OfferingConfigError) as info:
        config(slug="t4", kind="shared", replicas=4, memory_guard=value)
    assert "c.GPUSpawner.offerings[0] (slug 't4'): field 'memory_guard'" in str(info.value) and words in str(info.value)
    with pytest.raises(OfferingConfigError) as info:
        apply_overrides([], {"t4": {"memory_guard": value}})
    assert "c.GPUSpawner.offering_overrides['t4']: field 'memory_guard'" in str(info.value) and words in str(info.value)


def test_a_cpu_offering_has_no_memory_to_guard():
    with pytest.raises(OfferingConfigError, match="field 'memory_guard' applies to GPU offerings only"):
        config(slug="cpu2", kind="cpu", memory_guard=True)


def test_the_spawner_wide_settings_are_checked_with_the_others():
    assert config_problems({"memory_guard_kinds": ["shared", "mig"], "memory_guard_user_env": True}) == []
    (problem,) = config_problems({"memory_guard_kinds": ["shared", "cpu"]})
    assert "c.GPUSpawner.memory_guard_kinds: 'cpu' is not a GPU offering kind" in problem
    (problem,) = config_problems({"memory_guard_kinds": "shared"})
    assert "must be a list of kinds" in problem
    with pytest.raises(GuardConfigError, match="memory_guard_user_env must be True or False"):
        GuardDefaults.from_settings(["shared"], "yes")
    assert GuardDefaults.from_settings(sorted(DEFAULT_KINDS), False) == ON


def test_the_user_profile_env_wins_only_where_the_admin_allows_it():
    guard = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    environment = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", "LANG": "C.UTF-8"}
    user = {"XLA_PYTHON_CLIENT_MEM_FRACTION"}
    assert guarded_environment(environment, guard, user, user_env=False)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    allowed = guarded_environment(environment, guard, user, user_env=True)
    assert allowed == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", "LANG": "C.UTF-8", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    # the admin's own environment is not the user's: the guard wins over it
    assert guarded_environment(environment, guard, set(), user_env=True)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    setting = config(slug="t4", kind="shared", replicas=4, memory_guard={"user_env": True}).memory_guard
    assert setting == GuardSetting(enabled=None, fraction=None, user_env=True)
    assert guard_for(config(slug="t4", kind="shared", replicas=4, memory_guard={"user_env": True}), ON).user_env


@pytest.mark.parametrize("user_env", [False, True])
def test_jax_gets_one_fraction_under_the_name_every_jaxlib_reads(user_env):
    guard = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.093"}
    # a profile that spells it the new way: jaxlib before 0.4.38 would ignore that name
    profile = {"XLA_CLIENT_MEM_FRACTION": "0.9"}
    env = guarded_environment(profile, guard, set(profile), user_env)
    assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9" if user_env else "0.093"}
    assert guarded_environment({}, guard, set(), user_env) == guard
    # an admin environment with both (refused by jaxlib from 0.4.38 on): one, the guard's
    both = {"XLA_CLIENT_MEM_FRACTION": "0.6", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5", "LANG": "C"}
    assert guarded_environment(both, guard, set(), user_env) == {"LANG": "C", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.093"}
    # an unguarded pod's environment is left as it is, whatever it holds
    assert guarded_environment(both, {}, set(), user_env) == both


def test_the_offerings_own_env_wins_over_the_guard_and_the_pod_changes_carry_the_hook():
    offering = config(slug="t4", kind="shared", replicas=4, memory_mib=16384, env={"XLA_CLIENT_MEM_FRACTION": "0.1"})
    guard = guard_changes(guard_for(offering, ON), 1, "HOOK")
    changes = pod_changes(offering, 1, guard)
    # the admin's value wins, under the name every jaxlib reads; the guard adds no other
    assert changes.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1" and "XLA_CLIENT_MEM_FRACTION" not in changes.env
    assert "XLA_CLIENT_MEM_FRACTION" not in changes.guard_env and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in changes.guard_env
    # ... also over an admin environment that spells it the new way
    env = guarded_environment({"XLA_CLIENT_MEM_FRACTION": "0.6", **changes.env}, changes.guard_env, set(), False)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1" and "XLA_CLIENT_MEM_FRACTION" not in env
    assert changes.guard_env["GPUSPAWNER_MEMORY_FRACTION"] == "0.093"
    assert changes.annotations == {"gpuspawner.io/memguard-hook": "HOOK"} and len(changes.volumes) == len(changes.volume_mounts) == 1
    assert changes.command_prefix == path_prefix()
    plain = pod_changes(offering, 1)
    assert not plain.guard_env and not plain.volumes and not plain.annotations and not plain.command_prefix


def test_the_guards_prefix_runs_before_an_offerings_own():
    offering = config(slug="bf", kind="custom", command_prefix=["bitfusion", "run", "--"], memory_mib=8192, memory_guard={"fraction": 0.5})
    changes = pod_changes(offering, 1, guard_changes(guard_for(offering, ON), 1, "HOOK"))
    assert changes.command_prefix == (*path_prefix(), "bitfusion", "run", "--")


def test_the_page_says_what_a_share_really_gives():
    assert (
        memory_truth(Kind.SHARED, 16384, "time-slicing", 4, "Tesla T4")
        == "about 4 GB of this Tesla T4's 16 GB, not enforced; other users share this GPU"
    )
    assert (
        memory_truth(Kind.SHARED, 15360, "time-slicing", 4, "")
        == "about 3.8 GB of this GPU's 15 GB, not enforced; other users share this GPU"
    )
    assert memory_truth(Kind.SHARED, 16384, "time-slicing", None) == "16 GB GPU memory shared with other users, not enforced"
    assert memory_truth(Kind.SHARED, 4096, "mps", 4, "L4") == "4 GB of this L4's 16 GB, enforced by MPS; other users share its compute"
    assert memory_truth(Kind.MIG, 10240) == "MIG: 10 GB, enforced by the hardware"
    assert memory_truth(Kind.FULL, 81920) == "80 GB GPU memory"
    assert memory_truth(Kind.VGPU, 8192) == "8 GB GPU memory, enforced by the vGPU"
    assert memory_truth(Kind.SHARED, None, "time-slicing", 4) == ""


def test_the_spawn_page_rows_name_the_gpu_and_what_enforces_the_memory():
    mig = config(slug="mig", kind="mig", profile="2g.10gb", product="NVIDIA-A100-SXM4-40GB")
    rows = {r.slug: r for r in option_views([shared("time-slicing"), shared("mps"), mig], Requester("ada"), lambda o: UNCOUNTED, NOW)}
    assert [r.facts[0] for r in rows.values()] == [
        "about 4 GB of this Tesla T4's 16 GB, not enforced; other users share this GPU",
        "4 GB of this Tesla T4's 16 GB, enforced by MPS; other users share its compute",
        "MIG: 9.6 GB, enforced by the hardware",  # NVIDIA's 9856 MiB of an A100 40GB's 2g.10gb
    ]


# ------------------------------------------------------------------ the start-up hook, run for real

FAKE_TORCH = {
    "torch/__init__.py": "from . import cuda\n",
    "torch/cuda.py": textwrap.dedent(
        """
        CALLS = []
        _queued = []
        _initialized = False

        def device_count():
            return 2

        def is_initialized():
            return _initialized

        def set_per_process_memory_fraction(fraction, device=None):
            CALLS.append([fraction, device])

        def _lazy_call(callable):  # torch.cuda's: run now if initialised, else at init
            if _initialized:
                callable()
            else:
                _queued.append(callable)

        def init():
            global _initialized
            _initialized = True
            for call in _queued:
                call()
        """
    ),
}
FAKE_TENSORFLOW = {
    "tensorflow/__init__.py": textwrap.dedent(
        """
        class _Config:
            CALLS = []

            class LogicalDeviceConfiguration:
                def __init__(self, memory_limit=None):
                    self.memory_limit = memory_limit

            def list_physical_devices(self, kind):
                return ["/physical_device:GPU:0"] if kind == "GPU" else []

            def set_logical_device_configuration(self, device, configs):
                self.CALLS.append([device, [c.memory_limit for c in configs]])

        config = _Config()
        """
    ),
}


def python_in_pod(
    tmp_path: Path, code: str, frameworks: dict[str, str], env: dict[str, str], image_sitecustomize: str = "", hook: bool = True
) -> subprocess.CompletedProcess:
    """``code`` under a plain Python started the way a guarded pod starts it (``hook=False``:
    the same image without the guard), with ``frameworks`` (stand-in modules) on its path."""
    hook_dir = tmp_path / "memguard"
    hook_dir.mkdir()
    if hook:
        (hook_dir / "sitecustomize.py").write_text(HOOK.read_text())
    site = tmp_path / "site"
    for name, text in frameworks.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    site.mkdir(exist_ok=True)
    if image_sitecustomize:
        (site / "sitecustomize.py").write_text(image_sitecustomize)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSPAWNER_", "PYTHON"))}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env, "PYTHONPATH": f"{hook_dir}{os.pathsep}{site}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_python(tmp_path: Path, code: str, frameworks: dict[str, str], env: dict[str, str], image_sitecustomize: str = ""):
    """``code`` under a guarded pod's Python: its last line of output, as JSON, and its stderr."""
    result = python_in_pod(tmp_path, code, frameworks, env, image_sitecustomize)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


GUARD = {"GPUSPAWNER_MEMORY_FRACTION": "0.25", "GPUSPAWNER_MEMORY_MIB": "4096"}


def test_the_hook_caps_torch_on_every_gpu_only_once_cuda_starts(tmp_path):
    code = textwrap.dedent(
        """
        import json, sys
        before = "torch" in sys.modules
        import torch
        imported = list(torch.cuda.CALLS)
        torch.cuda.init()
        print(json.dumps({"before": before, "at_import": imported, "at_init": torch.cuda.CALLS}))
        """
    )
    out, stderr = run_python(tmp_path, code, FAKE_TORCH, GUARD)
    assert out == {"before": False, "at_import": [], "at_init": [[0.25, 0], [0.25, 1]]}
    assert "PyTorch may use 0.25 of each GPU's memory" in stderr


def test_the_hook_gives_tensorflow_a_logical_device_with_the_limit(tmp_path):
    code = "import json, tensorflow as tf; print(json.dumps(tf.config.CALLS))"
    out, stderr = run_python(tmp_path, code, FAKE_TENSORFLOW, GUARD)
    assert out == [["/physical_device:GPU:0", [4096]]]
    assert "TensorFlow may use 4096 MiB" in stderr


def test_without_a_framework_the_hook_imports_nothing_and_changes_nothing(tmp_path):
    code = textwrap.dedent(
        """
        import json, sys
        try:
            import torch
            found = True
        except ImportError:
            found = False
        print(json.dumps({"found": found, "loaded": sorted(m for m in sys.modules if m in ("torch", "tensorflow"))}))
        """
    )
    out, stderr = run_python(tmp_path, code, {}, GUARD)
    assert out == {"found": False, "loaded": []} and stderr == ""


def test_without_a_fraction_the_hook_stays_out_of_the_way(tmp_path):
    code = "import json, sys, torch; torch.cuda.init(); print(json.dumps([[type(f).__name__ for f in sys.meta_path], torch.cuda.CALLS]))"
    (finders, calls), _ = run_python(tmp_path, code, FAKE_TORCH, {})
    assert "AfterImport" not in finders and calls == []


def test_the_images_own_sitecustomize_still_runs(tmp_path):
    image = "import os\nos.environ['IMAGE_SITECUSTOMIZE'] = 'ran'\n"
    code = "import json, os, sitecustomize; print(json.dumps([os.environ.get('IMAGE_SITECUSTOMIZE'), sitecustomize.FRACTION_ENV]))"
    out, _ = run_python(tmp_path, code, {}, GUARD, image_sitecustomize=image)
    assert out == ["ran", "GPUSPAWNER_MEMORY_FRACTION"]


def test_a_broken_image_sitecustomize_or_fraction_never_stops_python(tmp_path):
    code = "import json; print(json.dumps('started'))"
    out, stderr = run_python(
        tmp_path, code, {}, {"GPUSPAWNER_MEMORY_FRACTION": "a lot"}, image_sitecustomize="raise RuntimeError('boom')\n"
    )
    assert out == "started"
    assert "ignoring GPUSPAWNER_MEMORY_FRACTION='a lot'" in stderr and "sitecustomize failed: boom" in stderr
