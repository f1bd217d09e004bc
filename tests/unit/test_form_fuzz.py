"""Fuzz the spawn form / API parsing: every input is hostile until proven otherwise.

``parse_choice`` must only ever return a :class:`Choice` for an offering in the given
mapping with one of that offering's counts, or raise :class:`ChoiceError` whose message
has no ``<``/``>`` and is under 400 characters. Nothing else may escape (a 500 on the hub).

Each test prints how many examples it ran (``pytest -s`` shows it) and asserts that both
outcomes (a Choice and a refusal) were seen, so a strategy that stops producing one of
them fails instead of passing vacuously.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.capacity.access import Requester, allowed
from gpuspawner.core.model import CPU_OFFERING
from gpuspawner.offerings.choice import Choice, ChoiceError, parse_choice, parse_count
from gpuspawner.offerings.config import offering_from_config

#: Examples per fuzz test (the two narrow ones run a quarter of it); raise it for a deeper run:
#: GPUSPAWNER_FUZZ_EXAMPLES=20000 pytest tests/unit/test_form_fuzz.py -s
EXAMPLES = int(os.environ.get("GPUSPAWNER_FUZZ_EXAMPLES", "1000"))
#: Derandomized by default so a run is reproducible (same examples every time, no database
#: written); GPUSPAWNER_FUZZ_RANDOM=1 explores fresh examples on each run.
DERANDOMIZE = os.environ.get("GPUSPAWNER_FUZZ_RANDOM") != "1"
MAX_MESSAGE = 400

# Not tests/offerings.py's: names with "·" and a group-only offering, for the form's escaping and refusals.
H100 = offering_from_config({"slug": "h100", "kind": "full", "display_name": "H100 80GB", "counts": [1, 2, 4, 8]}, 0)
MIG = offering_from_config({"slug": "mig-3g", "kind": "mig", "display_name": "A100 · MIG 3g.20gb", "profile": "3g.20gb"}, 1)
SECRET = offering_from_config(
    {"slug": "secret-a100", "kind": "full", "display_name": "Secret A100", "groups": ["hpc"], "counts": [1, 2]}, 2
)
HIDDEN = offering_from_config({"slug": "old-t4", "kind": "full", "display_name": "Old T4", "hidden": True}, 3)
CATALOG = [CPU_OFFERING, H100, MIG, SECRET, HIDDEN]
EVERYTHING = {o.slug: o for o in CATALOG}
FOR_STUDENT = allowed(CATALOG, Requester("stu", frozenset({"students"})))
assert "secret-a100" not in FOR_STUDENT
OFFERING_SETS = [EVERYTHING, FOR_STUDENT, {}, {"h100": H100}]

# ------------------------------------------------------------------------- strategies

MARKUP = [
    "<script>alert(1)</script>",
    "<b>",
    "<",
    ">",
    "&lt;b&gt;",
    '"><img src=x onerror=alert(1)>',
    "{{7*7}}",
    "${7*7}",
    "\x00",
    "\u202e",
    "\ufeff",
    "javascript:alert(1)",
    "' OR 1=1 --",
    "</textarea>",
    "a" * 500 + "<",
]
SLUGS = list(EVERYTHING) + ["gone", "secret-a100", "h100 ", " h100", "H100", "h100\n", "cpu\n", "-", "a" * 63, "a" * 64]
# Every character str.isspace() accepts (the ASCII separators \x1c-\x1f included) and a few that it does not.
WHITESPACE = ["", " ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u2003", "\u3000", "\u200b"]
NUMERIC_TEXT = ["1", "2", "4", "8", " 2 ", "02", "0", "-1", "+1", "1.0", "1e3", "0x10", "١", "４", "", " ", "999", "1000", "9" * 40]

markup = st.sampled_from(MARKUP)
text = st.one_of(st.text(max_size=20), markup, st.tuples(st.text(max_size=6), markup, st.text(max_size=6)).map("".join))
slug = st.sampled_from(SLUGS)
moderate_int = st.one_of(st.integers(min_value=-(10**60), max_value=10**60), st.sampled_from([0, 1, 2, 3, 4, 8, 16, -1, 2**31, 2**63]))
number = st.one_of(moderate_int, st.floats(allow_nan=True, allow_infinity=True), st.decimals(allow_nan=False, allow_infinity=False))
numeric_text = st.one_of(
    st.sampled_from(NUMERIC_TEXT),
    st.integers(-(10**6), 10**6).map(str),
    st.tuples(st.sampled_from(WHITESPACE), st.integers(0, 99999), st.sampled_from(WHITESPACE)).map(lambda t: f"{t[0]}{t[1]}{t[2]}"),
)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    number,
    text,
    numeric_text,
    slug,
    st.binary(max_size=20),
    slug.map(str.encode),
    numeric_text.map(lambda s: s.encode()),
)
json_like = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=5,
)
# What a form post or REST call can put under one key: a scalar, a list of them (form posts), or anything.
field_value = st.one_of(
    slug, slug.map(lambda s: [s]), numeric_text, numeric_text.map(lambda s: [s]), scalar, st.lists(scalar, max_size=3), json_like
)

mapping_options = st.tuples(
    st.fixed_dictionaries({}, optional={"offering": field_value, "count": field_value, "gpuspawner": json_like, "profile": json_like}),
    st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), json_like, max_size=3),
).map(lambda parts: {**parts[1], **parts[0]})
user_options = st.one_of(st.none(), mapping_options)
default_slug = st.one_of(st.none(), slug)
offering_set = st.sampled_from(range(len(OFFERING_SETS))).map(OFFERING_SETS.__getitem__)

# 10**k for k in 350..5000, either sign: past 400 characters of digits, and past Python's 4300-digit
# int->str limit (generated as exponents so hypothesis shrinks them quickly).
huge_int = st.tuples(st.integers(min_value=350, max_value=5000), st.sampled_from([1, -1]), st.integers(0, 9)).map(
    lambda t: t[1] * (10 ** t[0] + t[2])
)
# A request body that is not a JSON object at all (POST /users/:name/server with '[...]', '"x"', 3 ...).
non_mapping_options = st.one_of(
    st.lists(json_like, min_size=1, max_size=4),
    st.text(min_size=1, max_size=20),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.binary(min_size=1, max_size=10),
    st.lists(st.tuples(st.sampled_from(["offering", "count"]), slug), min_size=1, max_size=2),
)

# ---------------------------------------------------------------------------- checking


def check_choice(options: Any, offerings: dict, default: str | None) -> str:
    """Run parse_choice; return 'chosen' or 'refused'. Anything else is a failure."""
    try:
        choice = parse_choice(options, offerings, default)
    except ChoiceError as err:
        message = str(err)
        assert message, "empty ChoiceError message"
        assert "<" not in message and ">" not in message, f"markup echoed back: {message!r}"
        assert len(message) < MAX_MESSAGE, f"message of {len(message)} characters: {message[:120]!r}..."
        return "refused"
    assert isinstance(choice, Choice)
    assert choice.offering.slug in offerings, f"chose {choice.offering.slug!r}, not in {sorted(offerings)}"
    assert offerings[choice.offering.slug] is choice.offering
    assert type(choice.count) is int and choice.count in choice.offering.counts, f"count {choice.count!r} for {choice.offering.slug}"
    return "chosen"


def run_fuzz(
    name: str, test: Callable[[Counter], None], examples: int = EXAMPLES, need: tuple[str, ...] = ("chosen", "refused")
) -> Counter:
    """Run a hypothesis test body that counts its outcomes; print and check the counts."""
    seen: Counter = Counter()
    try:
        test(seen)
    finally:
        print(f"\n[fuzz] {name}: {seen.total()} examples run ({dict(seen)})")
    assert seen.total() >= examples, f"{name}: only {seen.total()} examples ran, expected at least {examples}"
    for outcome in need:
        assert seen[outcome] > 0, f"{name}: no example ended {outcome!r} in {seen.total()} examples: {dict(seen)}"
    return seen


def fuzz_settings(examples: int = EXAMPLES):
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------------------- tests


def test_fuzz_parse_choice_with_form_and_api_options():
    """Dict-shaped options (the form and the REST API), any values, moderate numbers."""

    def body(seen: Counter):
        @fuzz_settings()
        @given(options=user_options, offerings=offering_set, default=default_slug)
        def inner(options, offerings, default):
            seen[check_choice(options, offerings, default)] += 1

        inner()

    run_fuzz("parse_choice(form/API dict options)", body)


def test_fuzz_parse_choice_valid_slugs_any_count():
    """Always a real slug, so the count path is what gets hammered."""

    def body(seen: Counter):
        @fuzz_settings()
        @given(
            choice_slug=st.sampled_from(list(EVERYTHING)).flatmap(lambda s: st.sampled_from([s, [s], s.encode()])),
            count=field_value,
        )
        def inner(choice_slug, count):
            seen[check_choice({"offering": choice_slug, "count": count}, EVERYTHING, None)] += 1

        inner()

    run_fuzz("parse_choice(valid slug, any count)", body)


def test_fuzz_parse_choice_huge_counts():
    """Huge and hugely negative counts (JSON allows them): still a short, clean refusal."""

    def body(seen: Counter):
        @fuzz_settings(EXAMPLES // 4)
        @given(choice_slug=st.sampled_from(list(EVERYTHING)), count=huge_int, as_list=st.booleans())
        def inner(choice_slug, count, as_list):
            seen[check_choice({"offering": choice_slug, "count": [count] if as_list else count}, EVERYTHING, None)] += 1

        inner()

    run_fuzz("parse_choice(huge counts)", body, examples=EXAMPLES // 4, need=("refused",))


def test_fuzz_parse_choice_non_mapping_options():
    """user_options that are not a dict at all: a refusal, never a TypeError/ValueError."""

    def body(seen: Counter):
        @fuzz_settings(EXAMPLES // 4)
        @given(options=non_mapping_options, default=default_slug)
        def inner(options, default):
            seen[check_choice(options, EVERYTHING, default)] += 1

        inner()

    run_fuzz("parse_choice(non-dict options)", body, examples=EXAMPLES // 4, need=())


def test_fuzz_parse_count():
    """parse_count alone: an int (never a bool), or a short clean ChoiceError."""

    def body(seen: Counter):
        @fuzz_settings()
        @given(raw=st.one_of(field_value, huge_int))
        def inner(raw):
            try:
                value = parse_count(raw)
            except ChoiceError as err:
                message = str(err)
                assert "<" not in message and ">" not in message, message
                assert len(message) < MAX_MESSAGE, message[:120]
                seen["refused"] += 1
                return
            assert type(value) is int
            single = raw[0] if isinstance(raw, (list, tuple)) and len(raw) == 1 else raw
            if isinstance(single, (str, bytes)):
                assert 0 <= value <= 999, f"{raw!r} -> {value}"
            else:
                assert value == single
            seen["chosen"] += 1

        inner()

    run_fuzz("parse_count", body)


def test_check_choice_itself_can_fail():
    """The checker must reject a wrong outcome (so the fuzz tests above can fail)."""
    import pytest

    class Leaky(dict):
        def get(self, key, default=None):  # hands out an offering that is not in the mapping
            return SECRET

    with pytest.raises(AssertionError, match="not in"):
        check_choice({"offering": "secret-a100"}, Leaky(), None)
    assert check_choice({"offering": "<b>"}, EVERYTHING, None) == "refused"
    assert check_choice({"offering": "h100", "count": "8"}, EVERYTHING, None) == "chosen"
