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
import fcntl
import ipaddress
import json
import socket
import struct
import time
from pathlib import Path
from typing import Any

import yaml

from gpuspawner.devcluster import build
from gpuspawner.devcluster.certs import write_serving_certificate
from gpuspawner.devcluster.clusterstate import (
    ComponentExited,
    Controller,
    DevClusterError,
    apply_crds,
    log_tail,
    start_controller,
)
from gpuspawner.devcluster.ports import free_ports

#: where Kueue v0.17 reads its metrics server's certificate when its own certificate
#: management is off (a fixed path in cmd/kueue/main.go, not a setting)
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
#: where Kueue v0.17 reads its visibility server's certificate (tls.crt, tls.key) when its own
#: certificate management is off (``certDir`` in pkg/visibility/server.go, not a setting)
VISIBILITY_CERTS = Path("/visibility")
#: the Service of Kueue's visibility server and its port's name (config/components/visibility)
VISIBILITY_SERVICE = "visibility-server"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
#: the versions of its visibility API Kueue v0.17 serves (pkg/visibility/server.go's install),
#: one APIService each, as config/components/visibility ships them
VISIBILITY_VERSIONS = ("v1beta1", "v1beta2")
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
#: workers per controller, as Kueue's release configures them
RELEASE_CONCURRENCY = {
    "Job.batch": 5,
    "Pod": 5,
    "Workload.kueue.x-k8s.io": 5,
    "LocalQueue.kueue.x-k8s.io": 1,
    "Cohort.kueue.x-k8s.io": 1,
    "ClusterQueue.kueue.x-k8s.io": 1,
    "ResourceFlavor.kueue.x-k8s.io": 1,
}


def configuration(
    ports: dict[str, int], cert_dir: Path, wait_for_pods_ready: int = 0, visibility_address: str | None = None
) -> dict[str, Any]:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for the devcluster.
    ``wait_for_pods_ready``: seconds Kueue waits for an admitted workload's pods to be ready
    before it evicts them (0: off, Kueue's own default). ``visibility_address``: the address
    its visibility server listens on (None: no visibility server)."""
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
        # As the release's own configuration sets them (config/components/manager/
        # controller_manager_config.yaml); without them Kueue takes its code's defaults (20 queries
        # a second, burst 30, one worker per controller) and admits a burst of pods seconds later.
        "clientConnection": {"qps": 50, "burst": 100},
        "controller": {"groupKindConcurrency": RELEASE_CONCURRENCY},
    }
    if wait_for_pods_ready > 0:
        config["waitForPodsReady"] = {"timeout": f"{int(wait_for_pods_ready)}s"}
    if visibility_address:
        # (its port: --visibility-server-port; the configuration's bindPort wins only when not 8082)
        config["visibilityServer"] = {"bindAddress": visibility_address}
    return config


def machine_ipv4() -> str | None:
    """This machine's own IPv4 address that an EndpointSlice may hold: the first interface's
    that is not loopback, link-local or unspecified (None: none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            ip = ipaddress.IPv4Address(raw[20:24])
            if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast):
                return str(ip)
    return None


def visibility_objects(address: str, port: int) -> list[tuple[str, dict[str, Any]]]:
    """(API path, object) of what serves Kueue's visibility API through the API server: the
    Service, its EndpointSlice (``address``:``port``, Kueue's visibility server) and one
    APIService per version (Kueue's own: insecureSkipTLSVerify, as it ships them)."""
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]},
    }
    endpoints: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": VISIBILITY_SERVICE,
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": VISIBILITY_SERVICE, "endpointslice.kubernetes.io/managed-by": FIELD_MANAGER},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    out = [
        (f"/api/v1/namespaces/{NAMESPACE}/services/{VISIBILITY_SERVICE}", service),
        (f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices/{VISIBILITY_SERVICE}", endpoints),
    ]
    for version in VISIBILITY_VERSIONS:
        name = f"{version}.{VISIBILITY_GROUP}"
        api_service: dict[str, Any] = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name},
            "spec": {
                "group": VISIBILITY_GROUP,
                "version": version,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "insecureSkipTLSVerify": True,
                "service": {"name": VISIBILITY_SERVICE, "namespace": NAMESPACE, "port": 443},
            },
        }
        out.append((f"/apis/apiregistration.k8s.io/v1/apiservices/{name}", api_service))
    return out


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


def visibility_certificate(directory: Path = VISIBILITY_CERTS) -> None:
    """Kueue's visibility server reads its certificate from ``directory`` (``/visibility``)
    when its own certificate management is off; the API server does not verify it
    (insecureSkipTLSVerify, as Kueue ships its APIServices), so every devcluster on the
    machine shares one, written once."""
    if (directory / "tls.crt").is_file() and (directory / "tls.key").is_file():
        return
    try:
        write_serving_certificate(directory, "kueue-visibility")
    except OSError as exc:
        raise DevClusterError(
            f"Kueue v0.17 reads its visibility server's certificate from {directory} (a fixed path) and could not be given one"
            f" there ({exc}): create {directory} writable for this user, or run as a user who may, then `devcluster up --kueue` again"
        ) from None


