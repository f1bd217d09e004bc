"""GPU node-hours held per autoscaled pool, and those the culler's idle reclaims let go, measured
from Karpenter's NodeClaims (``karpenter.sh/v1``) and the culler's action log. Pure.

The measure (docs/autoscaling.md, "Node-hours and what idle reclaim saved"):

- A NodeClaim lived from its ``metadata.creationTimestamp`` to its ``metadata.deletionTimestamp``
  (when Karpenter, or anyone, began to delete it: its node takes no new pod from then), or to
  the end of the range while it has none. Its GPUs are the node's physical GPUs (GFD's label
  ``nvidia.com/gpu.count``, else ``status.allocatable["nvidia.com/gpu"]``); a claim with none
  is no GPU node and is left out. Its price per hour is the admin's for its pool, else the
  label Karpenter's kwok provider writes (``eks-node-viewer/instance-price``), else unknown.
- Held: each GPU NodeClaim's hours inside the range, per pool, times its GPUs (and price).
- Released after an idle reclaim: a NodeClaim whose deletion began within ``window`` after the
  culler stopped an idle server (``server_stopped`` for an idle reason) whose record names the
  claim's node, and no later than the range's end.
- Not held after it: for each released claim, the hours from its deletion to the next NodeClaim
  its pool made (when the pool grew again), or to the range's end: time the pool measurably ran
  with that node fewer. Neither figure is a guess of what the user would have done.

NodeClaims go from the API once deleted, so the input is what ``kubectl get nodeclaims -o json
--watch`` wrote (each change, the deletion included, one object after another), what
``gpuspawner record-nodeclaims`` appended (``tools.nodeclaimlog``), or one list.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpuspawner.names import nvidia
from gpuspawner.names.vocabulary import StopReason

POOL_LABEL = "karpenter.sh/nodepool"
PRICE_LABEL = "eks-node-viewer/instance-price"  # Karpenter's kwok provider (kwok/apis/v1alpha1/labels.go)
STOPPED = "server_stopped"
#: the culler's reasons that say the GPU sat idle (not a lease, a budget or an age limit)
IDLE_REASONS = frozenset({StopReason.IDLE, StopReason.GPU_IDLE_LIMIT, StopReason.WAITING, StopReason.UNRESPONSIVE})


class NodeHoursError(ValueError):
    """Input that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class NodeLife:
    name: str
    pool: str
    node: str
    gpus: int
    created: datetime
    deleted: datetime | None
    price: float | None


@dataclass(frozen=True)
class Release:
    """A node that went after an idle reclaim on it."""

    claim: str
    pool: str
    node: str
    gpus: int
    reclaimed: datetime
    deleted: datetime
    #: hours the pool ran without it: to its next new node, or the range's end
    not_held_h: float
    price: float | None
    user: str = ""

    @property
    def minutes_after_reclaim(self) -> float:
        return (self.deleted - self.reclaimed).total_seconds() / 60


@dataclass
class PoolHours:
    pool: str
    nodes: int = 0
    node_hours: float = 0.0
    gpu_node_hours: float = 0.0
    cost: float | None = 0.0
    releases: list[Release] = field(default_factory=list)

    @property
    def gpu_hours_not_held(self) -> float:
        return sum(r.not_held_h * r.gpus for r in self.releases)

    @property
    def cost_not_paid(self) -> float | None:
        prices = [r.price for r in self.releases]
        if any(p is None for p in prices):
            return None
        return sum(r.not_held_h * (r.price or 0.0) for r in self.releases)


def _time(text: object, what: str) -> datetime:
    if not isinstance(text, str):
        raise NodeHoursError(f"{what}: no time")
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as error:
        raise NodeHoursError(f"{what}: {text!r} is not an RFC 3339 time") from error
    if value.tzinfo is None:
        raise NodeHoursError(f"{what}: {text!r} has no time zone")
    return value


