"""Kubernetes quantities (``40Gi``, ``500m``, ``1.5``, ``2e3``) as exact numbers. Pure.

The one parser of the package: the scheduler's filters (:mod:`gpuspawner.core.fit`) and the
CEL selectors' ``quantity()`` (:mod:`gpuspawner.core.cel`) both read quantities here. The
grammar is Kubernetes' own (``k8s.io/apimachinery/pkg/api/resource``): a signed decimal
number followed by a binary suffix (``Ki`` .. ``Ei``), a decimal suffix (``n``, ``u``,
``m``, none, ``k``, ``M`` .. ``E``) or a decimal exponent (``e3``, ``E-2``). The value is a
:class:`~fractions.Fraction`, so ``0.1`` and ``100m`` are the same number, with no rounding.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

#: What each suffix multiplies the number by: decimal (n, u, m, none, k, M .. E) and binary (Ki .. Ei).
SUFFIXES: dict[str, Fraction] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3), "": Fraction(1)}
SUFFIXES |= {prefix: Fraction(10 ** (3 * power)) for power, prefix in enumerate("kMGTPE", 1)}
SUFFIXES |= {f"{prefix}i": Fraction(2 ** (10 * power)) for power, prefix in enumerate("KMGTPE", 1)}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity."""


def parse_quantity(text: Any) -> Fraction:
    """A Kubernetes quantity as an exact number: ``parse_quantity("500m") == Fraction(1, 2)``.

    Numbers (``2``, ``1.5``) are read through their text, as a quantity written bare in YAML.
    """
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (e.g. 40Gi, 81559Mi, 2)")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        return value * Fraction(10) ** int(exponent[1:])
    return value * SUFFIXES[suffix or ""]
