"""How a refused spawn becomes the hub's answer, which user_options keys survive, and what
the page says when the counts are not live. (Through a real hub: tests/api.)"""

from __future__ import annotations

import asyncio
import gc
import io
import logging
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from jupyterhub.spawner import SpawnException

from gpuspawner.capacity.index import Health
from gpuspawner.core.model import CPU_OFFERING
from gpuspawner.core.wording import counts_notice, unreachable_message
from gpuspawner.hub.hubhooks import RefusalsOnOneLine, log_refusals_on_one_line
from gpuspawner.hub.scheduling import REFUSAL_STATUS, SpawnRefused
from gpuspawner.offerings.choice import MALFORMED, NOT_OFFERED, ChoiceError, parse_choice
from gpuspawner.page.useroptions import check_profile, describe_keys, known_keys, split_known

ZURICH = ZoneInfo("Europe/Zurich")
NOW = datetime(2026, 11, 24, 14, 3, 51, tzinfo=ZURICH)


# ----------------------------------------------------------------------------- statuses


@pytest.mark.parametrize(
    "reason, status",
    [
        ("malformed", 400),
        ("not_offered", 403),
        ("window", 403),
        ("no_capacity", 409),
        ("queue_timeout", 409),
        ("unschedulable", 409),
        ("quota", 429),
        ("unreachable", 503),
        ("misconfigured", 503),
    ],
)
def test_each_refusal_reason_has_its_status(reason, status):
    refused = SpawnRefused("The message the page shows.", reason)
    assert refused.status_code == status and REFUSAL_STATUS[reason] == status
    # What JupyterHub reads: the JSON message, the spawn-pending page's, the metric's reason label.
    assert isinstance(refused, SpawnException)
    assert refused.jupyterhub_message == refused.message == str(refused) == "The message the page shows."
    assert refused.reason == reason
    assert refused.log_message == ""  # tornado logs no second line for it
    assert getattr(refused, "headers", {}).get("Retry-After") == ("30" if status == 503 else None)


def test_a_message_with_a_percent_sign_is_shown_as_it_is():
    refused = SpawnRefused("50% of an A100 is over your quota.", "quota")
    assert str(refused) == refused.jupyterhub_message == "50% of an A100 is over your quota."


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"offering": "h100x"}, NOT_OFFERED),  # unknown
        ({"offering": "h100"}, NOT_OFFERED),  # forbidden: the same answer as unknown
        ({"offering": "CPU"}, MALFORMED),  # cannot be a slug at all
        ({"offering": 5}, MALFORMED),
        ({"offering": "cpu", "count": "1e9"}, MALFORMED),
        ({"offering": "cpu", "count": 2}, MALFORMED),  # not one of the offering's counts
        ([("offering", "cpu")], MALFORMED),
    ],
)
def test_choice_errors_say_whether_the_request_is_malformed_or_names_nothing_offered(options, reason):
    with pytest.raises(ChoiceError) as info:
        parse_choice(options, {"cpu": CPU_OFFERING}, "cpu")
    assert info.value.reason == reason


def test_nothing_offered_at_all_is_not_offered():
    with pytest.raises(ChoiceError) as info:
        parse_choice({}, {}, None)
    assert info.value.reason == NOT_OFFERED


# ----------------------------------------------------------------------------- the log


def record(exc: BaseException | None, msg: str = "Failed to spawn single-user server with form") -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc else None
    return logging.LogRecord("JupyterHub", logging.ERROR, __file__, 1, msg, None, exc_info)


