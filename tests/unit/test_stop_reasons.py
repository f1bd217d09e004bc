"""The culler's stop reasons are spelled once (names.vocabulary.StopReason), and are on the wire
exactly the strings they were: the action log, the notices, the metrics' labels and the
notebook's GPU view read them."""

from __future__ import annotations

import json
import pathlib
import re

from gpuspawner.culler import records
from gpuspawner.names.vocabulary import StopReason

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gpuspawner"


def test_the_stop_reasons_on_the_wire() -> None:
    assert {r.value for r in StopReason} == {"idle", "max_age", "gpu_idle_limit", "unresponsive", "gpu_lease", "waiting", "budget"}
    assert json.dumps({"reason": StopReason.GPU_LEASE}) == '{"reason": "gpu_lease"}'
    assert f"{StopReason.MAX_AGE}" == "max_age" and StopReason.BUDGET == "budget"


def test_the_cullers_records_name_the_enum() -> None:
    for name in ("IDLE", "MAX_AGE", "GPU_IDLE_LIMIT", "UNRESPONSIVE", "GPU_LEASE", "WAITING", "BUDGET"):
        assert getattr(records, name) is StopReason[name]


def test_no_module_spells_a_stop_reason_again() -> None:
    """(The words that are only stop reasons; "idle", "waiting" and "budget" mean other things too.)"""
    spelled = re.compile(r"[\"'](max_age|gpu_idle_limit|gpu_lease|unresponsive)[\"']")
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "vocabulary.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if spelled.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found
