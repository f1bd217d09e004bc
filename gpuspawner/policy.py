"""Who may use what. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .offerings import Offering


@dataclass(frozen=True)
class Requester:
    """The user a decision is about."""

    name: str
    groups: frozenset[str] = frozenset()
    admin: bool = False


def may_use(offering: Offering, who: Requester) -> bool:
    """An offering restricted to groups and/or users is open to its members; admins may use all."""
    if who.admin or (not offering.groups and not offering.users):
        return True
    return who.name in offering.users or bool(who.groups & set(offering.groups))


def allowed(offerings: Iterable[Offering], who: Requester) -> dict[str, Offering]:
    """The offerings ``who`` may take, by slug, in order."""
    return {o.slug: o for o in offerings if may_use(o, who)}
