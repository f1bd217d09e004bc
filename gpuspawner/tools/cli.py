"""The ``gpuspawner`` admin command.

gpuspawner devcluster build|up|down|status|env   the local simulated GPU cluster
gpuspawner offerings [--nodes F] [--pods F] [--slices F --device-classes F [--claims F] [--taint-rules F]] [--config F]
                     [--nodepools F] [--cpu-guarantee N] [--mem-guarantee SIZE] [--json]
                     (with Karpenter's NodePools: its autoscaled pools, docs/autoscaling.md)
gpuspawner kueue [--config F] [--nodes F ...] [--cluster-queue NAME] [--namespace NS] [--output F]
                     Kueue's flavors, ClusterQueue and LocalQueues as YAML (docs/kueue.md)
gpuspawner report [--since 7d] [--by user|group|offering] [--format table|csv|json] --prometheus-url URL
gpuspawner probe [--once] [--port N] [--node NAME] [--namespace NS] [--proc DIR]   the per-pod GPU probe (docs/probe.md)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traitlets.config import Config

    from gpuspawner.capacity.index import ClusterIndex
    from gpuspawner.core.model import Offering
    from gpuspawner.devcluster.cluster import DevCluster
    from gpuspawner.offerings.catalog import CatalogConfig
    from gpuspawner.pod.notebook import Notebook

#: A list of Kubernetes objects as JSON (``kubectl get ... -o json``'s items).
Items = list[dict[str, Any]]

EXIT_USAGE = 2


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"gpuspawner: {message}", file=sys.stderr)
    return code


# --------------------------------------------------------------------------- devcluster


def _devcluster(args: argparse.Namespace) -> int:
    from gpuspawner.devcluster import build
    from gpuspawner.devcluster.cluster import DevCluster
    from gpuspawner.devcluster.clusterstate import DevClusterError
    from gpuspawner.devcluster.nodes import many_nodes, standard_nodes

    cluster = DevCluster(Path(args.dir) if args.dir else None)
    try:
        if args.verb == "build":
            build.build(force=args.force)
            if args.kueue:
                build.build_kueue(force=args.force)
            if args.karpenter:
                build.build_karpenter(force=args.force)
        elif args.verb == "up":
            nodes = list(standard_nodes())
            if args.extra_nodes:
                nodes += list(many_nodes(args.extra_nodes))
            cluster.up(nodes=nodes, log=lambda msg: print(msg, file=sys.stderr), kueue=args.kueue, karpenter=args.karpenter)
            _print_env(cluster)
        elif args.verb == "down":
            cluster.down()
        elif args.verb == "status":
            running = cluster.running()
            for name, alive in running.items():
                print(f"{name:26s} {'running' if alive else 'stopped'}")
            if cluster.state and "kueue" in cluster.state.pids:
                print(f"{'kueue':26s} {'running' if cluster.kueue().running else 'stopped'}")
            if cluster.state and "karpenter" in cluster.state.pids:
                print(f"{'karpenter':26s} {'running' if cluster.karpenter().running else 'stopped'}")
            if cluster.state and all(running.values()):
                print(f"API server: {cluster.state.server}\nKUBECONFIG={cluster.kubeconfig}")
            return 0 if all(running.values()) else 1
        elif args.verb == "env":
            if cluster.state is None:
                return _fail(f"no devcluster in {cluster.directory}; run `gpuspawner devcluster up`")
            _print_env(cluster)
    except (DevClusterError, build.BuildError) as exc:
        return _fail(str(exc), 1)
    return 0


def _print_env(cluster: DevCluster) -> None:
    for key, value in cluster.env().items():
        print(f"export {key}={value}")


# --------------------------------------------------------------------------- offerings


def _read_items(path: str, what: str) -> list[dict[str, Any]]:
    """Read ``kubectl get <what> -o json`` output (a List) or a bare JSON list."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); expected `kubectl get {what} -o json` output") from None
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    items = data.get("items") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"{path}: expected a JSON object with an 'items' list, as `kubectl get {what} -o json` prints")
    return items


