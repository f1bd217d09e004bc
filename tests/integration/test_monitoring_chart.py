"""The chart's optional monitoring objects (dashboard ConfigMap, PrometheusRule,
ServiceMonitors): with every option on they pass ``helm lint --strict``, and the real
kube-apiserver of the devcluster accepts each of them in a server-side dry run, with the
prometheus-operator CRDs (tests/data/prometheus-operator/, see SOURCE.md) installed, so
they are checked against the operator's own schemas. The rules also pass promtool."""

from __future__ import annotations

import json
import subprocess
import urllib.error
from pathlib import Path

import pytest
import yaml

from gpuspawner.devcluster import build
from gpuspawner.devcluster.prometheus import DASHBOARD_FILE, RULES_FILE
from tests.conftest import wait_for
from tests.integration.test_examples import CHART, helm

CRDS = Path(__file__).resolve().parents[1] / "data" / "prometheus-operator"
EVERYTHING_ON = [
    "--set",
    "monitoring.dashboard.enabled=true",
    "--set",
    "monitoring.dashboard.annotations.grafana_folder=GPUs",
    "--set",
    "monitoring.prometheusRule.enabled=true",
    "--set",
    "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
    "--set",
    "monitoring.serviceMonitor.enabled=true",
    "--set",
    "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
    "--set",
    "monitoring.serviceMonitor.hub.tokenSecret.name=hub-metrics-token",
    "--set",
    "monitoring.serviceMonitor.hub.tokenSecret.key=token",
]
PLURAL = {"ConfigMap": "configmaps", "PrometheusRule": "prometheusrules", "ServiceMonitor": "servicemonitors"}


def render(tmp_path: Path, namespace: str, *extra: str) -> list[dict]:
    out = helm("template", "mon", str(CHART), "--namespace", namespace, *EVERYTHING_ON, *extra, home=tmp_path)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_everything_on_passes_helm_lint_and_renders_the_monitoring_sources(tmp_path):
    lint = helm("lint", "--strict", str(CHART), *EVERYTHING_ON, home=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(tmp_path, "jhub")}
    assert sorted(docs) == [
        ("ClusterRole", "gpuspawner:jhub:hub"),
        ("ClusterRoleBinding", "gpuspawner:jhub:hub"),
        ("ConfigMap", "mon-gpuspawner-dashboard"),
        ("PrometheusRule", "mon-gpuspawner"),
        ("ServiceMonitor", "mon-gpuspawner-culler"),
        ("ServiceMonitor", "mon-gpuspawner-hub"),
    ]
    dashboard = docs[("ConfigMap", "mon-gpuspawner-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's label
    assert json.loads(dashboard["data"]["gpuspawner.json"]) == json.loads(DASHBOARD_FILE.read_text())
    rule = docs[("PrometheusRule", "mon-gpuspawner")]
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text())  # the file, untouched by templating
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    hub = docs[("ServiceMonitor", "mon-gpuspawner-hub")]["spec"]["endpoints"][0]
    assert hub["path"] == "/hub/metrics" and hub["honorLabels"] is True
    assert hub["authorization"]["credentials"] == {"name": "hub-metrics-token", "key": "token"}
    culler = docs[("ServiceMonitor", "mon-gpuspawner-culler")]["spec"]["endpoints"][0]
    assert culler["path"] == "/services/gpu-culler/metrics"


def test_monitoring_is_off_by_default_and_typos_are_refused(tmp_path):
    plain = helm("template", "mon", str(CHART), home=tmp_path)
    assert plain.returncode == 0 and "monitoring.coreos.com" not in plain.stdout and "grafana" not in plain.stdout
    typo = helm("template", "mon", str(CHART), "--set", "monitoring.dashbord.enabled=true", home=tmp_path)
    assert typo.returncode != 0 and "dashbord" in typo.stderr
    bad = helm("template", "mon", str(CHART), "--set", "monitoring.serviceMonitor.interval=soon", home=tmp_path)
    assert bad.returncode != 0 and "interval" in bad.stderr


def test_the_rules_pass_promtool_and_their_unit_tests():
    """promtool's checks, and rules_test.yaml: every alert fires on the history that should
    fire it (after its `for:`), not before, and the recording rules give the units expected
    (Prometheus' own rule engine, on synthetic series over hours of simulated time)."""
    promtool = str(build.tool("promtool"))
    proc = subprocess.run([promtool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 13 rules found" in proc.stdout
    tests = RULES_FILE.with_name("rules_test.yaml")
    proc = subprocess.run([promtool, "test", "rules", tests.name], cwd=tests.parent, capture_output=True, text=True)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    alerts = {r["alert"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if "alert" in r}
    tested = {
        t["alertname"] for case in yaml.safe_load(tests.read_text())["tests"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]
    }
    assert tested == alerts, f"alerts never seen firing in rules_test.yaml: {alerts - tested}"


def _apply_crd(kube, doc: dict) -> None:
    try:
        kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # already there (an earlier test of this session)
            raise

    def established() -> bool:
        crd = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, f"CRD {doc['metadata']['name']} established")


def _dry_run(kube, doc: dict, namespace: str) -> dict:
    group_version = doc["apiVersion"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return kube.request("POST", f"{base}/namespaces/{namespace}/{PLURAL[doc['kind']]}?dryRun=All&fieldValidation=Strict", doc)


@pytest.mark.cluster
def test_the_api_server_accepts_every_object_with_the_operators_crds(kube, namespace, tmp_path):
    for crd in sorted(CRDS.glob("*.yaml")):
        _apply_crd(kube, yaml.safe_load(crd.read_text()))
    docs = [d for d in render(tmp_path, namespace) if d["kind"] in PLURAL]
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "PrometheusRule", "ServiceMonitor", "ServiceMonitor"]

    def accepted(doc: dict) -> bool:
        try:
            return _dry_run(kube, doc, namespace)["metadata"]["name"] == doc["metadata"]["name"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # the CRD's REST endpoint is not served yet
                return False
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']} refused: {exc.read().decode()}") from None

    for doc in docs:
        wait_for(lambda doc=doc: accepted(doc), f"the API server to answer for {doc['kind']}")
    # the operator's schema is really applied: a broken rule and an unknown field are refused
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    broken = json.loads(json.dumps(rule))
    broken["spec"]["groups"][1]["rules"][0]["for"] = "one hour"
    with pytest.raises(urllib.error.HTTPError) as refused:
        _dry_run(kube, broken, namespace)
    assert refused.value.code == 422 and "for" in refused.value.read().decode()
    monitor = json.loads(json.dumps(next(d for d in docs if d["kind"] == "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    with pytest.raises(urllib.error.HTTPError) as unknown:
        _dry_run(kube, monitor, namespace)
    assert "honourLabels" in unknown.value.read().decode()
