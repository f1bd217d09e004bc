"""An extended-resource offering's units on DRA nodes (the extended-resource mapping). Pure.

A ``nvidia.com/gpu`` offering's pod lands on a device-plugin node (counted from allocatable,
:mod:`gpuspawner.capacity.counts`) or, where a DeviceClass maps the resource
(:mod:`gpuspawner.dra.extres`), on a node with none of it in its allocatable whose DRA
devices of that class the scheduler allocates through a claim it makes. This module gives
the second kind's rows, in the same shape (capacity, allocated, free, largest_free), with
the same placement filters (selector, affinity, taints, cordon) and the same room for the
notebook's cpu, memory and pod slot beside the GPU; only the GPUs come from the devices.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuspawner.capacity.counts import Row, Tally, summarise
from gpuspawner.core.fit import NodeFacts, blocked, room
from gpuspawner.core.model import Availability
from gpuspawner.dra.devices import DraState
from gpuspawner.dra.extres import free_mapped, mapped_devices
from gpuspawner.dra.slices import DeviceKey

#: The offering's mapped units are unknown now (a pool incomplete, DRA objects not listed).
UNKNOWN = None


def mapped_rows(
    tally: Tally, nodes: Mapping[str, NodeFacts], used: Mapping[str, Mapping[str, int]], dra: DraState
) -> list[tuple[str, Row, list[DeviceKey]]] | None:
    """The offering's rows on DRA nodes, each with its free devices (None: unknown now).

    An offering asking for several resources counts on a DRA node only if one mapped resource
    is all it asks for (the scheduler could map several, but GPU offerings ask for one).
    """
    resources = tally.offering.resources
    if len(resources) != 1:
        return []
    ((resource, per),) = resources.items()
    by_node = mapped_devices(dra, resource)
    if by_node is None:
        return UNKNOWN
    pod_requests = {k: v for k, v in tally.pod.requests.items() if k != resource}
    notebook = {k: v for k, v in tally.notebook_requests.items() if k != resource}
    out = []
    for name, devices in sorted(by_node.items()):
        facts = nodes.get(name)
        if facts is None or facts.allocatable.get(resource, 0) > 0:
            continue  # no Node (yet), or the device plugin's node (counted from allocatable)
        if blocked(tally.pod, facts, tally.tolerations) is not None:
            continue
        node_used = used.get(name, {})
        free_devices = free_mapped(dra, devices)
        capacity = len(devices) // per
        gpu_free = len(free_devices) // per
        free = min(room(pod_requests, facts, node_used), gpu_free)
        largest = min(gpu_free, max(tally.offering.counts)) if room(notebook, facts, node_used) >= 1 else 0
        out.append((name, (capacity, capacity - gpu_free, free, largest), [d.key for d in free_devices]))
    return out


def with_mapped(plugin: Availability, mapped: list[tuple[str, Row, list[DeviceKey]]]) -> Availability:
    """The device-plugin nodes' availability with the DRA nodes' rows added (each node is one or the other)."""
    if not mapped:
        return plugin
    rows = [(node, row) for node, row, _ in mapped]
    extra = summarise(rows)
    return Availability(
        capacity=(plugin.capacity or 0) + (extra.capacity or 0),
        allocated=(plugin.allocated or 0) + (extra.allocated or 0),
        free=(plugin.free or 0) + (extra.free or 0),
        largest_free=max(plugin.largest_free or 0, extra.largest_free or 0),
        nodes=tuple(sorted({*plugin.nodes, *extra.nodes})),
    )
