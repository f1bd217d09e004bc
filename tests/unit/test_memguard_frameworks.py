"""The memory guard judged by the frameworks' own code, not by our idea of them.

* JAX: every guarded pod environment is handed to the real jaxlib (the CPU wheel pinned in
  pyproject.toml's test extra): ``jaxlib.xla_client.generate_pjrt_gpu_plugin_options`` is
  what JAX's CUDA plugin calls to read the variables when it starts. It must not raise (a
  raise there makes JAX log it and run on the CPU), must cap at the guard's fraction and
  must not preallocate.
* The hook's PYTHONPATH: the pod's real command prefix, run by a real ``sh``, over an
  environment that already has the image's PYTHONPATH, into a real Python, a subprocess of
  it, a virtualenv's Python and an ipykernel kernel started by jupyter_client.
* TensorFlow: a stand-in whose ``set_memory_growth`` refuses, as TensorFlow's own
  (tensorflow/python/eager/context.py) does, a GPU with logical devices, with a ValueError.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
from jaxlib import xla_client

from gpuspawner.pod.memguard import guard_changes, guard_for, path_prefix
from gpuspawner.pod.podspec import POD_SETTINGS, layered_settings, pod_changes
from tests.unit.test_memguard import EVERY_KIND, ON, config, python_in_pod, shared

HOOK = Path(__file__).resolve().parents[2] / "gpuspawner" / "pod" / "memguard_hook.py"


def pod_environment(offering, defaults=ON, count=1, admin=None, profile=None) -> dict[str, str]:
    """The notebook container's environment as GPUSpawner builds the pod: the admin's
    ``environment`` with the chosen profile's merged over it (what KubeSpawner's settings
    hold), then the offering laid on by the spawner's own :func:`podspec.layered_settings`."""
    admin, profile = dict(admin or {}), dict(profile or {})
    guard = guard_for(offering, defaults)
    assert guard is not None
    changes = pod_changes(offering, count, guard_changes(guard, count, "HOOK"))
    site = {name: [] if name in ("node_affinity_required", "tolerations", "volumes", "volume_mounts") else {} for name in POD_SETTINGS}
    site.update(environment={**admin, **profile}, cmd=None)
    profile_keys = frozenset(k for k, v in profile.items() if admin.get(k) != v)
    return layered_settings(site, changes, profile_keys, guard.user_env)["environment"]


