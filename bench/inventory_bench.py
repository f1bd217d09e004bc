"""Inventory benchmarks, printed side by side (no assertions: shared, noisy machines).

1. Initial sync and per-event cost of the incremental index at 500 / 5,000 / 50,000
   pods over 100 / 1,000 / 5,000 nodes (synthetic events), next to recounting the
   whole cluster per page view (what a spawner without an inventory must do).
2. The data behind one spawn-page view at 1,000 GPU nodes, next to KubeSpawner
   building its plain profile list for the same number of profiles.
3. Peak memory of the index at 5,000 nodes and 50,000 pods, next to keeping the
   whole objects (as a generic informer cache does).
4. A real list+watch against the devcluster with 1,000 extra simulated nodes:
   initial sync, and the time from creating a pod to the inventory counting it.

``--hub-scale`` runs the hub-scale sections instead (issue 30: 1,000 GPU nodes, 20,000 pods of
the size real ones have: managedFields, env, volumes, status conditions):

5. Per-event cost of ``ClusterIndex.pod_event`` for a pod holding no GPU and for a GPU pod.
6. Peak memory of an initial sync through :class:`~gpuspawner.hub.inventory.Inventory` (a
   scripted, paged API server; in a fresh process, tracemalloc's peak and ru_maxrss).
7. One user's spawn page (GPUSpawner's options form, demo-like settings: discovery, an admin
   offering, quotas, 100 DRA nodes serving ``nvidia.com/gpu`` through the mapping): ms per view.

    python -m bench.inventory_bench [--quick] [--no-cluster] [--hub-scale]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from gpuspawner.capacity.access import Requester, allowed
from gpuspawner.capacity.counts import availability
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.devcluster.nodes import many_nodes
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
from gpuspawner.pod.podspec import pod_changes

SIZES = [(100, 500), (1000, 5000), (5000, 50000)]


def synthetic_pods(nodes: list[dict], count: int, rng: random.Random, offerings) -> list[dict]:
    """GPU and CPU pods bound to random nodes, shaped like real notebook/training pods."""
    gpu = [o for o in offerings if o.resources]
    pods = []
    for i in range(count):
        node = rng.choice(nodes)["metadata"]["name"]
        limits = dict(pod_changes(rng.choice(gpu), 1).limits) if rng.random() < 0.6 else {}
        pods.append(
            {
                "metadata": {
                    "name": f"pod-{i}",
                    "namespace": f"ns-{i % 50}",
                    "labels": {"app": "x", "hub.jupyter.org/username": f"u{i}"},
                    "annotations": {"note": "x" * 200},
                    "uid": f"uid-{i}",
                },
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "img", "resources": {"limits": {"cpu": "1", **limits}}}]},
                "status": {"phase": "Running", "podIP": "127.1.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
    return pods


def realistic_pod(i: int, node: str, limits: dict, hub_user: str | None = None) -> dict:
    """A pod of the size a real cluster's are (about 6 KiB of JSON): managedFields, env, volumes,
    probes, status conditions and container statuses. ``hub_user``: a notebook pod of this hub."""
    namespace = f"team-{i % 200}"
    labels = {"app.kubernetes.io/name": f"svc-{i % 97}", "pod-template-hash": f"{i:010x}", "tier": "backend"}
    if hub_user is not None:
        namespace = "jhub"
        labels = {"component": "singleuser-server", "hub.jupyter.org/username": hub_user, "gpuspawner.io/hub": ""}
    env = [{"name": f"SETTING_{k}", "value": f"value-{k}-{i}"} for k in range(12)]
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}})
    container = {
        "name": "main",
        "image": f"registry.example.org/team/app:{i % 13}.0.1",
        "args": ["--config=/etc/app/config.yaml", "--log-level=info"],
        "env": env,
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi", **limits}},
        "volumeMounts": [{"mountPath": f"/mnt/v{k}", "name": f"v{k}"} for k in range(4)]
        + [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": "kube-api-access", "readOnly": True}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10, "timeoutSeconds": 1},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 5},
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
    }
    sidecar = {"name": "proxy", "image": "registry.example.org/proxy:1.2", "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}
    fields = {f"f:{k}": {} for k in ("metadata", "spec", "status")}
    return {
        "metadata": {
            "name": f"pod-{i}",
            "namespace": namespace,
            "uid": f"0f1e2d3c-{i:08d}-4b5a-9687-a1b2c3d4e5f6",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": "2026-11-27T08:00:00Z",
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-20T10:00:00Z", "checksum/config": "ab" * 32},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"rs-{i % 997}", "uid": "u", "controller": True}],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-27T08:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": fields,
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-27T08:00:05Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {f"f:c{k}": {} for k in range(20)}},
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [container, sidecar],
            "volumes": [{"name": f"v{k}", "configMap": {"name": f"cm-{k}", "defaultMode": 420}} for k in range(4)]
            + [
                {
                    "name": "kube-api-access",
                    "projected": {"sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]},
                }
            ],
            "restartPolicy": "Always",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            "hostIP": "192.168.0.1",
            "startTime": "2026-11-27T08:00:01Z",
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-11-27T08:00:05Z", "lastProbeTime": None}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": c,
                    "ready": True,
                    "restartCount": 0,
                    "image": "img",
                    "imageID": "sha256:" + "0" * 64,
                    "containerID": "containerd://" + "1" * 64,
                    "started": True,
                    "state": {"running": {"startedAt": "2026-11-27T08:00:04Z"}},
                }
                for c in ("main", "proxy")
            ],
        },
    }


def hub_scale_pods(nodes: list[dict], count: int, seed: int = 30):
    """``count`` realistic pods over ``nodes`` (yielded one by one: nothing holds them all): 5% GPU pods,
    1 in 50 this hub's notebook pods."""
    make = hub_scale_pod(nodes, seed)
    for i in range(count):
        yield make(i)


