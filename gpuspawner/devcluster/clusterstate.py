"""The dev cluster on disk and on the wire: its saved state (ports, pids, folder, kubeconfig), a small HTTP client of its API server, and the process helpers the cluster uses."""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuspawner.devcluster import build
from gpuspawner.devcluster.podnet import node_cidr


class DevClusterError(RuntimeError):
    """The devcluster could not do what was asked; the message says why and what to do."""


class ComponentExited(DevClusterError):
    """A component died while starting (say, another process took its port in between)."""


def default_dir() -> Path:
    return build.cache_root() / "devcluster" / "run" / "default"


@dataclass
class ClusterState:
    """What ``up`` wrote down: enough for ``down``, ``status`` and ``env``."""

    directory: str
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    token: str = ""
    started_at: float = 0.0
    #: its own pod networks (see :mod:`gpuspawner.devcluster.podnet`): the band's first
    #: second octet and its width in octets (0: a cluster from before bands, as its nodes say)
    pod_net: int = 0
    pod_width: int = 0
    #: whether kube-apiserver runs with the aggregation layer's front proxy (a cluster with
    #: Kueue, for its visibility API; see :func:`gpuspawner.devcluster.certs.aggregation_args`)
    aggregation: bool = False

    @property
    def path(self) -> Path:
        return Path(self.directory)

    @property
    def kubeconfig(self) -> Path:
        return self.path / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def save(self) -> None:
        tmp = self.path / "cluster.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, self.path / "cluster.json")

    @classmethod
    def load(cls, directory: Path) -> ClusterState | None:
        try:
            return cls(**json.loads((directory / "cluster.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError, TypeError):
            return None


class KubeHTTP:
    """A minimal JSON client for the devcluster's API server (admin token, our CA)."""

    def __init__(self, state: ClusterState):
        self.state = state
        self.context = ssl.create_default_context(cafile=str(state.path / "pki" / "ca.crt"))

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.state.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.state.token}")
        if data is not None:
            ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
            req.add_header("Content-Type", ctype)
        with urllib.request.urlopen(req, context=self.context, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw and raw[:1] in b"{[" else raw.decode()

    def apply(self, path: str, document: str, timeout: float = 30.0) -> Any:
        """Server-side apply of ``document`` (JSON or YAML) at ``path`` (with its query)."""
        req = urllib.request.Request(self.state.server + path, data=document.encode(), method="PATCH")
        req.add_header("Authorization", f"Bearer {self.state.token}")
        req.add_header("Content-Type", "application/apply-patch+yaml")
        with urllib.request.urlopen(req, context=self.context, timeout=timeout) as resp:
            return json.loads(resp.read())

    def create_node(self, node: dict[str, Any], cidr: str | None = None) -> Any:
        """Create ``node`` with a pod network of this cluster's own band (``cidr``, or the
        first one no node has now), whatever ``podCIDR`` its manifest carried: two clusters
        must never hand out one pod IP."""
        if self.state.pod_width:
            cidr = cidr or self.free_pod_cidr()
            node = {**node, "spec": {**node.get("spec", {}), "podCIDR": cidr, "podCIDRs": [cidr]}}
        return self.request("POST", "/api/v1/nodes", node)

    def free_pod_cidr(self) -> str:
        """The first pod network of this cluster's band that no node has now."""
        taken = {n["spec"].get("podCIDR") for n in self.request("GET", "/api/v1/nodes")["items"]}
        return next(
            c for i in range(self.state.pod_width * 256) if (c := node_cidr(self.state.pod_net, i, self.state.pod_width)) not in taken
        )

    def ok(self, path: str) -> bool:
        try:
            self.request("GET", path, timeout=2.0)
            return True
        except (urllib.error.URLError, OSError, ValueError):
            return False


def kubeconfig_text(state: ClusterState, ca: Path) -> str:
    ca_data = base64.b64encode(ca.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "devcluster", "cluster": {"server": state.server, "certificate-authority-data": ca_data}}],
        "users": [{"name": "devcluster-admin", "user": {"token": state.token}}],
        "contexts": [{"name": "devcluster", "context": {"cluster": "devcluster", "user": "devcluster-admin", "namespace": "default"}}],
        "current-context": "devcluster",
    }
    return json.dumps(config, indent=2)


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])[-600:]
    except OSError:
        return "(no log)"


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def terminate(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group ``pid`` leads, then SIGKILL what is left after ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not alive(pid):
                return
            time.sleep(0.05)


def start_controller(state: ClusterState, name: str, args: list[str], cwd: Path, ready_url: str, timeout: float, **env: str) -> None:
    """Start a controller beside the devcluster (Kueue, Karpenter) in its own process group, its
    output in ``logs/<name>.log`` and its pid recorded as ``name`` (``down`` ends it); wait until
    ``ready_url`` answers 200, or raise with its log's last lines if it exits first."""
    log = open(Path(state.directory) / "logs" / f"{name}.log", "ab")
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env={**os.environ, **env},
        start_new_session=True,
    )
    log.close()
    state.pids[name] = proc.pid
    state.save()
    deadline = time.monotonic() + timeout
    while not http_ok(ready_url):
        if not alive(proc.pid):
            tail = log_tail(Path(state.directory) / "logs" / f"{name}.log")
            raise ComponentExited(f"{name} exited while starting; its log ends: {tail}")
        if time.monotonic() > deadline:
            raise DevClusterError(f"{name} did not become ready within {timeout:.0f}s; see {state.directory}/logs/{name}.log")
        time.sleep(0.3)


def apply_crds(client: KubeHTTP, manifests: str, field_manager: str, timeout: float, owner: str) -> None:
    """Server-side apply the CustomResourceDefinitions of ``manifests`` (YAML documents) and wait
    until each is established; ``owner`` names whose CRDs they are in an error."""
    names = []
    for crd in yaml.safe_load_all(manifests):
        if crd and crd.get("kind") == "CustomResourceDefinition":
            names.append(crd["metadata"]["name"])
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            client.apply(f"{path}?fieldManager={field_manager}&force=true", json.dumps(crd))
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(client, name):
            if time.monotonic() > deadline:
                raise DevClusterError(f"{owner}'s CRD {name} was not established within {timeout:.0f}s")
            time.sleep(0.2)


def _established(client: KubeHTTP, name: str) -> bool:
    crd = client.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in (crd.get("status") or {}).get("conditions") or [])


class Controller:
    """A controller run beside the devcluster (Kueue, Karpenter): its files in the state folder's
    ``<name>/``, its pid recorded as ``name``."""

    name = ""

    def __init__(self, state: ClusterState, kubeconfig: Path) -> None:
        self.state = state
        self.kubeconfig = kubeconfig
        self.directory = Path(state.directory) / self.name
        self.client = KubeHTTP(state)

    @property
    def running(self) -> bool:
        return alive(self.state.pids.get(self.name))

    def stop(self) -> None:
        """Stop the controller and leave what it installed (CRDs, webhooks, NodePools): the
        controller down, as a cluster sees it."""
        pid = self.state.pids.pop(self.name, None)
        if pid and alive(pid):
            terminate(pid)
        self.state.save()
