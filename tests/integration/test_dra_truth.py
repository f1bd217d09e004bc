"""DRA capacity truth: each DRA offering's free count equals the pods the real kube-scheduler
binds with claims of that offering, over random states of the simulated NVIDIA driver (pools
split over slices, a newer generation published beside the old one, devices other users hold).

Runs gpuspawner.devcluster.dratruth (``make dra-truth`` checks 100 states) in its own process
with its own devcluster, on a few fixed seeds; GPUSPAWNER_DRA_TRUTH_SEEDS replaces them. The same
for dynamic MIG (``--kind dynamic-mig``: free counts per MIG profile from counter sets), whose seeds
GPUSPAWNER_DRA_TRUTH_DYNAMIC_MIG_SEEDS replaces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuspawner.devcluster import dratruth_counters
from gpuspawner.devcluster.dratruth import draw_state
from gpuspawner.devcluster.truth import _seeds
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.cluster

SEEDS = os.environ.get("GPUSPAWNER_DRA_TRUTH_SEEDS", "0-3")
DYNAMIC_MIG_SEEDS = os.environ.get("GPUSPAWNER_DRA_TRUTH_DYNAMIC_MIG_SEEDS", "0-2,5")


def test_the_ci_states_cover_split_pools_newer_generations_and_held_devices():
    states = [draw_state(s) for s in _seeds(SEEDS)]
    layouts = [layout for s in states for layout in s.layout.values()]
    assert any(gen > 1 for gen, _ in layouts) and any(count > 1 for _, count in layouts)
    assert any(s.held for s in states) and any(n.mig for s in states for n in s.nodes)


def run_dratruth(tmp_path, seeds: str, *kind: str) -> list[dict]:
    """``python -m gpuspawner.devcluster.dratruth`` on ``seeds``; its exit status and every offering's result."""
    report = tmp_path / "dratruth.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpuspawner.devcluster.dratruth", *kind, "--seeds", seeds, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"dra_truth{'_' + kind[-1] if kind else ''}.txt").write_text(done.stdout + done.stderr[-4000:])
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, f"{summary}\n{done.stdout[-6000:]}"
    results = json.loads(report.read_text())
    assert all(r["agrees"] for r in results), summary
    return results


def test_dra_free_counts_equal_what_the_real_scheduler_allocates(tmp_path):
    results = run_dratruth(tmp_path, SEEDS)
    assert len(results) >= 8
    assert sum(r["predicted"] for r in results) > 0


def test_the_dynamic_mig_ci_states_cover_other_users_holes_two_gpus_static_mig_and_newer_generations():
    states = [dratruth_counters.draw_state(s) for s in _seeds(DYNAMIC_MIG_SEEDS)]
    assert any(s.stops for s in states) and any(len(s.asks) > len(s.stops) for s in states)
    assert any(n.dynamic_mig and n.gpus > 1 for s in states for n in s.nodes)
    assert any(n.mig for s in states for n in s.nodes)  # static MIG devices in the same offerings
    assert any(gen > 1 for s in states for gen, _ in s.layout.values())


@pytest.mark.k8s("1.36", "partitionable devices (DRAPartitionableDevices)")
def test_dynamic_mig_free_counts_per_profile_equal_what_the_real_scheduler_allocates(tmp_path):
    results = run_dratruth(tmp_path, DYNAMIC_MIG_SEEDS, "--kind", "dynamic-mig")
    assert len({r["slug"] for r in results}) == 7  # every A100-40GB profile
    assert sum(r["predicted"] for r in results) > 0 and any(r["predicted"] == 0 for r in results)


EXTRES_SEEDS = os.environ.get("GPUSPAWNER_DRA_TRUTH_EXTRES_SEEDS", "0-3")


def test_the_extended_resource_states_mix_both_kinds_of_node_and_both_kinds_of_holder():
    from gpuspawner.devcluster.dratruth_extres import draw_state as draw_extres

    states = [draw_extres(s) for s in _seeds(EXTRES_SEEDS)]
    dra_nodes = {n.name for s in states for n in s.nodes}
    assert any(s.plugin for s in states) and any(node in dra_nodes for s in states for node, _ in s.plain)


