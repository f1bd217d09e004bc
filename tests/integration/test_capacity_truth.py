"""Capacity truth: in random cluster states of the wide generator, every offering's free
count equals the number of its notebook pods the real kube-scheduler binds.

Runs gpuspawner.devcluster.truth (the harness behind ``make capacity-truth``, which
checks 200 states) in its own process with its own devcluster, on a fixed set of seeds
chosen to include cordoned nodes and an offering that tolerates them, NotReady taints
(both halves, and the NoExecute half alone), taints nobody tolerates, nodes with a few
pod slots, and notebooks with cpu/memory guarantees, a memory limit only, and
zero-to-jupyterhub's user-pod tolerations. GPUSPAWNER_TRUTH_SEEDS replaces the seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuspawner.devcluster.truth import _seeds, draw_state
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.cluster

SEEDS = os.environ.get("GPUSPAWNER_TRUTH_SEEDS", "0-11,13")


def features(seeds: list[int]) -> set[str]:
    """What the states of ``seeds`` put in front of the scheduler."""
    found = set()
    for seed in seeds:
        state = draw_state(seed)
        found |= {f"notebook:{k}" for k in state.kube}
        if state.gpu.get("offering_overrides"):
            found.add("tolerates everything")
        for node in state.nodes:
            spec, allocatable = node["spec"], node["status"]["allocatable"]
            if spec.get("unschedulable"):
                found.add("cordoned")
            effects = {t["effect"] for t in spec.get("taints", []) if t["key"] == "node.kubernetes.io/not-ready"}
            if effects:
                found.add("not-ready " + "+".join(sorted(effects)))
            if any(t["key"] == "dedicated" and t["effect"] == "NoSchedule" for t in spec.get("taints", [])):
                found.add("untolerated taint")
            if int(allocatable.get("pods", "110")) <= 8:
                found.add("few pod slots")
    return found


def test_the_ci_states_cover_what_the_scheduler_weighs():
    got = features(_seeds(SEEDS))
    want = {
        "cordoned",
        "tolerates everything",
        "not-ready NoExecute+NoSchedule",
        "not-ready NoExecute",
        "untolerated taint",
        "few pod slots",
        "notebook:cpu_guarantee",
        "notebook:mem_guarantee",
        "notebook:mem_limit",
        "notebook:tolerations",
    }
    assert want <= got, f"the seeds {SEEDS} no longer cover {sorted(want - got)}"


def test_free_counts_equal_what_the_real_scheduler_binds(tmp_path):
    report = tmp_path / "truth.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpuspawner.devcluster.truth", "--seeds", SEEDS, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "capacity_truth.txt").write_text(done.stdout + done.stderr[-4000:])
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, f"{summary}\n{done.stdout[-6000:]}"
    results = json.loads(report.read_text())
    assert all(r["agrees"] for r in results)
    assert len(results) >= 60, summary  # enough offerings checked to mean something
    assert sum(r["predicted"] for r in results) > 0 and any(r["predicted"] == 0 for r in results)
    assert summary.startswith(f"{len(results)} of {len(results)} offerings agree over {len(_seeds(SEEDS))} states")
