"""Which servers go through Kueue: the LocalQueue and priority class each pod is labelled with,
the most specific mapping winning, and check_config refusing a mapping that cannot work."""

from __future__ import annotations

import pytest

from gpuspawner.capacity.checks import config_problems
from gpuspawner.capacity.kueuequeues import KueueRouting, routing_problems
from gpuspawner.names.kueuenames import PRIORITY_LABEL, QUEUE_LABEL
from gpuspawner.offerings.config import offering_from_config

H100 = offering_from_config({"slug": "h100", "kind": "full", "product": "NVIDIA-H100-80GB-HBM3"}, 0)
MIG = offering_from_config({"slug": "mig-1g", "kind": "mig", "profile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB"}, 0)
CPU = offering_from_config({"slug": "cpu", "kind": "cpu"}, 0)

ROUTING = KueueRouting.from_settings(
    {"default": "gpu", "groups": {"ml-course": "ml-course", "staff": "staff"}, "offerings": {"h100": "research"}},
    {"staff": "interactive-high"},
)


def test_the_most_specific_mapping_wins_and_cpu_goes_only_where_named():
    assert ROUTING.queue_for(H100, ["ml-course"]) == "research"  # the offering's own
    assert ROUTING.queue_for(MIG, ["ml-course", "staff"]) == "ml-course"  # the first group listed
    assert ROUTING.queue_for(MIG, ["staff", "ml-course"]) == "ml-course"  # (the config's order, not the user's)
    assert ROUTING.queue_for(MIG, []) == "gpu"
    assert ROUTING.queue_for(CPU, ["ml-course"]) == ""
    assert KueueRouting.from_settings({"offerings": {"cpu": "cpu-queue"}}).queue_for(CPU, []) == "cpu-queue"
    assert KueueRouting.from_settings({"default": "gpu", "offerings": {"h100": ""}}).queue_for(H100, []) == ""


def test_labels_carry_the_queue_and_the_groups_priority_class():
    assert ROUTING.labels(MIG, ["staff"]) == {QUEUE_LABEL: "staff", PRIORITY_LABEL: "interactive-high"}
    assert ROUTING.labels(MIG, []) == {QUEUE_LABEL: "gpu"}
    assert ROUTING.labels(CPU, ["staff"]) == {}  # not through Kueue: no priority either
    assert not KueueRouting().enabled and KueueRouting().labels(H100, []) == {}


@pytest.mark.parametrize(
    "queues, priorities, words",
    [
        ({"default": "GPU_Queue"}, {}, "['default'] must be a LocalQueue's name"),
        ({"queues": {"a": "b"}}, {}, "unknown key(s) ['queues']"),
        ({"groups": {"ml": ""}}, {}, "['groups']['ml'] must be a LocalQueue's name"),
        ({"groups": ["ml"]}, {}, "['groups'] must be a dict"),
        ("gpu", {}, "must be a dict with 'default'"),
        ({}, {"staff": 3}, "kueue_priority_classes['staff'] must be a WorkloadPriorityClass's name"),
    ],
)
def test_a_wrong_mapping_is_refused_naming_the_setting(queues, priorities, words):
    [problem] = routing_problems(queues, priorities)
    assert words in problem
    assert any(words in p for p in config_problems({"kueue_queues": queues, "kueue_priority_classes": priorities}))


def test_waiting_in_the_hubs_queue_and_in_kueues_is_refused():
    [problem] = config_problems({"kueue_queues": {"default": "gpu"}, "admission": "queue", "start_timeout": 900})
    assert "c.GPUSpawner.admission is 'queue'" in problem and "two queues" in problem
    offering = {"slug": "h100", "kind": "full", "product": "NVIDIA-H100-80GB-HBM3", "admission": "queue"}
    [problem] = config_problems({"kueue_queues": {"offerings": {"h100": "research"}}, "offerings": [offering], "start_timeout": 900})
    assert "offering 'h100' goes through Kueue" in problem
    assert config_problems({"kueue_queues": {"offerings": {"h100": "research"}}, "admission": "queue", "start_timeout": 900}) == []
    assert config_problems({"kueue_queues": {"default": "gpu"}, "admission": "warn"}) == []
