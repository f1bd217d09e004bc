"""Settings as a cache key.

A hub's settings (offerings, quotas, queue mappings) are dicts and lists: not hashable, and
editable in place by a site's hook. :class:`SettingsKey` hashes and compares them by their
written-out value (``marshal``, else ``repr``) taken when the key is made, so ``functools.lru_cache`` can keep what is computed from
them: the same settings find the answer, a changed setting (even edited in place) is a new key.
"""

from __future__ import annotations

import marshal
from typing import Any


class SettingsKey:
    """``value``, hashed and compared by what it was when the key was made: written out by
    ``marshal`` (a few times cheaper than its ``repr`` for a page of offerings: a view makes
    several keys), or by its ``repr`` where marshal cannot write it (a hook, an object). The two
    never compare equal (bytes and str), and each reads back to one value."""

    __slots__ = ("key", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        try:
            self.key: bytes | str = marshal.dumps(value, 2)  # (version 2: no back-references, the same value the same bytes)
        except ValueError:
            self.key = repr(value)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SettingsKey) and other.key == self.key
