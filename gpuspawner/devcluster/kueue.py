"""Kueue on the devcluster: the real controller, built from its Go module, run against the
devcluster's kube-apiserver with its CRDs, its configuration and its admission webhooks.

``gpuspawner devcluster up --kueue`` (or ``DevCluster.up(kueue=True)``) starts it after the
control plane:

1. Kueue's CRDs, copied out of its module by ``build_kueue``, are applied server-side.
2. A configuration file: the ``pod`` and ``batch/job`` integrations on, every namespace but
   ``kube-system`` and ``kueue-system`` managed, leader election and Kueue's own certificate
   management off (a webhook certificate is written here instead), every port free.
3. The controller starts with the cluster's admin kubeconfig; ``up`` waits for its
   ``/readyz`` (certificates loaded, webhook server listening).
4. Its webhook configurations -- those of pods, Jobs and Kueue's own kinds, as its module
   ships them -- are registered by URL with the CA of that certificate. They fail closed, as
   Kueue's do: while Kueue is down (:meth:`Kueue.stop`), pods cannot be created outside
   ``kube-system`` and ``kueue-system``.

A pod labelled ``kueue.x-k8s.io/queue-name`` is then gated (``kueue.x-k8s.io/admission``)
until Kueue admits its Workload.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from gpuspawner.devcluster import build
from gpuspawner.devcluster.certs import write_serving_certificate
from gpuspawner.devcluster.clusterstate import ClusterState, ComponentExited, DevClusterError, KubeHTTP, alive, http_ok, log_tail, terminate
from gpuspawner.devcluster.ports import free_ports

#: where Kueue v0.17 reads its metrics server's certificate when its own certificate
#: management is off (a fixed path in cmd/kueue/main.go, not a setting)
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
#: the process's key in the cluster's recorded pids, and its ports' keys
NAME = "kueue"
PORTS = ("kueue-webhook", "kueue-health", "kueue-metrics", "kueue-visibility")
#: Kueue's own namespace (its configuration's default); never managed, never gated
NAMESPACE = "kueue-system"
#: the API groups whose webhooks are registered: pods, Jobs and Kueue's own kinds (the
#: integrations this devcluster turns on; a webhook for a kind Kueue does not serve would
#: refuse that kind everywhere)
WEBHOOK_GROUPS = frozenset({"", "batch", "kueue.x-k8s.io"})
#: the namespaces Kueue's pod webhooks leave alone (as its kustomization patches them)
UNMANAGED = ["kube-system", NAMESPACE]
FIELD_MANAGER = "gpuspawner-devcluster"


def configuration(ports: dict[str, int], cert_dir: Path, wait_for_pods_ready: int = 0) -> dict[str, Any]:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for the devcluster.
    ``wait_for_pods_ready``: seconds Kueue waits for an admitted workload's pods to be ready
    before it evicts them (0: off, Kueue's own default)."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue-health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue-metrics']}"},
        "webhook": {"port": ports["kueue-webhook"], "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": UNMANAGED}]
        },
        "integrations": {"frameworks": ["pod", "batch/job"]},
    }
    if wait_for_pods_ready > 0:
        config["waitForPodsReady"] = {"timeout": f"{int(wait_for_pods_ready)}s"}
    return config


def webhook_configurations(manifests: str, url: str, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations as its module ships them, pointed at ``url`` (its webhook
    server) with ``ca``, keeping the webhooks of :data:`WEBHOOK_GROUPS` only; pod webhooks
    leave :data:`UNMANAGED` alone."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc or doc.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups or not groups <= WEBHOOK_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook = {**hook, "clientConfig": {"url": url.rstrip("/") + path, "caBundle": base64.b64encode(ca).decode()}}
            if "" in groups:
                hook["namespaceSelector"] = {
                    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": UNMANAGED}]
                }
            hooks.append(hook)
        name = "kueue-" + doc["metadata"]["name"]
        out.append({"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": {"name": name}, "webhooks": hooks})
    return out


def metrics_certificate(directory: Path = METRICS_CERTS) -> None:
    """Kueue will not start without a certificate for its metrics server at ``directory``
    (``/etc/kueue/metrics/certs``) when its own certificate management is off; nothing in
    the devcluster verifies it, so every devcluster on the machine shares one, written once."""
    if (directory / "tls.crt").is_file() and (directory / "tls.key").is_file():
        return
    try:
        write_serving_certificate(directory, "kueue-metrics")
    except OSError as exc:
        raise DevClusterError(
            f"Kueue v0.17 reads its metrics certificate from {directory} (a fixed path) and could not be given one there ({exc}):"
            f" create {directory} writable for this user, or run as a user who may, then `devcluster up --kueue` again"
        ) from None


class Kueue:
    """The Kueue controller of one devcluster (its state folder's ``kueue/``)."""

    def __init__(self, state: ClusterState, kubeconfig: Path) -> None:
        self.state = state
        self.kubeconfig = kubeconfig
        self.directory = Path(state.directory) / "kueue"
        self.client = KubeHTTP(state)

    @property
    def running(self) -> bool:
        return alive(self.state.pids.get(NAME))

    def up(self, timeout: float = 120.0, wait_for_pods_ready: int = 0) -> None:
        """Build (if needed), install the CRDs, start the controller, register its webhooks."""
        bins = build.build_kueue()
        self.directory.mkdir(parents=True, exist_ok=True)
        for key, port in free_ports(PORTS).items():
            self.state.ports.setdefault(key, port)
        self.state.save()
        certs = write_serving_certificate(self.directory / "certs", "kueue-webhook")
        metrics_certificate()
        (self.directory / "config.yaml").write_text(yaml.safe_dump(configuration(self.state.ports, certs, wait_for_pods_ready)))
        self._namespace()
        self._apply_crds((bins / "crds.yaml").read_text(), timeout)
        self.start(timeout)
        url = f"https://127.0.0.1:{self.state.ports['kueue-webhook']}"
        for config in webhook_configurations((bins / "webhooks.yaml").read_text(), url, (certs / "ca.crt").read_bytes()):
            self._apply(f"/apis/admissionregistration.k8s.io/v1/{config['kind'].lower()}s/{config['metadata']['name']}", config)

    def start(self, timeout: float = 120.0) -> None:
        """Start the controller (again, after :meth:`stop`) and wait until it is ready."""
        if self.running:
            return
        log = open(Path(self.state.directory) / "logs" / "kueue.log", "ab")
        proc = subprocess.Popen(
            [
                str(build.kueue_dir() / "kueue"),
                f"--config={self.directory / 'config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--visibility-server-port={self.state.ports['kueue-visibility']}",
                # its visibility API server reads a certificate from /visibility (a fixed path) and
                # would be served through an APIService to a Service: not on this devcluster
                "--feature-gates=VisibilityOnDemand=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.directory,
            start_new_session=True,
        )
        log.close()
        self.state.pids[NAME] = proc.pid
        self.state.save()
        ready = f"http://127.0.0.1:{self.state.ports['kueue-health']}/readyz"
        deadline = time.monotonic() + timeout
        while not http_ok(ready):
            if not alive(proc.pid):
                tail = log_tail(Path(self.state.directory) / "logs" / "kueue.log")
                raise ComponentExited(f"kueue exited while starting; its log ends: {tail}")
            if time.monotonic() > deadline:
                raise DevClusterError(f"kueue did not become ready within {timeout:.0f}s; see {self.state.directory}/logs/kueue.log")
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop the controller and leave its webhooks registered: Kueue down, as a cluster sees it."""
        pid = self.state.pids.pop(NAME, None)
        if pid and alive(pid):
            terminate(pid)
        self.state.save()

    # ------------------------------------------------------------------ internals

    def _namespace(self) -> None:
        self._apply(f"/api/v1/namespaces/{NAMESPACE}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})

    def _apply_crds(self, manifests: str, timeout: float) -> None:
        names = []
        for crd in yaml.safe_load_all(manifests):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                names.append(crd["metadata"]["name"])
                self._apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}", crd)
        deadline = time.monotonic() + timeout
        for name in names:
            while not self._established(name):
                if time.monotonic() > deadline:
                    raise DevClusterError(f"Kueue's CRD {name} was not established within {timeout:.0f}s")
                time.sleep(0.2)

    def _established(self, name: str) -> bool:
        crd = self.client.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in (crd.get("status") or {}).get("conditions") or [])

    def _apply(self, path: str, body: dict[str, Any]) -> Any:
        """Server-side apply (the devcluster owns these fields)."""
        return self.client.apply(f"{path}?fieldManager={FIELD_MANAGER}&force=true", json.dumps(body))
