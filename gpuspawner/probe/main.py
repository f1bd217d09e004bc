"""The ``gpuspawner probe`` command: ``--once`` prints one scrape, otherwise serves
``/metrics`` (one NVML pass per request) and ``/ready`` (the readiness probe's own path:
it touches neither NVML nor the sample window)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuspawner.probe.collect import ProbeCollector, ProcReader
from gpuspawner.probe.nvml import DEFAULT_WINDOW_S, NvmlReader
from gpuspawner.probe.pods import ApiPods, PodDirectory, StaticPods

DEFAULT_PORT = 9402
METRICS_PATH = "/metrics"
READY_PATH = "/ready"


def server(registry: CollectorRegistry, listen: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) for ``/metrics`` and ``/ready``; any other path is 404.
    prometheus_client's own server answers every path with a scrape, so a readiness probe on
    any path would run an NVML pass."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlsplit(self.path).path
            if path == METRICS_PATH:
                body, kind, status = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path == READY_PATH:
                body, kind, status = b"ok\n", "text/plain; charset=utf-8", 200
            else:
                body, kind, status = f"not found: try {METRICS_PATH}\n".encode(), "text/plain; charset=utf-8", 404
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            pass  # every scrape would be a line

    httpd = ThreadingHTTPServer((listen, port), Handler)
    httpd.daemon_threads = True
    return httpd


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
    p.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help=f"report each process's SM utilisation over the last S seconds of NVML samples (default: {DEFAULT_WINDOW_S:g}); "
        "keep it above the scrape interval",
    )
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
    collector = ProbeCollector(NvmlReader(window_s=args.window), ProcReader(args.proc), pods, args.node)
    registry.register(collector)
    if args.once:
        sys.stdout.write(generate_latest(registry).decode())
        return 0 if collector.last is not None and collector.last.up else 1
    try:
        httpd = server(registry, args.listen, args.port)
    except OSError as exc:
        print(f"gpuspawner probe: cannot serve on {args.listen}:{args.port}: {exc.strerror}; pick another --port", file=sys.stderr)
        return 1
    logging.getLogger("gpuspawner.probe").info("serving %s and %s on %s:%d", METRICS_PATH, READY_PATH, args.listen, args.port)
    httpd.serve_forever()
    return 0
