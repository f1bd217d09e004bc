"""A stock zero-to-jupyterhub hub (its namespaced Role only, without charts/gpuspawner)
switched to GPUSpawner, against the devcluster's real RBAC: the inventory may not list
nodes or pods cluster-wide. The hub says so once, clearly, in its log; the spawn page
renders at once with "free count unavailable"; spawns still work; and installing the
chart's ClusterRole makes the counts live without a restart."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api

from gpuspawner.devcluster.podrunner import PodRunner
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.kubeapi import NEEDED_PERMISSIONS
from tests.api.gpuhub import GPUHub
from tests.conftest import wait_for
from tests.integration.test_examples import CHART, helm

pytestmark = pytest.mark.cluster

#: zero-to-jupyterhub's hub Role (templates/hub/rbac.yaml): its own namespace only.
Z2JH_HUB_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
        "verbs": ["get", "watch", "list", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
]
HALF_V100 = {"slug": "half-v100", "kind": "custom", "display_name": "Half a V100", "resources": {"nvidia.com/vgpu": 500}}


def z2jh_hub_account(kube, namespace: str) -> str:
    """The ``hub`` ServiceAccount with z2jh's Role, and a token for it."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hub"}},
    )
    kube.request(
        "POST",
        f"{rbac}/namespaces/{namespace}/roles",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "hub"}, "rules": Z2JH_HUB_RULES},
    )
    kube.request(
        "POST",
        f"{rbac}/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "hub"},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"},
        },
    )
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    return kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/hub/token", request)["status"]["token"]