def test_a_refusal_nobody_awaited_is_one_line_in_asyncios_log_too():
    """A spawn refused after the page stopped waiting (slow_spawn_timeout on a busy hub): asyncio
    logs JupyterHub's unawaited finish-spawn task when it is collected, with the refusal."""
    log_refusals_on_one_line(logging.getLogger("test-hub"))
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logging.getLogger("asyncio").addHandler(handler)

    async def finish_user_spawn():
        raise SpawnRefused("The profile 'nope' is not offered.", "not_offered")

    async def page():
        task = asyncio.ensure_future(finish_user_spawn())
        await asyncio.sleep(0.01)
        assert task.done()

    try:
        asyncio.run(page())
        gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    assert "Task exception was never retrieved" in out.getvalue()
    assert "The profile 'nope' is not offered." in out.getvalue()
    assert "Traceback" not in out.getvalue()


def test_a_logged_refusal_is_one_line_with_its_message():
    line = record(SpawnRefused("The GPU option 'x' is not offered to you.", "not_offered"))
    assert RefusalsOnOneLine().filter(line)
    assert line.exc_info is None and line.exc_text is None
    text = logging.Formatter().format(line)
    assert text == "Failed to spawn single-user server with form: The GPU option 'x' is not offered to you."
    assert "\n" not in text


def test_the_spawn_pages_echoes_of_a_refused_start_are_dropped():
    """A refusal happens as the server starts, where User.spawn logs its line; the spawn page
    (form POST, or /hub/spawn?...) logs the same failure twice more when it shows the form again."""
    refusal = SpawnRefused("The GPU option 'x' is not offered to you.", "not_offered")
    refusal.during_start = True  # as GPUSpawner._start marks it
    for func in ("_post", "get"):
        echo = logging.LogRecord(
            "JupyterHub", logging.ERROR, __file__, 1, "Failed to spawn", None, (SpawnRefused, refusal, None), func=func
        )
        assert not RefusalsOnOneLine().filter(echo)
    again = logging.LogRecord(
        "JupyterHub", logging.ERROR, __file__, 1, f"Error starting server alice: {refusal}", None, None, func="_wrap_spawn_single_user"
    )
    assert not RefusalsOnOneLine().filter(again)
    said = logging.LogRecord("JupyterHub", logging.ERROR, __file__, 1, f"Not starting alice's server : {refusal}", None, None, func="spawn")
    assert RefusalsOnOneLine().filter(said)
    form = logging.LogRecord(
        "JupyterHub",
        logging.ERROR,
        __file__,
        1,
        "Failed to spawn",
        None,
        (SpawnRefused, SpawnRefused("No GPU is free.", "no_capacity"), None),
        func="_post",
    )
    assert RefusalsOnOneLine().filter(form)  # refused by the form itself: its only line


def test_any_other_exception_keeps_its_traceback():
    try:
        raise KeyError("bug")
    except KeyError as exc:
        line = logging.LogRecord("JupyterHub", logging.ERROR, __file__, 1, "Failed", None, (KeyError, exc, exc.__traceback__))
    assert RefusalsOnOneLine().filter(line)
    assert "Traceback" in logging.Formatter().format(line)


# ----------------------------------------------------------------------------- user_options keys

PROFILES = [
    {"display_name": "Python", "slug": "python", "default": True},
    {
        "display_name": "PyTorch",
        "slug": "pytorch",
        "profile_options": {
            "image": {"display_name": "Image", "choices": {"cuda12": {}, "cuda11": {}}, "unlisted_choice": {"enabled": True}},
        },
    },
]


def test_only_known_keys_are_kept():
    keys = known_keys(PROFILES, declared=["site_flag"])
    options = {
        "offering": "cpu",
        "count": 1,
        "profile": "pytorch",
        "image": "cuda12",
        "image--unlisted-choice": "x",
        "site_flag": True,
        "junk": "x" * 100,
        "gpuspawner": {"forged": 1},
        "__jupyterhub_x": 1,
        5: "int key",
    }
    kept, dropped = split_known(options, keys)
    assert kept == {
        "offering": "cpu",
        "count": 1,
        "profile": "pytorch",
        "image": "cuda12",
        "image--unlisted-choice": "x",
        "site_flag": True,
    }
    assert dropped == ["junk", "gpuspawner", "__jupyterhub_x", 5]


