"""CEL device selectors as Kubernetes evaluates them for Dynamic Resource Allocation. Pure.

A DeviceClass, a ResourceClaim request and an admin's DRA offering select devices with CEL
expressions over ``device.driver``, ``device.attributes[<domain>].<name>`` and
``device.capacity[<domain>].<name>``. gpuspawner compiles them with cel-python (``celpy``) and
evaluates them against the devices of ResourceSlices, so it counts the devices the scheduler
would allocate. Kubernetes' CEL library adds functions plain CEL lacks; the subset here is
what device selectors use (docs/config.md, "DRA offerings"):

* ``quantity('40Gi')`` and a quantity's ``compareTo``, ``isGreaterThan``, ``isLessThan``,
  ``asInteger``; capacity values are quantities;
* ``semver('9.0.0')`` and a version's ``compareTo``, ``isGreaterThan``, ``isLessThan``,
  ``major``, ``minor``, ``patch``; version attributes are versions;
* ``lowerAscii``, ``upperAscii`` on strings (``matches``, ``startsWith``... are plain CEL).

An expression that raises for a device (a missing attribute, say) does not select it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import celpy
import celpy.celtypes as ct

from gpuspawner.core.quantity import parse_quantity

_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$")


class SelectorError(ValueError):
    """A CEL expression that does not compile, or a value that is not a semantic version
    (a malformed quantity is a :class:`gpuspawner.core.quantity.QuantityError`)."""


class Quantity(ct.StringType):
    """A quantity in CEL (kept as its text; compared by value)."""

    @property
    def value(self) -> Fraction:
        return parse_quantity(str(self))


class Version(ct.StringType):
    """A semantic version in CEL (``major.minor.patch``)."""

    @property
    def parts(self) -> tuple[int, int, int]:
        match = _SEMVER.match(str(self))
        if not match:
            raise SelectorError(f"{str(self)!r} is not a semantic version (major.minor.patch)")
        return int(match.group(1)), int(match.group(2)), int(match.group(3))


def _key(value: Any) -> Any:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, Version):
        return value.parts
    raise TypeError(f"compareTo needs a quantity or a version, not {type(value).__name__}")


def _compare(a: Any, b: Any) -> ct.IntType:
    x, y = _key(a), _key(b)
    return ct.IntType((x > y) - (x < y))


def _quantity(text: Any) -> Quantity:
    parse_quantity(text)
    return Quantity(str(text))


def _semver(text: Any) -> Version:
    version = Version(str(text))
    version.parts  # noqa: B018 - validates
    return version


_FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "semver": _semver,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: ct.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: ct.BoolType(_compare(a, b) < 0),
    "asInteger": lambda q: ct.IntType(int(q.value)),
    "major": lambda v: ct.IntType(v.parts[0]),
    "minor": lambda v: ct.IntType(v.parts[1]),
    "patch": lambda v: ct.IntType(v.parts[2]),
    "lowerAscii": lambda s: ct.StringType(str(s).lower()),
    "upperAscii": lambda s: ct.StringType(str(s).upper()),
}

_ENV = celpy.Environment()


@dataclass(frozen=True)
class Selector:
    """One compiled CEL device selector."""

    expression: str
    program: Any

    def matches(self, device: Mapping[str, Any]) -> bool:
        """Does the expression select ``device`` (a :func:`device_activation` value)? Errors select nothing."""
        try:
            result = self.program.evaluate({"device": device})
        except Exception:  # noqa: BLE001 - celpy raises its own and Python's errors; Kubernetes skips the device
            return False
        return result is True or (isinstance(result, ct.BoolType) and bool(result))


@lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """Compile ``expression`` once (cached); :class:`SelectorError` says where it does not parse."""
    try:
        ast = _ENV.compile(expression)
    except Exception as exc:  # noqa: BLE001 - celpy's parse errors carry the caret picture in their text
        raise SelectorError(f"CEL expression does not compile: {str(exc).rstrip()}") from None
    return Selector(expression, _ENV.program(ast, functions=_FUNCTIONS))


def _cel_value(value: Mapping[str, Any]) -> Any:
    """One ResourceSlice attribute (``{"string": ...}``, ``{"int": ...}``, ``{"bool": ...}``, ``{"version": ...}``)."""
    if "string" in value:
        return ct.StringType(value["string"])
    if "int" in value:
        return ct.IntType(int(value["int"]))
    if "bool" in value:
        return ct.BoolType(bool(value["bool"]))
    if "version" in value:
        return Version(value["version"])
    return None


def _by_domain(names: Mapping[str, Any], driver: str, convert: Any) -> ct.MapType:
    """``{"productName": v, "resource.kubernetes.io/pciBusID": w}`` -> ``{driver: {productName: v}, "resource.kubernetes.io": {...}}``."""
    domains: dict[str, dict[ct.StringType, Any]] = {}
    for name, value in names.items():
        domain, _, short = name.rpartition("/")
        converted = convert(value)
        if converted is not None:
            domains.setdefault(domain or driver, {})[ct.StringType(short)] = converted
    return ct.MapType({ct.StringType(d): ct.MapType(v) for d, v in domains.items()})


def device_activation(driver: str, attributes: Mapping[str, Any], capacity: Mapping[str, Any]) -> ct.MapType:
    """The ``device`` variable of a selector, from a ResourceSlice device's attributes and capacity."""
    return ct.MapType(
        {
            ct.StringType("driver"): ct.StringType(driver),
            ct.StringType("attributes"): _by_domain(attributes, driver, _cel_value),
            ct.StringType("capacity"): _by_domain(capacity, driver, lambda c: Quantity(str(c.get("value", "0")))),
        }
    )
