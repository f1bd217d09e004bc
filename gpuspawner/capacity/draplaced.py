"""Where a DRA offering's pod may land, and how many more fit there: the device-plugin path's filters. Pure.

A DRA offering's pod asks for no extended resource, yet the scheduler places it with every
filter it applies to any pod before its DRA plugin looks at devices: the node's cordon, its
taints against the pod's tolerations, the pod's node selector and affinity
(:func:`gpuspawner.core.fit.blocked`), and the node's allocatable cpu, memory and pod slots
beside what is bound there (:func:`gpuspawner.core.fit.room`, with the notebook's guarantees:
:class:`~gpuspawner.capacity.counts.Tally`). :func:`dra_room` gives, per node that publishes
devices, how many more of the offering's pods it takes; :meth:`gpuspawner.dra.devices.DraState.availability`
then counts each node's free devices within it (a node the pod cannot land on offers none).
The same numbers feed the spawn page, ``gpuspawner offerings`` and admission
(:meth:`gpuspawner.capacity.index.ClusterIndex.availability`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuspawner.capacity.counts import Tally
from gpuspawner.core.fit import NodeFacts, blocked, room


def dra_room(
    tally: Tally, nodes: Mapping[str, NodeFacts], used: Mapping[str, Mapping[str, int]], device_nodes: Iterable[str]
) -> dict[str, int]:
    """Node -> how many more of ``tally``'s offering's pods the scheduler's non-DRA filters let onto
    it, for each of ``device_nodes`` the pod may land on at all (a node with no Node object, cordoned,
    with a taint the pod does not tolerate or outside its selector and affinity is left out)."""
    out = {}
    for name in device_nodes:
        facts = nodes.get(name)
        if facts is None or blocked(tally.pod, facts, tally.tolerations) is not None:
            continue
        out[name] = room(tally.pod.requests, facts, used.get(name, {}))
    return out


class DraRooms:
    """:func:`dra_room` per offering, kept until ``stamp`` changes (the index's stamp of node and use events)."""

    def __init__(self) -> None:
        self._stamp: object = None
        self._kept: dict[tuple[object, ...], dict[str, int]] = {}

    def get(
        self,
        tally: Tally,
        nodes: Mapping[str, NodeFacts],
        used: Mapping[str, Mapping[str, int]],
        device_nodes: Iterable[str],
        stamp: object,
    ) -> dict[str, int]:
        if stamp != self._stamp:
            self._stamp, self._kept = stamp, {}
        pod = tally.pod
        key = (tuple(sorted(pod.requests.items())), tuple(sorted(pod.node_selector.items())), repr(pod.terms), repr(tally.tolerations))
        found = self._kept.get(key)
        if found is None:
            found = self._kept[key] = dra_room(tally, nodes, used, device_nodes)
        return found