def hub_scale_pod(nodes: list[dict], seed: int = 30):
    """The ``i``-th pod of :func:`hub_scale_pods`, made on its own."""
    gpu_nodes = [n for n in nodes if any(r.startswith("nvidia.com/") and r != "nvidia.com/gpu.present" for r in n["status"]["allocatable"])]

    def make(i: int) -> dict:
        rng = random.Random(seed * 1_000_003 + i)
        gpu = rng.random() < 0.05
        node = rng.choice(gpu_nodes if gpu else nodes)["metadata"]["name"]
        return realistic_pod(i, node, {"nvidia.com/gpu": "1"} if gpu else {}, f"user{i % 600}" if i % 50 == 0 else None)

    return make


def bench_sizes(quick: bool) -> None:
    print("\n## 1. Inventory: initial sync and per-event cost (synthetic)")
    print(f"{'nodes':>6} {'pods':>7} {'sync s':>8} {'event us':>9} {'recount/view ms':>16} {'view ms':>8} {'recount/view : ours':>20}")
    per_event = []
    sizes = SIZES[:2] if quick else SIZES
    for n_nodes, n_pods in sizes:
        rng = random.Random(n_nodes)
        nodes = list(many_nodes(n_nodes))
        offerings = build_catalog(CatalogConfig(), nodes=nodes)
        pods = synthetic_pods(nodes, n_pods, rng, offerings)
        index = ClusterIndex()
        started = time.perf_counter()
        index.replace(nodes=nodes, pods=pods)
        for o in offerings:
            index.availability(o)
        sync = time.perf_counter() - started
        events = 3000
        stream = []
        for i in range(events):
            pod = rng.choice(pods)
            if i % 3 == 0:
                stream.append(("DELETED", pod))
            else:
                moved = json.loads(json.dumps(pod))
                moved["spec"]["nodeName"] = rng.choice(nodes)["metadata"]["name"]
                stream.append(("MODIFIED", moved))
        runs = []
        for _ in range(3):  # best of three: the machine is shared
            started = time.perf_counter()
            for kind, pod in stream:
                index.pod_event(kind, pod)
            runs.append((time.perf_counter() - started) / events * 1e6)
        event_us = min(runs)
        per_event.append(event_us)
        started = time.perf_counter()
        views = 3
        for _ in range(views):
            [availability(o, nodes, pods) for o in offerings]
        recount = (time.perf_counter() - started) / views * 1e3
        started = time.perf_counter()
        for _ in range(200):
            [index.availability(o) for o in offerings]
        view = (time.perf_counter() - started) / 200 * 1e3
        print(f"{n_nodes:>6} {n_pods:>7} {sync:>8.2f} {event_us:>9.1f} {recount:>16.1f} {view:>8.3f} {recount / view:>19.0f}x")
    print(f"per-event cost, largest size : smallest size = {per_event[-1] / per_event[0]:.2f}x (target <= 1.5x)")


