"""Start and stop the local control plane: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok on 127.0.0.1.

Everything lives in one state folder: certificates, a token, the kubeconfig,
logs, etcd's data and ``cluster.json`` (ports and process ids). ``down`` ends
exactly the processes that ``up`` started (by their recorded ids and process
groups), so it is safe on a shared machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from gpuspawner.devcluster import build, podnet
from gpuspawner.devcluster.certs import aggregation_args, write_certificates, write_front_proxy_certificates
from gpuspawner.devcluster.clusterstate import (
    ClusterState,
    ComponentExited,
    DevClusterError,
    KubeHTTP,
    alive,
    default_dir,
    http_ok,
    kubeconfig_text,
    log_tail,
    terminate,
)
from gpuspawner.devcluster.karpenter import Karpenter
from gpuspawner.devcluster.kueuecontroller import Kueue
from gpuspawner.devcluster.nodes import standard_nodes
from gpuspawner.devcluster.ports import free_ports

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
#: Controllers the devcluster needs: default service accounts (pod admission needs
#: them), their tokens, garbage collection and namespace deletion. Never the node
#: lifecycle controller: kwok's nodes send no heartbeats and would be tainted NotReady.
#: The resourceclaim controller makes a pod's ResourceClaims from its ResourceClaimTemplates
#: and removes them with the pod (Dynamic Resource Allocation). The job controller makes a
#: batch/v1 Job's pods (the Kueue demo's batch Job, which Kueue suspends until it admits it).
#: The device-taint-eviction controller evicts pods whose allocated device gets a NoExecute
#: taint (from its ResourceSlice or a DeviceTaintRule); it starts only where the
#: DRADeviceTaints gate is on (GA in 1.37, beta and on in 1.36, alpha and off before).
#:
#: The DRA features the devcluster serves need no --feature-gates on Kubernetes 1.37
#: (pkg/features/kube_features.go): on by default are DRAPartitionableDevices (beta),
#: DRAConsumableCapacity (beta), DRADeviceBindingConditions (beta, with
#: DRAResourceClaimDeviceStatus GA), DRADeviceTaints and DRADeviceTaintRules (GA; the
#: DeviceTaintRule kind is served in resource.k8s.io/v1), DRAExtendedResource and
#: DRAPrioritizedList (GA). docs/dra.md has the table per feature and version.
#: The pod garbage collector deletes the pods of a node that is gone (after its 40 s quarantine), with the
#: DisruptionTarget reason DeletionByPodGC, as on any cluster: a server whose node is deleted
#: then loses its pod, which the hub sees (docs/fair-turns.md, "What a user holds").
KCM_CONTROLLERS = (
    "serviceaccount,serviceaccount-token,garbagecollector,namespace,resourceclaim-controller,"
    "device-taint-eviction-controller,job-controller,pod-garbage-collector-controller"
)


class DevCluster:
    """One local control plane in ``directory``."""

    def __init__(self, directory: Path | None = None, audited_clients: Iterable[str] = ()):
        """``audited_clients``: names of extra admin identities (each gets its own token,
        :meth:`client_kubeconfig`) whose every request the API server writes to its audit log
        (``logs/audit.log``, JSON lines at the Metadata level; nobody else's): a benchmark counts one
        client's requests from the server's own record."""
        self.directory = Path(directory or os.environ.get("GPUSPAWNER_DEVCLUSTER_DIR") or default_dir())
        self.state = ClusterState.load(self.directory)
        self.audited_clients = tuple(audited_clients)

    @property
    def audit_log(self) -> Path:
        return self.directory / "logs" / "audit.log"

    def client_token(self, name: str) -> str:
        """The bearer token of the audited client ``name`` (derived from the cluster's own token)."""
        if name not in self.audited_clients:
            raise DevClusterError(f"{name!r} is not one of this cluster's audited clients {list(self.audited_clients)}")
        state = self._require_state()
        return hashlib.sha256(f"{state.token}:{name}".encode()).hexdigest()[:48]

    def client_kubeconfig(self, name: str) -> Path:
        """A kubeconfig that speaks to this cluster as the audited client ``name``."""
        state = self._require_state()
        path = self.directory / f"kubeconfig-{name}"
        text = json.loads(kubeconfig_text(state, self.directory / "pki" / "ca.crt"))
        text["users"][0]["user"]["token"] = self.client_token(name)
        path.write_text(json.dumps(text, indent=2))
        return path

    # ------------------------------------------------------------------ queries

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    def running(self) -> dict[str, bool]:
        """Component -> whether its recorded process is alive."""
        if self.state is None:
            return {name: False for name in COMPONENTS}
        return {name: alive(self.state.pids.get(name)) for name in COMPONENTS}

    def client(self) -> KubeHTTP:
        if self.state is None:
            raise DevClusterError(f"no devcluster in {self.directory}: run `gpuspawner devcluster up` first")
        return KubeHTTP(self.state)

    def env(self) -> dict[str, str]:
        """Variables that point kubectl, KubeSpawner and our tests at this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig), "GPUSPAWNER_DEVCLUSTER_DIR": str(self.directory)}

    # ------------------------------------------------------------------ up / down

    def up(
        self, nodes: Iterable[dict] | None = None, timeout: float = 90.0, log=print, kueue: bool = False, karpenter: bool = False
    ) -> ClusterState:
        """Start everything (building binaries first if needed) and load ``nodes``; with
        ``kueue``, also Kueue's controller, its CRDs and its webhooks (:mod:`.kueue`); with
        ``karpenter``, Karpenter's kwok provider and GPU pools at zero nodes (:mod:`.karpenter`).

        Idempotent: a cluster already running here is left as it is (Kueue started on it
        when asked and not running; its API server restarted first with the aggregation layer's
        flags, :func:`aggregation_args`, where it runs without them; Karpenter too).
        """
        if self.state is not None and all(self.running().values()):
            log(f"devcluster already running in {self.directory}")
            if kueue:
                if not self.state.aggregation:
                    self.kueue().stop()  # (started without its visibility server: started again with it)
                    write_front_proxy_certificates(self.directory / "pki")
                    self.state.aggregation = True
                    self.restart(("kube-apiserver",), timeout=timeout)
                self.kueue().up(timeout=timeout)
            if karpenter:
                self.karpenter().up(timeout=timeout)
            return self.state
        self.down(quiet=True)
        started = time.monotonic()
        bins = build.build()
        nodes = list(nodes) if nodes is not None else standard_nodes()
        for attempt in (1, 2):
            try:
                state = self._start_all(bins, nodes, timeout, aggregation=kueue)
                break
            except ComponentExited as exc:
                if attempt == 2:
                    raise
                log(f"devcluster: {exc}; starting again on other ports")
        try:
            if kueue:
                self.kueue().up(timeout=timeout)
            if karpenter:
                self.karpenter().up(timeout=timeout)
        except BaseException:
            self.down(quiet=True)
            raise
        extras = "".join(f" with {name}" for name, on in (("Kueue", kueue), ("Karpenter", karpenter)) if on)
        log(f"devcluster up in {time.monotonic() - started:.1f}s: {state.server}{extras} (KUBECONFIG={self.kubeconfig})")
        return state

    def kueue(self) -> Kueue:
        """This cluster's Kueue controller (:mod:`.kueue`)."""
        return Kueue(self._require_state(), self.kubeconfig)

    def karpenter(self) -> Karpenter:
        """This cluster's Karpenter (:mod:`.karpenter`)."""
        return Karpenter(self._require_state(), self.kubeconfig)

    def _start_all(self, bins: Path, nodes: list[dict], timeout: float, aggregation: bool = False) -> ClusterState:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Every `up` is a fresh cluster: the nodes of nodes.yaml and nothing else.
        shutil.rmtree(self.directory / "etcd", ignore_errors=True)
        for sub in ("logs", "etcd"):
            (self.directory / sub).mkdir(exist_ok=True)
        width = podnet.band_width(len(nodes))
        state = ClusterState(
            directory=str(self.directory),
            ports=free_ports(("etcd", "etcd-peer", "apiserver", "scheduler", "kcm", "kwok")),
            token=secrets.token_hex(24),
            started_at=time.time(),
            pod_net=podnet.claim(str(self.directory), width, alive, _running),
            pod_width=width,
            aggregation=aggregation,
        )
        self.state = state
        pki = write_certificates(self.directory / "pki")
        if aggregation:
            write_front_proxy_certificates(pki)
        tokens = [f'{state.token},gpuspawner-admin,gpuspawner-admin,"system:masters"']
        tokens += [f'{self.client_token(name)},{name},{name},"system:masters"' for name in self.audited_clients]
        (self.directory / "tokens.csv").write_text("\n".join(tokens) + "\n")
        if self.audited_clients:
            policy = {
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived", "ResponseStarted"],
                "rules": [{"level": "Metadata", "users": list(self.audited_clients)}, {"level": "None"}],
            }
            (self.directory / "audit-policy.json").write_text(json.dumps(policy))
        self.kubeconfig.write_text(kubeconfig_text(state, pki / "ca.crt"))
        state.save()
        try:
            self._start(bins, "etcd", self._etcd_args(state))
            self._wait(lambda: http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"), "etcd", timeout)
            self._start(bins, "kube-apiserver", self._apiserver_args(state, pki))
            client = KubeHTTP(state)
            self._wait(lambda client=client: client.ok("/readyz"), "kube-apiserver", timeout)
            self._start(bins, "kube-controller-manager", self._kcm_args(state, pki))
            self._start(bins, "kube-scheduler", self._scheduler_args(state))
            self._start(bins, "kwok", self._kwok_args(state))
            self._wait(lambda: client.ok("/api/v1/namespaces/default/serviceaccounts/default"), "default service account", timeout)
            for i, node in enumerate(nodes):
                client.create_node(node, podnet.node_cidr(state.pod_net, i, state.pod_width))
            self._wait(lambda: self._nodes_ready(client), "nodes Ready (kwok)", timeout)
        except urllib.error.HTTPError as exc:
            self.down(quiet=True)
            detail = exc.read().decode(errors="replace")[:300]
            raise DevClusterError(f"the API server refused {exc.url}: HTTP {exc.code} {detail}") from None
        except BaseException:
            self.down(quiet=True)
            raise
        return state

    def down(self, quiet: bool = False, log=print) -> None:
        """Stop every process ``up`` started here; keep the folder (logs) for a post-mortem."""
        state = self.state or ClusterState.load(self.directory)
        if state is None:
            return
        for name in [*(n for n in state.pids if n not in COMPONENTS), *reversed(COMPONENTS)]:  # (Kueue first)
            pid = state.pids.get(name)
            if pid and alive(pid):
                terminate(pid)
        state.pids = {}
        podnet.release(str(self.directory))
        if state.path.is_dir():
            state.save()
        if not quiet:
            log(f"devcluster in {self.directory} stopped")

    def restart(self, components: Iterable[str] = ("kube-apiserver", "etcd"), pause: float = 0.0, timeout: float = 60.0) -> None:
        """Stop ``components`` and start them again on the same ports and data (an outage).

        ``pause`` seconds pass between the stop and the start.
        """
        self.stop_components(components)
        time.sleep(pause)
        self.start_components(components, timeout)

    def stop_components(self, components: Iterable[str]) -> None:
        """Stop ``components`` (e.g. ``("kube-apiserver",)``): an outage that lasts until
        :meth:`start_components` brings them back on the same ports and data."""
        state = self._require_state()
        for name in reversed(self._ordered(components)):
            pid = state.pids.pop(name, None)
            if pid and alive(pid):
                terminate(pid)
        state.save()

    def start_components(self, components: Iterable[str], timeout: float = 60.0) -> None:
        """Start ``components`` again (after :meth:`stop_components`) and wait until they answer."""
        state = self._require_state()
        pki = self.directory / "pki"
        bins = build.bin_dir()
        args = {
            "etcd": lambda: self._etcd_args(state),
            "kube-apiserver": lambda: self._apiserver_args(state, pki),
            "kube-controller-manager": lambda: self._kcm_args(state, pki),
            "kube-scheduler": lambda: self._scheduler_args(state),
            "kwok": lambda: self._kwok_args(state),
        }
        for name in self._ordered(components):
            self._start(bins, name, args[name]())
            if name == "etcd":
                self._wait(lambda: http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"), "etcd", timeout)
            if name == "kube-apiserver":
                client = KubeHTTP(state)
                self._wait(lambda client=client: client.ok("/readyz"), "kube-apiserver", timeout)

    def _require_state(self) -> ClusterState:
        if self.state is None:
            raise DevClusterError(f"no devcluster in {self.directory}")
        return self.state

    @staticmethod
    def _ordered(components: Iterable[str]) -> list[str]:
        wanted = set(components)
        unknown = wanted - set(COMPONENTS)
        if unknown:
            raise DevClusterError(f"unknown devcluster component(s) {sorted(unknown)}; known: {', '.join(COMPONENTS)}")
        return [n for n in COMPONENTS if n in wanted]

    # ------------------------------------------------------------------ internals

    def _start(self, bins: Path, name: str, args: list[str]) -> None:
        assert self.state is not None
        log_file = open(self.directory / "logs" / f"{name}.log", "ab")
        binary = bins / name
        proc = subprocess.Popen(
            [str(binary), *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.directory,
            start_new_session=True,  # its own process group: down() ends it and its children
        )
        log_file.close()
        self.state.pids[name] = proc.pid
        self.state.save()

    def _wait(self, check, what: str, timeout: float) -> None:
        assert self.state is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            dead = [n for n, pid in self.state.pids.items() if not alive(pid)]
            if dead:
                tail = log_tail(self.directory / "logs" / f"{dead[0]}.log")
                raise ComponentExited(
                    f"{', '.join(dead)} exited while waiting for {what} (see {self.directory / 'logs'}); its log ends: {tail}"
                )
            time.sleep(0.2)
        raise DevClusterError(f"timed out after {timeout:.0f}s waiting for {what}; see {self.directory / 'logs'}")

    @staticmethod
    def _nodes_ready(client: KubeHTTP) -> bool:
        items = client.request("GET", "/api/v1/nodes")["items"]
        return all(
            any(c.get("type") == "Ready" and c.get("status") == "True" for c in (n.get("status") or {}).get("conditions") or [])
            for n in items
        )

    def _etcd_args(self, s: ClusterState) -> list[str]:
        client = f"http://127.0.0.1:{s.ports['etcd']}"
        peer = f"http://127.0.0.1:{s.ports['etcd-peer']}"
        return [
            "--name=devcluster",
            f"--data-dir={self.directory / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=devcluster={peer}",
            "--log-level=warn",
            "--quota-backend-bytes=4294967296",
            "--snapshot-count=20000",
        ]

    def _apiserver_args(self, s: ClusterState, pki: Path) -> list[str]:
        return [
            *(aggregation_args(pki) if s.aggregation else []),
            f"--etcd-servers=http://127.0.0.1:{s.ports['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The default endpoint reconciler publishes the advertise address as the endpoint of
            # the `kubernetes` Service, and from 1.37 refuses to start with a loopback one ("may
            # not be in the loopback range"). Nothing in the devcluster reaches the API server
            # through that Service (every client has the kubeconfig), so none is kept.
            "--endpoint-reconciler-type=none",
            f"--secure-port={s.ports['apiserver']}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={self.directory / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # New nodes get a not-ready taint that only the node lifecycle controller lifts,
            # and that controller would mark kwok's heartbeat-less nodes NotReady: neither runs.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--enable-priority-and-fairness=false",
            *(
                [
                    f"--audit-policy-file={self.directory / 'audit-policy.json'}",
                    f"--audit-log-path={self.audit_log}",
                    "--audit-log-format=json",
                    "--audit-log-maxbackup=0",
                    "--audit-log-maxsize=0",
                ]
                if self.audited_clients
                else []
            ),
            "--profiling=false",
            "--v=1",
        ]

    def _component_auth(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}", "--leader-elect=false"]

    def _kcm_args(self, s: ClusterState, pki: Path) -> list[str]:
        return [
            *self._component_auth(),
            "--bind-address=127.0.0.1",
            f"--secure-port={s.ports['kcm']}",
            f"--controllers={KCM_CONTROLLERS}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=false",
            "--v=1",
        ]

    def _scheduler_args(self, s: ClusterState) -> list[str]:
        return [*self._component_auth(), "--bind-address=127.0.0.1", f"--secure-port={s.ports['scheduler']}", "--v=2"]

    def _kwok_args(self, s: ClusterState) -> list[str]:
        stages = self.directory / "kwok-stages.yaml"
        stages.write_text(build.cluster_stages(build.stages_file().read_text()))
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{s.ports['kwok']}",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=0",
        ]


def _running(directory: str) -> bool:
    """Whether the devcluster in ``directory`` is up (its API server runs)."""
    state = ClusterState.load(Path(directory)) if directory else None
    return state is not None and alive(state.pids.get("kube-apiserver"))