def json_objects(text: str, what: str) -> list[dict[str, Any]]:
    """Every JSON object in ``text``: one object, a JSON array, a list (``items``) or objects one
    after another (``kubectl ... -o json --watch``, JSON lines)."""
    decoder, at = json.JSONDecoder(), 0
    out: list[dict[str, Any]] = []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return out
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as error:
            raise NodeHoursError(f"{what}: not JSON at line {error.lineno}: {error.msg}") from error
        items = value.get("items") if isinstance(value, dict) and str(value.get("kind", "")).endswith("List") else value
        for item in items if isinstance(items, list) else [value]:
            if not isinstance(item, dict):
                raise NodeHoursError(f"{what}: an entry is not a JSON object")
            out.append(item)


def node_lives(objects: Iterable[Mapping[str, Any]], prices: Mapping[str, float] | None = None) -> list[NodeLife]:
    """The GPU NodeClaims among ``objects`` (the last state of each, by uid), as lives."""
    last: dict[str, Mapping[str, Any]] = {}
    for obj in objects:
        if obj.get("kind") != "NodeClaim" or not str(obj.get("apiVersion", "")).startswith("karpenter.sh/"):
            raise NodeHoursError(f"not a Karpenter NodeClaim: {obj.get('apiVersion')}/{obj.get('kind')}")
        meta = obj.get("metadata") or {}
        key = str(meta.get("uid") or meta.get("name") or "")
        if not key:
            raise NodeHoursError("a NodeClaim without a name")
        if key not in last or meta.get("deletionTimestamp") or not (last[key].get("metadata") or {}).get("deletionTimestamp"):
            last[key] = obj  # a deletion seen stays seen
    lives = []
    for obj in last.values():
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        labels = meta.get("labels") or {}
        name = str(meta.get("name", ""))
        gpus = _gpus(labels, status.get("allocatable") or {}, name)
        if not gpus:
            continue
        pool = str(labels.get(POOL_LABEL, ""))
        price = (prices or {}).get(pool)
        if price is None and labels.get(PRICE_LABEL):
            try:
                price = float(labels[PRICE_LABEL])
            except ValueError:
                price = None
        deleted = meta.get("deletionTimestamp")
        lives.append(
            NodeLife(
                name=name,
                pool=pool,
                node=str(status.get("nodeName", "")),
                gpus=gpus,
                created=_time(meta.get("creationTimestamp"), f"NodeClaim {name}: creationTimestamp"),
                deleted=_time(deleted, f"NodeClaim {name}: deletionTimestamp") if deleted else None,
                price=price,
            )
        )
    return sorted(lives, key=lambda life: life.created)


def _gpus(labels: Mapping[str, Any], allocatable: Mapping[str, Any], name: str) -> int:
    for value in (labels.get(nvidia.COUNT_LABEL), allocatable.get(nvidia.GPU)):
        if value not in (None, ""):
            try:
                return int(str(value))
            except ValueError as error:
                raise NodeHoursError(f"NodeClaim {name}: GPU count {value!r} is not a whole number") from error
    return 0


def _hours(start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0) / 3600


def idle_reclaims(actions: Iterable[Mapping[str, Any]]) -> list[tuple[datetime, str, str]]:
    """(when, node, user) of each idle server stop in the culler's action log that names a node."""
    out = []
    for entry in actions:
        if entry.get("action") != STOPPED or entry.get("reason") not in IDLE_REASONS:
            continue
        when = _time(entry.get("time"), "culler action log entry")
        for node in entry.get("nodes") or ():
            out.append((when, str(node), str(entry.get("user", ""))))
    return sorted(out)


