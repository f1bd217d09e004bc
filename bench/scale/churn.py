"""Other people's pods: many of them, in other namespaces, coming and going at a steady rate.

``fill`` creates the standing pods with ``spec.nodeName`` set (as a DaemonSet or a batch system
binds them), spread over the nodes within what each node allows, from several threads each with
its own keep-alive connection. ``Churn`` then deletes the oldest and creates new ones through the
real scheduler at a fixed rate, in a thread of its own, until stopped. Their shape is that of
real workload pods (labels, an owner, env, a volume, requests): what every cluster-wide pod
watch must read.
"""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import random
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlparse

from gpuspawner.devcluster.clusterstate import ClusterState
from gpuspawner.devcluster.nodes import CLASS_LABEL

NAMESPACES = [f"team-{i:02d}" for i in range(20)]
LABEL = "bench.gpuspawner.io/churn"


class Conn:
    """One keep-alive HTTPS connection to the API server (the admin token), reconnecting on error."""

    def __init__(self, state: ClusterState):
        url = urlparse(state.server)
        self.host, self.port = url.hostname, url.port
        self.context = ssl.create_default_context(cafile=str(state.path / "pki" / "ca.crt"))
        self.token = state.token
        self.conn: http.client.HTTPSConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        for attempt in (1, 2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=30)
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw[:1] == b"{" else {})
            except (OSError, http.client.HTTPException):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt == 2:
                    return 0, {}
        return 0, {}


def pod(name: str, namespace: str, rng: random.Random, node: str | None = None, gpu: str | None = None, node_class: str = "") -> dict:
    """A workload pod as a Job would make it (about 2 KB of JSON, like a real one)."""
    limits = {gpu: "1"} if gpu else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL: "1", "app.kubernetes.io/name": "etl", "batch.kubernetes.io/job-name": name[:40], "team": namespace},
            "annotations": {"example.org/commit": f"{rng.getrandbits(160):040x}", "example.org/owner": f"{namespace}@example.org"},
        },
        "spec": {
            **({"nodeName": node} if node else {}),
            **({"nodeSelector": {CLASS_LABEL: node_class}} if node_class else {}),
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.org/team/etl:2026.11",
                    "command": ["python", "-m", "etl.run", "--shard", str(rng.randrange(1000))],
                    "env": [{"name": f"ETL_SETTING_{i}", "value": f"value-{rng.getrandbits(32):08x}"} for i in range(8)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi", **limits}},
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
        },
    }


def ensure_namespaces(state: ClusterState, names: list[str]) -> None:
    conn = Conn(state)
    for name in names:
        conn.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def fill(state: ClusterState, nodes: list[str], count: int, threads: int = 8, seed: int = 30) -> tuple[list[tuple[str, str]], float]:
    """``count`` standing pods bound round robin to ``nodes`` (CPU only: they never change a GPU
    count, so the benchmark's GPU spawns always fit). Returns (namespace, name) of each, and the
    seconds it took."""
    ensure_namespaces(state, NAMESPACES)
    rng = random.Random(seed)
    made = [(NAMESPACES[i % len(NAMESPACES)], f"standing-{i:06d}", nodes[i % len(nodes)]) for i in range(count)]
    bodies = [pod(name, ns, rng, node=node) for ns, name, node in made]
    local = threading.local()

    def create(body: dict) -> int:
        if not hasattr(local, "conn"):
            local.conn = Conn(state)
        path = f"/api/v1/namespaces/{body['metadata']['namespace']}/pods"
        for _ in range(5):
            status, _ = local.conn.request("POST", path, body)
            if status in (201, 409):
                return status
            time.sleep(0.5)
        return status

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        failed = sum(1 for status in pool.map(create, bodies) if status not in (201, 409))
    if failed:
        raise RuntimeError(f"{failed} of {count} standing pods could not be created")
    return [(ns, name) for ns, name, _ in made], time.monotonic() - started


class Churn:
    """Delete the oldest pod and create a new one (through the scheduler; one in fifty asks for a
    GPU of ``gpu_resources`` on a node of ``gpu_class``, at most ``gpu_cap`` of them at once) ``rate``
    times a second, until :meth:`stop`."""

    def __init__(
        self,
        state: ClusterState,
        standing: list[tuple[str, str]],
        rate: float,
        gpu_resources: list[str],
        gpu_class: str,
        gpu_cap: int,
        seed: int = 31,
    ):
        self.state, self.rate, self.gpu_resources, self.gpu_class, self.gpu_cap = state, rate, gpu_resources, gpu_class, gpu_cap
        self.pods = collections.deque(standing)
        self.gpu_pods: collections.deque[tuple[str, str]] = collections.deque()  # at most gpu_cap: the oldest goes first
        self.rng = random.Random(seed)
        self.created = self.deleted = self.errors = 0
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared: paused
        self._running.set()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        self._thread.join(timeout=30)

    def pause(self) -> None:
        """No new churn until :meth:`resume` (a recount needs the cluster still)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def _run(self) -> None:
        conn = Conn(self.state)
        n = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            if not self._running.is_set():
                self._running.wait()
                next_at = time.monotonic()
            gpu = self.rng.choice(self.gpu_resources) if self.gpu_resources and self.gpu_cap and n % 50 == 0 else None
            queue = self.gpu_pods if gpu and len(self.gpu_pods) >= self.gpu_cap else self.pods
            if queue:
                ns, name = queue.popleft()
                status, _ = conn.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
                self.deleted += status == 200
                self.errors += status not in (200, 404)
            ns = NAMESPACES[n % len(NAMESPACES)]
            name = f"churn-{n:07d}"
            status, _ = conn.request(
                "POST", f"/api/v1/namespaces/{ns}/pods", pod(name, ns, self.rng, gpu=gpu, node_class=self.gpu_class if gpu else "")
            )
            if status == 201:
                self.created += 1
                (self.gpu_pods if gpu else self.pods).append((ns, name))
            else:
                self.errors += 1
            n += 1
            next_at += 1.0 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))
