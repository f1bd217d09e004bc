"""DRA capacity truth: each DRA offering's free count equals the pods the real kube-scheduler
binds with claims of that offering, over random states of the simulated NVIDIA driver (pools
split over slices, a newer generation published beside the old one, devices other users hold).

Runs gpuspawner.devcluster.dratruth (``make dra-truth`` checks 100 states) in its own process
with its own devcluster, on a few fixed seeds; GPUSPAWNER_DRA_TRUTH_SEEDS replaces them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuspawner.devcluster.dratruth import draw_state
from gpuspawner.devcluster.truth import _seeds
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.cluster

SEEDS = os.environ.get("GPUSPAWNER_DRA_TRUTH_SEEDS", "0-3")


def test_the_ci_states_cover_split_pools_newer_generations_and_held_devices():
    states = [draw_state(s) for s in _seeds(SEEDS)]
    layouts = [layout for s in states for layout in s.layout.values()]
    assert any(gen > 1 for gen, _ in layouts) and any(count > 1 for _, count in layouts)
    assert any(s.held for s in states) and any(n.mig for s in states for n in s.nodes)


def dratruth(tmp_path, artifact: str, *args: str) -> tuple[list[dict], str]:
    """Run ``python -m gpuspawner.devcluster.dratruth`` with ``args``: its results, and its summary line."""
    report = tmp_path / "dratruth.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpuspawner.devcluster.dratruth", *args, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / artifact).write_text(done.stdout + done.stderr[-4000:])
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, f"{summary}\n{done.stdout[-6000:]}"
    return json.loads(report.read_text()), summary


def test_dra_free_counts_equal_what_the_real_scheduler_allocates(tmp_path):
    results, summary = dratruth(tmp_path, "dra_truth.txt", "--seeds", SEEDS)
    assert all(r["agrees"] for r in results) and len(results) >= 8, summary
    assert sum(r["predicted"] for r in results) > 0


EXTRES_SEEDS = os.environ.get("GPUSPAWNER_DRA_TRUTH_EXTRES_SEEDS", "0-3")


def test_the_extended_resource_states_mix_both_kinds_of_node_and_both_kinds_of_holder():
    from gpuspawner.devcluster.dratruth_extres import draw_state as draw_extres

    states = [draw_extres(s) for s in _seeds(EXTRES_SEEDS)]
    dra_nodes = {n.name for s in states for n in s.nodes}
    assert any(s.plugin for s in states) and any(node in dra_nodes for s in states for node, _ in s.plain)


def test_plain_gpu_offerings_count_mapped_dra_gpus_as_the_real_scheduler_allocates_them(tmp_path):
    """``--kind extres``: plain nvidia.com/gpu offerings over device-plugin and DRA nodes (``make dra-truth`` checks 100 states)."""
    results, summary = dratruth(tmp_path, "dra_truth_extres.txt", "--kind", "extres", "--seeds", EXTRES_SEEDS)
    plain = [r for r in results if r["slug"] in ("h100-plain", "any-gpu-plain")]
    assert all(r["agrees"] for r in results) and len(plain) == len(_seeds(EXTRES_SEEDS)), summary
    assert sum(r["predicted"] for r in plain) > 0
