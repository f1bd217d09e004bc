"""DRA capacity truth for GPU-memory shares and device taints: each offering's free count equals
the pods the real kube-scheduler binds (and kube-controller-manager's device taint eviction
leaves) with claims of that offering, over a few fixed states of each kind.

Runs ``python -m gpuspawner.devcluster.dratruth --kind capacity|taints`` (``make dra-truth``
checks 100 states of each) in its own process with its own devcluster;
GPUSPAWNER_DRA_SHARES_SEEDS replaces the seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuspawner.devcluster.dratruth_shares import draw_capacity, draw_taints
from gpuspawner.devcluster.truth import _seeds
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.cluster

SEEDS = os.environ.get("GPUSPAWNER_DRA_SHARES_SEEDS", "0-3")


def test_the_ci_states_cover_each_sharing_mode_rounding_and_each_taint_effect():
    capacity = [draw_capacity(s) for s in _seeds(SEEDS)]
    modes = {n.shares for s in capacity for n in s.nodes}
    assert {"memory", ""} <= modes and modes & {"unlimited", "2", "3", "4", "7"}
    assert any(h.memory and not h.memory.endswith("Mi") for s in capacity for h in s.held)  # bytes the allocator rounds up
    taints = [draw_taints(s) for s in _seeds(SEEDS)]
    effects = {t["effect"] for s in taints for n in s.nodes for ts in n.taints.values() for t in ts}
    assert effects == {"NoSchedule", "NoExecute", "None"} and all(s.variants for s in taints)


@pytest.mark.parametrize("kind", ["capacity", "taints"])
def test_free_counts_equal_what_the_real_scheduler_allocates(tmp_path, kind):
    report = tmp_path / f"dratruth-{kind}.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpuspawner.devcluster.dratruth", "--kind", kind, "--seeds", SEEDS, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"dra_truth_{kind}.txt").write_text(done.stdout + done.stderr[-4000:])
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, f"{summary}\n{done.stdout[-6000:]}"
    results = json.loads(report.read_text())
    assert all(r["agrees"] for r in results) and len(results) >= 8, summary
    assert sum(r["predicted"] for r in results) > 0
