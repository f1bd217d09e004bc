"""Karpenter's NodePools (``karpenter.sh/v1``) -> the offerings their nodes would serve. Pure.

An autoscaled pool may have no node yet, so there is nothing for :func:`discover` to read; but a
NodePool's template says what its nodes will carry: the labels (GPU Feature Discovery's, where
the admin puts them there, as the devcluster's pools do), the taints, the requirements. Each
NodePool becomes one *template node* -- its labels, its single-valued ``In`` requirements as
labels, its taints, and the GPU resources GFD's labels imply -- and :func:`discover` reads that
node like any other, so a pool's offering is the very offering its real nodes give (one slug).

What the labels imply (the NVIDIA device plugin's conventions, as :mod:`.discovery` reads them):
``nvidia.com/mig-<profile>.count`` labels give that many ``nvidia.com/mig-<profile>`` and no
whole GPU (MIG mixed); otherwise ``nvidia.com/gpu.count`` times ``nvidia.com/gpu.replicas``
(time-slicing, MPS) give ``nvidia.com/gpu``. A pool whose template has neither is ignored, with
the reason, as is one whose node class does not exist.

A pool's limit is its ``spec.limits.nodes`` (Karpenter counts nodes under that key); the nodes it
has now are the nodes labelled ``karpenter.sh/nodepool`` with its name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.names.nvidia import COUNT_LABEL, GPU, MIG_PREFIX, REPLICAS_LABEL
from gpuspawner.offerings.discovery import DEFAULT_VGPU_CLASS_LABELS, discover

__all__ = ["NODEPOOL_LABEL", "Pool", "read_pools", "template_node"]

#: the label Karpenter puts on every node of a NodePool, its value the pool's name
NODEPOOL_LABEL = "karpenter.sh/nodepool"
_MIG_COUNT = re.compile(rf"^{re.escape(MIG_PREFIX)}(?P<profile>.+)\.count$")


@dataclass(frozen=True)
class Pool:
    """One NodePool that serves GPU offerings: the slugs of those, its node limit (None: none
    set) and how many nodes it has now."""

    name: str
    slugs: tuple[str, ...]
    limit: int | None
    nodes: int

    @property
    def room(self) -> int | None:
        """How many nodes it may still add (None: no limit)."""
        return None if self.limit is None else max(0, self.limit - self.nodes)

    def describe(self) -> str:
        """ "up to 4 nodes, 1 now: can grow by 3" / "... at its limit" / "no node limit, 0 now"."""
        if self.limit is None:
            return f"no node limit, {self.nodes} now"
        growth = "the pool is at its limit" if self.room == 0 else f"can grow by {self.room}"
        return f"up to {self.limit} node{'s' if self.limit != 1 else ''}, {self.nodes} now: {growth}"


def template_node(nodepool: Mapping[str, Any]) -> dict[str, Any]:
    """The Node a NodePool's template describes, as :func:`discover` reads nodes."""
    template = (nodepool.get("spec") or {}).get("template") or {}
    spec = template.get("spec") or {}
    labels = {str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()}
    for req in spec.get("requirements") or []:
        values = req.get("values") or []
        if req.get("operator") == "In" and len(values) == 1:
            labels.setdefault(str(req.get("key")), str(values[0]))
    labels[NODEPOOL_LABEL] = str((nodepool.get("metadata") or {}).get("name", ""))
    return {
        "metadata": {"name": f"nodepool/{labels[NODEPOOL_LABEL]}", "labels": labels},
        "spec": {"taints": [dict(t) for t in spec.get("taints") or []]},
        "status": {"allocatable": _implied_resources(labels)},
    }


def _implied_resources(labels: Mapping[str, str]) -> dict[str, str]:
    mig = {f"{MIG_PREFIX}{m['profile']}": v for k, v in labels.items() if (m := _MIG_COUNT.match(k)) and v.isdigit()}
    if mig:
        return {GPU: "0", **mig}
    count, replicas = labels.get(COUNT_LABEL, ""), labels.get(REPLICAS_LABEL, "1")
    if not count.isdigit():
        return {}
    return {GPU: str(int(count) * (int(replicas) if replicas.isdigit() and int(replicas) > 0 else 1))}


def _limit(nodepool: Mapping[str, Any]) -> tuple[int | None, str]:
    value = ((nodepool.get("spec") or {}).get("limits") or {}).get("nodes")
    if value is None:
        return None, ""
    text = str(value)
    return (int(text), "") if text.isdigit() else (None, f"its limits.nodes {text!r} is not a whole number of nodes")


def read_pools(
    nodepools: Iterable[Mapping[str, Any]],
    node_classes: Iterable[tuple[str, str, str]] | None,
    nodes: Iterable[Mapping[str, Any]] = (),
    vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS,
) -> tuple[list[Pool], list[Offering], list[tuple[str, str]]]:
    """(the GPU pools, the offerings their template nodes serve, (pool, why it is ignored) for
    the others). ``node_classes``: the (group, kind, name) of every node class that exists
    (None: not known, not checked); ``nodes``: the cluster's nodes, to count each pool's."""
    known = None if node_classes is None else set(node_classes)
    have: dict[str, int] = {}
    for node in nodes:
        pool = ((node.get("metadata") or {}).get("labels") or {}).get(NODEPOOL_LABEL)
        if pool:
            have[pool] = have.get(pool, 0) + 1
    pools: list[Pool] = []
    offerings: list[Offering] = []
    ignored: list[tuple[str, str]] = []
    for nodepool in nodepools:
        name = str((nodepool.get("metadata") or {}).get("name", ""))
        ref = (((nodepool.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeClassRef") or {}
        key = (str(ref.get("group", "")), str(ref.get("kind", "")), str(ref.get("name", "")))
        limit, bad_limit = _limit(nodepool)
        if known is not None and key not in known:
            ignored.append((name, f"its node class {key[1] or '?'} {key[2] or '?'} ({key[0] or 'no group'}) does not exist"))
            continue
        if bad_limit:
            ignored.append((name, bad_limit))
            continue
        found = discover([template_node(nodepool)], vgpu_class_labels)
        if not found:
            ignored.append(
                (
                    name,
                    f"no GPU: its template's labels say none ({COUNT_LABEL} or {MIG_PREFIX}<profile>.count, as GPU Feature"
                    " Discovery writes them), so the hub cannot tell what its nodes would have",
                )
            )
            continue
        pools.append(Pool(name, tuple(o.slug for o in found), limit, have.get(name, 0)))
        offerings.extend(o for o in found if o.slug not in {p.slug for p in offerings})
    return pools, offerings, ignored
