"""The memory guard's TensorFlow wrapper against the real TensorFlow (``make framework-check``).

Run by a Python that has ``tensorflow-cpu`` (the check installs it into
``.venv-frameworks/tensorflow``; about 1.6 GB, too large for ``make test``). There is no GPU,
so TensorFlow's refusal is met on the CPU, which takes logical devices too: TensorFlow's
``Context.set_memory_growth`` checks "logical devices configured" before the device's type,
so the CPU with two logical devices meets the same ``ValueError`` a guarded GPU meets. Then
the hook's :func:`growth_already_on` is applied to the real ``tf.config.experimental`` and
the usual snippet must run; ``(device, False)`` must still reach TensorFlow. Last, the whole
hook is loaded as a pod loads it (``sitecustomize`` on ``PYTHONPATH``, the guard's variables
set) before ``import tensorflow``: the import must work and the hook say nothing (no GPU).

Prints what it found; exits 1 on the first thing that is not as docs/memory-guard.md says.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK = Path(__file__).resolve().parents[1] / "gpuspawner" / "pod" / "memguard_hook.py"
REFUSAL = "Cannot set memory growth on device when virtual devices configured"


def fail(message: str) -> int:
    print(f"framework-check (TensorFlow): FAILED: {message}")
    return 1


def main() -> int:
    import tensorflow as tf

    spec = importlib.util.spec_from_file_location("gpuspawner_memguard_hook", HOOK)
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)

    print(f"TensorFlow {tf.__version__}")
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    try:
        tf.config.experimental.set_memory_growth(cpu, True)
        return fail("TensorFlow accepted set_memory_growth on a device with logical devices")
    except ValueError as exc:
        if REFUSAL not in str(exc):
            return fail(f"TensorFlow refused with another ValueError: {exc}")
        print(f"TensorFlow itself: ValueError: {exc}")
    except RuntimeError as exc:
        return fail(f"TensorFlow refused with a RuntimeError, not the ValueError the docs name: {exc}")

    hook.growth_already_on(tf.config.experimental, [cpu])
    if tf.config.experimental.set_memory_growth(cpu, True) is not None:
        return fail("the wrapped set_memory_growth answered something")
    print("with the hook's wrapper: set_memory_growth(device, True) runs")
    try:
        tf.config.experimental.set_memory_growth(cpu, False)
        return fail("set_memory_growth(device, False) did not reach TensorFlow")
    except ValueError as exc:
        print(f"set_memory_growth(device, False) still reaches TensorFlow: ValueError: {exc}")

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(HOOK.read_text())
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUSPAWNER_"))},
            "PYTHONPATH": tmp,
            "GPUSPAWNER_MEMORY_FRACTION": "0.093",
            "GPUSPAWNER_MEMORY_MIB": "1536",
            "TF_FORCE_GPU_ALLOW_GROWTH": "true",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        code = "import sys, tensorflow as tf; print(tf.__version__, 'with', type(sys.meta_path[0]).__name__, 'first on sys.meta_path')"
        got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        guard_lines = [line for line in got.stderr.splitlines() if line.startswith("gpuspawner memory guard")]
        if got.returncode != 0:
            return fail(f"import tensorflow under the hook failed: {got.stderr.strip().splitlines()[-1:]}")
        if "AfterImport" not in got.stdout:
            return fail(f"the hook was not loaded: {got.stdout.strip()}")
        if guard_lines:
            return fail(f"the hook spoke without a GPU: {guard_lines}")
        print(f"import tensorflow under the whole hook: {got.stdout.strip()}, no guard message (no GPU)")
    print("framework-check (TensorFlow): as docs/memory-guard.md says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
