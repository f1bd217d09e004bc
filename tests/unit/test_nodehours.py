"""GPU node-hours from Karpenter's NodeClaims and what the culler's idle reclaims let go
(gpuspawner/tools/nodehours.py, `gpuspawner report --nodeclaims`): on what the real Karpenter
v1.14.1 wrote (tests/data/karpenter/nodeclaims-watch.json: `kubectl get nodeclaims -o json
--watch` during tests/karpenter/test_karpenter_disruption.py, two H100 nodes of the pool
`consolidating-h100`, each deleted once emptied), and on the culler's action records."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuspawner.culler.gpu_metrics import DeviceReading, PodGpuView, device_name
from gpuspawner.culler.notices import gpu_nodes
from gpuspawner.tools import nodehours, report

WATCH = Path(__file__).parent.parent / "data" / "karpenter" / "nodeclaims-watch.json"
POOL = "consolidating-h100"
KEPT = "consolidating-h100-jpfwt"  # created 04:38:56, deleted 04:41:24 (after the notebook stopped)
ANCHOR = "consolidating-h100-snpxr"  # created 04:38:04, deleted 04:41:29
START = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
END = datetime(2026, 11, 29, 5, 0, tzinfo=UTC)


def t(text: str) -> datetime:
    return datetime.fromisoformat(f"2026-11-29T{text}+00:00")


def lives() -> list[nodehours.NodeLife]:
    return nodehours.node_lives(nodehours.json_objects(WATCH.read_text(), "watch"))


def test_each_claim_lives_from_creation_to_the_start_of_its_deletion_as_karpenter_wrote_it():
    by_name = {life.name: life for life in lives()}
    assert set(by_name) == {KEPT, ANCHOR}  # ten changes of two NodeClaims: the last state of each
    kept = by_name[KEPT]
    assert (kept.created, kept.deleted) == (t("04:38:56"), t("04:41:24"))
    assert kept.pool == POOL and kept.gpus == 8 and kept.price == 40.0  # GFD's count; the kwok provider's price label
    assert kept.node.startswith("kwok-consolidating-h100-jpfwt-")


def test_held_hours_per_pool_and_the_node_an_idle_reclaim_let_go():
    claims = lives()
    node = next(life.node for life in claims if life.name == KEPT)
    actions = [
        {"time": "2026-11-29T04:41:10+00:00", "action": "server_stopped", "reason": "idle", "user": "ada", "nodes": [node]},
        {"time": "2026-11-29T04:41:00+00:00", "action": "server_stopped", "reason": "gpu_lease", "nodes": [node]},  # not idle
        {"time": "2026-11-29T04:41:00+00:00", "action": "kernels_shut_down", "reason": "idle", "nodes": [node]},  # no stop
    ]
    pools = nodehours.measure(claims, nodehours.idle_reclaims(actions), START, END)
    row = pools[POOL]
    held = (t("04:41:24") - t("04:38:56")) + (t("04:41:29") - t("04:38:04"))
    assert row.nodes == 2 and row.node_hours == pytest.approx(held.total_seconds() / 3600)
    assert row.gpu_node_hours == pytest.approx(8 * row.node_hours) and row.cost == pytest.approx(40.0 * row.node_hours)
    [release] = row.releases
    assert (release.claim, release.user, release.minutes_after_reclaim) == (KEPT, "ada", pytest.approx(14 / 60))
    # the pool made no node after it: it ran without it to the range's end
    assert release.not_held_h == pytest.approx((END - t("04:41:24")).total_seconds() / 3600)
    assert row.gpu_hours_not_held == pytest.approx(8 * release.not_held_h)
    assert row.cost_not_paid == pytest.approx(40.0 * release.not_held_h)
    text = nodehours.render(pools)
    assert f"  {POOL}: 2 node(s), " in text and "1 node(s) let go after an idle reclaim (on average 0.2 min after it)" in text
    # each node let go, by name, with its own saving
    gap = release.not_held_h
    assert (
        f"      NodeClaim {KEPT} (node {node}): deleted 0.2 min after ada's idle server was stopped at 2026-11-29 04:41:10 UTC; "
        f"the pool then ran {gap * 60:.1f} min without it ({8 * gap:,.2f} GPU node-hours, ${40 * gap:,.2f} not paid)"
    ) in text, text
    # a node let go seconds ago has saved a little, not nothing: the table says it, the JSON to the second
    soon = nodehours.measure(claims, nodehours.idle_reclaims(actions), START, t("04:41:25"))[POOL]
    assert "the pool then ran 1 s without it (0.0022 GPU node-hours, $0.01 not paid)" in nodehours.render({POOL: soon})
    [as_json] = json.loads(nodehours.render({POOL: soon}, "json"))
    assert as_json["gpu_node_hours_not_held"] == pytest.approx(8 / 3600, abs=1e-6) and as_json["cost_not_paid"] > 0


def test_a_reclaim_too_long_before_or_on_another_node_releases_nothing_and_a_new_node_ends_the_gap():
    claims = lives()
    node = next(life.node for life in claims if life.name == KEPT)
    late = [{"time": "2026-11-29T04:00:00+00:00", "action": "server_stopped", "reason": "idle", "nodes": [node]}]
    assert nodehours.measure(claims, nodehours.idle_reclaims(late), START, END)[POOL].releases == []
    other = [{"time": "2026-11-29T04:41:00+00:00", "action": "server_stopped", "reason": "idle", "nodes": ["elsewhere"]}]
    assert nodehours.measure(claims, nodehours.idle_reclaims(other), START, END)[POOL].releases == []
    # a later node of the pool: the gap ends when it was created
    grown = nodehours.NodeLife("later", POOL, "n", 8, t("04:50:00"), None, 40.0)
    ok = [{"time": "2026-11-29T04:41:00+00:00", "action": "server_stopped", "reason": "waiting", "nodes": [node]}]
    [release] = nodehours.measure([*claims, grown], nodehours.idle_reclaims(ok), START, END)[POOL].releases
    assert release.not_held_h == pytest.approx((t("04:50:00") - t("04:41:24")).total_seconds() / 3600)


def test_hours_are_clipped_to_the_range_and_an_unknown_price_says_so():
    claims = lives()
    pools = nodehours.measure(claims, [], t("04:40:00"), t("04:41:00"))
    assert pools[POOL].node_hours == pytest.approx(2 / 60)
    no_price = [nodehours.NodeLife("x", "p", "n", 1, t("04:00:00"), None, None)]
    assert nodehours.measure(no_price, [], START, END)["p"].cost is None
    assert "price unknown" in nodehours.render(nodehours.measure(no_price, [], START, END))


def test_bad_input_is_named():
    with pytest.raises(nodehours.NodeHoursError, match="not JSON"):
        nodehours.json_objects('{"kind": ', "f")
    as_list = json.dumps({"apiVersion": "v1", "kind": "List", "items": nodehours.json_objects(WATCH.read_text(), "w")})
    assert len(nodehours.json_objects(as_list, "f")) == 10 and len(nodehours.json_objects("[" + '{"a": 1}' + "]", "f")) == 1
    with pytest.raises(nodehours.NodeHoursError, match="an entry is not a JSON object"):
        nodehours.json_objects("[1]", "f")
    with pytest.raises(nodehours.NodeHoursError, match="not a Karpenter NodeClaim"):
        nodehours.node_lives([{"apiVersion": "v1", "kind": "Node"}])
    bad_time = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "a", "labels": {"nvidia.com/gpu.count": "1"}}}
    with pytest.raises(nodehours.NodeHoursError, match="creationTimestamp: no time"):
        nodehours.node_lives([bad_time])
    cpu_only = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": "c", "creationTimestamp": "2026-11-29T04:00:00Z"},
    }
    assert nodehours.node_lives([cpu_only]) == []  # no GPU: not counted


def test_the_report_reads_the_files_and_refuses_bad_ones_in_one_line(tmp_path, capsys):
    actions = tmp_path / "actions.jsonl"
    node = next(life.node for life in lives() if life.name == KEPT)
    actions.write_text(json.dumps({"time": "2026-11-29T04:41:10Z", "action": "server_stopped", "reason": "idle", "nodes": [node]}) + "\n")
    args = [
        "--nodeclaims",
        str(WATCH),
        "--actions",
        str(actions),
        "--since",
        "1h",
        "--until",
        "2026-11-29T05:00:00Z",
        "--prometheus-url",
        "",
    ]
    assert report.main(args) == 0
    out = capsys.readouterr().out
    assert "GPU nodes of autoscaled pools (measured from Karpenter's NodeClaims):" in out and "let go after an idle reclaim" in out
    assert report.main([*args, "--format", "json", "--pool-price", f"{POOL}=2.5"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["released_after_idle_reclaim"] == 1 and row["cost"] == pytest.approx(2.5 * row["node_hours"], abs=0.01)
    assert report.main([*args, "--pool-price", "gpu-h100"]) == 1
    assert "--pool-price 'gpu-h100': write POOL=PRICE" in capsys.readouterr().err
    assert report.main(["--nodeclaims", str(tmp_path / "missing.json"), "--prometheus-url", ""]) == 1
    assert "cannot read it" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert report.main(["--nodeclaims", str(tmp_path / "bad.json"), "--prometheus-url", ""]) == 1
    assert "not JSON" in capsys.readouterr().err


def test_the_cullers_action_record_names_the_nodes_dcgm_exporter_put_the_gpus_on():
    name, _ = device_name({"Hostname": "kwok-gpu-h100-abc", "gpu": "0", "UUID": "GPU-1"})
    scraped, _ = device_name({"instance": "10.0.0.5:9400", "gpu": "1", "UUID": "GPU-2"})
    view = PodGpuView("idle", "quiet", devices=(DeviceReading(name, False), DeviceReading(scraped, False)))
    assert gpu_nodes(view) == ["kwok-gpu-h100-abc"]  # a scrape address is no node
    assert gpu_nodes(PodGpuView("unknown", "")) == [] and gpu_nodes(None) == []
