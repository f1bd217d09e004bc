"""A start the hub never finished (it restarted meanwhile) leaves the user a notice, and only then."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

from gpuspawner.hub.lifecycle import (
    interrupted_start_notice,
    start_was_interrupted,
    stopped_by_the_restart_check,
    unanswered_after_restart_notice,
)
from gpuspawner.hub.spawnstate import SpawnState


def spawner(**kw):
    base = dict(offerings=[], discover_offerings=True, spawn_state=SimpleNamespace(saved_record=None, choice=None), stop_notice=None)
    base.update(kw)
    return SimpleNamespace(**base)


def test_a_server_the_hub_finds_without_a_record_of_its_start_was_interrupted():
    assert start_was_interrupted(spawner())


def test_a_finished_start_a_start_of_this_hub_a_kept_reason_or_plain_kubespawner_are_not():
    assert not start_was_interrupted(spawner(spawn_state=SimpleNamespace(saved_record={"offering": "cpu"}, choice=None)))
    assert not start_was_interrupted(spawner(spawn_state=SimpleNamespace(saved_record=None, choice=object())))
    assert not start_was_interrupted(spawner(stop_notice={"time": "x", "text": "stopped by Kueue"}))
    assert not start_was_interrupted(spawner(discover_offerings=False))  # KubeSpawner's own form: no record ever


def test_the_notice_says_what_happened_and_what_to_do():
    notice = interrupted_start_notice("train", datetime(2026, 11, 27, 14, 2, tzinfo=UTC))
    assert notice == {
        "time": "2026-11-27T14:02:00+00:00",
        "text": "Your server 'train' was starting when the hub restarted (at Nov 27 14:02 UTC), so it did not start. Please start it again.",
    }
    assert interrupted_start_notice("", datetime(2026, 11, 27, 14, 2, tzinfo=UTC))["text"].startswith("Your server was starting")


def found(**state):
    """A spawner as a restarted hub's start-up check finds it (its saved record loaded)."""
    spawn_state = SpawnState(saved_record={"offering": "cpu"})
    for key, value in state.items():
        setattr(spawn_state, key, value)
    return spawner(spawn_state=spawn_state)


def test_a_stop_of_a_found_server_that_never_answered_is_the_restart_checks():
    assert stopped_by_the_restart_check(found())
    assert stopped_by_the_restart_check(spawner(spawn_state=SpawnState()))  # (no record: the start itself was cut)


def test_a_stop_after_an_answer_a_start_or_a_refusal_of_this_hub_or_with_a_kept_reason_is_not():
    assert not stopped_by_the_restart_check(found(answered=True))  # the restarted hub heard it: the user's own stop
    assert not stopped_by_the_restart_check(found(started_at=12.5))
    decided = asyncio.Event()
    decided.set()
    assert not stopped_by_the_restart_check(found(decided=decided))  # refused or admitted by this hub
    assert not stopped_by_the_restart_check(spawner(spawn_state=SpawnState(saved_record={"offering": "cpu"}), stop_notice={"text": "x"}))
    assert not stopped_by_the_restart_check(spawner(spawn_state=SpawnState(choice=object())))
    assert not stopped_by_the_restart_check(spawner(spawn_state=SpawnState(), discover_offerings=False))


def test_the_unanswered_notice_says_what_happened_and_what_to_do():
    notice = unanswered_after_restart_notice("", datetime(2026, 11, 29, 0, 34, tzinfo=UTC), 30)
    assert notice["text"] == (
        "Your server did not answer the hub when the hub restarted (at Nov 29 00:34 UTC; it was probably still starting), "
        "so the hub stopped it after waiting 30 s. Please start it again."
    )


def test_a_refused_start_keeps_its_words_dated():
    from gpuspawner.hub.lifecycle import refused_start_notice

    notice = refused_start_notice(
        "lab", datetime(2026, 11, 29, 1, 5, tzinfo=UTC), "FPGA node cannot run now. The scheduler says: 0/3 nodes."
    )
    assert notice == {
        "time": "2026-11-29T01:05:00+00:00",
        "text": "Your server 'lab' did not start (at Nov 29 01:05 UTC): FPGA node cannot run now. The scheduler says: 0/3 nodes.",
    }
