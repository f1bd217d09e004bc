"""What one scrape of `gpuspawner probe` costs, and its resident memory, on a full node.

Two nodes, NVML replaced at the binding's boundary (gpuspawner/devcluster/nvmlstandin.py:
the binding's real Python layer, ctypes structs and retries run; only libnvidia-ml's C
calls are Python functions) and a /proc of cgroup files as containerd writes them:

* 8 GPUs x 7 MIG instances (H100 1g.10gb), one notebook process on each instance, asked
  per instance, and again with instances that answer NotSupported (read from the parent);
* 8 GPUs time-sliced x 48 processes each (384 pods; half of them busy, so NVML returns
  per-process samples).

Printed side by side: the NVML pass alone and the whole scrape (pass, cgroup reads,
attribution, Prometheus text), the NVML calls per scrape, the size of /metrics, and the
probe's resident memory (each node in a fresh interpreter). Nothing asserted.

No baseline from dcgm-exporter: it needs DCGM and a GPU to start, and no GPU is here;
its per-process mode is not the same work either. The numbers are absolute: the stand-in
answers in microseconds, so the real driver's time per call is not in them.

    python -m bench.probe_bench [--scrapes 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.procstat import memory_mib

GIB = 1 << 30


def _rss_mib() -> float:
    return memory_mib("self", "VmRSS", missing=float("nan"))


def build(kind: str, root: Path):
    from gpuspawner.devcluster.nvmlstandin import FakeGpu, FakeMig, FakeNvmlLib, FakeProcess, ProcTree, cgroup_line
    from gpuspawner.probe.pods import StaticPods

    procs = ProcTree(root / "proc")
    pods, gpus = [], []
    pid = 1000

    def process(gpu: int, slot: int, busy: bool) -> FakeProcess:
        nonlocal pid
        pid += 1
        uid = f"{gpu:08x}-{slot:04x}-4000-8000-{pid:012x}"
        container = f"{pid:064x}"
        procs.add(pid, cgroup_line(uid, container), namespaced=True)
        pods.append(
            {
                "metadata": {"uid": uid, "namespace": "jhub", "name": f"jupyter-user{gpu}-{slot}"},
                "status": {"containerStatuses": [{"name": "notebook", "containerID": f"containerd://{container}"}]},
            }
        )
        return FakeProcess(pid, (slot % 5 + 1) * (GIB // 4), sm_util=60 if busy else 0)

    for g in range(8):
        if kind.startswith("mig"):
            migs = [
                FakeMig(f"MIG-{g:02x}{i:02x}0000-0000-5000-8000-000000000000", "1g.10gb", 7 + i, 0, 10 * GIB, [process(g, i, False)])
                for i in range(7)
            ]
            gpus.append(
                FakeGpu(
                    f"GPU-{g:08x}-0000-4000-8000-000000000000",
                    "NVIDIA H100 80GB HBM3",
                    80 * GIB,
                    migs=migs,
                    mig_processes_on_parent_only=kind == "mig-parent",
                )
            )
        else:
            gpus.append(
                FakeGpu(
                    f"GPU-{g:08x}-0000-4000-8000-000000000000",
                    "Tesla T4",
                    16 * GIB,
                    processes=[process(g, i, i % 2 == 0) for i in range(48)],
                )
            )
    return FakeNvmlLib(gpus), procs.root, StaticPods(pods)


def child(kind: str, scrapes: int) -> dict:
    """One node in this interpreter: times and memory, as JSON on stdout."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuspawner.devcluster.nvmlstandin import installed
    from gpuspawner.probe.collect import ProbeCollector, ProcReader
    from gpuspawner.probe.nvml import NvmlReader

    with tempfile.TemporaryDirectory() as tmp:
        lib, proc_root, pods = build(kind, Path(tmp))
        rss_start = _rss_mib()
        with installed(lib) as nvml:
            reader = NvmlReader(nvml)
            registry = CollectorRegistry(auto_describe=False)
            registry.register(ProbeCollector(reader, ProcReader(proc_root), pods, "gpu-node-1"))
            body = generate_latest(registry)  # warm: nvmlInit, first pod lookups
            passes, full, calls = [], [], []
            for _ in range(scrapes):
                t0 = time.perf_counter()
                result = reader.read()
                passes.append(time.perf_counter() - t0)
                before = lib.calls
                t0 = time.perf_counter()
                body = generate_latest(registry)
                full.append(time.perf_counter() - t0)
                calls.append(lib.calls - before)
        return {
            "devices": len(result.readings),
            "processes": sum(len(r.processes) for r in result.readings),
            "pass_ms": [1000 * x for x in passes],
            "scrape_ms": [1000 * x for x in full],
            "calls": max(calls),
            "bytes": len(body),
            "rss_start": rss_start,
            "rss_end": _rss_mib(),
        }


NODES = [
    ("mig", "8 GPUs x 7 MIG instances"),
    ("mig-parent", "8 x 7 MIG, processes via parent"),
    ("timeslice", "8 GPUs x 48 time-slice processes"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--child", choices=[k for k, _ in NODES], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.scrapes)))
        return 0
    rows = []
    for kind, label in NODES:
        out = subprocess.run(
            [sys.executable, "-m", "bench.probe_bench", "--child", kind, "--scrapes", str(args.scrapes)], capture_output=True, text=True
        )
        if out.returncode != 0:
            print(f"{label}: failed\n{out.stderr}", file=sys.stderr)
            return 1
        rows.append((label, json.loads(out.stdout)))

    def q(values: list[float], p: float) -> float:
        return statistics.quantiles(values, n=100)[int(p) - 1] if len(values) > 1 else values[0]

    print(f"gpuspawner probe, {args.scrapes} scrapes per node (stand-in NVML; median / p95 in ms)")
    print(
        f"{'node':34s} {'devices':>7s} {'procs':>6s} {'NVML pass':>15s} {'whole scrape':>15s} {'NVML calls':>10s} {'/metrics':>9s} {'RSS MiB':>8s}"
    )
    for label, r in rows:
        nv = f"{statistics.median(r['pass_ms']):6.2f} / {q(r['pass_ms'], 95):6.2f}"
        sc = f"{statistics.median(r['scrape_ms']):6.2f} / {q(r['scrape_ms'], 95):6.2f}"
        print(
            f"{label:34s} {r['devices']:7d} {r['processes']:6d} {nv:>15s} {sc:>15s} {r['calls']:10d} {r['bytes'] / 1024:7.1f}KB {r['rss_end']:8.1f}"
        )
    worst = max(statistics.median(r["scrape_ms"]) for _, r in rows)
    print(f"At a 15 s scrape interval the busiest node costs {worst / 15000:.2%} of one core (plus the driver's own time per NVML call).")
    print("RSS is the whole interpreter with prometheus_client, pynvml and the probe loaded, after the scrapes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
