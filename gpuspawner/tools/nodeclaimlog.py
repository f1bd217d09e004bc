"""``gpuspawner record-nodeclaims FILE``: Karpenter's NodeClaims as they change, appended to a JSON
lines file that ``gpuspawner report --nodeclaims FILE`` reads (docs/autoscaling.md).

A deleted NodeClaim leaves the API, so the node-hours report needs a record kept while the
claims lived: this lists NodeClaims (``karpenter.sh/v1``), then watches them, and appends one line
per claim each time what the report reads of it changes (its name, uid, creation and deletion
times, node, allocatable and its pool, price and GPU-count labels: :func:`trimmed`), nothing
else, so a claim takes at most five lines in its life (created, priced, its allocatable, its
node, deleted). The file is never rewritten: a
restarted recorder reads it back to know what it wrote, and a claim it had recorded alive that is gone from the API when it lists
again (deleted while it did not watch) is written deleted at that list's time (at the latest:
the report's figure for it is then an upper bound). A ``DELETED`` event whose object has no
``deletionTimestamp`` (a claim without Karpenter's finalizer) is stamped with the time it was
heard.

Where the cluster does not serve Karpenter's CRDs (404) or may not be read (403) it says so and
asks again every minute (said once). In a deployment it runs as a hub-managed service in the
hub pod (``hub_config/z2jh_values.yaml``), writing beside the culler's action log on the hub's
volume, with the hub's account (the gpuspawner chart's ``karpenter.enabled`` lets it list and
watch NodeClaims).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuspawner.names import nvidia
from gpuspawner.tools import nodehours

log = logging.getLogger("gpuspawner.nodeclaimlog")
GROUP, VERSION, PLURAL = "karpenter.sh", "v1", "nodeclaims"
#: the labels the report reads (the pool, the kwok provider's price, GFD's GPU count): Karpenter's
#: own labels come and go as the node registers and would each make a line
LABELS = frozenset({nodehours.POOL_LABEL, nodehours.PRICE_LABEL, nvidia.COUNT_LABEL})
#: seconds between tries where NodeClaims cannot be read, and of one watch
RETRY_SECONDS = 60.0
WATCH_SECONDS = 240


def trimmed(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the node-hours report reads of a NodeClaim (``tools.nodehours.node_lives``)."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    keep = ("name", "uid", "creationTimestamp", "deletionTimestamp")
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k in LABELS}
    return {
        "apiVersion": obj.get("apiVersion") or f"{GROUP}/{VERSION}",
        "kind": obj.get("kind") or "NodeClaim",
        "metadata": {**{k: meta[k] for k in keep if meta.get(k) is not None}, **({"labels": labels} if labels else {})},
        "status": {k: status[k] for k in ("nodeName", "allocatable") if status.get(k) is not None},
    }


def _key(record: Mapping[str, Any]) -> str:
    meta = record.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name") or "")


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClaimLog:
    """The lines to append: what was written last of each claim (by uid), and what changed. Pure."""

    def __init__(self, written: list[dict[str, Any]] | None = None) -> None:
        self.last: dict[str, dict[str, Any]] = {}
        for record in written or ():
            if _key(record):
                self.last[_key(record)] = record

    def changed(self, obj: Mapping[str, Any], heard: datetime, deleted: bool = False) -> dict[str, Any] | None:
        """The record to append for ``obj`` (None: the report would read nothing new); ``deleted``:
        the watch said DELETED, so a claim without a deletion time was deleted when it was heard."""
        record = trimmed(obj)
        if deleted and "deletionTimestamp" not in record["metadata"]:
            record["metadata"]["deletionTimestamp"] = _stamp(heard)
        key = _key(record)
        before = self.last.get(key)
        if not key or before == record or (before and "deletionTimestamp" in before["metadata"] and not deleted):
            return None  # (a deletion once written stays written)
        self.last[key] = record
        return record

    def gone(self, listed: list[Mapping[str, Any]], heard: datetime) -> list[dict[str, Any]]:
        """The records of claims written alive that a new list no longer has: deleted by ``heard``."""
        present = {_key(trimmed(o)) for o in listed}
        out = []
        for key, record in list(self.last.items()):
            if key not in present and "deletionTimestamp" not in record["metadata"]:
                ended = {**record, "metadata": {**record["metadata"], "deletionTimestamp": _stamp(heard)}}
                self.last[key] = ended
                out.append(ended)
        return out


def read_back(path: Path) -> ClaimLog:
    """The log of what ``path`` holds already (empty where it does not exist)."""
    if not path.exists():
        return ClaimLog()
    return ClaimLog(nodehours.json_objects(path.read_text(encoding="utf-8"), str(path)))


async def record(path: Path, kubeconfig: str | None = None, stop: asyncio.Event | None = None) -> None:
    """List and watch NodeClaims, appending changes to ``path``, until ``stop`` is set."""
    from kubernetes_asyncio import client, config

    loader: Any = config  # (kubernetes_asyncio's loaders are untyped)
    try:
        loader.load_incluster_config()
    except config.ConfigException:
        await loader.load_kube_config(config_file=kubeconfig)
    claims = read_back(path)
    stop = stop or asyncio.Event()
    async with client.ApiClient() as api_client:
        api: Any = client.CustomObjectsApi(api_client)
        with path.open("a", encoding="utf-8") as out:

            def append(records: list[dict[str, Any]]) -> None:
                for item in records:
                    out.write(json.dumps(item, sort_keys=True) + "\n")
                out.flush()

            said = ""
            while not stop.is_set():
                try:
                    if not await _until_stopped(_list_and_watch(api, claims, append, stop), stop):
                        return
                except Exception as exc:  # noqa: BLE001 - said (once), and asked again
                    why = {404: "Karpenter's NodeClaims (karpenter.sh/v1) are not served", 403: "may not list/watch nodeclaims"}
                    now_said = why.get(int(getattr(exc, "status", 0) or 0), f"{type(exc).__name__}: {exc}")
                    level = logging.DEBUG if now_said == said else logging.WARNING
                    said = now_said
                    log.log(level, "record-nodeclaims: %s; asking again every %.0f s", said, RETRY_SECONDS)
                    try:
                        await asyncio.wait_for(stop.wait(), RETRY_SECONDS)
                    except TimeoutError:
                        pass


async def _until_stopped(work: Any, stop: asyncio.Event) -> bool:
    """Run ``work`` (a coroutine) until it ends (True; its exception raised) or ``stop`` is set
    (False: it is cancelled, a watch waiting for its next event included)."""
    task, stopped = asyncio.ensure_future(work), asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for pending in (task, stopped):
        if pending not in done:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
    if task in done:
        task.result()
        return True
    return False


async def _list_and_watch(api: Any, claims: ClaimLog, append: Any, stop: asyncio.Event) -> None:
    listed = await api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    now = datetime.now(UTC)
    items = listed.get("items") or []
    append([r for r in (claims.changed(o, now) for o in items) if r is not None] + claims.gone(items, now))
    version = (listed.get("metadata") or {}).get("resourceVersion", "")
    while not stop.is_set():
        resp = await api.list_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            watch=True,
            resource_version=version,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=WATCH_SECONDS + 60,
        )
        try:
            if resp.status >= 400:
                raise RuntimeError(f"watching NodeClaims answered {resp.status}")
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        return  # (too old: list again)
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    changed = claims.changed(obj, datetime.now(UTC), deleted=event["type"] == "DELETED")
                    append([changed] if changed is not None else [])
        finally:
            resp.release()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="FILE", help="the JSON lines file to append to (created if missing)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig outside a cluster (default: in-cluster, then $KUBECONFIG)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        asyncio.run(record(Path(args.output), args.kubeconfig))
    except KeyboardInterrupt:
        return 0
    except nodehours.NodeHoursError as exc:
        print(f"gpuspawner record-nodeclaims: {args.output} is not a NodeClaim record: {exc}", file=sys.stderr)
        return 1
    return 0
