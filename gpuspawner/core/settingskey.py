"""Settings as a cache key.

A hub's settings (offerings, quotas, queue mappings) are dicts and lists: not hashable, and
editable in place by a site's hook. :class:`SettingsKey` hashes and compares them by their
``repr`` taken when the key is made, so ``functools.lru_cache`` can keep what is computed from
them: the same settings find the answer, a changed setting (even edited in place) is a new key.
"""

from __future__ import annotations

from typing import Any


class SettingsKey:
    """``value``, hashed and compared by its ``repr`` at the time the key was made."""

    __slots__ = ("key", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.key = repr(value)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SettingsKey) and other.key == self.key