def jax_options(env: dict[str, str], monkeypatch) -> dict:
    """What JAX's CUDA plugin is given for ``env``: jaxlib's own reading of the variables."""
    for name in list(os.environ):
        if name.startswith("XLA_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return dict(xla_client.generate_pjrt_gpu_plugin_options())


USER_ENV = {"memory_guard": {"user_env": True}}
CASES = {
    "time-sliced share": (lambda: shared("time-slicing"), ON, 1, {}, {}, 0.093),
    "MPS share": (lambda: shared("mps"), ON, 1, {}, {}, 0.093),
    "configured share": (lambda: config(slug="t4", kind="shared", replicas=3, memory_mib=15360), ON, 1, {}, {}, 0.133),
    "share of unknown size": (lambda: config(slug="t4", kind="shared", replicas=4), ON, 1, {}, {}, 0.125),
    "custom with a fraction": (
        lambda: config(slug="half", kind="custom", resources={"nvidia.com/vgpu": 500}, memory_mib=8192, memory_guard={"fraction": 0.5}),
        ON,
        1,
        {},
        {},
        0.5,
    ),
    "whole GPUs with a fraction": (
        lambda: config(slug="h100", kind="full", memory_mib=81920, counts=[1, 2], memory_guard={"fraction": 0.5}),
        ON,
        2,
        {},
        {},
        0.5,
    ),
    "MIG, grab only": (lambda: config(slug="mig", kind="mig", profile="1g.10gb"), EVERY_KIND, 1, {}, {}, None),
    "whole GPU, grab only": (lambda: config(slug="h100", kind="full", memory_mib=81920), EVERY_KIND, 1, {}, {}, None),
    "admin sets the new name": (lambda: shared("time-slicing"), ON, 1, {"XLA_CLIENT_MEM_FRACTION": "0.6"}, {}, 0.093),
    "admin sets the old name": (lambda: shared("time-slicing"), ON, 1, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.6"}, {}, 0.093),
    "profile sets the new name, not allowed": (lambda: shared("time-slicing"), ON, 1, {}, {"XLA_CLIENT_MEM_FRACTION": "0.9"}, 0.093),
    "profile sets the new name, allowed": (
        lambda: config(slug="t4", kind="shared", replicas=4, memory_mib=16384, **USER_ENV),
        ON,
        1,
        {},
        {"XLA_CLIENT_MEM_FRACTION": "0.9"},
        0.9,
    ),
    "profile sets the old name, allowed": (
        lambda: config(slug="t4", kind="shared", replicas=4, memory_mib=16384, **USER_ENV),
        ON,
        1,
        {},
        {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.8"},
        0.8,
    ),
    "offering env sets the new name": (
        lambda: config(slug="t4", kind="shared", replicas=4, memory_mib=16384, env={"XLA_CLIENT_MEM_FRACTION": "0.1"}),
        ON,
        1,
        {},
        {},
        0.1,
    ),
    "offering env sets the old name": (
        lambda: config(slug="t4", kind="shared", replicas=4, memory_mib=16384, env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1"}),
        ON,
        1,
        {},
        {},
        0.1,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_real_jaxlib_accepts_every_guarded_environment_caps_at_its_fraction_and_does_not_preallocate(case, monkeypatch):
    make, defaults, count, admin, profile, fraction = CASES[case]
    env = pod_environment(make(), defaults, count, admin, profile)
    options = jax_options(env, monkeypatch)  # raises ValueError where jaxlib refuses the environment
    assert options.get("memory_fraction") == fraction, env
    assert options["preallocate"] is False, env
    if fraction is not None and not profile and not case.startswith("offering"):
        assert options["memory_fraction"] == float(env["GPUSPAWNER_MEMORY_FRACTION"])


def test_the_judge_is_real_jaxlib_refuses_both_spellings_together_where_it_reads_the_new_one(monkeypatch):
    """What the guard set before this test existed: a jaxlib that reads the new name (0.4.38
    on) refuses it (so JAX ran on the CPU); one that does not (0.4.30 and before) ignores the
    new name, which is why the guard never uses it. Both found by asking jaxlib itself."""
    reads_new = "memory_fraction" in jax_options({"XLA_CLIENT_MEM_FRACTION": "0.5"}, monkeypatch)
    both = {"XLA_CLIENT_MEM_FRACTION": "0.25", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25"}
    if reads_new:
        with pytest.raises(ValueError, match="XLA_CLIENT_MEM_FRACTION is specified together with XLA_PYTHON_CLIENT_MEM_FRACTION"):
            jax_options(both, monkeypatch)
    else:
        assert jax_options(both, monkeypatch)["memory_fraction"] == 0.25
    assert jax_options({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}, monkeypatch)["memory_fraction"] == 0.5  # every jaxlib


def test_the_pinned_jaxlib_is_one_that_refuses_both(monkeypatch):
    """make test's jaxlib is a current one; `make framework-check` runs the tests above
    (``-k real_jaxlib``) against older ones, which read the old name only."""
    assert "memory_fraction" in jax_options({"XLA_CLIENT_MEM_FRACTION": "0.5"}, monkeypatch)


# ------------------------------------------------------------------ PYTHONPATH through the command prefix

PROBE = textwrap.dedent(
    """
    import json, os, subprocess, sys
    import image_lib  # from the image's own PYTHONPATH
    hook = sys.modules.get("sitecustomize")
    out = {
        "image_lib": image_lib.WHERE,
        "hook": getattr(hook, "FRACTION_ENV", None),
        "finder": [type(f).__name__ for f in sys.meta_path][:1],
        "pythonpath": os.environ["PYTHONPATH"],
    }
    if len(sys.argv) > 1:
        child = subprocess.run([sys.argv[1], __file__], capture_output=True, text=True, check=True)
        out["child"] = json.loads(child.stdout)
    print(json.dumps(out))
    """
)


def guarded_layout(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A hook directory (as the downwardAPI volume projects it), an image's own library
    directory on the image's PYTHONPATH, and the environment of the container."""
    hook_dir = tmp_path / "memguard"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK.read_text())
    image_dir = tmp_path / "image-lib"
    image_dir.mkdir()
    (image_dir / "image_lib.py").write_text("WHERE = 'the image'\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSPAWNER_", "PYTHON", "VIRTUAL_ENV"))}
    env = {**clean, "PYTHONPATH": str(image_dir), "GPUSPAWNER_MEMORY_FRACTION": "0.093", "GPUSPAWNER_MEMORY_MIB": "1536"}
    return hook_dir, image_dir, env


def through_prefix(hook_dir: Path, env: dict[str, str], *command: str) -> dict:
    result = subprocess.run([*path_prefix(str(hook_dir)), *command], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_prefix_keeps_the_images_pythonpath_and_loads_the_hook_in_python_and_its_subprocesses(tmp_path):
    hook_dir, image_dir, env = guarded_layout(tmp_path)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = through_prefix(hook_dir, env, sys.executable, str(script), sys.executable)
    expected = {
        "image_lib": "the image",
        "hook": "GPUSPAWNER_MEMORY_FRACTION",
        "finder": ["AfterImport"],
        "pythonpath": f"{hook_dir}:{image_dir}",
    }
    assert out == {**expected, "child": expected}
    # without an image PYTHONPATH the hook is the whole of it (no empty entry: "" would add the cwd)
    bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    result = subprocess.run([*path_prefix(str(hook_dir)), "sh", "-c", 'printf %s "$PYTHONPATH"'], env=bare, capture_output=True, text=True)
    assert result.stdout == str(hook_dir)


def test_the_prefix_reaches_a_virtualenvs_python(tmp_path):
    hook_dir, image_dir, env = guarded_layout(tmp_path)
    venv.create(tmp_path / "venv", with_pip=False, system_site_packages=False)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = through_prefix(hook_dir, env, str(tmp_path / "venv" / "bin" / "python"), str(script))
    assert out["hook"] == "GPUSPAWNER_MEMORY_FRACTION" and out["image_lib"] == "the image" and out["finder"] == ["AfterImport"]


def test_python_dash_i_ignores_pythonpath_and_so_the_hook_as_the_docs_say(tmp_path):
    hook_dir, _, env = guarded_layout(tmp_path)
    code = "import json, sys; print(json.dumps(getattr(sys.modules.get('sitecustomize'), 'FRACTION_ENV', None)))"
    for flag in ("-I", "-E", "-S"):
        result = subprocess.run([*path_prefix(str(hook_dir)), sys.executable, flag, "-c", code], env=env, capture_output=True, text=True)
        assert json.loads(result.stdout) is None, flag


KERNEL = textwrap.dedent(
    """
    import json
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        seen = []
        code = (
            "import sys, image_lib; "
            "print(image_lib.WHERE, getattr(sys.modules.get('sitecustomize'), 'FRACTION_ENV', None), type(sys.meta_path[0]).__name__)"
        )
        kc.execute_interactive(code, timeout=60, output_hook=lambda m: seen.append(m["content"].get("text", "")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    print(json.dumps("".join(seen).split()))
    """
)


def test_an_ipykernel_kernel_started_by_the_server_gets_the_hook_and_the_images_path(tmp_path):
    hook_dir, _, env = guarded_layout(tmp_path)
    env = {**env, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    out = through_prefix(hook_dir, env, sys.executable, str(script))
    assert out == ["the", "image", "GPUSPAWNER_MEMORY_FRACTION", "AfterImport"]


# ------------------------------------------------------------------ TensorFlow's set_memory_growth

#: TensorFlow's physical devices and configuration calls, with set_memory_growth checking in
#: the order tensorflow/python/eager/context.py (Context.set_memory_growth) does: unknown
#: device, then logical ("virtual") devices configured -> ValueError, then non-GPU.
TF_LIKE = {
    "tensorflow/__init__.py": textwrap.dedent(
        """
        import collections
        PhysicalDevice = collections.namedtuple("PhysicalDevice", ["name", "device_type"])

        class _Experimental:
            def __init__(self, context):
                self._context = context

            def set_memory_growth(self, device, enable):
                context = self._context
                if device not in context.physical:
                    raise ValueError("Unrecognized device: %r" % (device,))
                if device in context.virtual:
                    raise ValueError("Cannot set memory growth on device when virtual devices configured")
                if device.device_type != "GPU":
                    raise ValueError("Cannot set memory growth on non-GPU devices")
                context.growth[device] = enable

        class _Config:
            class LogicalDeviceConfiguration:
                def __init__(self, memory_limit=None):
                    self.memory_limit = memory_limit

            def __init__(self):
                self.physical = [PhysicalDevice("/physical_device:CPU:0", "CPU"), PhysicalDevice("/physical_device:GPU:0", "GPU")]
                self.virtual = {}
                self.growth = {}
                self.experimental = _Experimental(self)

            def list_physical_devices(self, kind=None):
                return [d for d in self.physical if kind in (None, d.device_type)]

            def set_logical_device_configuration(self, device, configs):
                self.virtual[device] = [c.memory_limit for c in configs]

        config = _Config()
        """
    ),
}

USUAL_SNIPPET = textwrap.dedent(
    """
    import json
    import tensorflow as tf
    outcome = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
            outcome.append("ok")
        except RuntimeError as exc:  # what the usual snippet catches
            outcome.append("caught: " + str(exc))
    try:
        tf.config.experimental.set_memory_growth(tf.config.list_physical_devices("GPU")[0], False)
        outcome.append("off accepted")
    except ValueError as exc:
        outcome.append("off refused: " + str(exc))
    print(json.dumps([outcome, {d.name: v for d, v in tf.config.virtual.items()}]))
    """
)


def test_the_usual_tensorflow_growth_snippet_runs_on_a_guarded_gpu(tmp_path):
    result = python_in_pod(tmp_path, USUAL_SNIPPET, TF_LIKE, {"GPUSPAWNER_MEMORY_FRACTION": "0.093", "GPUSPAWNER_MEMORY_MIB": "1536"})
    assert result.returncode == 0, result.stderr
    outcome, virtual = json.loads(result.stdout)
    assert virtual == {"/physical_device:GPU:0": [1536]}
    # asking for growth again is answered by the guard; turning it off still reaches TensorFlow
    assert outcome == ["ok", "off refused: Cannot set memory growth on device when virtual devices configured"]


def test_the_tensorflow_stand_in_refuses_as_tensorflow_does_once_a_logical_device_is_set(tmp_path):
    """Without the guard's wrapper the same snippet dies with TensorFlow's ValueError: the
    test above would fail if the hook stopped answering set_memory_growth."""
    snippet = USUAL_SNIPPET.replace("import tensorflow as tf", "import tensorflow as tf\n" + _configure_like_the_hook())
    result = python_in_pod(tmp_path, snippet, TF_LIKE, {}, hook=False)
    assert result.returncode == 1
    assert "ValueError: Cannot set memory growth on device when virtual devices configured" in result.stderr


def _configure_like_the_hook() -> str:
    return (
        "for _gpu in tf.config.list_physical_devices('GPU'):\n"
        "    tf.config.set_logical_device_configuration(_gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=1536)])\n"
    )
