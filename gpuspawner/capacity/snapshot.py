"""The hub's cluster index over a snapshot of the cluster's objects. Pure.

``gpuspawner offerings`` (from files or one list of the live cluster) and ``make dra-truth`` count
with the very :class:`~gpuspawner.capacity.index.ClusterIndex` the hub's watch keeps, fed all at
once, so every offering's count is the one the spawn page and admission read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.pod.notebook import Notebook


def snapshot_index(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    dra: Mapping[str, Iterable[Mapping[str, Any]]] | None,
    notebook: Notebook,
) -> ClusterIndex:
    """``dra``: the lists of ``slices``, ``classes``, ``claims`` and ``rules`` (DeviceTaintRules), or None
    where the cluster serves no DRA (its offerings then have no count)."""
    index = ClusterIndex()
    index.set_notebook(notebook)
    index.replace(nodes=nodes, pods=pods)  # also marks the device plugin's nodes, whose DRA devices are not counted
    if dra is not None:
        index.dra.replace(**{kind: list(items) for kind, items in dra.items()})
        index.dra.synced = True
    return index
