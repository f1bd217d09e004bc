"""The one Kubernetes quantity parser (gpuspawner.core.quantity), against the two it replaced:
fit's (Decimal, rounded up to the scheduler's units) and cel's (Fraction). For every valid
quantity the new one gives what each old one gave; malformed text is refused as before."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuspawner.core.fit import amount
from gpuspawner.core.quantity import QuantityError, parse_quantity

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3), "": 1, "k": 10**3}
_DECIMAL |= {"M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_OLD_CEL = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")
_OLD_FIT = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE]|)$")


def old_cel(text: str) -> Fraction:
    """cel.parse_quantity as it was."""
    number, exponent, suffix = _OLD_CEL.match(text.strip()).groups()  # type: ignore[union-attr]
    if exponent:
        return Fraction(number) * Fraction(10) ** int(exponent[1:])
    return Fraction(number) * Fraction({**_BINARY, **_DECIMAL}[suffix or ""])


_OLD_FIT_SUFFIXES = {"": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3")}
_OLD_FIT_SUFFIXES |= {s: Decimal(10) ** (3 * i) for i, s in enumerate("kMGTPE", 1)}
_OLD_FIT_SUFFIXES |= {s: Decimal(2) ** (10 * i) for i, s in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"], 1)}


def old_fit(resource: str, text: str) -> int | None:
    """fit.amount as it was, for a quantity's text."""
    digits, suffix = _OLD_FIT.match(text.strip()).groups()  # type: ignore[union-attr]
    try:
        scale = Decimal(f"1{suffix}") if suffix[:1] in ("e", "E") else _OLD_FIT_SUFFIXES[suffix]
    except InvalidOperation:
        return None  # its one slip: "E" and "Ei" read as an exponent with no digits
    number = Decimal(digits) * scale
    return int(math.ceil(number * 1000 if resource == "cpu" else number))


_digits = st.text("0123456789", min_size=1, max_size=8)
_number = st.one_of(
    _digits,
    st.builds(lambda a, b: f"{a}.{b}", _digits, st.text("0123456789", max_size=6)),
    st.builds(lambda b: f".{b}", _digits),
)
_tail = st.one_of(
    st.sampled_from([*_BINARY, *_DECIMAL]),
    st.builds(lambda e, n: f"{e}{n}", st.sampled_from(["e", "E", "e+", "e-", "E-"]), st.integers(0, 12)),
)
quantities = st.builds(lambda sign, number, tail: f"{sign}{number}{tail}", st.sampled_from(["", "+", "-"]), _number, _tail)


@given(quantities)
def test_the_one_parser_reads_every_valid_quantity_as_cel_did(text):
    assert parse_quantity(text) == old_cel(text)


@given(quantities, st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]))
def test_the_scheduler_units_are_what_fit_gave(text, resource):
    before = old_fit(resource, text)
    if before is None:  # exa: fit refused "1E" and "1Ei" (read as exponents), Kubernetes reads 10**18 and 2**60
        assert text.endswith(("E", "Ei")) and amount(resource, text) == math.ceil(parse_quantity(text) * (1000 if resource == "cpu" else 1))
    else:
        assert amount(resource, text) == before


@pytest.mark.parametrize(
    ("text", "value"),
    [("40Gi", 40 * 2**30), ("500m", Fraction(1, 2)), ("1e3", 1000), ("1.5", Fraction(3, 2)), ("2E-2", Fraction(1, 50)), ("1E", 10**18)],
)
def test_examples(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["40 GiB", "", "Gi", "1.2.3", "1Ki2", "1e", "0x10", "١"])
def test_malformed_text_is_refused(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)
    assert amount("memory", text) is None


def test_numbers_and_booleans_as_fit_took_them():
    assert amount("cpu", 2) == 2000 and amount("cpu", 0.25) == 250 and amount("memory", True) is None