def _config_from_file(path: str) -> Config:
    """Load a jupyterhub_config.py the way JupyterHub does and return its GPUSpawner section."""
    from traitlets.config.loader import ConfigFileNotFound, PyFileConfigLoader

    file = Path(path)
    try:
        loader = PyFileConfigLoader(file.name, path=str(file.parent.resolve()))
        config: Config = loader.load_config()
    except ConfigFileNotFound:
        raise ValueError(f"{path}: no such file") from None
    except Exception as exc:  # the admin's own Python: report it, do not crash
        raise ValueError(f"{path}: could not load it: {type(exc).__name__}: {exc}") from None
    return config


def _notebook(config: Config | None, args: argparse.Namespace) -> tuple[Notebook, str]:
    """The notebook pod's own requests and placement from the config (c.Spawner < c.KubeSpawner
    < c.GPUSpawner, as JupyterHub resolves them), then --cpu-guarantee/--mem-guarantee.

    Returns (Notebook, where its cpu/memory came from).
    """
    from traitlets.config.loader import LazyConfigValue

    from gpuspawner.pod.notebook import NOTEBOOK_TRAITS, Notebook

    settings: dict[str, Any] = {}
    origin: dict[str, str] = {}
    dicts = {"node_selector", "extra_resource_guarantees", "extra_resource_limits"}
    for section in ("Spawner", "KubeSpawner", "GPUSpawner"):
        if config is not None and section in config:
            for name in NOTEBOOK_TRAITS:
                if name in config[section]:
                    value = config[section][name]
                    if isinstance(value, LazyConfigValue):  # c.KubeSpawner.tolerations.append(...)
                        value = value.get_value(settings.get(name, {} if name in dicts else []))
                    settings[name] = value
                    origin[name] = f"c.{section}.{name}"
    for name in ("cpu_guarantee", "mem_guarantee"):
        value = getattr(args, name)
        if value is not None:
            settings[name] = value
            origin[name] = f"--{name.replace('_', '-')}"
    notebook = Notebook.from_settings(settings, origin)
    sources = [origin[n] for n in ("cpu_guarantee", "mem_guarantee", "cpu_limit", "mem_limit") if n in origin]
    return notebook, ", ".join(sources) or "none set"


def _catalog_config(config: Config | None) -> CatalogConfig:
    """The catalog settings of a loaded config; ValueError listing every problem in it."""
    from gpuspawner.capacity.checks import config_problems, gpuspawner_section
    from gpuspawner.offerings.catalog import CatalogConfig

    section = gpuspawner_section(config)
    problems = config_problems(section)
    if problems:
        raise ValueError("the GPUSpawner settings are wrong:\n  - " + "\n  - ".join(problems))
    return CatalogConfig.from_settings(section)