def measure(
    lives: list[NodeLife],
    reclaims: list[tuple[datetime, str, str]],
    since: datetime,
    until: datetime,
    window: timedelta = timedelta(minutes=30),
) -> dict[str, PoolHours]:
    """Per pool: GPU node-hours held in [``since``, ``until``] and the releases after idle reclaims."""
    pools: dict[str, PoolHours] = {}
    for life in lives:
        end = min(life.deleted or until, until)
        start = max(life.created, since)
        if end <= start:
            continue
        row = pools.setdefault(life.pool, PoolHours(life.pool))
        hours = _hours(start, end)
        row.nodes += 1
        row.node_hours += hours
        row.gpu_node_hours += hours * life.gpus
        row.cost = None if row.cost is None or life.price is None else row.cost + hours * life.price
        if life.deleted is None or not since <= life.deleted <= until:
            continue
        before = [r for r in reclaims if r[1] == life.node and timedelta(0) <= life.deleted - r[0] <= window]
        if not before:
            continue
        when, _, user = before[-1]
        grown = [other.created for other in lives if other.pool == life.pool and other.created > life.deleted]
        back = min([*grown, until])
        row.releases.append(
            Release(life.name, life.pool, life.node, life.gpus, when, life.deleted, _hours(life.deleted, back), life.price, user)
        )
    return dict(sorted(pools.items()))


def render(pools: Mapping[str, PoolHours], fmt: str = "table") -> str:
    """The pools' rows: table (with a total) or JSON."""
    if fmt == "json":
        return json.dumps(
            [
                {
                    "pool": p.pool,
                    "nodes": p.nodes,
                    "node_hours": round(p.node_hours, 3),
                    "gpu_node_hours": round(p.gpu_node_hours, 3),
                    "cost": None if p.cost is None else round(p.cost, 2),
                    "released_after_idle_reclaim": len(p.releases),
                    # (to the second and below: a node let go minutes ago has saved a little already)
                    "gpu_node_hours_not_held": round(p.gpu_hours_not_held, 6),
                    "cost_not_paid": None if p.cost_not_paid is None else round(p.cost_not_paid, 6),
                    "releases": [
                        {
                            "nodeclaim": r.claim,
                            "node": r.node,
                            "user": r.user,
                            "reclaimed": r.reclaimed.isoformat(),
                            "deleted": r.deleted.isoformat(),
                            "minutes_after_reclaim": round(r.minutes_after_reclaim, 1),
                            "hours_not_held": round(r.not_held_h, 6),
                        }
                        for r in p.releases
                    ],
                }
                for p in pools.values()
            ],
            indent=2,
        )
    if not pools:
        return "GPU nodes of autoscaled pools: none lived in the range (no GPU NodeClaim)."

    def money(value: float | None) -> str:
        return "price unknown" if value is None else f"${_amount(value)}"

    lines = ["GPU nodes of autoscaled pools (measured from Karpenter's NodeClaims):"]
    for p in pools.values():
        lines.append(
            f"  {p.pool}: {p.nodes} node(s), {p.node_hours:.2f} node-hours, {p.gpu_node_hours:.2f} GPU node-hours ({money(p.cost)})"
        )
        if p.releases:
            after = sum(r.minutes_after_reclaim for r in p.releases) / len(p.releases)
            lines.append(
                f"    {len(p.releases)} node(s) let go after an idle reclaim (on average {after:.1f} min after it); "
                f"the pool then ran {_amount(p.gpu_hours_not_held)} GPU node-hours without them ({money(p.cost_not_paid)} not paid)"
            )
        for r in p.releases:
            cost = None if r.price is None else r.not_held_h * r.price
            lines.append(
                f"      NodeClaim {r.claim} (node {r.node}): deleted {r.minutes_after_reclaim:.1f} min after "
                f"{r.user or 'a user'}'s idle server was stopped at {r.reclaimed:%Y-%m-%d %H:%M:%S %Z}; the pool then ran "
                f"{_duration(r.not_held_h)} without it ({_amount(r.not_held_h * r.gpus)} GPU node-hours, {money(cost)} not paid)"
            )
    return "\n".join(lines)


def _amount(value: float) -> str:
    """Two decimals, or four where that would say 0 of something that is not (a node let go minutes ago)."""
    return f"{value:,.2f}" if value == 0 or abs(value) >= 0.005 else f"{value:.4f}"


def _duration(hours: float) -> str:
    seconds = hours * 3600
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{hours:.2f} h"
