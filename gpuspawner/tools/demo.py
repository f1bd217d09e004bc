"""The demo: a JupyterHub with GPUSpawner on the simulated GPU cluster, in one command.

    python -m gpuspawner.tools.demo            (or: make demo)
    python -m gpuspawner.tools.demo --kueue    (or: make demo KUEUE=1): with the real Kueue
    python -m gpuspawner.tools.demo --autoscale    (or: make demo AUTOSCALE=1): GPU pools at
        zero nodes that the real Karpenter grows (docs/autoscaling.md)

Starts the devcluster (building it once), puts some GPU pods of another team on
it, runs the local pod runner (so spawned pods become real JupyterLab servers on
their pod IPs), a dcgm-exporter stand-in reporting those pods' GPUs (there is no GPU
here), the real Prometheus scraping it, the hub's /hub/metrics and the culler's
metrics (with the chart's recording and alerting rules loaded), and JupyterHub with
hub_config/demo_config.py behind a real configurable-http-proxy; then prints the URLs
and who to log in as. Logs go to files in the scratch folder. Ctrl-C stops
everything and removes the scratch folder.

With ``--kueue`` the devcluster runs Kueue too, every GPU server goes through its LocalQueue
``demo``, and a batch Job of another namespace competes for the same ClusterQueue
(:mod:`gpuspawner.tools.demokueue`).

With ``--autoscale`` the devcluster starts with its CPU node only and runs the real Karpenter
with its GPU pools at zero nodes (:mod:`gpuspawner.devcluster.karpenter`): a GPU server brings
a node up, after the node class's registration delay (:data:`AUTOSCALE_BOOT`, a cloud's boot
time), and an emptied node goes away; no other team's pods are seeded. The hub records
Karpenter's NodeClaims into the state folder (its ``nodeclaim-recorder`` service), and the
startup text prints the ``gpuspawner report`` that shows the GPU node-hours held and what the
culler's idle reclaims saved (:meth:`Demo.node_hours_command`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.clusterstate import KubeHTTP
from gpuspawner.devcluster.dcgmstandin import DcgmStandIn
from gpuspawner.devcluster.fakedcgm import SimulatedDCGM
from gpuspawner.devcluster.hub import HubProcess
from gpuspawner.devcluster.karpenter import POOLS, give_pod_networks, node_class, node_pool
from gpuspawner.devcluster.nodes import CLASS_LABEL, standard_nodes
from gpuspawner.devcluster.podrunner import PodRunner
from gpuspawner.devcluster.ports import free_port
from gpuspawner.devcluster.prometheus import RULES_FILE, Prometheus, ScrapeJob
from gpuspawner.names.nvidia import GPU, GPU_SHARED, MIG_PREFIX, PRODUCT_LABEL
from gpuspawner.tools import demokueue

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hub_config" / "demo_config.py"
NAMESPACE = "jhub"
#: with ``--autoscale``: how long Karpenter's kwok provider waits before a new node registers
AUTOSCALE_BOOT = "20s"
#: in the state folder: the culler's action log, and (``--autoscale``) the record of Karpenter's
#: NodeClaims the hub's ``nodeclaim-recorder`` service appends (``gpuspawner record-nodeclaims``)
ACTION_LOG = "gpu-culler-actions.jsonl"
NODECLAIM_RECORD = "nodeclaims.jsonl"

#: Another team's jobs, already holding GPUs when the demo starts (so free counts are not all full).
OTHER_TEAM = [
    ("finetune-llm", {GPU: "4"}, {PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}),
    ("embeddings", {f"{MIG_PREFIX}3g.20gb": "1"}, {}),
    ("course-grader", {GPU_SHARED: "1"}, {}),
]


@dataclass
class Demo:
    url: str
    api_url: str
    state: Path
    cluster: DevCluster
    runner: PodRunner
    hub: subprocess.Popen[bytes]
    telemetry: SimulatedDCGM
    prometheus: Prometheus
    #: what the demo set up in Kueue (``kueue=True``), else None
    kueue: demokueue.KueueDemo | None = None
    #: with ``autoscale``: the record of Karpenter's NodeClaims (``gpuspawner report --nodeclaims``)
    nodeclaims: Path | None = None
    #: whether the culler runs (and writes :attr:`action_log`)
    culler: bool = True

    @property
    def action_log(self) -> Path:
        """The culler's action log (``gpuspawner report --actions``)."""
        return self.state / ACTION_LOG

    def node_hours_command(self) -> str:
        """The ``gpuspawner report`` that shows the GPU node-hours the autoscaled pools held and
        what idle reclaims let go ("" without ``autoscale``)."""
        if self.nodeclaims is None:
            return ""
        cli = shutil.which("gpuspawner", path=str(Path(sys.executable).parent)) or "gpuspawner"  # (this venv's)
        actions = f" --actions {self.action_log}" if self.culler else ""  # (no culler: no idle reclaim to join)
        return f"{cli} report --nodeclaims {self.nodeclaims}{actions} --since 1d"


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterHub exited with {proc.returncode}; see {log_file}:\n{log_file.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return  # 200: the proxy routes to a hub that answers
        except (urllib.error.URLError, OSError):  # incl. the proxy's 404 before the hub's route exists
            time.sleep(0.2)
    raise RuntimeError(f"JupyterHub did not answer at {url} within {timeout:.0f}s; see {log_file}")


def seed_other_team(kube: KubeHTTP) -> None:
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "research-team"}})
    for name, limits, selector in OTHER_TEAM:
        spec = {
            "containers": [{"name": "job", "image": "pytorch/pytorch", "resources": {"limits": limits}}],
            "tolerations": [{"operator": "Exists"}],
            "nodeSelector": selector,
        }
        kube.request(
            "POST", "/api/v1/namespaces/research-team/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        )


@contextlib.contextmanager
def running_demo(
    port: int = 8000,
    hub_port: int = 8081,
    culler: bool = True,
    quiet: bool = False,
    extra_env: dict[str, str] | None = None,
    scrape_interval: str = "5s",
    kueue: bool = False,
    autoscale: bool = False,
) -> Iterator[Demo]:
    """Everything the demo runs, torn down on exit (also on errors and Ctrl-C), in reverse order."""
    if not (REPO / "node_modules" / ".bin" / "configurable-http-proxy").exists():
        raise RuntimeError("configurable-http-proxy is missing: run `npm install` (or `make demo`) in the repository first")
    state = Path(tempfile.mkdtemp(prefix="gpuspawner-demo-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, state, ignore_errors=True)
        cluster = DevCluster(state / "cluster")
        stack.callback(cluster.down, quiet=True)
        nodes = [n for n in standard_nodes() if n["metadata"]["labels"][CLASS_LABEL] == "cpu"] if autoscale else None
        cluster.up(nodes=nodes, log=(lambda m: None) if quiet else print, kueue=kueue, karpenter=autoscale)
        kube = cluster.client()
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        if autoscale:
            for body in (node_class(AUTOSCALE_BOOT), *(node_pool(pool, network=True) for pool in POOLS)):
                cluster.karpenter().apply(body)
            networks = threading.Event()
            threading.Thread(target=_pod_networks, args=(kube, networks), daemon=True).start()
            stack.callback(networks.set)
        else:
            seed_other_team(kube)
        runner = PodRunner(kube, root=state / "pods")
        runner.start()
        stack.callback(runner.stop)
        # no GPU here: dcgm-exporter's rows for the GPU pods, from a stand-in
        standin = DcgmStandIn(access_log=state / "dcgm-exporter.access.log").start()
        stack.callback(standin.stop)
        telemetry = SimulatedDCGM(kube, standin, step=1.0)
        telemetry.start()
        stack.callback(telemetry.stop)
        culler_metrics_port = free_port()
        prometheus_token = secrets.token_hex(16)  # the hub's "prometheus" service: read:metrics only
        (state / "prometheus-token").write_text(prometheus_token)
        prometheus = Prometheus(
            state / "prometheus",
            [
                ScrapeJob("dcgm-exporter", [standin.target]),
                ScrapeJob("jupyterhub", [f"127.0.0.1:{hub_port}"], metrics_path="/hub/metrics", token_file=state / "prometheus-token"),
                ScrapeJob("gpu-culler", [f"127.0.0.1:{culler_metrics_port}"]),
            ],
            rule_files=[RULES_FILE],
            scrape_interval=scrape_interval,
        ).start()
        stack.callback(prometheus.stop)
        proxy_api_port = free_port()
        env = {
            **os.environ,
            **cluster.env(),
            "GPUSPAWNER_DEMO_DIR": str(state),
            "GPUSPAWNER_DEMO_PORT": str(port),
            "GPUSPAWNER_DEMO_HUB_PORT": str(hub_port),
            "GPUSPAWNER_DEMO_PROXY_API_PORT": str(proxy_api_port),
            "GPUSPAWNER_DEMO_NAMESPACE": NAMESPACE,
            "GPUSPAWNER_DEMO_CULLER": "1" if culler else "0",
            "GPUSPAWNER_DEMO_PROMETHEUS_URL": prometheus.url,
            "GPUSPAWNER_DEMO_PROMETHEUS_TOKEN": prometheus_token,
            "GPUSPAWNER_DEMO_CULLER_METRICS_PORT": str(culler_metrics_port),
            **(demokueue.hub_env() if kueue else {}),
            "GPUSPAWNER_DEMO_ACTION_LOG": str(state / ACTION_LOG),
            **({"GPUSPAWNER_DEMO_AUTOSCALE": "1", "GPUSPAWNER_DEMO_NODECLAIMS": str(state / NODECLAIM_RECORD)} if autoscale else {}),
            **(extra_env or {}),
        }
        # Kueue's objects for the hub's offerings, as `gpuspawner kueue` writes them from the
        # hub's own config, and the batch Job competing with the hub for the same quota
        kueue_demo = demokueue.set_up(kube, CONFIG, env, state) if kueue else None
        log_file = state / "jupyterhub.log"
        hub_process = HubProcess(state, port, hub_port, proxy_api_port, log_path=log_file)  # its config: CONFIG, from env
        hub = hub_process.launch(CONFIG, env)
        # the hub, its proxy, its managed services (the culler): every process it started, even
        # one in a session of its own that the hub does not stop on its way out
        stack.callback(hub_process.end, timeout=30)
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/hub/health", 90, hub, log_file)
        yield Demo(
            url=url,
            api_url=f"{url}/hub/api",
            state=state,
            cluster=cluster,
            runner=runner,
            hub=hub,
            telemetry=telemetry,
            prometheus=prometheus,
            kueue=kueue_demo,
            nodeclaims=state / NODECLAIM_RECORD if autoscale else None,
            culler=culler,
        )


def _pod_networks(kube: KubeHTTP, stop: threading.Event) -> None:
    """Until ``stop``: give the nodes Karpenter makes a pod network (:func:`give_pod_networks`)."""
    while not stop.wait(0.5):
        try:
            give_pod_networks(kube)
        except (urllib.error.URLError, OSError) as exc:  # (the cluster going down on exit, a node gone meanwhile)
            logging.getLogger("gpuspawner.demo").debug("pod networks: %s", exc)


#: a JupyterHub access-log line for a request that went well ("[I ... JupyterHub log:192] 200 GET ...")
_ACCESS_OK = re.compile(r"^\[[DI] [^\]]* JupyterHub log:\d+\] [123]\d\d ")


def console_line(line: str) -> bool:
    """Whether the demo's console shows this hub log line: the hub's own messages and the
    culler's decisions, not the access log of requests that went well (Prometheus' scrapes
    and the form's refreshes would drown everything; they stay in jupyterhub.log)."""
    return bool(line.strip()) and not _ACCESS_OK.match(line)


def follow(path: Path, stop: threading.Event, start: int, show: Callable[..., object] = print) -> None:
    """Print the lines ``path`` gains after byte ``start`` that :func:`console_line` keeps."""
    with open(path, errors="replace") as f:
        f.seek(start)
        while not stop.is_set():
            line = f.readline()
            if not line:
                stop.wait(0.3)
            elif console_line(line):
                show(line.rstrip("\n"), flush=True)


def autoscale_banner(demo: Demo) -> str:
    """The startup text's lines on the autoscaled pools' node-hours ("" without ``--autoscale``)."""
    if demo.nodeclaims is None:
        return ""
    saved = ", and saved by idle reclaims," if demo.culler else ""
    return (
        "GPU pools at zero nodes (Karpenter): a GPU server brings a node up, an emptied node goes away.\n"
        f"  GPU node-hours held{saved} in hours and cost, recorded from the start (run it while the demo runs:\n"
        f"  its state folder goes when it stops):\n"
        f"  {demo.node_hours_command()}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="JupyterHub with GPUSpawner on a simulated GPU cluster")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-culler", action="store_true", help="do not run the GPU-aware culler service")
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="run the real Kueue: GPU servers go through its queue, beside a competing batch Job (docs/kueue.md)",
    )
    parser.add_argument(
        "--autoscale",
        action="store_true",
        help="GPU pools at zero nodes grown by the real Karpenter, instead of fixed GPU nodes (docs/autoscaling.md)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        with running_demo(
            port=args.port, hub_port=free_port(), culler=not args.no_culler, kueue=args.kueue, autoscale=args.autoscale
        ) as demo:
            print(
                f"\nJupyterHub with GPUSpawner is running: {demo.url}\n\n"
                "Log in (password: gpu) as\n"
                "  student1     shared GPUs and MIG 1g slices\n"
                "  researcher1  everything, whole GPUs too\n"
                "  admin        everything, and the admin page\n\n"
                f"Prometheus: {demo.prometheus.url}   (dashboard and rules: charts/gpuspawner/monitoring/;\n"
                f"  usage: gpuspawner report --prometheus-url={demo.prometheus.url} --since 1h --by user)\n"
                f"Hub log: {demo.state / 'jupyterhub.log'}   KUBECONFIG={demo.cluster.kubeconfig}\n"
                f"Other logs (Prometheus, dcgm-exporter stand-in, pods): {demo.state}\n"
                f"{demokueue.banner(demo.kueue, demo.cluster.kubeconfig) if demo.kueue else ''}"
                f"{autoscale_banner(demo)}"
                "Press Ctrl-C to stop everything. The hub's log and the culler's decisions follow.\n",
                flush=True,
            )
            stop = threading.Event()
            log = demo.state / "jupyterhub.log"
            threading.Thread(target=follow, args=(log, stop, log.stat().st_size), daemon=True).start()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            while not stop.wait(1.0):
                if demo.hub.poll() is not None:
                    print(f"gpuspawner demo: JupyterHub exited; see {demo.state / 'jupyterhub.log'}", file=sys.stderr)
                    return 1
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        print(f"gpuspawner demo: {exc}", file=sys.stderr)
        return 1
    print("demo stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
