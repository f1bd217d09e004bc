"""A start the hub never finished (it restarted meanwhile) leaves the user a notice, and only then."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from gpuspawner.hub.lifecycle import interrupted_start_notice, start_was_interrupted


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
