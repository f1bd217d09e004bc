"""A queue that waits as long as JupyterHub's start_timeout or longer cannot work: the hub
gives the waiting spawn up first, saying only "timed out". check_config refuses that mix
wherever it is set (the default admission, an offering, an override), and says what to set."""

from __future__ import annotations

import pytest

from gpuspawner.capacity.checks import GPUSpawnerConfigError, check_config, config_problems, queue_problems
from gpuspawner.spawner import CHECKED_TRAITS

QUEUED = {"admission": "queue", "queue_timeout": 600}


def test_an_override_that_waits_past_start_timeout_is_refused_with_what_to_set():
    [problem] = queue_problems({"start_timeout": 300, "offering_overrides": {"mig-3g": QUEUED}})
    assert problem.startswith("c.GPUSpawner.offering_overrides['mig-3g']: a spawn may wait 600 s in the queue")
    assert "c.KubeSpawner.start_timeout is 300 s" in problem and "(e.g. 900)" in problem
    assert queue_problems({"start_timeout": 900, "offering_overrides": {"mig-3g": QUEUED}}) == []


@pytest.mark.parametrize(
    "section",
    [
        {"admission": "queue"},  # the default queue wait, 300 s, against JupyterHub's default 60 s
        {"admission": "queue", "queue_timeout": 120, "start_timeout": 120},  # equal is not shorter
        {"offerings": [{"slug": "h100", "admission": "queue", "queue_timeout": 400}], "start_timeout": 300},
        {"admission": "queue", "offering_overrides": {"h100": {"queue_timeout": 900}}, "start_timeout": 600},
    ],
)
def test_every_place_a_queue_is_set_is_checked(section):
    assert len(queue_problems(section)) == 1, section


def test_no_queue_no_problem_and_check_config_refuses_the_mix():
    assert queue_problems({"offering_overrides": {"h100": {"queue_timeout": 9000}}}) == []  # not queued: never waits
    assert queue_problems({"admission": "block", "start_timeout": 1}) == []
    assert config_problems({"admission": "queue", "queue_timeout": 30, "start_timeout": 300}) == []
    from traitlets.config import Config

    c = Config()
    c.KubeSpawner.start_timeout = 300
    c.GPUSpawner.offering_overrides = {"mig-3g": QUEUED}
    with pytest.raises(GPUSpawnerConfigError, match="start_timeout"):
        check_config(c)
    c.KubeSpawner.start_timeout = 900
    check_config(c)


def test_the_spawner_checks_its_own_start_and_queue_timeouts():
    assert {"start_timeout", "queue_timeout"} <= set(CHECKED_TRAITS)
