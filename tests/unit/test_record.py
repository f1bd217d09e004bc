"""The record GPUSpawner writes and every reader reads: one dataclass, one set of keys."""

from __future__ import annotations

import json

from gpuspawner.culler.contract import parse_offering
from gpuspawner.hub.spawnstate import SpawnState, saved_holdings, server_record
from gpuspawner.names.record import GpuRecord
from gpuspawner.offerings.choice import Choice
from tests.offerings import H100, MIG_1G, offering


def written(chosen, count=1, **state):
    return server_record(SpawnState(choice=Choice(chosen, count), **state), "jupyter-ann", "jhub", "http://10.0.0.5:8888/user/ann/")


def test_what_the_spawner_writes_reads_back_the_same_on_every_side():
    raw = json.loads(json.dumps(written(offering(H100), 2, devices=[{"driver": "gpu.nvidia.com", "device": "gpu-0"}])))
    record, problems = GpuRecord.from_json(raw)
    assert problems == {} and record.to_json() == raw  # the JSON round trip loses nothing
    assert (record.offering, record.kind, record.count, record.pod, record.namespace) == ("h100", "full", 2, "jupyter-ann", "jhub")
    seen = parse_offering({"offering": "h100", "gpuspawner": raw})  # the culler's reading of the same record
    assert (seen.slug, seen.kind, seen.pod, seen.url, dict(seen.resources)) == (
        record.offering,
        record.kind,
        record.pod,
        record.url,
        dict(record.resources),
    )
    assert seen.devices == record.devices
    assert saved_holdings([("ann", raw)])["jhub/jupyter-ann"].units == 2  # and a restarted hub's quotas


def test_a_malformed_record_is_read_as_far_as_it_is_well_formed():
    raw = written(offering(MIG_1G)) | {"count": "2", "resources": ["x"], "devices": "gpu-0"}
    record, problems = GpuRecord.from_json(raw)
    assert record.count is None and record.resources == {} and record.devices is None
    assert sorted(problems) == ["count", "devices", "resources"] and all(repr(key) in p for key, p in problems.items())
    assert saved_holdings([("ann", raw)]) == {}  # no whole count: a restarted hub counts nothing for it
