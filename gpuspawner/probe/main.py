"""The ``gpuspawner probe`` command: ``--once`` prints one scrape, otherwise serves ``/metrics``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from .collect import ProbeCollector, ProcReader
from .nvml import NvmlReader
from .pods import ApiPods, PodDirectory, StaticPods

DEFAULT_PORT = 9402


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--once", action="store_true", help="print one scrape (Prometheus text) and exit")
    p.add_argument("--listen", default="0.0.0.0", help="address to serve /metrics on (default: all)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve /metrics on (default: {DEFAULT_PORT})")
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="this node's name (default: $NODE_NAME)")
    p.add_argument("--proc", default="/proc", metavar="DIR", help="the host's /proc, where the processes NVML names live (default: /proc)")
    p.add_argument(
        "--namespace",
        action="append",
        default=None,
        metavar="NS",
        help="name the pods of this namespace (repeat for more; default: $GPUSPAWNER_PROBE_NAMESPACES, comma-separated); "
        "pods elsewhere keep their UID only",
    )
    p.add_argument("--pods", metavar="FILE", help="read pod names from `kubectl get pods -o json` output instead of the API server")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig outside a cluster (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--refresh", type=float, default=30.0, metavar="S", help="list pods again at most every S seconds (default: 30)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def directory(args: argparse.Namespace) -> PodDirectory | None:
    if args.pods:
        return StaticPods.from_file(args.pods)
    namespaces = args.namespace or [n for n in os.environ.get("GPUSPAWNER_PROBE_NAMESPACES", "").split(",") if n.strip()]
    if not namespaces:
        return None
    if not args.node:
        raise ValueError("--namespace needs --node (or $NODE_NAME): the probe lists only the pods on its own node")
    return ApiPods(args.node, [n.strip() for n in namespaces], args.refresh, args.kubeconfig)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s gpuspawner-probe: %(message)s")
    try:
        pods = directory(args)
    except ValueError as exc:
        print(f"gpuspawner probe: {exc}", file=sys.stderr)
        return 2
    if pods is None:
        logging.getLogger("gpuspawner.probe").warning("no --namespace or --pods: pods are labelled by UID only (pod_uid)")
    registry = CollectorRegistry(auto_describe=False)
    collector = ProbeCollector(NvmlReader(), ProcReader(args.proc), pods, args.node)
    registry.register(collector)
    if args.once:
        sys.stdout.write(generate_latest(registry).decode())
        return 0 if collector.last is not None and collector.last.up else 1
    try:
        start_http_server(args.port, addr=args.listen, registry=registry)
    except OSError as exc:
        print(f"gpuspawner probe: cannot serve on {args.listen}:{args.port}: {exc.strerror}; pick another --port", file=sys.stderr)
        return 1
    logging.getLogger("gpuspawner.probe").info("serving /metrics on %s:%d", args.listen, args.port)
    threading.Event().wait()
    return 0
