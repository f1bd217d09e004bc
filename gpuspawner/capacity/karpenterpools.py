"""Karpenter's autoscaled pools as the hub sees them. Pure.

The inventory (:mod:`gpuspawner.hub.inventory`) mirrors Karpenter's NodePools and NodeClaims
(``karpenter.sh/v1``) here where ``discover_offerings`` is on and the cluster serves them. A pool's
offering is the one its nodes will give (:func:`gpuspawner.offerings.nodepools.read_pools`: the same
slug), there before the pool has a node, and every discovered offering a pool serves is flagged
autoscaled with the model's ``scalable_nodes``/``scale_up_minutes`` (admission lets it grow) and its
:class:`~gpuspawner.core.model.PoolSize` (the page says "up to 4 ... nodes", and "the pool is at its
limit" where it may add none). The nodes a pool has now are its NodeClaims (Karpenter counts an in
flight one against ``limits.nodes`` too); without them (not readable), its nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpuspawner.core.model import Offering, PoolSize
from gpuspawner.offerings.nodepools import NODEPOOL_LABEL, Pool, read_pools

__all__ = ["DEFAULT_SCALE_UP_MINUTES", "GROUP", "NODECLAIMS", "NODEPOOLS", "STREAMS", "VERSION", "PoolState", "autoscaled"]

GROUP, VERSION = "karpenter.sh", "v1"
NODEPOOLS, NODECLAIMS = "nodepools", "nodeclaims"
#: The inventory's streams of Karpenter's objects.
STREAMS = (NODEPOOLS, NODECLAIMS)
#: How long a new node takes, where the admin says nothing (an offering override's ``scale_up_minutes``).
DEFAULT_SCALE_UP_MINUTES = 5


class PoolState:
    """The NodePools and NodeClaims of the cluster, by name, as the watch brings them."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Mapping[str, Any]]] = {kind: {} for kind in STREAMS}
        self.synced = dict.fromkeys(STREAMS, False)
        #: Why the pools are not read ("" while they are, or before the first answer).
        self.unavailable = ""
        #: Moves whenever what :meth:`pools` answers may have changed.
        self.generation = 0

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        self.objects[kind] = {_name(o): o for o in items}
        self.generation += 1

    def event(self, stream: str, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event (``ADDED``, ``MODIFIED``, ``DELETED``) of ``obj`` on ``stream``."""
        name, mine = _name(obj), self.objects[stream]
        if kind == "DELETED":
            if mine.pop(name, None) is None:
                return
        else:
            old, mine[name] = mine.get(name), obj
            if old is not None and stream == NODECLAIMS and _pool_of(old) == _pool_of(obj):
                return  # a NodeClaim's steps: its pool's count is the same
            if old is not None and stream == NODEPOOLS and old.get("spec") == obj.get("spec"):
                return  # the pool's status: what it offers and its limit are the same
        self.generation += 1

    def pools(
        self, node_labels: Iterable[Mapping[str, str]], vgpu_class_labels: Iterable[str]
    ) -> tuple[list[Pool], list[Offering], list[tuple[str, str]]]:
        """:func:`read_pools` of the NodePools now ([] until they are listed), counting NodeClaims, or
        the nodes' labels where NodeClaims are not read."""
        if not self.synced[NODEPOOLS]:
            return [], [], []
        counted: Iterable[Mapping[str, Any]] = (
            self.objects[NODECLAIMS].values() if self.synced[NODECLAIMS] else ({"metadata": {"labels": labels}} for labels in node_labels)
        )
        return read_pools(self.objects[NODEPOOLS].values(), None, counted, vgpu_class_labels)


def autoscaled(discovered: list[Offering], pools: list[Pool], pool_offerings: list[Offering], minutes: int) -> list[Offering]:
    """``discovered`` with each offering a pool serves flagged autoscaled, then the pools' offerings
    that no node gives yet. Several pools of one slug add up (no limit where one has none)."""
    if not pools:
        return discovered
    by_slug: dict[str, list[Pool]] = {}
    for pool in pools:
        for slug in pool.slugs:
            by_slug.setdefault(slug, []).append(pool)
    have = {o.slug for o in discovered}
    out = []
    for offering in [*discovered, *(o for o in pool_offerings if o.slug not in have)]:
        mine = by_slug.get(offering.slug)
        if not mine:
            out.append(offering)
            continue
        limits = [p.limit for p in mine]
        size = PoolSize(None if None in limits else sum(p.limit or 0 for p in mine), sum(p.nodes for p in mine))
        room = size.room
        out.append(
            replace(
                offering,
                scalable_nodes=1 if room is None else room,  # (no limit: it can always add one more)
                scale_up_minutes=offering.scale_up_minutes or minutes,
                pool=size,
            )
        )
    return out


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _pool_of(obj: Mapping[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(NODEPOOL_LABEL)
