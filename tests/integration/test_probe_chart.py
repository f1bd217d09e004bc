"""The chart's per-pod GPU probe DaemonSet (docs/probe.md): off by default; when on, exactly
the privileges the docs name (hostPID, the node's GPUs through the NVIDIA runtime class and
no GPU taken from the device plugin, no hostPath, non-root) and a Role per namespace that
lists pods, nothing more. Rendered by the real Helm; the real kube-apiserver accepts it."""

from __future__ import annotations

import urllib.error

import pytest
import yaml

from gpuspawner.probe.pods import ApiPods
from tests.conftest import wait_for
from tests.integration.test_examples import CHART, helm, sar

ON = ["--set", "probe.enabled=true", "--set", "probe.image.repository=ghcr.io/example/gpuspawner", "--set", "probe.image.tag=0.1.0"]


def render(tmp_path, namespace: str, *extra: str) -> dict[tuple[str, str, str], dict]:
    out = helm("template", "gpu", str(CHART), "--namespace", namespace, *extra, home=tmp_path)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


def test_probe_is_off_by_default(tmp_path):
    kinds = {k[0] for k in render(tmp_path, "jhub")}
    assert kinds == {"ClusterRole", "ClusterRoleBinding"}


def test_probe_without_an_image_says_what_to_set(tmp_path):
    out = helm("template", "gpu", str(CHART), "--set", "probe.enabled=true", home=tmp_path)
    assert out.returncode != 0 and "probe.image.repository: name an image with gpuspawner installed" in out.stderr


def test_probe_has_exactly_the_privileges_the_docs_name(tmp_path):
    lint = helm("lint", "--strict", str(CHART), *ON, "--set", "probe.podMonitor.enabled=true", home=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render(tmp_path, "gpu-system", *ON, "--set", "hub.namespace=jhub", "--set", "probe.podMonitor.enabled=true")
    ds = docs[("DaemonSet", "gpu-system", "gpu-gpuspawner-probe")]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    assert "volumes" not in pod and "hostNetwork" not in pod and "hostIPC" not in pod
    [c] = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPUSPAWNER_PROBE_NAMESPACES"] == "jhub"
    assert not any("nvidia.com" in r for part in c["resources"].values() for r in part)  # no GPU taken from users
    assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # a UID of its own, not "nobody" (65534), which z2jh's own pods run as: with hostPID the
    # probe could signal every process of its UID on the node
    assert c["securityContext"]["runAsUser"] == c["securityContext"]["runAsGroup"] == 49402
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}  # not /metrics: no NVML pass
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and "privileged" not in c["securityContext"]
    assert c["command"] == ["gpuspawner", "probe", "--port", "9402"]
    assert c["image"] == "ghcr.io/example/gpuspawner:0.1.0"
    role = docs[("Role", "jhub", "gpu-gpuspawner-probe")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    binding = docs[("RoleBinding", "jhub", "gpu-gpuspawner-probe")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-gpuspawner-probe", "namespace": "gpu-system"}]
    assert not [k for k in docs if k[0].startswith("Cluster") and "probe" in k[2]]
    monitor = docs[("PodMonitor", "gpu-system", "gpu-gpuspawner-probe")]
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "interval": "15s"}]


def test_probe_refuses_to_run_as_root(tmp_path):
    out = helm("template", "gpu", str(CHART), *ON, "--set", "probe.securityContext.runAsUser=0", home=tmp_path)
    assert out.returncode != 0 and "runAsUser" in out.stderr
    out = helm("template", "gpu", str(CHART), *ON, "--set", "probe.securityContext.runAsNonRoot=false", home=tmp_path)
    assert out.returncode != 0 and "runAsNonRoot" in out.stderr


def test_probe_roles_in_each_named_namespace(tmp_path):
    docs = render(tmp_path, "gpu-system", *ON, "--set", "probe.namespaces={jhub,research}")
    assert {k[1] for k in docs if k[0] == "Role"} == {"jhub", "research"}
    ds = docs[("DaemonSet", "gpu-system", "gpu-gpuspawner-probe")]
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUSPAWNER_PROBE_NAMESPACES"] == "jhub,research"
    bad = helm("template", "gpu", str(CHART), *ON, "--set", "probe.namespaces={Jhub}", home=tmp_path)
    assert bad.returncode != 0 and "/probe/namespaces/0" in bad.stderr


PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
}


@pytest.mark.cluster
def test_the_api_server_accepts_the_probe(kube, namespace, tmp_path):
    docs = render(tmp_path, namespace, *ON)
    assert sorted(k[0] for k in docs if k[0] in PATHS) == ["DaemonSet", "Role", "RoleBinding", "ServiceAccount"]
    for (kind, ns, name), doc in docs.items():
        if kind not in PATHS:
            continue

        def accepted(doc=doc, kind=kind, ns=ns, name=name) -> bool:
            try:
                path = PATHS[kind].format(ns=ns) + "?dryRun=All&fieldValidation=Strict"
                return kube.request("POST", path, doc)["metadata"]["name"] == name
            except urllib.error.HTTPError as exc:
                raise AssertionError(f"{kind} {name} refused: {exc.read().decode()}") from None

        wait_for(accepted, f"the API server to accept {kind} {name}")


# -- the probe's one question to Kubernetes, against the real API server -------------------
def _pod(name: str, node: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "notebook", "image": "jupyter/base-notebook"}]},
    }


@pytest.mark.cluster
def test_probe_names_the_pods_on_its_node_from_the_api_server(kube, devcluster, namespace):
    mine = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", _pod("jupyter-ann", "gpu-t4-ts-shared"))
    other = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", _pod("jupyter-bob", "gpu-l4-mps"))
    pods = ApiPods("gpu-t4-ts-shared", [namespace], refresh_s=0, kubeconfig=str(devcluster.kubeconfig))
    found = pods.lookup(mine["metadata"]["uid"])
    assert found is not None and (found.namespace, found.name) == (namespace, "jupyter-ann")
    assert pods.lookup(other["metadata"]["uid"]) is None  # another node's pod: not listed
    assert pods.errors == 0


def test_probe_without_the_api_server_keeps_uids_and_does_not_ask_every_scrape(tmp_path, caplog):
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
                "users": [{"name": "probe", "user": {"token": "x"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "probe"}}],
                "current-context": "gone",
            }
        )
    )
    now = [0.0]
    pods = ApiPods("gpu-node-1", ["jhub"], refresh_s=30, kubeconfig=str(config), clock=lambda: now[0])
    assert pods.lookup("11111111-1111-4111-8111-111111111111") is None
    assert pods.lookup("11111111-1111-4111-8111-111111111111") is None
    assert pods.errors == 1, "listed again within refresh_s"
    assert "could not list pods on node gpu-node-1 in jhub" in caplog.text
    now[0] = 31.0
    pods.lookup("11111111-1111-4111-8111-111111111111")
    assert pods.errors == 2


@pytest.mark.cluster
def test_the_probe_role_lets_it_list_pods_in_its_namespace_and_nothing_else(kube, namespace, tmp_path):
    docs = render(tmp_path, namespace, *ON)
    probe = f"system:serviceaccount:{namespace}:gpu-gpuspawner-probe"
    created = []
    try:
        for (kind, ns, _), doc in docs.items():
            if kind in ("ServiceAccount", "Role", "RoleBinding"):
                kube.request("POST", PATHS[kind].format(ns=ns), doc)
                created.append(PATHS[kind].format(ns=ns) + "/" + doc["metadata"]["name"])
        wait_for(lambda: sar(kube, probe, namespace, verb="list", resource="pods", namespace=namespace), "the RoleBinding in force")

        def may(verb: str, resource: str, ns: str = "", subresource: str = "") -> bool:
            attributes = {"verb": verb, "resource": resource, "namespace": ns, "subresource": subresource}
            return sar(kube, probe, namespace, **{k: v for k, v in attributes.items() if v})

        denied = [
            ("list", "pods"),  # cluster-wide
            ("list", "pods", "kube-system"),
            ("get", "pods", namespace),
            ("watch", "pods", namespace),
            ("create", "pods", namespace, "exec"),
            ("get", "nodes", "", "proxy"),
            ("get", "secrets", namespace),
            ("list", "nodes"),
            ("delete", "pods", namespace),
        ]
        assert [d for d in denied if may(*d)] == []
    finally:
        for path in reversed(created):
            kube.request("DELETE", path)