def _live_items(args: argparse.Namespace) -> tuple[Items, Items, dict[str, Items] | None]:
    """Nodes, pods and (where the cluster serves resource.k8s.io/v1 and we may read it) the
    DRA slices, classes and claims from the cluster of the current kubeconfig (or in-cluster config)."""
    import asyncio

    from kubernetes_asyncio import client, config

    async def fetch() -> tuple[Items, Items, dict[str, Items] | None]:
        # Any: kubernetes_asyncio's config loaders are untyped, and every call here is made with
        # ``_preload_content=False`` and answers the raw response (read as JSON), which its hints do not say.
        kube_config: Any = config
        try:
            kube_config.load_incluster_config()
        except config.ConfigException:
            await kube_config.load_kube_config(config_file=args.kubeconfig)
        async with client.ApiClient() as api_client:
            api: Any = client.CoreV1Api(api_client)
            nodes = await api.list_node(_preload_content=False)
            pods = await api.list_pod_for_all_namespaces(_preload_content=False)
            node_items: Items = json.loads(await nodes.read())["items"]
            pod_items: Items = json.loads(await pods.read())["items"]
            resource: Any = client.ResourceV1Api(api_client)
            found: dict[str, Items] = {}
            dra: dict[str, Items] | None = found
            for kind, method in (
                ("slices", resource.list_resource_slice),
                ("classes", resource.list_device_class),
                ("claims", resource.list_resource_claim_for_all_namespaces),
            ):
                try:
                    answer = await method(_preload_content=False)
                    found[kind] = json.loads(await answer.read())["items"]
                except client.ApiException as exc:  # 404: no DRA in this cluster; 403: not ours to read
                    print(f"gpuspawner: no DRA offerings: listing {kind} answered {exc.status} {exc.reason}", file=sys.stderr)
                    dra = None
                    break
            if dra is not None:  # DeviceTaintRules (resource.k8s.io/v1 from 1.37): none where not served or not ours to read
                answer = await api_client.call_api(
                    "/apis/resource.k8s.io/v1/devicetaintrules",
                    "GET",
                    {},
                    [],
                    {"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    response_types_map={},
                    _preload_content=False,
                )
                dra["rules"] = json.loads(await answer.read()).get("items") or [] if answer.status < 400 else []
            return node_items, pod_items, dra

    return asyncio.run(fetch())


def _dra_files(args: argparse.Namespace) -> dict[str, Items] | None:
    """``--slices``/``--device-classes``/``--claims`` files (``kubectl get ... -o json``), or None."""
    if not (args.slices or args.device_classes or args.claims):
        return None
    if not (args.slices and args.device_classes):
        raise ValueError(
            "--slices and --device-classes go together (`kubectl get resourceslices -o json`, "
            "`kubectl get deviceclasses -o json`): a class's selectors decide which devices it has"
        )
    return {
        "slices": _read_items(args.slices, "resourceslices"),
        "classes": _read_items(args.device_classes, "deviceclasses"),
        "claims": _read_items(args.claims, "resourceclaims -A") if args.claims else [],
        "rules": _read_items(args.taint_rules, "devicetaintrules") if args.taint_rules else [],
    }


def _snapshot(
    args: argparse.Namespace,
) -> tuple[Config | None, Notebook, str, Items, Items, ClusterIndex, list[Offering], CatalogConfig]:
    """The config (or None), the notebook and where its cpu/memory came from, the nodes, pods,
    DRA state and the hub's catalog, from --nodes files or the live cluster.

    Raises ValueError or OfferingConfigError for the admin's mistakes, RuntimeError where the
    cluster could not be read."""
    from gpuspawner.offerings.catalog import build_catalog
    from gpuspawner.offerings.discovery import discover

    config = _config_from_file(args.config) if args.config else None
    notebook, source = _notebook(config, args)
    if args.nodes:
        nodes = _read_items(args.nodes, "nodes")
        pods = _read_items(args.pods, "pods -A") if args.pods else []
        dra = _dra_files(args)
    elif args.pods or args.slices or args.device_classes or args.claims:
        raise ValueError("--pods, --slices, --device-classes and --claims need --nodes (or none of them, to read the live cluster)")
    else:
        try:
            nodes, pods, dra = _live_items(args)
        except Exception as exc:
            raise RuntimeError(f"could not read the cluster ({type(exc).__name__}: {exc}); give --nodes FILE to work offline") from None
    catalog_config = _catalog_config(config)
    from gpuspawner.capacity.snapshot import snapshot_index

    index = snapshot_index(nodes, pods, dra, notebook)  # the hub's own index: the page's and admission's counts
    discovered = discover(nodes, catalog_config.vgpu_class_labels) + index.dra.discovered()
    catalog = build_catalog(catalog_config, nodes, discovered)
    return config, notebook, source, nodes, pods, index, catalog, catalog_config


def _offerings(args: argparse.Namespace) -> int:
    from gpuspawner.capacity.counts import unreached
    from gpuspawner.dra.devices import unmatched
    from gpuspawner.offerings.catalog import merge
    from gpuspawner.offerings.entry import OfferingConfigError
    from gpuspawner.offerings.overrides import apply_overrides
    from gpuspawner.tools import pools

    try:
        _, notebook, source, nodes, pods, index, catalog, catalog_config = _snapshot(args)
    except (ValueError, OfferingConfigError) as exc:
        return _fail(str(exc))
    except RuntimeError as exc:
        return _fail(str(exc), 1)
    for warning in unmatched(catalog, index.dra):
        print(f"gpuspawner: warning: {warning}", file=sys.stderr)
    try:
        found = pools.read(args, nodes, catalog_config.vgpu_class_labels, _read_items)
    except ValueError as exc:
        return _fail(str(exc))
    except Exception as exc:  # the cluster answered the nodes but not this: the rest stands
        found = pools.Pools(note=f"could not read them: {type(exc).__name__}: {exc}")
    if catalog_config.discover:  # a pool with no node yet offers what its nodes will serve
        catalog = merge(catalog, apply_overrides(found.offerings, catalog_config.overrides))
    rows = []
    for offering in catalog:
        avail = index.availability(offering)  # the spawn page's and admission's own count
        extra = {"dra": f"DRA claim: {offering.claim.device_class}"} if offering.claim is not None else {}
        rows.append(
            {
                **offering.summary(),
                **extra,
                "capacity": avail.capacity,
                "free": avail.free,
                "largest_free": avail.largest_free,
                "nodes": avail.nodes,
                "pools": [
                    {"name": p.name, "limit": p.limit, "nodes": p.nodes, "room": p.room} for p in found.pools if offering.slug in p.slugs
                ],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"# Free: notebooks the scheduler would still place, each with its GPU and {notebook.describe()} ({source}).")
    print(f"{'SLUG':44s} {'KIND':7s} {'FREE':>5s} {'CAP':>5s}  NAME / LIMITS")
    for row in rows:
        cap = "-" if row["capacity"] is None else str(row["capacity"])
        free = "-" if row["free"] is None else str(row["free"])
        limits = ", ".join(f"{k}={v}" for k, v in row["limits"].items()) or row.get("dra") or "no GPU"
        flags = " [hidden]" if row["hidden"] else ""
        who = f" (groups: {', '.join(row['groups'])})" if row["groups"] else ""
        print(f"{row['slug']:44s} {row['kind']:7s} {free:>5s} {cap:>5s}  {row['display_name']}{flags}{who}")
        print(f"{'':44s} {'':7s} {'':>5s} {'':>5s}    {limits}; {row['isolation_phrase']}")
    pools.show(found)
    hidden = unreached(nodes, catalog, notebook, catalog_config.vgpu_class_labels)
    if hidden:
        print("\nGPUs no offering can use:")
        for node, resource, amount, reason in hidden:
            print(f"  {node}: {amount} x {resource}: {reason}")
    return 0


# --------------------------------------------------------------------------- kueue


def _kueue(args: argparse.Namespace) -> int:
    """Kueue's ResourceFlavors, ClusterQueue and LocalQueues for the hub's offerings, as YAML (docs/kueue.md)."""
    from gpuspawner.capacity.checks import gpuspawner_section
    from gpuspawner.capacity.counts import availability
    from gpuspawner.capacity.kueuequeues import KueueRouting
    from gpuspawner.capacity.kueueyaml import allocatable_totals, kueue_documents, render
    from gpuspawner.offerings.entry import OfferingConfigError

    try:
        config, notebook, _, nodes, pods, _, catalog, _ = _snapshot(args)
        section = gpuspawner_section(config)
        routing = KueueRouting.from_settings(section.get("kueue_queues"), section.get("kueue_priority_classes"))
        namespace = args.namespace or section.get("namespace")
        if not namespace:
            raise ValueError("no namespace for the LocalQueues: give --namespace, or --config with c.KubeSpawner.namespace")
        capacities = {o.slug: availability(o, nodes, pods, notebook).capacity for o in catalog if o.claim is None}
        documents = kueue_documents(
            catalog,
            capacities,
            cluster_queue=args.cluster_queue,
            namespace=namespace,
            local_queues=routing.queues(),
            cpu_memory=allocatable_totals(nodes),
            priority_classes=routing.priority_classes.values(),
        )
    except (ValueError, OfferingConfigError) as exc:
        return _fail(str(exc))
    except RuntimeError as exc:
        return _fail(str(exc), 1)
    if not routing.queues():
        print("gpuspawner: warning: c.GPUSpawner.kueue_queues names no queue: no LocalQueue written", file=sys.stderr)
    text = render(
        documents,
        header="Written by `gpuspawner kueue` (docs/kueue.md). Review it, then: kubectl apply --server-side -f FILE",
    )
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


# --------------------------------------------------------------------------- main


def _snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of :func:`_snapshot`: where the nodes, pods and config come from."""
    parser.add_argument("--nodes", metavar="FILE", help="`kubectl get nodes -o json` output (offline mode)")
    parser.add_argument("--pods", metavar="FILE", help="`kubectl get pods -A -o json` output, for free counts")
    parser.add_argument("--slices", metavar="FILE", help="`kubectl get resourceslices -o json` output: DRA devices (with --nodes)")
    parser.add_argument("--device-classes", metavar="FILE", help="`kubectl get deviceclasses -o json` output (with --slices)")
    parser.add_argument("--claims", metavar="FILE", help="`kubectl get resourceclaims -A -o json` output, for DRA free counts")
    parser.add_argument(
        "--taint-rules", metavar="FILE", help="`kubectl get devicetaintrules -o json` output: admins' device taints (Kubernetes 1.37+)"
    )
    parser.add_argument("--config", metavar="FILE", help="a jupyterhub_config.py to read c.GPUSpawner from")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for live mode (default: $KUBECONFIG)")
    parser.add_argument(
        "--cpu-guarantee",
        type=float,
        metavar="CORES",
        help="CPU cores each notebook requests (default: c.KubeSpawner.cpu_guarantee from --config)",
    )
    parser.add_argument(
        "--mem-guarantee",
        metavar="SIZE",
        help="memory each notebook requests, e.g. 1G (zero-to-jupyterhub's default; default: c.KubeSpawner.mem_guarantee)",
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpuspawner", description="GPU offerings for JupyterHub on Kubernetes.")
    sub = top.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("devcluster", help="a local Kubernetes control plane with simulated GPU nodes")
    dev.add_argument("verb", choices=["build", "up", "down", "status", "env"])
    dev.add_argument("--dir", help="state folder (default: ~/.cache/gpuspawner/devcluster/run/default)")
    dev.add_argument("--force", action="store_true", help="build: rebuild every binary")
    dev.add_argument("--extra-nodes", type=int, default=0, metavar="N", help="up: also load N generated nodes")
    dev.add_argument("--kueue", action="store_true", help="build/up: also Kueue's controller, its CRDs and webhooks (docs/kueue.md)")
    dev.add_argument(
        "--karpenter",
        action="store_true",
        help="build/up: also Karpenter's kwok provider and GPU NodePools at zero nodes (docs/autoscaling.md)",
    )
    dev.set_defaults(func=_devcluster)

    off = sub.add_parser("offerings", help="print the offerings the spawner would show, with capacity and free counts")
    _snapshot_arguments(off)
    off.add_argument("--json", action="store_true", help="print a JSON list")
    from gpuspawner.tools import pools

    pools.add_arguments(off)
    off.set_defaults(func=_offerings)

    kq = sub.add_parser("kueue", help="Kueue's ResourceFlavors, ClusterQueue and LocalQueues for the offerings, as YAML to review")
    _snapshot_arguments(kq)
    kq.add_argument("--cluster-queue", default="gpuspawner", metavar="NAME", help="the ClusterQueue's name (default: gpuspawner)")
    kq.add_argument(
        "--namespace", metavar="NS", help="the hub's namespace, for the LocalQueues (default: c.KubeSpawner.namespace from --config)"
    )
    kq.add_argument("--output", "-o", metavar="FILE", help="write the YAML to FILE (default: standard output)")
    kq.set_defaults(func=_kueue)

    from gpuspawner.tools import report

    rep = sub.add_parser("report", help="GPU-hours held, active and idle per user, group or offering, from Prometheus")
    report.add_arguments(rep)
    rep.set_defaults(func=report.run)

    from gpuspawner.tools import nodeclaimlog

    rec = sub.add_parser("record-nodeclaims", help="append Karpenter's NodeClaims as they change to a file (for report --nodeclaims)")
    nodeclaimlog.add_arguments(rec)
    rec.set_defaults(func=nodeclaimlog.run)

    from gpuspawner.probe import main as probe

    pro = sub.add_parser("probe", help="per-pod GPU memory from NVML as Prometheus metrics (a node agent; docs/probe.md)")
    probe.add_arguments(pro)
    pro.set_defaults(func=probe.run)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
