"""The admin's ``c.GPUSpawner.offering_overrides``: rename, hide or restrict offerings by slug. Pure.

Overrides apply to discovered offerings (whose names the cluster's labels decide) as
well as configured ones; see docs/config.md, ``offering_overrides``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.config import admission_fields
from gpuspawner.offerings.entry import Entry, OfferingConfigError, as_list

_OVERRIDABLE = {
    "display_name",
    "description",
    "groups",
    "users",
    "hidden",
    "extra_tolerations",
    "env",
    "labels",
    "annotations",
    "counts",
    "admission",
    "queue_timeout",
    "gpu_hour_cost",
    "price_per_hour",
    "scalable_nodes",
    "scale_up_minutes",
    "windows",
    "memory_guard",
}


def apply_overrides(offerings: list[Offering], overrides: Mapping[str, Any]) -> list[Offering]:
    """Rename, hide or restrict discovered offerings: ``{slug: {field: value}}``.

    A slug that matches nothing is not an error (discovery depends on what the
    cluster has right now), but a field that cannot be overridden is.
    """
    if not isinstance(overrides, Mapping):
        raise OfferingConfigError(f"c.GPUSpawner.offering_overrides must be a dict of slug -> dict, got {type(overrides).__name__}")
    by_slug = {o.slug: o for o in offerings}
    for slug, change in overrides.items():
        where = f"c.GPUSpawner.offering_overrides[{slug!r}]"
        entry = Entry(change, where)
        for name in change:
            if name not in _OVERRIDABLE:
                raise OfferingConfigError(f"{where}: field {name!r} cannot be overridden; allowed: {sorted(_OVERRIDABLE)}")
        updates = _override_values(entry, change)
        if slug not in by_slug:
            continue
        current = by_slug[slug]
        for name in ("env", "labels", "annotations"):
            if name in updates:
                updates[name] = {**getattr(current, name), **updates[name]}
        if "tolerations" in updates:
            updates["tolerations"] = current.tolerations + updates["tolerations"]
        if "counts" in updates and current.kind is not Kind.FULL:
            raise entry.fail("counts", "applies to whole-GPU offerings only")
        by_slug[slug] = replace(current, **updates)
    return [by_slug[o.slug] for o in offerings]


def _override_values(entry: Entry, change: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one override's values (whether or not its slug exists right now)."""
    updates: dict[str, Any] = {}
    for name in ("display_name", "description"):
        if name in change:
            updates[name] = entry.text(name, required=True)
    for name in ("groups", "users"):
        if name in change:
            updates[name] = entry.str_list(name)
    if "hidden" in change:
        updates["hidden"] = entry.flag("hidden", False)
    for name in ("env", "labels", "annotations"):
        if name in change:
            updates[name] = entry.str_map(name)
    if "extra_tolerations" in change:
        updates["tolerations"] = entry.tolerations("extra_tolerations")
    if "memory_guard" in change:
        updates["memory_guard"] = entry.memory_guard()
    updates.update(admission_fields(entry))
    if "counts" in change:
        updates["counts"] = tuple(sorted({entry.positive_int("counts", c) for c in as_list(entry, "counts", [1])}))
    return updates
