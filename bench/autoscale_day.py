"""A simulated day on an autoscaled H100 pool, with and without the GPU culler: GPU node-hours
held, what the culler's idle reclaims let go, and the users who waited for a node.

A model, not a cluster: minute steps over 24 hours; users start notebooks of one GPU in a
morning and an afternoon burst and at random, work in active stretches with idle gaps between
them, and go home leaving the notebook running unless they stop it (some do); a notebook the
culler stopped in a gap is started again when its user comes back. The pool is the
devcluster's H100 pool (8 GPUs a node, its node limit and price: gpuspawner.devcluster.karpenter
POOLS); a new node is ready ``--boot`` minutes after a spawn finds no free GPU; a node is removed
the minute it is empty (consolidation; ``karpenter.sh/do-not-disrupt`` keeps busy ones). The
culler stops a notebook idle for the culler's own idle timeout for a whole GPU
(gpuspawner.culler.policy's default). The held and "not held after an idle reclaim" figures are
computed by the same code as ``gpuspawner report --nodeclaims`` (gpuspawner.tools.nodehours)
from the NodeClaim lives and action records the run produces. Nothing asserted.

    python -m bench.autoscale_day [--users 60] [--seed 7] [--boot 3]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpuspawner.culler.policy import Policy
from gpuspawner.devcluster.karpenter import POOLS
from gpuspawner.tools import nodehours

POOL = next(p for p in POOLS if p.name == "gpu-h100")
GPUS_PER_NODE = 8
DAY = 24 * 60
START = datetime(2026, 11, 30, tzinfo=UTC)


@dataclass
class Session:
    user: str
    arrive: int  # minute of the day the spawn is asked for
    active: list[tuple[int, int]]  # (from, to) minutes after the notebook is up
    leaves: int  # minutes after it is up: the user is gone
    stops_on_leaving: bool


@dataclass
class Node:
    name: str
    created: int
    ready: int
    used: set[str] = field(default_factory=set)
    deleted: int | None = None


def sessions(users: int, rng: random.Random) -> list[Session]:
    out = []
    for i in range(users):
        burst = rng.random()
        arrive = (
            int(rng.gauss(9.5 * 60, 20)) if burst < 0.4 else int(rng.gauss(13.5 * 60, 25)) if burst < 0.7 else rng.randint(7 * 60, 20 * 60)
        )
        at, active = 0, []
        for _ in range(rng.randint(1, 4)):  # stretches of work with idle gaps (reading, a meeting, lunch)
            length = rng.randint(10, 90)
            active.append((at, at + length))
            at += length + rng.randint(5, 120)
        out.append(Session(f"user{i}", max(0, min(arrive, DAY - 60)), active, at, rng.random() < 0.3))
    return sorted(out, key=lambda s: s.arrive)


def simulate(plan: list[Session], culler: bool, boot: int, idle_timeout_min: int) -> dict[str, object]:
    nodes: list[Node] = []
    waiting: list[tuple[Session, int]] = []  # (session, asked at)
    running: dict[str, tuple[Session, int, Node]] = {}  # user -> (session, up since, node)
    waited, waits, actions, restarts = 0, [], [], 0
    by_minute: dict[int, list[Session]] = {}
    for s in plan:
        by_minute.setdefault(s.arrive, []).append(s)
    for minute in range(DAY):
        waiting += [(s, minute) for s in by_minute.get(minute, [])]
        still = []
        for s, asked in waiting:  # place on a ready node with room, else wait (a node is asked for)
            node = next((n for n in nodes if n.deleted is None and n.ready <= minute and len(n.used) < GPUS_PER_NODE), None)
            if node is None:
                booting = sum(GPUS_PER_NODE - len(n.used) for n in nodes if n.deleted is None and n.ready > minute)
                live = sum(1 for n in nodes if n.deleted is None)
                if booting < sum(1 for w in waiting if w[1] <= asked) and live < POOL.max_nodes:
                    nodes.append(Node(f"{POOL.name}-{len(nodes)}", minute, minute + boot))
                still.append((s, asked))
                continue
            node.used.add(s.user)
            running[s.user] = (s, minute, node)
            if minute > asked:
                waited, waits = waited + 1, [*waits, minute - asked]
        waiting = still
        for user, (s, up, node) in list(running.items()):
            age = minute - up
            last_active = max((min(b, age) for a, b in s.active if a <= age), default=0)
            stop = age >= s.leaves and s.stops_on_leaving
            if culler and not stop and age - last_active >= idle_timeout_min and not any(a <= age < b for a, b in s.active):
                stop = True
                when = (START + timedelta(minutes=minute)).isoformat()
                actions.append({"time": when, "action": "server_stopped", "reason": "idle", "user": user, "nodes": [node.name]})
            if stop:
                node.used.discard(user)
                del running[user]
                later = [(a - age, b - age) for a, b in s.active if a > age]
                if later and minute + later[0][0] < DAY:  # culled between stretches: the user comes back and starts it again
                    back = minute + later[0][0]
                    again = Session(
                        user, back, [(a - later[0][0], b - later[0][0]) for a, b in later], s.leaves - age - later[0][0], s.stops_on_leaving
                    )
                    by_minute.setdefault(back, []).append(again)
                    restarts += 1
        for node in nodes:  # consolidation: an empty, ready node goes
            if node.deleted is None and node.ready <= minute and not node.used:
                node.deleted = minute
    lives = [
        nodehours.NodeLife(
            n.name,
            POOL.name,
            n.name,
            GPUS_PER_NODE,
            START + timedelta(minutes=n.created),
            None if n.deleted is None else START + timedelta(minutes=n.deleted),
            POOL.price,
        )
        for n in nodes
    ]
    pools = nodehours.measure(lives, nodehours.idle_reclaims(actions), START, START + timedelta(minutes=DAY), timedelta(minutes=5))
    row = pools.get(POOL.name, nodehours.PoolHours(POOL.name))
    return {
        "nodes made": row.nodes,
        "GPU node-hours held": row.gpu_node_hours,
        "cost held ($)": row.cost or 0.0,
        "idle reclaims": len(actions),
        "nodes let go after one": len(row.releases),
        "GPU node-hours not held after": row.gpu_hours_not_held,
        "users who waited for a node": waited,
        "longest wait (min)": max(waits, default=0),
        "never served": len(waiting),
        "restarts after a cull": restarts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--boot", type=int, default=3, help="minutes from a node asked for to ready (a stand-in for a cloud's)")
    args = parser.parse_args()
    timeout = Policy().kind_timeouts.get("full", Policy().default_timeout) // 60
    plan = sessions(args.users, random.Random(args.seed))
    without = simulate(plan, culler=False, boot=args.boot, idle_timeout_min=timeout)
    with_culler = simulate(plan, culler=True, boot=args.boot, idle_timeout_min=timeout)
    print(f"A simulated day: {args.users} users, pool {POOL.name} (up to {POOL.max_nodes} nodes of {GPUS_PER_NODE} GPUs, ${POOL.price}/h)")
    print(f"culler idle timeout for a whole GPU: {timeout} min; a node ready {args.boot} min after it is asked for\n")
    print(f"{'':34}{'without culler':>16}{'with culler':>14}{'ratio':>8}")
    for key, before in without.items():
        after = with_culler[key]
        assert isinstance(before, int | float) and isinstance(after, int | float)
        ratio = f"{after / before:.2f}" if before else "-"
        print(f"{key:34}{before:>16.1f}{after:>14.1f}{ratio:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
