"""The scale benchmark (`make scale`, bench/scale) at CI's small fixed size, on both spawners.

Nothing here is timed: the run must end with every spawn accounted for (each GPU and "No GPU"
request running, each impossible one refused with words, none pending or lost, no notebook pod
without its server; with ``--contention`` each request beyond a scarce offering's units served
or answered with words), GPUSpawner's free counts equal to a recount from a fresh list and to
what the real scheduler binds, and every inventory-lag probe seen by the hub (`--check`); and it
must print the whole table.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--nodes", "22", "--pods", "300", "--churn", "5", "--users", "60", "--spawns", "24", "--window", "6", "--page-users", "6"]
ROWS = [
    "spawn page p99",
    "request -> pod bound p99",
    "request -> refusal p99",
    "hub CPU seconds (storm)",
    "hub peak memory MiB",
    "API requests per spawn",
    "inventory lag p99",
]


def run_bench(tmp_path: Path, *extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scale", *SMALL, "--start-timeout", "40", "--check", "--keep", str(tmp_path / "work"), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, (
        f"bench.scale exited {proc.returncode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}\n{hub_news(tmp_path)}"
    )
    return proc.stdout


def hub_news(tmp_path: Path) -> str:
    """What GPUSpawner's hub said of the cluster (the inventory, outages, the reflector), for a failure's report."""
    lines = []
    for log in sorted((tmp_path / "work").glob("*/hub.log")):
        said = [line for line in log.read_text(errors="replace").splitlines() if any(w in line for w in NEWS)]
        lines += [f"--- {log.parent.name}/hub.log", *said[-80:]]
    return "\n".join(lines)


NEWS = ("inventory", "cannot be reached", "reflector", "Spawn failed", "giving up", "did not start")


def test_a_small_storm_on_kubespawner_and_gpuspawner_loses_nothing(tmp_path):
    out = run_bench(tmp_path, "--contention")
    assert "KubeSpawner" in out and "GPUSpawner : KubeSpawner" in out, out
    for row in [*ROWS, "contended -> verdict p99"]:
        assert row in out, f"the table has no {row!r} row:\n{out}"
    assert "free counts against a recount from a fresh list: exact" in out, out
    checked = re.search(r"free counts against the real scheduler: (\d+) of (\d+) offerings agree \(", out)
    assert checked and checked.group(1) == checked.group(2) and int(checked.group(2)) >= 5, out
    assert out.count("servers stuck pending, lost or wrong: none") == 2, out


def test_a_small_storm_with_the_hub_and_the_api_server_restarted_loses_nothing(tmp_path):
    out = run_bench(tmp_path, "--faults")
    assert "fault: hub restarted" in out and "fault: kube-apiserver restarted" in out, out
    assert "free counts against a recount from a fresh list: exact" in out, out
    assert "servers stuck pending, lost or wrong: none" in out, out