class Kueue(Controller):
    """The Kueue controller of one devcluster (its state folder's ``kueue/``)."""

    name = NAME

    def up(self, timeout: float = 120.0, wait_for_pods_ready: int = 0) -> None:
        """Build (if needed), install the CRDs, start the controller, register its webhooks; where
        the API server runs with the aggregation layer, serve its visibility API too (step 5
        above) and wait until the API server answers it."""
        bins = build.build_kueue()
        self.directory.mkdir(parents=True, exist_ok=True)
        for key, port in free_ports(PORTS).items():
            self.state.ports.setdefault(key, port)
        self.state.save()
        certs = write_serving_certificate(self.directory / "certs", "kueue-webhook")
        metrics_certificate()
        address = None
        if self.state.aggregation:
            address = machine_ipv4()
            if address is None:
                raise DevClusterError(
                    "Kueue's visibility API needs an IPv4 address of this machine other than loopback (the API server refuses"
                    " loopback addresses in EndpointSlices), and it has none"
                )
            visibility_certificate()
        config = configuration(self.state.ports, certs, wait_for_pods_ready, address)
        (self.directory / "config.yaml").write_text(yaml.safe_dump(config))
        self._namespace()
        apply_crds(self.client, (bins / "crds.yaml").read_text(), FIELD_MANAGER, timeout, "Kueue")
        self.start(timeout)
        url = f"https://127.0.0.1:{self.state.ports['kueue-webhook']}"
        for hooks in webhook_configurations((bins / "webhooks.yaml").read_text(), url, (certs / "ca.crt").read_bytes()):
            self._apply(f"/apis/admissionregistration.k8s.io/v1/{hooks['kind'].lower()}s/{hooks['metadata']['name']}", hooks)
        if address is not None:
            for path, body in visibility_objects(address, self.state.ports["kueue-visibility"]):
                self._apply(path, body)
            self._wait_served(timeout)

    @property
    def visibility(self) -> bool:
        """Whether its configuration runs its visibility server (set by :meth:`up`)."""
        try:
            config = yaml.safe_load((self.directory / "config.yaml").read_text()) or {}
        except FileNotFoundError:
            return False
        return bool(config.get("visibilityServer"))

    def start(self, timeout: float = 120.0) -> None:
        """Start the controller (again, after :meth:`stop`) and wait until it is ready."""
        if self.running:
            return
        args = [
            str(build.kueue_dir() / "kueue"),
            f"--config={self.directory / 'config.yaml'}",
            f"--kubeconfig={self.kubeconfig}",
            f"--visibility-server-port={self.state.ports['kueue-visibility']}",
        ]
        if not self.visibility:
            # its visibility server is served through an APIService, which needs the API server's
            # aggregation layer: off where the API server runs without it
            args.append("--feature-gates=VisibilityOnDemand=false")
        ready = f"http://127.0.0.1:{self.state.ports['kueue-health']}/readyz"
        deadline = time.monotonic() + timeout
        start_controller(self.state, NAME, args, self.directory, ready, timeout)
        if self.visibility and self._registered():  # (started again: its visibility API too)
            self._wait_served(max(1.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ internals

    def _namespace(self) -> None:
        self._apply(f"/api/v1/namespaces/{NAMESPACE}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})

    def _wait_served(self, timeout: float) -> None:
        """Wait until the API server answers each version of the visibility API from Kueue's
        visibility server (its APIService Available, and the server authenticating the API
        server's front proxy: right after a start it answers as to an anonymous user for a
        moment, until it has read the front proxy's CA)."""
        deadline = time.monotonic() + timeout
        for version in VISIBILITY_VERSIONS:
            while not self.client.ok(f"/apis/{VISIBILITY_GROUP}/{version}"):
                if not self.running:
                    tail = log_tail(Path(self.state.directory) / "logs" / "kueue.log")
                    raise ComponentExited(f"kueue exited before its visibility API was served; its log ends: {tail}")
                if time.monotonic() > deadline:
                    api_service = self.client.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{version}.{VISIBILITY_GROUP}")
                    conditions = (api_service.get("status") or {}).get("conditions") or []
                    available: dict[str, Any] = next((c for c in conditions if c.get("type") == "Available"), {})
                    raise DevClusterError(
                        f"Kueue's visibility API {version}.{VISIBILITY_GROUP} was not served within {timeout:.0f}s (Available:"
                        f" {available.get('status')}, {available.get('reason')}: {available.get('message')});"
                        f" see {self.state.directory}/logs/kueue.log"
                    )
                time.sleep(0.3)

    def _registered(self) -> bool:
        """Whether the visibility API's APIServices are registered (by an earlier :meth:`up`)."""
        return self.client.ok(f"/apis/apiregistration.k8s.io/v1/apiservices/{VISIBILITY_VERSIONS[-1]}.{VISIBILITY_GROUP}")

    def _apply(self, path: str, body: dict[str, Any]) -> Any:
        """Server-side apply (the devcluster owns these fields)."""
        return self.client.apply(f"{path}?fieldManager={FIELD_MANAGER}&force=true", json.dumps(body))
