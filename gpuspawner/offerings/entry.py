"""One entry of the admin's settings read field by field, with errors that name the entry, the field and what to write instead. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from gpuspawner.core.model import GuardSetting


class OfferingConfigError(ValueError):
    """An admin's offering entry is wrong. The message names the entry and field."""


_EXAMPLE = (
    "Example: {'slug': 'a100-mig-3g', 'kind': 'mig', 'display_name': 'A100 · MIG 3g.20gb', "
    "'profile': '3g.20gb', 'product': 'NVIDIA-A100-SXM4-40GB'}"
)


class Entry:
    """Reads one config dict, raising errors that name the entry and field."""

    def __init__(self, raw: Any, where: str):
        self.where = where
        if not isinstance(raw, Mapping):
            raise OfferingConfigError(f"{where}: must be a dict, got {type(raw).__name__}. {_EXAMPLE}")
        self.raw = raw

    def fail(self, name: str, problem: str) -> OfferingConfigError:
        return OfferingConfigError(f"{self.where}: field '{name}' {problem}")

    @overload
    def text(self, name: str, default: str, required: bool = False) -> str: ...
    @overload
    def text(self, name: str, *, required: Literal[True]) -> str: ...
    @overload
    def text(self, name: str, default: None = None, required: bool = False) -> str | None: ...

    def text(self, name: str, default: str | None = None, required: bool = False) -> str | None:
        value = self.raw.get(name, default)
        if value is None:
            if required:
                raise self.fail(name, f"is required. {_EXAMPLE}")
            return None
        if not isinstance(value, str) or (required and not value.strip()):
            raise self.fail(name, f"must be a non-empty string, got {value!r}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {value!r}")
        return value

    def positive_int(self, name: str, value: Any = None) -> int:
        value = self.raw.get(name) if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(name, f"must be a positive integer, got {value!r}")
        return value

    def str_list(self, name: str) -> tuple[str, ...]:
        value = self.raw.get(name, [])
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(name, f"must be a list of non-empty strings, got {value!r}")
        return tuple(value)

    def str_map(self, name: str) -> dict[str, str]:
        value = self.raw.get(name, {})
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()):
            raise self.fail(name, f"must be a dict of strings to strings, got {value!r}")
        return dict(value)

    def memory_guard(self) -> GuardSetting:
        """The ``memory_guard`` field: false (off), true (on, sized from the offering's share) or a
        dict of ``enabled``, ``fraction`` (0 < f <= 1, of each GPU's memory) and ``user_env``."""
        value = self.raw.get("memory_guard")
        if value is None:
            return GuardSetting()
        if isinstance(value, bool):
            return GuardSetting(enabled=value)
        example = "e.g. false, true or {'fraction': 0.25, 'user_env': false}"
        if not isinstance(value, Mapping):
            raise self.fail("memory_guard", f"must be true, false or a dict, {example}; got {value!r}")
        unknown = sorted(str(k) for k in value if k not in ("enabled", "fraction", "user_env"))
        if unknown:
            raise self.fail("memory_guard", f"has unknown key(s) {unknown}; the keys are 'enabled', 'fraction' and 'user_env', {example}")
        flags: dict[str, bool | None] = {}
        for key in ("enabled", "user_env"):
            flag = value.get(key)
            if flag is not None and not isinstance(flag, bool):
                raise self.fail("memory_guard", f"['{key}'] must be true or false, got {flag!r}")
            flags[key] = flag
        fraction = value.get("fraction")
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1):
            raise self.fail(
                "memory_guard", f"['fraction'] must be a number above 0 and at most 1 (of each GPU's memory, e.g. 0.25), got {fraction!r}"
            )
        enabled = flags["enabled"]
        if enabled is None and fraction is not None:
            enabled = True  # a fraction is asked for: the guard is on
        return GuardSetting(enabled=enabled, fraction=None if fraction is None else float(fraction), user_env=flags["user_env"])

    def resources(self) -> dict[str, int] | None:
        if "resources" not in self.raw:
            return None
        value = self.raw["resources"]
        if not isinstance(value, Mapping) or not value:
            raise self.fail("resources", f"must be a non-empty dict like {{'nvidia.com/gpu': 1}}, got {value!r}")
        out = {}
        for name, qty in value.items():
            if not isinstance(name, str) or "/" not in name:
                raise self.fail("resources", f"has {name!r}: extended resource names look like 'vendor.com/name'")
            if isinstance(qty, str) and qty.isdigit():
                qty = int(qty)
            out[name] = self.positive_int(f"resources['{name}']", qty) if isinstance(qty, int) else self._bad_qty(name, qty)
        return out

    def _bad_qty(self, name: str, qty: Any) -> int:
        raise self.fail("resources", f"['{name}'] must be a positive whole number (extended resources cannot be fractional), got {qty!r}")

    def tolerations(self, name: str) -> tuple[dict[str, Any], ...]:
        value = self.raw.get(name, [])
        if not isinstance(value, (list, tuple)):
            raise self.fail(name, f"must be a list of toleration dicts, got {value!r}")
        allowed = {"key", "operator", "value", "effect", "tolerationSeconds"}
        for tol in value:
            if (
                not isinstance(tol, Mapping)
                or not set(tol) <= allowed
                or tol.get("operator", "Equal") not in ("Equal", "Exists")
                or tol.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
            ):
                raise self.fail(
                    name,
                    f"has {tol!r}: a toleration is a dict with keys {sorted(allowed)}, operator Equal or Exists and "
                    "effect NoSchedule, PreferNoSchedule or NoExecute (or none), "
                    "e.g. {'key': 'sku', 'operator': 'Equal', 'value': 'gpu', 'effect': 'NoSchedule'}",
                )
        return tuple(dict(t) for t in value)


def as_list(entry: Entry, name: str, default: list[Any]) -> list[Any]:
    """``entry[name]`` as a non-empty list (``default`` when absent)."""
    value = entry.raw.get(name, default)
    if not isinstance(value, (list, tuple)) or not value:
        raise entry.fail(name, f"must be a non-empty list, e.g. [1, 2, 4], got {value!r}")
    return list(value)
