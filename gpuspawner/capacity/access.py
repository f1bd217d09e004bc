"""Who may use what. Pure. (When: :mod:`gpuspawner.core.windows`.)"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuspawner.core.model import Offering


@dataclass(frozen=True)
class Requester:
    """The user a decision is about."""

    name: str
    groups: frozenset[str] = frozenset()
    admin: bool = False


def named(items: Any) -> list[tuple[str, Any]]:
    """(name, item) for each of ``items`` that has a name: a hub's groups, or a group's users.

    JupyterHub gives lists of objects with a ``name``; authenticators and custom User
    objects have been seen to give names, a single name, None, or nothing at all. Every
    such shape works (a single string is one name); a value that cannot be iterated
    counts as none: a spawn must not fail on how groups are stored.
    """
    if items is None:
        return []
    if isinstance(items, str):
        return [(items, items)]
    try:
        items = list(items)
    except TypeError:
        return []
    out = []
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if isinstance(name, str) and name:
            out.append((name, item))
    return out


def may_use(offering: Offering, who: Requester) -> bool:
    """An offering restricted to groups and/or users is open to its members; admins may use all."""
    if who.admin or (not offering.groups and not offering.users):
        return True
    return who.name in offering.users or bool(who.groups & set(offering.groups))


def allowed(offerings: Iterable[Offering], who: Requester) -> dict[str, Offering]:
    """The offerings ``who`` may take, by slug, in order."""
    return {o.slug: o for o in offerings if may_use(o, who)}
