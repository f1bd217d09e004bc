"""The memory guard and the probe on a real NVIDIA GPU (``make gpu-check``; docs/memory-guard.md).

CI has no GPU: what the frameworks do with the guard's environment is checked there against
their own code (tests/unit/test_memguard_frameworks.py), never on a device. This is the
check on one. On a machine with an NVIDIA GPU it

1. sizes the guard for a quarter of GPU 0 (a time-sliced share of 4 replicas), exactly as
   the spawner would (gpuspawner.pod.memguard), and lays out the start-up hook as a pod has it;
2. starts JAX, PyTorch and TensorFlow, each in its own process through the pod's real
   command prefix (``sh -c 'export PYTHONPATH=...'``), allocates past the cap and expects
   each to refuse (TensorFlow also runs the usual ``set_memory_growth`` snippet first);
3. keeps one guarded process holding GPU memory and prints ``gpuspawner probe --once``
   beside ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv``.

The frameworks must be installed with CUDA in the Python named by ``--python`` (default:
this one); a framework that is not there is reported "not installed" and the check is
incomplete (exit 1). Without a GPU it stops before anything else and says so (exit 2).

    python scripts/gpu_check.py [--python PATH] [--replicas 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuspawner.offerings.config import offering_from_config  # noqa: E402
from gpuspawner.pod.memguard import GuardDefaults, guard_changes, guard_for, path_prefix  # noqa: E402

HOOK = REPO / "gpuspawner" / "pod" / "memguard_hook.py"
NO_GPU = 2

#: Each framework: a program that prints one JSON line {"version", "device", "refused", "detail"}.
#: It allocates 1.5 times the cap in one piece: refused means the framework's own
#: out-of-memory error, not a crash.
PROGRAMS = {
    "jax": textwrap.dedent(
        """
        import json, os
        import jax, jax.numpy as jnp
        cap = float(os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]) * int(os.environ["GPU_CHECK_TOTAL_BYTES"])
        out = {"version": jax.__version__, "device": str(jax.devices()[0]), "refused": False, "detail": ""}
        if jax.devices()[0].platform != "gpu":
            out["detail"] = "JAX runs on " + jax.devices()[0].platform + ": the CUDA plugin did not start (the guard's environment?)"
        else:
            try:
                x = jnp.ones((int(cap * 1.5) // 4,), dtype=jnp.float32).block_until_ready()
                out["detail"] = "allocated %d bytes past a cap of %d" % (x.nbytes, cap)
            except Exception as exc:
                out["refused"] = "RESOURCE_EXHAUSTED" in str(exc) or "out of memory" in str(exc).lower()
                out["detail"] = type(exc).__name__ + ": " + str(exc).splitlines()[0]
        print(json.dumps(out))
        """
    ),
    "torch": textwrap.dedent(
        """
        import json, os
        import torch
        cap = float(os.environ["GPUSPAWNER_MEMORY_FRACTION"]) * int(os.environ["GPU_CHECK_TOTAL_BYTES"])
        out = {"version": torch.__version__, "device": "", "refused": False, "detail": ""}
        if not torch.cuda.is_available():
            out["detail"] = "torch.cuda.is_available() is False"
        else:
            out["device"] = torch.cuda.get_device_name(0)
            try:
                x = torch.empty(int(cap * 1.5), dtype=torch.uint8, device="cuda")
                out["detail"] = "allocated %d bytes past a cap of %d" % (x.numel(), cap)
            except torch.cuda.OutOfMemoryError as exc:
                out["refused"] = True
                out["detail"] = "OutOfMemoryError: " + str(exc).splitlines()[0]
        print(json.dumps(out))
        """
    ),
    "tensorflow": textwrap.dedent(
        """
        import json, os
        import tensorflow as tf
        cap = int(os.environ["GPUSPAWNER_MEMORY_MIB"]) << 20
        out = {"version": tf.__version__, "device": "", "refused": False, "detail": ""}
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            out["detail"] = "TensorFlow lists no GPU"
        else:
            out["device"] = gpus[0].name
            for gpu in gpus:  # the usual snippet: must not raise under the guard
                tf.config.experimental.set_memory_growth(gpu, True)
            try:
                with tf.device("/GPU:0"):
                    x = tf.ones((int(cap * 1.5) // 4,), dtype=tf.float32)
                    _ = x.numpy()[:1]
                out["detail"] = "allocated %d bytes past a cap of %d" % (int(cap * 1.5), cap)
            except tf.errors.ResourceExhaustedError as exc:
                out["refused"] = True
                out["detail"] = "ResourceExhaustedError: " + str(exc).splitlines()[0]
        print(json.dumps(out))
        """
    ),
}

#: A guarded process that holds memory until its stdin closes (for the probe beside nvidia-smi).
HOLDER = textwrap.dedent(
    """
    import sys, torch
    x = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    print("holding", flush=True)
    sys.stdin.read()
    """
)


def run(command: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, **kw)


def gpu_zero() -> tuple[str, int, str] | None:
    """(name, total MiB, driver version) of GPU 0, or None where there is no NVIDIA GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    got = run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits", "-i", "0"], timeout=60)
    if got.returncode != 0 or not got.stdout.strip():
        return None
    name, total, driver = (part.strip() for part in got.stdout.strip().splitlines()[0].split(","))
    return name, int(float(total)), driver


def guarded_env(total_mib: int, replicas: int) -> dict[str, str]:
    """The guard's variables for a time-sliced share of ``replicas`` of a GPU of ``total_mib``."""
    offering = offering_from_config({"slug": "gpu-check", "kind": "shared", "replicas": replicas, "memory_mib": total_mib}, 0)
    guard = guard_for(offering, GuardDefaults())
    assert guard is not None and guard.fraction is not None
    return dict(guard_changes(guard, 1, HOOK.read_text()).env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the Python with JAX, PyTorch and TensorFlow (CUDA builds)")
    parser.add_argument("--replicas", type=int, default=4, help="the share to guard: 1/replicas of GPU 0 (default: 4)")
    args = parser.parse_args(argv)
    gpu = gpu_zero()
    if gpu is None:
        print(
            "gpu-check: no NVIDIA GPU here (nvidia-smi is missing or lists none); this check needs one. "
            "CI's checks against the frameworks' own code are in `make test`.",
            file=sys.stderr,
        )
        return NO_GPU
    name, total_mib, driver = gpu
    env_guard = guarded_env(total_mib, args.replicas)
    print(f"gpu-check {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: GPU 0 {name}, {total_mib} MiB, driver {driver}")
    print(f"guard for 1/{args.replicas}: " + " ".join(f"{k}={v}" for k, v in sorted(env_guard.items())))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        hook_dir = Path(tmp) / "memguard"
        hook_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(HOOK.read_text())
        env = {**os.environ, **env_guard, "GPU_CHECK_TOTAL_BYTES": str(total_mib << 20), "CUDA_VISIBLE_DEVICES": "0"}
        env.pop("PYTHONPATH", None)
        results = {}
        for framework, program in PROGRAMS.items():
            got = run([*path_prefix(str(hook_dir)), args.python, "-c", program], env=env, timeout=600)
            lines = [line for line in got.stdout.splitlines() if line.startswith("{")]
            if got.returncode != 0 and "ModuleNotFoundError" in got.stderr:
                results[framework] = {"refused": None, "detail": "not installed in " + args.python}
            elif lines:
                results[framework] = json.loads(lines[-1])
            else:
                results[framework] = {"refused": False, "detail": "failed: " + (got.stderr.strip().splitlines() or ["?"])[-1]}
            guard_lines = [line for line in got.stderr.splitlines() if line.startswith("gpuspawner memory guard")]
            r = results[framework]
            verdict = {True: "REFUSED past the cap", False: "NOT refused", None: "not checked"}[r.get("refused")]
            print(f"{framework:<11} {r.get('version', '')} {r.get('device', '')}: {verdict}: {r['detail']}")
            for line in guard_lines:
                print(f"            {line}")
        print("\nthe probe beside nvidia-smi, while a guarded PyTorch process holds 256 MiB:")
        holder = subprocess.Popen(
            [*path_prefix(str(hook_dir)), args.python, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            ready = holder.stdout.readline().strip() if holder.stdout else ""
            if ready != "holding":
                print("  (no holder: PyTorch with CUDA is needed for this part)")
            smi = run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"], timeout=60)
            print("$ nvidia-smi --query-compute-apps=pid,used_memory --format=csv\n" + smi.stdout)
            probe = run([str(Path(sys.executable).with_name("gpuspawner")), "probe", "--once"], timeout=120)
            wanted = [line for line in probe.stdout.splitlines() if "gpuspawner_probe_" in line and not line.startswith("#")]
            print("$ gpuspawner probe --once\n" + "\n".join(wanted) + (("\n" + probe.stderr) if probe.returncode else ""))
        finally:
            if holder.stdin:
                holder.stdin.close()
            holder.wait(timeout=60)
    if any(r.get("refused") is None for r in results.values()):
        print("\nincomplete: install the missing frameworks (CUDA builds) in --python and run again")
        return 1
    return 0 if all(r.get("refused") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