def test_without_a_profile_list_the_profile_keys_are_unknown():
    kept, dropped = split_known({"offering": "cpu", "profile": "python", "image": "cuda12"}, known_keys([]))
    assert kept == {"offering": "cpu"} and dropped == ["profile", "image"]


def test_a_callable_profile_list_keeps_option_shaped_keys_only():
    keys = known_keys(lambda spawner: PROFILES)
    assert "profile" in keys and "image" in keys and "image--unlisted-choice" in keys
    assert "x" * 100 not in keys and "<b>" not in keys and "" not in keys


def test_values_of_known_keys_are_kept_as_they_are_for_validation():
    huge = "a" * 1_000_000
    deep: dict = {}
    for _ in range(1000):
        deep = {"a": deep}
    kept, dropped = split_known({"offering": huge, "count": deep, "junk": 1}, known_keys([]))
    assert kept == {"offering": huge, "count": deep} and dropped == ["junk"]  # the start still gets its 400


def test_dropped_keys_are_described_short_and_safely():
    text = describe_keys(["x" * 10_000, "<script>", *[f"k{i}" for i in range(20)]])
    assert len(text) < 400 and "<" not in text and text.endswith("and 14 more")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"profile": "nope"}, "The profile 'nope' does not exist on this hub. Profiles: python, pytorch."),
        ({"profile": ["python"]}, "The profile must be the name of one profile: python, pytorch."),
        ({"profile": "x" * 1_000_000}, "does not exist"),
        ({"profile": "pytorch", "image": "cuda99"}, "'cuda99' is not a choice for Image in the profile PyTorch. Choices: cuda12, cuda11."),
        ({"profile": "pytorch", "image": ["cuda12"]}, "is not a choice for Image"),
        ({"profile": "pytorch", "image--unlisted-choice": {"a": 1}}, "The value for Image must be a short text"),
    ],
)
def test_a_profile_or_choice_that_does_not_exist_is_malformed(options, message):
    with pytest.raises(ChoiceError) as info:
        check_profile(options, PROFILES)
    assert message in str(info.value) and info.value.reason == MALFORMED
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"profile": ""},
        {"profile": "python"},
        {"profile": "pytorch", "image": "cuda11"},
        {"profile": "pytorch", "image--unlisted-choice": "my/image:1"},
    ],
)
def test_valid_profile_choices_pass(options):
    check_profile(options, PROFILES)


# ----------------------------------------------------------------------------- what the page says


def test_live_counts_need_no_notice():
    assert counts_notice(Health(ready=True), NOW) == ""


def test_lost_cluster_shows_how_old_the_counts_are_in_the_site_zone():
    health = Health(ready=False, answered=True, as_of=NOW.timestamp() - 44, error="ClientConnectorError: refused")
    notice = counts_notice(health, NOW)
    assert notice.startswith("The GPU cluster cannot be reached: the free counts are as of 14:03:07 CET (44 s ago)")
    assert "refused" not in notice  # the error is for the log, not for users
    assert unreachable_message(health, NOW) == (
        "The GPU cluster cannot be reached (since 14:03:07 CET, 44 s ago), so no server can start now. Please try again in a few minutes."
    )
    older = Health(ready=False, answered=True, as_of=NOW.timestamp() - 3 * 3600)
    assert "(3 h ago)" in counts_notice(older, NOW)
    assert "(5 min ago)" in counts_notice(Health(ready=False, answered=True, as_of=NOW.timestamp() - 300), NOW)


def test_never_counted_and_still_connecting_say_so():
    never = Health(ready=False, answered=True, as_of=None, error="refused")
    assert "free counts are unknown" in counts_notice(never, NOW)
    assert unreachable_message(never, NOW).startswith("The GPU cluster cannot be reached, so no server can start now.")
    starting = Health(ready=False, answered=False)
    assert "still connecting" in counts_notice(starting, NOW) and "still connecting" in unreachable_message(starting, NOW)
