"""`gpuspawner record-nodeclaims`' record (gpuspawner/tools/nodeclaimlog.py), the pure part: on
the changes the real Karpenter v1.14.1 made (tests/data/karpenter/nodeclaims-watch.json, as in
tests/unit/test_nodehours.py) it writes a few trimmed lines per claim that give the node-hours
report the same lives; a claim gone while it did not watch, and a DELETED event without a
deletion time, are written deleted when heard; a restarted recorder writes nothing again."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gpuspawner.tools import nodehours
from gpuspawner.tools.nodeclaimlog import ClaimLog, read_back, trimmed
from tests.unit.test_nodehours import WATCH

HEARD = datetime(2026, 11, 29, 4, 50, tzinfo=UTC)


def changes() -> list[dict]:
    return nodehours.json_objects(WATCH.read_text(), "watch")


def test_the_record_gives_the_report_the_same_lives_in_fewer_lines():
    log = ClaimLog()
    written = [r for r in (log.changed(obj, HEARD) for obj in changes()) if r is not None]
    assert nodehours.node_lives(written) == nodehours.node_lives(changes())
    assert len(written) < len(changes())  # (status conditions and resource versions are not the report's)
    assert all(set(r["metadata"]) <= {"name", "uid", "labels", "creationTimestamp", "deletionTimestamp"} for r in written)
    assert {k for r in written for k in r["metadata"].get("labels", {})} == {
        "karpenter.sh/nodepool",
        "eks-node-viewer/instance-price",
        "nvidia.com/gpu.count",
    }
    assert all(set(r["status"]) <= {"nodeName", "allocatable"} for r in written)


def test_a_restarted_recorder_reads_back_what_it_wrote(tmp_path):
    path = tmp_path / "nodeclaims.jsonl"
    log = ClaimLog()
    lines = [json.dumps(r) for r in (log.changed(obj, HEARD) for obj in changes()) if r is not None]
    path.write_text("\n".join(lines) + "\n")
    again = read_back(path)
    assert [again.changed(obj, HEARD) for obj in changes()] == [None] * len(changes())
    assert read_back(tmp_path / "missing.jsonl").last == {}


def test_claims_deleted_unseen_are_written_deleted_when_heard():
    alive = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": "gpu-h100-abcde", "uid": "u1", "creationTimestamp": "2026-11-29T04:00:00Z", "resourceVersion": "7"},
        "status": {"nodeName": "kwok-1", "allocatable": {"nvidia.com/gpu": "8"}, "conditions": []},
    }
    log = ClaimLog()
    assert log.changed(alive, HEARD) == trimmed(alive)
    assert log.changed({**alive, "metadata": {**alive["metadata"], "resourceVersion": "8"}}, HEARD) is None
    # a DELETED event of a claim without Karpenter's finalizer: deleted when heard
    ended = log.changed(alive, HEARD, deleted=True)
    assert ended is not None and ended["metadata"]["deletionTimestamp"] == "2026-11-29T04:50:00Z"
    assert log.changed(alive, HEARD) is None  # a deletion once written stays written
    # a claim the next list no longer has (deleted while the recorder was down)
    other = {**alive, "metadata": {**alive["metadata"], "uid": "u2", "name": "gpu-h100-fghij"}}
    log.changed(other, HEARD)
    [gone] = log.gone([], HEARD)
    assert gone["metadata"]["name"] == "gpu-h100-fghij" and gone["metadata"]["deletionTimestamp"] == "2026-11-29T04:50:00Z"
    assert log.gone([], HEARD) == []
    [life] = [x for x in nodehours.node_lives([gone]) if x.name == "gpu-h100-fghij"]
    assert life.deleted == HEARD