def bench_page_view() -> None:
    print("\n## 2. Data behind one spawn-page view at 1,000 GPU nodes")
    from kubespawner import KubeSpawner

    nodes = list(many_nodes(1000))
    index = ClusterIndex()
    index.replace(nodes=nodes, pods=synthetic_pods(nodes, 5000, random.Random(1), build_catalog(CatalogConfig(), nodes=nodes)))
    config = CatalogConfig()
    who = Requester("alice", frozenset({"students"}))

    def ours():
        catalog = build_catalog(config, discovered=index.discovered())
        return [(o, index.availability(o)) for o in allowed(catalog, who).values()]

    n_profiles = len(ours())
    profiles = [
        {
            "display_name": f"Profile {i}",
            "slug": f"p{i}",
            "description": "x",
            "kubespawner_override": {
                "extra_resource_limits": {"nvidia.com/gpu": "1"},
                "node_selector": {"a": "b"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
        for i in range(n_profiles)
    ]

    class User:
        name = "alice"
        id = 1
        url = "/user/alice/"

    os.environ.setdefault("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    os.environ.setdefault("KUBERNETES_SERVICE_PORT", "6443")
    spawner = KubeSpawner.__new__(KubeSpawner)
    spawner.user_options = {}

    def theirs():
        return KubeSpawner._get_initialized_profile_list(spawner, profiles)

    def timeit(fn, n=300):
        fn()
        started = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - started) / n * 1e3

    a, b = timeit(ours), timeit(theirs)
    print(
        f"{n_profiles} offerings with live free counts: gpuspawner {a:.3f} ms | KubeSpawner profile list {b:.3f} ms "
        f"| ratio {a / b:.2f}x (target <= 2x)"
    )


def bench_memory(quick: bool) -> None:
    print("\n## 3. Peak memory at 5,000 nodes and 50,000 pods")
    n_nodes, n_pods = (1000, 5000) if quick else (5000, 50000)
    nodes = list(many_nodes(n_nodes))
    pods = synthetic_pods(nodes, n_pods, random.Random(2), build_catalog(CatalogConfig(), nodes=nodes))
    gc.collect()
    tracemalloc.start()
    index = ClusterIndex()
    index.replace(nodes=nodes, pods=pods)
    for o in build_catalog(CatalogConfig(), discovered=index.discovered()):
        index.availability(o)
    _, ours = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del index
    gc.collect()
    tracemalloc.start()
    whole = {p["metadata"]["name"]: json.loads(json.dumps(p)) for p in pods}
    whole.update({n["metadata"]["name"]: json.loads(json.dumps(n)) for n in nodes})
    _, theirs = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"{n_nodes} nodes, {n_pods} pods: gpuspawner index {ours / 2**20:.1f} MiB | whole objects {theirs / 2**20:.1f} MiB "
        f"| ratio {ours / theirs:.2f}x"
    )


async def _real_watch(n_nodes: int) -> None:
    from kubernetes_asyncio import client, config

    from gpuspawner.devcluster.cluster import DevCluster
    from gpuspawner.devcluster.nodes import standard_nodes
    from gpuspawner.hub.inventory import Inventory

    with tempfile.TemporaryDirectory() as tmp:
        cluster = DevCluster(Path(tmp))
        started = time.perf_counter()
        await asyncio.to_thread(cluster.up, [*standard_nodes(), *many_nodes(n_nodes)], 600.0, lambda m: None)
        print(f"devcluster with {n_nodes + len(standard_nodes())} nodes up in {time.perf_counter() - started:.1f}s")
        try:
            await config.load_kube_config(config_file=str(cluster.kubeconfig))
            async with client.ApiClient() as api_client:
                api = client.CoreV1Api(api_client)
                inventory = Inventory(api)
                started = time.perf_counter()
                inventory.start()
                await inventory.wait_ready(120)
                sync = time.perf_counter() - started
                offerings = build_catalog(CatalogConfig(), discovered=inventory.index.discovered())
                mig = next(o for o in offerings if o.slug == "mig-nvidia-a100-sxm4-40gb-3g-20gb")
                kube = cluster.client()
                lags = []
                for i in range(20):
                    before = inventory.index.availability(mig).free
                    pod = {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": f"b{i}"},
                        "spec": {
                            "containers": [{"name": "c", "image": "x", "resources": {"limits": dict(pod_changes(mig, 1).limits)}}],
                            "tolerations": [dict(t) for t in mig.tolerations],
                        },
                    }
                    created = time.perf_counter()
                    await asyncio.to_thread(kube.request, "POST", "/api/v1/namespaces/default/pods", pod)
                    while inventory.index.availability(mig).free != before - 1:
                        await asyncio.sleep(0.002)
                    lags.append(time.perf_counter() - created)
                print(
                    f"real list+watch: initial sync {sync:.2f}s; pod created -> counted: median {statistics.median(lags) * 1e3:.0f} ms, "
                    f"max {max(lags) * 1e3:.0f} ms over {len(lags)} pods (includes scheduling by the real scheduler)"
                )
                await inventory.stop()
        finally:
            cluster.down(quiet=True)


def bench_pod_events(n_nodes: int, n_pods: int) -> None:
    print(f"\n## 5. Per-event cost of pod_event at {n_nodes} nodes and {n_pods} realistic pods")
    nodes = list(many_nodes(n_nodes))
    index = ClusterIndex()
    index.replace(nodes=nodes, pods=hub_scale_pods(nodes, n_pods))  # the raw pods are not kept, as in the hub
    for o in build_catalog(CatalogConfig(), discovered=index.discovered()):
        index.availability(o)
    make = hub_scale_pod(nodes)
    sample = [make(i) for i in range(3000)]
    gc.collect()
    for label, chosen in (
        ("non-GPU pod", [p for p in sample if "nvidia.com/gpu" not in p["spec"]["containers"][0]["resources"]["limits"]]),
        ("GPU pod", [p for p in sample if "nvidia.com/gpu" in p["spec"]["containers"][0]["resources"]["limits"]]),
    ):
        some = chosen[:150]
        # A status update (MODIFIED, same requests), a delete and the pod again (ADDED): each a fresh
        # object, as the watch decodes it.
        stream = []
        for pod in some:
            text = json.dumps(pod)
            stream += [("MODIFIED", json.loads(text)), ("DELETED", json.loads(text)), ("ADDED", json.loads(text))]
        runs = []
        for _ in range(3):
            copies = [(kind, json.loads(json.dumps(raw))) for kind, raw in stream] if runs else stream
            started = time.perf_counter()
            for kind, raw in copies:
                index.pod_event(kind, raw)
            runs.append((time.perf_counter() - started) / len(copies) * 1e6)
        print(f"{label:>12}: {min(runs):7.1f} us per event (MODIFIED/DELETED/ADDED, best of 3)")


class _Paged:
    """The list calls of a scripted API server: its answers' bytes, pages of ``limit`` items made
    before the measurement (as the API server's socket holds them, not the hub's heap), then a
    watch that stays quiet."""

    def __init__(self, items, limit: int = 500):
        self.pages: list[bytes] = []
        page: list[dict] = []
        for item in items:
            page.append(item)
            if len(page) == limit:
                self._add(page)
                page = []
        if page or not self.pages:
            self._add(page)
        last = json.loads(self.pages[-1])
        del last["metadata"]["continue"]
        self.pages[-1] = json.dumps(last).encode()

    def _add(self, items: list[dict]) -> None:
        self.pages.append(json.dumps({"items": items, "metadata": {"resourceVersion": "1", "continue": str(len(self.pages) + 1)}}).encode())

    async def __call__(self, limit: int = 500, _continue: str | None = None, watch: bool = False, **_: object):
        return _Body(b"") if watch else _Body(self.pages[int(_continue or 0)])


class _Body:
    """What kubernetes_asyncio returns with _preload_content=False: the bytes, or a watch that stays quiet."""

    status = 200

    def __init__(self, payload: bytes):
        self.payload = payload
        self.content = self

    async def read(self) -> bytes:
        return self.payload

    async def iter_any(self):
        await asyncio.sleep(3600)
        yield b""

    def release(self) -> None:
        pass


def sync_memory_child(n_nodes: int, n_pods: int) -> None:
    """In a fresh process: one initial sync through Inventory; prints its peak memory."""
    import resource

    from gpuspawner.hub.inventory import Inventory

    nodes = list(many_nodes(n_nodes))

    class Api:
        list_node = _Paged(nodes)
        list_pod_for_all_namespaces = _Paged(hub_scale_pods(nodes, n_pods))

    async def run() -> tuple[int, float]:
        inventory = Inventory(Api(), dra_api=None, kueue_api=None)
        inventory.dra_api = inventory.kueue_api = None
        gc.collect()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        started = time.perf_counter()
        inventory.start()
        if not await inventory.wait_ready(600):
            raise SystemExit(f"the inventory did not sync: {inventory.last_error}")
        took = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(
            f"initial sync of {n_nodes} nodes and {len(inventory.index.pods)} pods: {took:.1f}s, "
            f"traced peak {peak / 2**20:.1f} MiB, ru_maxrss growth {rss / 1024:.1f} MiB"
        )
        await inventory.stop()
        return peak, took

    asyncio.run(run())


def bench_sync_memory(n_nodes: int, n_pods: int) -> None:
    import subprocess

    print(f"\n## 6. Peak memory of an initial sync through Inventory ({n_nodes} nodes, {n_pods} realistic pods)")
    sample = json.dumps(realistic_pod(0, "node", {}))
    print(f"(one pod is {len(sample) / 1024:.1f} KiB of JSON)")
    out = subprocess.run(
        [sys.executable, "-m", "bench.inventory_bench", "--sync-memory-child", str(n_nodes), str(n_pods)],
        capture_output=True,
        text=True,
        check=False,
    )
    print(out.stdout.strip() or out.stderr.strip()[-2000:])


def bench_render(n_nodes: int, n_pods: int, renders: int, profile: bool = False) -> None:
    print(f"\n## 7. One user's spawn page at {n_nodes} GPU nodes and {n_pods} realistic pods (in-process, no API server)")
    asyncio.run(_render(n_nodes, n_pods, renders, profile))


async def _render(n_nodes: int, n_pods: int, renders: int, profile: bool) -> None:
    from jupyterhub.objects import Hub
    from traitlets.config import Config

    from gpuspawner.devcluster import dradriver as dd
    from gpuspawner.devcluster.nodes import standard_nodes
    from gpuspawner.hub.inventory import Inventory
    from gpuspawner.spawner import GPUSpawner

    dra = [dd.DraNode(f"dra-h100-mapped-{i}", dd.H100_80GB, 8, labels=dict(dd.EXTRES_NODE.labels)) for i in range(100)]
    nodes = [*standard_nodes(), *many_nodes(n_nodes), *(dd.dra_node_manifest(n, i) for i, n in enumerate(dra))]
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False) as kubeconfig:
        kubeconfig.write(
            "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
            "clusters: [{name: x, cluster: {server: 'https://127.0.0.1:9', insecure-skip-tls-verify: true}}]\n"
            "users: [{name: x, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: x, user: x}}]\n"
        )
    os.environ["KUBECONFIG"] = kubeconfig.name
    from kubernetes_asyncio.config import kube_config

    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = kubeconfig.name

    class Group:
        def __init__(self, name: str):
            self.name, self.users = name, []

    class User:
        name = escaped_name = "researcher1"
        id = 1
        url = "/user/researcher1/"
        admin = False
        groups = [Group("researchers"), Group("students")]

    config = Config()
    config.KubeSpawner.namespace = "jhub"
    settings = config.GPUSpawner
    settings.discover_offerings = True
    settings.site_timezone = "Europe/Zurich"
    settings.default_offering = "cpu"
    settings.user_quota = {"total": 2}
    settings.group_quotas = {"students": {"total": 6, "full": 0}}
    settings.offerings = [
        {
            "slug": "half-v100",
            "kind": "custom",
            "display_name": "Half a V100",
            "resources": {"nvidia.com/vgpu": 500},
            "groups": ["researchers"],
        }
    ]
    settings.offering_overrides = {"gpu-nvidia-h100-80gb-hbm3": {"groups": ["researchers"], "counts": [1, 2, 4]}}
    spawner = GPUSpawner(hub=Hub(ip="127.0.0.1", port=8081), user=User(), config=config)
    inventory = Inventory(spawner.api)
    inventory.dra_api = inventory.kueue_api = None
    inventory._tasks = [asyncio.get_running_loop().create_future()]  # "started": fed below, never by the API server
    inventory.index.replace(nodes=nodes, pods=hub_scale_pods(nodes, n_pods))
    inventory.index.dra.replace(
        slices=[s for n in dra for s in dd.resource_slices(n.name, dd.node_devices(n))], classes=dd.device_classes(), claims=[]
    )
    inventory.index.dra.synced = True
    inventory._set_synced("nodes", True)
    inventory._set_synced("pods", True)
    Inventory._instances[spawner.api.api_client.configuration.host] = inventory
    calls: list[str] = []
    api_client = spawner.api.api_client
    real_call = api_client.call_api

    async def counted(resource_path: str, method: str, *args, **kwargs):
        calls.append(f"{method} {resource_path}")
        return await real_call(resource_path, method, *args, **kwargs)

    api_client.call_api = counted  # every Kubernetes request of the views goes through here
    html = await spawner._render_gpu_form()
    times = []
    for _ in range(renders):
        started = time.perf_counter()
        await spawner._render_gpu_form()
        times.append(time.perf_counter() - started)
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(
        f"GPUSpawner spawn page ({len(html) / 1024:.0f} KiB): p50 {statistics.median(times) * 1e3:.1f} ms, "
        f"p99 {p99 * 1e3:.1f} ms per view over {renders} views; Kubernetes API requests made by the views: {len(calls)} {sorted(set(calls))[:3]}"
    )
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10):
            await spawner._render_gpu_form()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    os.unlink(kubeconfig.name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--no-cluster", action="store_true", help="skip the real list+watch")
    parser.add_argument("--nodes", type=int, default=1000, help="extra nodes for the real list+watch")
    parser.add_argument("--hub-scale", action="store_true", help="sections 5-7 only (issue 30's hub scale)")
    parser.add_argument("--pods", type=int, default=20000, help="realistic pods of the hub-scale sections")
    parser.add_argument("--renders", type=int, default=200, help="spawn-page views timed in section 7")
    parser.add_argument("--profile", action="store_true", help="cProfile ten spawn-page views (section 7)")
    parser.add_argument("--sync-memory-child", nargs=2, type=int, metavar=("NODES", "PODS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sync_memory_child:
        sync_memory_child(*args.sync_memory_child)
        return 0
    if args.hub_scale:
        print("# gpuspawner hub-scale benchmarks")
        bench_pod_events(args.nodes, args.pods)
        bench_sync_memory(args.nodes, args.pods)
        bench_render(args.nodes, args.pods, args.renders, args.profile)
        return 0
    print("# gpuspawner inventory benchmarks")
    bench_sizes(args.quick)
    bench_page_view()
    bench_memory(args.quick)
    if not args.no_cluster:
        print("\n## 4. Real list+watch against the devcluster")
        asyncio.run(_real_watch(args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
