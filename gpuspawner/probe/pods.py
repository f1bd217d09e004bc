"""Pod UID -> namespace, name and container names: the probe's only question to Kubernetes.

The cgroup path gives a process's pod UID and container ID; the names Prometheus and the
culler join on come from the pod objects. Two sources:

* :class:`ApiPods`: the API server, ``list pods`` in the namespaces given (the notebooks'
  namespace by default, so the chart grants a namespaced Role, not a ClusterRole), only the
  pods on this node (``fieldSelector=spec.nodeName=<node>``). Listed again when a UID it
  has not seen turns up, at most every ``refresh_s`` seconds.
* :class:`StaticPods`: a ``kubectl get pods -o json`` file (``--pods FILE``; tests, offline).

Not the kubelet's ``/pods``: reading it needs ``nodes/proxy``, which also allows exec into
every pod on the node. Not the process's environment (``HOSTNAME``): a user sets that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("gpuspawner.probe")


@dataclass(frozen=True)
class PodName:
    namespace: str
    name: str
    #: container ID (without "containerd://") -> container name
    containers: Mapping[str, str] = field(default_factory=dict)


class PodDirectory(Protocol):
    def lookup(self, uid: str) -> PodName | None: ...


def index_pods(items: Iterable[Mapping[str, Any]]) -> dict[str, PodName]:
    """UID -> PodName from pod objects (``kubectl get pods -o json``'s ``items``)."""
    out: dict[str, PodName] = {}
    for pod in items:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            continue
        status = pod.get("status") or {}
        containers = {}
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for c in status.get(key) or []:
                cid = str(c.get("containerID") or "")
                if "://" in cid:
                    containers[cid.split("://", 1)[1]] = str(c.get("name", ""))
        out[str(uid)] = PodName(str(meta.get("namespace", "")), str(meta.get("name", "")), containers)
    return out


class StaticPods:
    def __init__(self, items: Iterable[Mapping[str, Any]]) -> None:
        self.pods = index_pods(items)

    @classmethod
    def from_file(cls, path: str) -> StaticPods:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: cannot read a pod list ({exc}); give `kubectl get pods -o json` output") from None
        items = data.get("items") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON object with an 'items' list, as `kubectl get pods -o json` prints")
        return cls(items)

    def lookup(self, uid: str) -> PodName | None:
        return self.pods.get(uid)


class ApiPods:
    """The pods on ``node`` in ``namespaces``, from the API server (in-cluster or kubeconfig)."""

    def __init__(
        self,
        node: str,
        namespaces: Iterable[str],
        refresh_s: float = 30.0,
        kubeconfig: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.namespaces = list(namespaces)
        self.refresh_s = refresh_s
        self.kubeconfig = kubeconfig
        self.clock = clock
        self.pods: dict[str, PodName] = {}
        self.errors = 0
        self._listed_at: float | None = None

    def lookup(self, uid: str) -> PodName | None:
        if uid not in self.pods and (self._listed_at is None or self.clock() - self._listed_at >= self.refresh_s):
            self.refresh()
        return self.pods.get(uid)

    def refresh(self) -> None:
        self._listed_at = self.clock()
        try:
            items = asyncio.run(self._list())
        except Exception as exc:  # the API server down or RBAC missing: names stay as they were
            self.errors += 1
            log.warning("could not list pods on node %s in %s: %s: %s", self.node, ",".join(self.namespaces), type(exc).__name__, exc)
            return
        self.pods = index_pods(items)

    async def _list(self) -> list[dict[str, Any]]:
        from kubernetes_asyncio import client, config

        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]  # (kubernetes_asyncio leaves it unannotated)
        except config.ConfigException:
            await config.load_kube_config(config_file=self.kubeconfig)
        async with client.ApiClient() as api_client:
            api: Any = client.CoreV1Api(api_client)  # (with _preload_content=False it answers the raw response)
            items: list[dict[str, Any]] = []
            for ns in self.namespaces:
                resp = await api.list_namespaced_pod(ns, field_selector=f"spec.nodeName={self.node}", _preload_content=False)
                items.extend(json.loads(await resp.read())["items"])
            return items
