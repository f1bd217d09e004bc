"""A notebook whose node Karpenter drained (issue 42, nodes that vanish under a running notebook):
the home page says Karpenter's reason, read from its event on the pod (hub/departures.py,
core/noticewords.py), instead of the bare "evicted through the Kubernetes eviction API". The
events are Karpenter v1.14.1's as the real controller published them on the devcluster
(tests/data/karpenter/pod-events.json, recorded during tests/karpenter/test_karpenter_disruption.py)
and, for the reasons that run could not show, as its source writes them
(pkg/controllers/node/termination/terminator/events/events.go)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuspawner.hub.departures import home_notice, karpenter_departure

EVENTS = Path(__file__).parent.parent / "data" / "karpenter" / "pod-events.json"
NOW = datetime(2026, 11, 28, 14, 5, tzinfo=UTC)
GONE = {"reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting", "node": "kwok-gpu-h100-x", "time": "2026-11-28T14:02:00Z"}


def event(reason: str, message: str, component: str = "karpenter") -> dict:
    return {
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "involvedObject": {"kind": "Pod", "name": "jupyter-ada"},
    }


def test_the_real_karpenters_eviction_of_an_unprotected_notebook_says_consolidation():
    events = json.loads(EVENTS.read_text())
    assert karpenter_departure(events) == "Underutilized"
    text = home_notice(GONE, False, "train", NOW, karpenter_departure(events))["text"]
    assert text == (
        "Your server 'train' was stopped at Nov 28 14:02 UTC because Karpenter, the cluster's node autoscaler, took its node"
        " kwok-gpu-h100-x away to pack underused nodes together (consolidation). Please start it again."
    )


@pytest.mark.parametrize(
    "events, words",
    [
        (
            [event("Evicted", "Evicted pod: Drifted")],
            "replaced its node kwok-gpu-h100-x, which no longer matched its node pool's settings (drift)",
        ),
        ([event("Evicted", "Evicted pod: Forceful Termination")], "ended its node kwok-gpu-h100-x (it expired, the cloud took it back"),
        (
            [event("Disrupted", "Deleting the pod to accommodate the terminationTime 2026-11-28 14:02:00 +0000 UTC of the node. ...")],
            "when the node's grace period ran out, which overrides the notebook's protection",
        ),
        ([event("Evicted", "Evicted pod: SomethingNew")], "removed its node kwok-gpu-h100-x (SomethingNew)"),
    ],
)
def test_each_of_karpenters_reasons_in_words(events, words):
    said = karpenter_departure(events)
    assert words in home_notice(GONE, False, "", NOW, said)["text"]


def test_without_karpenters_event_the_clusters_own_words_stay():
    others = [event("Evicted", "Evicted pod: Underutilized", component="someone-else"), event("Scheduled", "assigned", "default-scheduler")]
    assert karpenter_departure(others) == "" and karpenter_departure([]) == ""
    assert "evicted through the Kubernetes eviction API" in home_notice(GONE, False, "", NOW, karpenter_departure(others))["text"]