def kubeconfig_for(devcluster, token: str, path: Path) -> Path:
    """The devcluster's kubeconfig with the hub's token instead of the admin's."""
    config = json.loads(devcluster.kubeconfig.read_text())
    config["users"] = [{"name": "hub", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "hub"
    path.write_text(json.dumps(config))
    return path


def grant(kube, namespace: str, name: str, verbs: list[str]) -> list[str]:
    """A ClusterRole with ``verbs`` on nodes and pods, bound to the hub's ServiceAccount."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = f"{namespace}-{name}"
    kube.request(
        "POST",
        f"{rbac}/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": verbs}],
        },
    )
    kube.request(
        "POST",
        f"{rbac}/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        },
    )
    return [f"{rbac}/clusterroles/{role}", f"{rbac}/clusterrolebindings/{role}"]


def install_chart(kube, namespace: str, home: Path) -> list[str]:
    """Apply charts/gpuspawner as Helm renders it; returns what to delete afterwards."""
    rendered = helm("template", f"rbac-{namespace}", str(CHART), "--namespace", namespace, home=home)
    assert rendered.returncode == 0, rendered.stderr
    created = []
    for doc in (d for d in yaml.safe_load_all(rendered.stdout) if d):
        plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}[doc["kind"]]
        kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{plural}", doc)
        created.append(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{doc['metadata']['name']}")
    return created


async def until(check, what, timeout: float = 60.0) -> None:
    """Wait (without blocking the loop) until ``check()``; fail naming ``what`` otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what() if callable(what) else what}")
        await asyncio.sleep(0.05)


async def test_inventory_names_the_missing_permissions_once_and_heals_when_granted(devcluster, kube, namespace, caplog, tmp_path):
    token = z2jh_hub_account(kube, namespace)
    ca = devcluster.directory / "pki" / "ca.crt"
    conf = Configuration(
        host=json.loads(devcluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"],
        api_key={"BearerToken": token},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    conf.ssl_ca_cert = str(ca)
    client = ApiClient(conf)
    inventory = Inventory(CoreV1Api(client), forbidden_retry=0.2)
    caplog.set_level(logging.INFO, logger="gpuspawner.hub.inventory")
    created: list[str] = []
    inventory.start()
    try:
        # Nobody waits for counts that cannot come: a generous bound, far below the timeout asked for.
        health = await asyncio.wait_for(inventory.wait_answered(3600), 60)
        assert not health.ready and NEEDED_PERMISSIONS in health.forbidden and "charts/gpuspawner" in health.forbidden
        await until(lambda: inventory.stream_failures >= 6, "several refused retries")
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors
        assert "list/watch nodes, list/watch pods (cluster-wide)" in errors[0] and "charts/gpuspawner" in errors[0]
        assert "403" in errors[0] and f"system:serviceaccount:{namespace}:hub" in inventory.last_error

        # Allowed to list but not to watch: the watch's 403 is noticed (never read as an
        # empty stream and asked again at once, over and over), and still no second error.
        created = grant(kube, namespace, "list-only", ["list"])
        await until(lambda: "watching" in inventory.last_error, lambda: f"a refused watch ({inventory.last_error})")
        assert inventory.forbidden  # still: the counts cannot be kept live without the watch
        assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1

        created += install_chart(kube, namespace, tmp_path)
        await until(
            lambda: inventory.ready and not inventory.forbidden,
            lambda: f"the inventory to sync once the chart's ClusterRole is bound ({inventory.last_error})",
        )
        assert inventory.forbidden == "" and inventory.health.ready
        assert "gpu-v100-fractional" in inventory.index.nodes
        assert any("counts are live" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    finally:
        await inventory.stop()
        await client.close()
        for path in reversed(created):
            kube.request("DELETE", path)


#: Appended to the API tests' hub config: the hub's own kubeconfig (z2jh's Role only),
#: and a site offering with a resource to count beside what discovery would find.
HUB_CONFIG = """
import os
from kubernetes_asyncio.config import kube_config
os.environ["KUBECONFIG"] = {kubeconfig!r}
kube_config.KUBE_CONFIG_DEFAULT_LOCATION = {kubeconfig!r}
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
# A page or spawn that waited for the inventory would hang for an hour: the test would time out.
c.GPUSpawner.inventory_ready_timeout = 3600
c.GPUSpawner.offerings = c.GPUSpawner.offerings + [{offering!r}]
"""


def test_stock_z2jh_hub_renders_at_once_and_spawns(devcluster, kube, namespace, tmp_path):
    token = z2jh_hub_account(kube, namespace)
    kubeconfig = kubeconfig_for(devcluster, token, tmp_path / "hub.kubeconfig")
    hub = GPUHub(
        tmp_path / "hub",
        devcluster,
        namespace,
        http_timeout=120,
        extra_config=HUB_CONFIG.format(kubeconfig=str(kubeconfig), offering=HALF_V100),
    )
    runner = PodRunner(kube, root=tmp_path / "pods")  # the pod's notebook, really served
    runner.start()
    try:
        hub.start()
        for _ in range(3):  # every render at once, and never a second error in the log
            page = hub.spawn_page("researcher1", timeout=120)
            assert page.status_code == 200 and 'value="half-v100"' in page.text, page.text[-2000:]
            assert "free count unavailable" in page.text
        # A refused choice: the form comes back with the reason, the choice still selected.
        refused = hub.form_post("researcher1", {"offering": "half-v100", "count-half-v100": "3", "profile": "python"})
        assert refused.status == 400 and "not 3" in refused.message, (refused.status, refused.message)
        assert re.search(r'value="half-v100"[^>]*checked', refused.body)
        answer = hub.form_post("researcher1", {"offering": "half-v100", "profile": "python"})
        assert answer.status in (302, 303), (answer.status, answer.message)
        wait_for(
            lambda: (hub.user_model("researcher1").get("servers") or {}).get("", {}).get("ready"), "the server to be ready", timeout=180
        )
        pods = hub.pods("researcher1")
        assert [p["spec"]["nodeName"] for p in pods] == ["gpu-v100-fractional"]
        assert pods[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/vgpu"] == "500"
        log = hub.log_text()
        assert log.count("charts/gpuspawner") == 1, log[-4000:]
        assert "list/watch nodes, list/watch pods (cluster-wide)" in log
        hub.stop_server("researcher1")
    finally:
        hub.stop()
        runner.stop()
