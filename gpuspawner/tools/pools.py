"""`gpuspawner offerings`' autoscaled pools: Karpenter's NodePools (``karpenter.sh/v1``) and the
node classes they name, read from the live cluster (or ``--nodepools FILE``), turned into
offerings by :mod:`gpuspawner.offerings.nodepools` and printed with their limits, and the pools
ignored with their reasons."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.offerings.nodepools import Pool, read_pools

NODEPOOLS = "/apis/karpenter.sh/v1/nodepools"


@dataclass
class Pools:
    """What was read: the GPU pools, their offerings, the pools ignored, and ``note`` where no
    NodePool could be read at all (why, in one line)."""

    pools: list[Pool] = field(default_factory=list)
    offerings: list[Offering] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodepools", metavar="FILE", help="`kubectl get nodepools -o json` output: Karpenter's autoscaled pools (with --nodes)"
    )


def read(args: argparse.Namespace, nodes: list[dict[str, Any]], vgpu_class_labels: Any, read_items: Any) -> Pools:
    """The pools of ``--nodepools FILE`` (node classes not checked), or of the live cluster where
    ``--nodes`` is not given. ``read_items``: the CLI's reader of ``kubectl get -o json`` files."""
    if args.nodepools:
        items, classes, note = read_items(args.nodepools, "nodepools"), None, ""
    elif args.nodes:
        return Pools()
    else:
        items, classes, note = _live(args.kubeconfig)
    if items is None:
        return Pools(note=note)
    pools, offerings, ignored = read_pools(items, classes, nodes, vgpu_class_labels)
    return Pools(pools, offerings, ignored)


def show(found: Pools, print_line: Any = print) -> None:
    """The pools section of `gpuspawner offerings`' table."""
    if found.note:
        print_line(f"\n# Autoscaled pools: none read ({found.note}).")
        return
    if not (found.pools or found.ignored):
        return
    print_line("\nAutoscaled pools (Karpenter NodePools):")
    for pool in found.pools:
        print_line(f"  {pool.name}: {', '.join(pool.slugs)}; {pool.describe()}")
    for name, why in found.ignored:
        print_line(f"  {name}: ignored: {why}")


def _live(kubeconfig: str | None) -> tuple[list[dict[str, Any]] | None, set[tuple[str, str, str]] | None, str]:
    """(NodePools, the node classes that exist, note) from the cluster; NodePools None (and the
    note saying why) where Karpenter's CRDs are not served or not ours to read."""
    import asyncio

    from kubernetes_asyncio import client, config

    async def fetch() -> tuple[list[dict[str, Any]] | None, set[tuple[str, str, str]] | None, str]:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]  # (kubernetes_asyncio leaves it unannotated)
        except config.ConfigException:
            await config.load_kube_config(config_file=kubeconfig)
        async with client.ApiClient() as api_client:

            async def get(path: str) -> tuple[int, Any]:
                answer = await api_client.call_api(
                    path,
                    "GET",
                    {},
                    [],
                    {"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    response_types_map={},
                    _preload_content=False,
                )
                return answer.status, json.loads(await answer.read()) if answer.status < 400 else None

            status, body = await get(NODEPOOLS)
            if status == 404:
                return None, None, "Karpenter's NodePools (karpenter.sh/v1) are not served by this cluster"
            if status >= 400:
                return None, None, f"listing Karpenter's NodePools answered {status}"
            items = body.get("items") or []
            classes: set[tuple[str, str, str]] = set()
            kinds = {(str(r.get("group", "")), str(r.get("kind", ""))) for r in map(_class_ref, items) if r}
            for group, kind in kinds:
                classes |= {(group, kind, name) for name in await _names(get, group, kind)}
            return items, classes, ""

    return asyncio.run(fetch())


def _class_ref(nodepool: Mapping[str, Any]) -> Mapping[str, Any]:
    return (((nodepool.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeClassRef") or {}


async def _names(get: Any, group: str, kind: str) -> list[str]:
    """The names of the cluster-scoped objects of ``kind`` in API ``group`` (none where the
    group or kind is not served)."""
    status, api_group = await get(f"/apis/{group}") if group else (404, None)
    if status >= 400:
        return []
    version = ((api_group or {}).get("preferredVersion") or {}).get("groupVersion")
    status, resources = await get(f"/apis/{version}")
    plural = next((r["name"] for r in (resources or {}).get("resources") or [] if r.get("kind") == kind and "/" not in r["name"]), None)
    if status >= 400 or plural is None:
        return []
    status, listed = await get(f"/apis/{version}/{plural}")
    return [str(o["metadata"]["name"]) for o in (listed or {}).get("items") or []] if status < 400 else []