@pytest.mark.k8s("1.36", "the extended-resource mapping (DRAExtendedResource)")
def test_plain_gpu_offerings_count_mapped_dra_gpus_as_the_real_scheduler_allocates_them(tmp_path):
    """``--kind extres``: plain nvidia.com/gpu offerings over device-plugin and DRA nodes (``make dra-truth`` checks 100 states)."""
    results = run_dratruth(tmp_path, EXTRES_SEEDS, "--kind", "extres")
    plain = [r for r in results if r["slug"] in ("h100-plain", "any-gpu-plain")]
    assert len(plain) == len(_seeds(EXTRES_SEEDS)) and sum(r["predicted"] for r in plain) > 0


SHARES_SEEDS = os.environ.get("GPUSPAWNER_DRA_SHARES_SEEDS", "0-3")


def test_the_ci_states_cover_each_sharing_mode_rounding_and_each_taint_effect():
    from gpuspawner.devcluster.dratruth_shares import draw_capacity, draw_taints

    capacity = [draw_capacity(s) for s in _seeds(SHARES_SEEDS)]
    modes = {n.shares for s in capacity for n in s.nodes}
    assert {"memory", ""} <= modes and modes & {"unlimited", "2", "3", "4", "7"}
    assert any(h.memory and not h.memory.endswith("Mi") for s in capacity for h in s.held)  # bytes the allocator rounds up
    taints = [draw_taints(s) for s in _seeds(SHARES_SEEDS)]
    effects = {t["effect"] for s in taints for n in s.nodes for ts in n.taints.values() for t in ts}
    assert effects == {"NoSchedule", "NoExecute", "None"} and all(s.variants for s in taints)


@pytest.mark.k8s("1.36", "consumable capacity and device taints (DRAConsumableCapacity, DRADeviceTaints)")
@pytest.mark.parametrize("kind", ["capacity", "taints"])
def test_share_and_taint_free_counts_equal_what_the_real_scheduler_allocates(tmp_path, kind):
    """``--kind capacity|taints``: GPU-memory shares, and tainted devices with claims that tolerate them
    (the device taint eviction included); ``make dra-truth`` checks 100 states of each."""
    results = run_dratruth(tmp_path, SHARES_SEEDS, "--kind", kind)
    assert len(results) >= 8 and sum(r["predicted"] for r in results) > 0


MIXED_SEEDS = os.environ.get("GPUSPAWNER_DRA_TRUTH_MIXED_SEEDS", "3,15,28,35")


def test_the_mixed_ci_states_cover_cordons_node_taints_tight_cpu_device_taints_and_rules():
    """Issue 41's cases, each in at least one CI state: a cordoned node, a node taint the pods do not
    tolerate, a node with cpu for one or two notebooks only, device taints in slices, DeviceTaintRules."""
    from gpuspawner.devcluster.dratruth_mixed import draw_state as draw_mixed

    states = [draw_mixed(s) for s in _seeds(MIXED_SEEDS)]
    assert any(s.cordoned for s in states) and any(s.node_tainted for s in states)
    assert any(29.0 <= cores < 31.0 for s in states for cores in s.cpu_hog.values())
    assert any(n.taints for s in states for n in s.nodes) and any(s.rules for s in states)
    assert any(n.labels for s in states for n in s.nodes)  # H100s labelled as GFD labels them: the mapping serves them
    assert any(s.alternatives for s in states) and any(n.shares for s in states for n in s.nodes)  # dynamic MIG, memory shares
    assert any(s.other_driver for s in states) and any("driver" not in sel for s in states for _, sel, _ in s.rules)


@pytest.mark.k8s("1.37", "DeviceTaintRule in resource.k8s.io/v1 (DRADeviceTaintRules) and the mapping (DRAExtendedResource)")
def test_dra_and_mapped_counts_apply_the_nodes_filters_and_device_taint_rules_as_the_real_scheduler_does(tmp_path):
    """``--kind mixed``: the discovered DRA offerings (some also tolerating the node taint), dynamic MIG
    alternatives, memory shares, a second driver's class and both mapped resources' plain offerings;
    ``make dra-truth`` checks 200 states."""
    results = run_dratruth(tmp_path, MIXED_SEEDS, "--kind", "mixed")
    slugs = {r["slug"] for r in results}
    assert {"any-gpu-plain", "example-plain", "example-dra"} <= slugs and any("-or-" in slug for slug in slugs)
    assert any(r["slug"] == "any-gpu-plain" and r["predicted"] > 0 for r in results)
    assert any(r["slug"].startswith("dra-mig-") and r["predicted"] > 0 for r in results)
    assert len([r for r in results if r["slug"].startswith("cli:")]) * 2 == len(results)  # the CLI's count of each, too
