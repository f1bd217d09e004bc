"""The runnable examples an admin copies (hub_config/) and the RBAC chart (charts/gpuspawner),
checked against the real things they will meet:

* every ``hub_config/*.py`` loads the way JupyterHub loads it (traitlets' PyFileConfigLoader),
  names only real traits, is accepted by a real GPUSpawner, and builds a catalog over the
  devcluster's nodes that the ``gpuspawner offerings`` CLI prints too; each offering's pod
  is accepted by the real kube-apiserver (server-side dry run);
* ``hub_config/z2jh_values.yaml`` merged over zero-to-jupyterhub's own values validates
  against the chart's schema (4.4.0 and main), and its ``hub.config.GPUSpawner`` passes the
  same checks as the Python examples;
* the chart, rendered by a real Helm, grants the hub exactly what the inventory needs,
  proved by SubjectAccessReviews against the devcluster's RBAC.

The zero-to-jupyterhub reference files are read from ``$GPUSPAWNER_Z2JH_REFERENCE``,
``tests/data/z2jh`` or ``/work/shared/reference/z2jh`` (the first that exists).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
from datetime import datetime, timedelta
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from jsonschema import Draft7Validator
from traitlets.config import Config, LazyConfigValue
from traitlets.config.loader import PyFileConfigLoader

from gpuspawner.capacity.counts import availability
from gpuspawner.core.fit import amount
from gpuspawner.core.model import Offering
from gpuspawner.core.windows import window_state
from gpuspawner.devcluster import build as devcluster_build
from gpuspawner.names.selectors import terms_match
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
from gpuspawner.offerings.choice import Choice
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
HUB_CONFIG = REPO / "hub_config"
CHART = REPO / "charts" / "gpuspawner"
EXAMPLES = sorted(HUB_CONFIG.glob("*.py"))
Z2JH_VALUES = HUB_CONFIG / "z2jh_values.yaml"
#: zero-to-jupyterhub releases whose values and schema the values file must satisfy.
Z2JH_RELEASES = ("4.4.0", "main-48ea50e")

HELM_VERSION = "v3.22.0"

cluster = pytest.mark.cluster

#: Config sections an example may set, and the class whose traits they configure.
SECTIONS = {
    "JupyterHub": "jupyterhub.app:JupyterHub",
    "Spawner": "jupyterhub.spawner:Spawner",
    "KubeSpawner": "kubespawner:KubeSpawner",
    "GPUSpawner": "gpuspawner.spawner:GPUSpawner",
    "Authenticator": "jupyterhub.auth:Authenticator",
    "DummyAuthenticator": "jupyterhub.auth:DummyAuthenticator",
    "ConfigurableHTTPProxy": "jupyterhub.proxy:ConfigurableHTTPProxy",
}

#: GPUSpawner trait -> CatalogConfig field.
CATALOG_FIELDS = (
    ("offerings", "offerings"),
    ("offering_overrides", "overrides"),
    ("discover_offerings", "discover"),
    ("include_cpu_offering", "include_cpu"),
    ("vgpu_class_labels", "vgpu_class_labels"),
)


# --------------------------------------------------------------------------- helpers


def _import(spec: str):
    module, _, name = spec.partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


def load_config(path: Path) -> Config:
    """Load a jupyterhub_config.py exactly as JupyterHub does (``get_config()`` and all)."""
    return PyFileConfigLoader(path.name, path=str(path.parent)).load_config()


def resolved(value: Any, initial: Any) -> Any:
    """A config value as the trait will see it (``c.X.y.append(...)`` leaves a LazyConfigValue)."""
    return value.get_value(initial) if isinstance(value, LazyConfigValue) else value


def catalog_config(config: Config) -> CatalogConfig:
    """The ``c.GPUSpawner`` section, as the catalog reads it."""
    section = config.GPUSpawner
    kwargs = {}
    for trait, field in CATALOG_FIELDS:
        if trait in section:
            kwargs[field] = resolved(section[trait], [] if trait == "offerings" else {})
    return CatalogConfig(**kwargs)


def z2jh_reference() -> Path:
    candidates = [os.environ.get("GPUSPAWNER_Z2JH_REFERENCE"), REPO / "tests" / "data" / "z2jh", "/work/shared/reference/z2jh"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "values.schema-4.4.0.yaml").is_file():
            return Path(candidate)
    pytest.fail(
        "zero-to-jupyterhub's values-<release>.yaml and values.schema-<release>.yaml are needed: "
        "set GPUSPAWNER_Z2JH_REFERENCE to their folder, or copy them into tests/data/z2jh"
    )


def helm_merge(base: Any, override: Any) -> Any:
    """Helm's coalescing of user values over a chart's: maps merge, a null deletes, the rest replaces."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def schema_errors(values: dict, release: str) -> list[str]:
    ref = z2jh_reference()
    chart_values = yaml.safe_load((ref / f"values-{release}.yaml").read_text())
    schema = yaml.safe_load((ref / f"values.schema-{release}.yaml").read_text())
    merged = helm_merge(chart_values, values)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}" for e in Draft7Validator(schema).iter_errors(merged))


def z2jh_values() -> dict:
    return yaml.safe_load(Z2JH_VALUES.read_text())


def z2jh_as_config_file(directory: Path) -> Path:
    """A jupyterhub_config.py doing what z2jh's own does with the values: ``c[app].update(cfg)``
    for each ``hub.config`` section, ``singleuser.startTimeout`` as ``start_timeout`` (z2jh's
    default 300 when unset), then each ``hub.extraConfig`` entry, in key order."""
    values = z2jh_values()
    hub = values["hub"]
    start_timeout = (values.get("singleuser") or {}).get("startTimeout", 300)
    path = directory / "z2jh_hub_config.py"
    path.write_text(
        "import json\n"
        "c = get_config()  # noqa: F821\n"
        f"for app, cfg in json.loads({json.dumps(json.dumps(hub['config']))}).items():\n"
        "    c[app].update(cfg)\n"
        f"c.KubeSpawner.start_timeout = {int(start_timeout)}\n"
        f"for key, config_py in sorted(json.loads({json.dumps(json.dumps(hub.get('extraConfig') or {}))}).items()):\n"
        "    exec(config_py)\n"
    )
    return path


def helm_binary() -> Path:
    """Helm, built once from the Go module proxy into the gpuspawner cache (keyed by version)."""
    target = devcluster_build.cache_root() / "tools" / f"helm-{HELM_VERSION}" / "helm"
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        pytest.fail(f"Go is needed to build Helm {HELM_VERSION} for the chart tests (see README: Go 1.26+)")
    target.parent.mkdir(parents=True, exist_ok=True)
    ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        env = {**os.environ, "GOBIN": scratch, "CGO_ENABLED": "0", "GOFLAGS": ""}
        proc = subprocess.run(
            [go, "install", f"-ldflags={ldflags}", f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"building Helm {HELM_VERSION} failed:\n{proc.stderr[-3000:]}")
        os.replace(Path(scratch) / "helm", target)  # never a half-written binary in the cache
    return target


def helm(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    return subprocess.run([str(helm_binary()), *args], env=env, capture_output=True, text=True, check=False)


def same_request(offering: Offering) -> tuple:
    """What a pod of this offering asks of Kubernetes: two offerings with the same are one offering twice."""
    return (
        offering.kind,
        tuple(sorted(offering.resources.items())),
        tuple(sorted(offering.node_selector.items())),
        offering.placement_terms,
        offering.command_prefix,
    )


def nodes_of_class(offering: Offering, nodes: list[dict]) -> set[str]:
    """Nodes carrying the offering's labels (selector and node affinity) and resources, whatever their taints."""
    out = set()
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        allocatable = node.get("status", {}).get("allocatable") or {}
        if node.get("spec", {}).get("unschedulable"):
            continue
        if (
            all(labels.get(k) == v for k, v in offering.node_selector.items())
            and terms_match(offering.placement_terms, labels)
            and all((amount(r, allocatable.get(r, 0)) or 0) > 0 for r in offering.resources)
        ):
            out.add(node["metadata"]["name"])
    return out


def sar(kube, user: str, namespace_of_user: str, **attributes: str) -> bool:
    """Ask the API server's authorizer whether this ServiceAccount may do it."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            # the groups a real ServiceAccount token carries
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace_of_user}", "system:authenticated"],
            "resourceAttributes": attributes,
        },
    }
    answer = kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def demo_environment(monkeypatch, tmp_path):
    """What hub_config/demo_config.py reads; nothing that would load further files."""
    monkeypatch.setenv("GPUSPAWNER_DEMO_DIR", str(tmp_path))
    for name in ("GPUSPAWNER_DEMO_API_TOKEN", "GPUSPAWNER_DEMO_EXTRA_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def nodes(kube) -> list[dict]:
    return kube.request("GET", "/api/v1/nodes")["items"]


@pytest.fixture(scope="module")
def nodes_json(nodes, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nodes") / "nodes.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "NodeList", "items": nodes}))
    return path


@pytest.fixture(params=[*[p.name for p in EXAMPLES], "z2jh_values.yaml:hub.config"])
def example(request, tmp_path) -> Path:
    if request.param.startswith("z2jh_values.yaml"):
        return z2jh_as_config_file(tmp_path)
    return HUB_CONFIG / request.param


# --------------------------------------------------------------------------- the Python examples


def test_the_examples_are_there():
    names = {p.name for p in EXAMPLES}
    assert {"demo_config.py", "culler_service_example.py", "site_mig_timeslicing.py", "gke.py", "vsphere_vgpu.py"} <= names
    for path in EXAMPLES:
        text = path.read_text()
        assert text.lstrip().startswith('"""'), f"{path.name}: start with a docstring saying who it is for and how to use it"
        assert "c = get_config()" in text, f"{path.name}: use c = get_config(), as JupyterHub config files do"
        if "c.GPUSpawner." in text:
            assert "check_config(c)" in text, f"{path.name}: end with check_config(c), so a broken GPU config stops the hub"
    assert "check_config(c)" in "".join(z2jh_values()["hub"]["extraConfig"].values())


def test_check_config_in_the_examples_stops_a_broken_gpu_config(tmp_path):
    """The check the examples end with really refuses: a broken copy does not load."""
    from gpuspawner.capacity.checks import GPUSpawnerConfigError

    for name in ("site_mig_timeslicing.py", "gke.py", "vsphere_vgpu.py"):
        text = (HUB_CONFIG / name).read_text()
        broken = text.replace("check_config(c)", 'c.GPUSpawner.site_timezone = "Europe/Zurch"\ncheck_config(c)')
        (tmp_path / name).write_text(broken)
        with pytest.raises(GPUSpawnerConfigError, match="Zurch"):
            load_config(tmp_path / name)


def test_examples_set_only_real_traits(example):
    config = load_config(example)
    for section in config:
        assert section in SECTIONS, f"{example.name}: c.{section} is not a section this test knows; add it to SECTIONS"
        known = set(_import(SECTIONS[section]).class_trait_names(config=True))
        unknown = sorted(set(config[section]) - known)
        assert not unknown, f"{example.name}: c.{section} has no trait(s) {unknown}"


@cluster
async def test_example_builds_a_catalog_a_real_spawner_accepts(example, nodes, devcluster):
    from jupyterhub.objects import Hub

    from tests.integration.test_spawner import User

    config = load_config(example)
    cfg = catalog_config(config)
    catalog = build_catalog(cfg, nodes=nodes)
    slugs = [o.slug for o in catalog]
    assert len(slugs) == len(set(slugs)), slugs

    # The real spawner takes the whole config, finds nothing wrong in it (quotas, time zone,
    # admission, offerings), and reads the same catalog from it.
    spawner = _import(SECTIONS["GPUSpawner"])(hub=Hub(), user=User("examples"), config=config)
    assert spawner.config_problems() == []
    assert build_catalog(spawner.catalog_config, nodes=nodes) == catalog

    # Overrides name offerings that exist: an override with a mistyped slug is silently ignored.
    missing = sorted(set(cfg.overrides) - set(slugs))
    assert not missing, f"{example.name}: offering_overrides for slugs the devcluster's catalog does not have: {missing}"

    # No offering is another one twice (a configured offering must reuse the slug of the
    # discovered offering it describes, or users see the same GPU twice).
    seen: dict[tuple, str] = {}
    for offering in catalog:
        key = same_request(offering)
        assert key not in seen, f"{example.name}: {offering.slug!r} asks for exactly what {seen[key]!r} asks for"
        seen[key] = offering.slug

    # A configured offering reaches every node of its class: none is lost to a taint it does not tolerate.
    for offering in catalog:
        if offering.source == "config" and offering.resources:
            served = set(availability(offering, nodes, []).nodes)
            assert served == nodes_of_class(offering, nodes), (
                f"{example.name}: {offering.slug} cannot use {sorted(nodes_of_class(offering, nodes) - served)} (a taint?)"
            )


@cluster
async def test_each_offering_makes_a_pod_the_api_server_accepts(example, nodes, devcluster, kube, namespace):
    from jupyterhub.objects import Hub

    from tests.integration.test_spawner import User

    config = load_config(example)
    catalog = build_catalog(catalog_config(config), nodes=nodes)
    GPUSpawner = _import(SECTIONS["GPUSpawner"])
    for offering in catalog:
        spawner = GPUSpawner(hub=Hub(), user=User("examples"), config=config)
        spawner.namespace = namespace
        spawner.server = spawner.user.server
        spawner.apply_choice(Choice(offering, offering.counts[-1]))
        manifest = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
        try:
            pod = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", manifest)
        except urllib.error.HTTPError as exc:
            pytest.fail(f"{example.name}: the API server refuses the pod of {offering.slug}: {exc.read().decode()[:800]}")
        container = pod["spec"]["containers"][0]
        limits = {k: v for k, v in (container["resources"].get("limits") or {}).items() if "/" in k}
        assert limits == {k: str(v) for k, v in offering.limits_for(offering.counts[-1]).items()}, offering.slug
        assert (pod["spec"].get("nodeSelector") or {}) == dict(offering.node_selector), offering.slug
        if offering.command_prefix:
            command = [*(container.get("command") or []), *(container.get("args") or [])]
            assert command[: len(offering.command_prefix)] == list(offering.command_prefix), offering.slug


@cluster
def test_offerings_cli_prints_the_same_catalog_as_json(example, nodes, nodes_json, tmp_path):
    env = {**os.environ, "GPUSPAWNER_DEMO_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpuspawner.tools.cli", "offerings", "--config", str(example), "--nodes", str(nodes_json), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"{example.name}: exit {proc.returncode}\n{proc.stderr}"
    rows = json.loads(proc.stdout)
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
    expected = build_catalog(catalog_config(load_config(example)), nodes=nodes)
    assert [r["slug"] for r in rows] == [o.slug for o in expected]
    assert all({"kind", "limits", "capacity", "free"} <= set(r) for r in rows)


# --------------------------------------------------------------------------- site specifics


def test_mig_by_day_whole_gpus_nights_and_weekends_never_both_never_neither():
    """At every half hour of a winter and a summer week in Zurich, exactly one of the A100's
    two forms may be started: MIG slices in working hours, the whole GPU otherwise."""
    config = load_config(HUB_CONFIG / "site_mig_timeslicing.py")
    assert config.GPUSpawner.site_timezone == "Europe/Zurich"
    offerings = build_catalog(catalog_config(config), nodes=[])
    whole = [o for o in offerings if o.kind is Kind.FULL and o.product == "NVIDIA-A100-SXM4-40GB"]
    mig = [o for o in offerings if o.kind is Kind.MIG]
    assert len(whole) == 1 and len(mig) == 3
    assert all(o.windows for o in [*whole, *mig])
    zone = ZoneInfo(config.GPUSpawner.site_timezone)
    for monday in (datetime(2026, 1, 5, tzinfo=zone), datetime(2026, 7, 6, tzinfo=zone)):
        for step in range(7 * 48):
            now = monday + timedelta(minutes=30 * step)
            whole_open = not window_state(whole[0].windows, now)
            for o in mig:
                assert whole_open != (not window_state(o.windows, now)), (
                    f"{now:%a %H:%M}: whole A100 {whole_open}, {o.slug} {not whole_open}"
                )


def test_gke_example_declares_its_autoscaled_pool():
    offerings = {o.slug: o for o in build_catalog(catalog_config(load_config(HUB_CONFIG / "gke.py")), nodes=[])}
    scalable = [o for o in offerings.values() if o.scalable_nodes]
    assert scalable and all(o.scale_up_minutes for o in scalable)
    assert any(o.kind is Kind.MIG and "cloud.google.com/gke-gpu-partition-size" in o.node_selector for o in offerings.values())
    for o in offerings.values():
        if o.is_gpu:  # GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in [dict(t) for t in o.tolerations], o.slug


def test_vsphere_example_has_vgpu_classes_and_bitfusion():
    offerings = build_catalog(catalog_config(load_config(HUB_CONFIG / "vsphere_vgpu.py")), nodes=[])
    vgpu = [o for o in offerings if o.kind is Kind.VGPU]
    assert any(o.node_selector.get("nvidia.com/vgpu.present") == "true" and o.node_selector.get("nvidia.com/gpu.product") for o in vgpu)
    bitfusion = [o for o in offerings if o.command_prefix]
    assert [o.command_prefix for o in bitfusion] == [("bitfusion", "run", "-n", "1", "-p", "0.5", "--")]
    assert not bitfusion[0].resources and not bitfusion[0].tolerations


# --------------------------------------------------------------------------- zero-to-jupyterhub values


@pytest.mark.parametrize("release", Z2JH_RELEASES)
def test_z2jh_values_validate_against_the_chart_schema(release):
    errors = schema_errors(z2jh_values(), release)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("release", Z2JH_RELEASES)
def test_z2jh_schema_check_rejects_an_unknown_key_under_cull(release):
    broken = z2jh_values()
    broken["cull"]["gpu"] = True
    errors = schema_errors(broken, release)
    assert any(e.startswith("cull:") and "'gpu'" in e for e in errors), errors


def test_z2jh_values_use_the_entry_point_and_replace_the_stock_culler():
    values = z2jh_values()
    spawner_class = values["hub"]["config"]["JupyterHub"]["spawner_class"]
    (entry,) = [e for e in entry_points(group="jupyterhub.spawners") if e.name == spawner_class]
    assert entry.load() is _import(SECTIONS["GPUSpawner"])
    assert values["cull"]["enabled"] is False
    assert "GPUSpawner" in values["hub"]["config"]


def test_z2jh_culler_service_has_exactly_the_example_scopes_and_a_command_the_culler_accepts():
    from gpuspawner.culler import REQUIRED_SCOPES, GpuCuller

    example = load_config(HUB_CONFIG / "culler_service_example.py")
    (role,) = [r for r in resolved(example.JupyterHub.load_roles, []) if r["name"] == "gpu-culler"]
    values = z2jh_values()
    service = values["hub"]["services"]["gpu-culler"]
    loaded = values["hub"]["loadRoles"]["gpu-culler"]
    assert sorted(loaded["scopes"]) == sorted(role["scopes"]) == sorted(REQUIRED_SCOPES)
    assert loaded["services"] == ["gpu-culler"]

    command = service["command"]
    assert command[:3] == ["python3", "-m", "gpuspawner.culler"]
    culler = GpuCuller()
    try:
        culler.parse_command_line(command[3:])
    except SystemExit as exc:  # traitlets exits on an unknown option
        pytest.fail(f"the culler refuses hub.services.gpu-culler.command ({exc})")
    assert culler.prometheus_url and culler.metrics_port


def test_z2jh_nodeclaim_recorder_writes_beside_the_cullers_log_with_a_command_the_cli_accepts():
    """The NodeClaim recorder (gpuspawner/tools/nodeclaimlog.py) as a hub-managed service: the
    `gpuspawner` command takes its arguments, it writes on the hub's volume (z2jh mounts its
    hub-db-dir PVC at /srv/jupyterhub with the default hub.db.type sqlite-pvc) beside the culler's
    action log, so one `gpuspawner report --nodeclaims ... --actions ...` in the hub pod reads both,
    and it holds no hub scope (it speaks to the API server only, with the hub's account)."""
    from gpuspawner.tools.cli import parser

    values = z2jh_values()
    command = values["hub"]["services"]["nodeclaim-recorder"]["command"]
    assert command[0] == "gpuspawner" and "gpuspawner" in {e.name for e in entry_points(group="console_scripts")}
    args = parser().parse_args(command[1:])
    assert args.func.__module__ == "gpuspawner.tools.nodeclaimlog"
    culler_log = next(a for a in values["hub"]["services"]["gpu-culler"]["command"] if a.startswith("--GpuCuller.action_log_path="))
    assert Path(args.output).parent == Path(culler_log.partition("=")[2]).parent == Path("/srv/jupyterhub")
    assert not any("nodeclaim-recorder" in (role.get("services") or []) for role in values["hub"]["loadRoles"].values())


# --------------------------------------------------------------------------- the RBAC chart


@cluster
def test_chart_grants_the_hub_exactly_node_and_pod_reads(kube, namespace, tmp_path):
    lint = helm("lint", "--strict", str(CHART), home=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    rendered = helm("template", "gpuspawner-rbac", str(CHART), "--namespace", namespace, home=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["ClusterRole", "ClusterRoleBinding"] and len(docs) == 2, [d["kind"] for d in docs]
    role, binding = by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]
    grants = {(g, r): sorted(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert grants == {
        ("", "nodes"): ["get", "list", "watch"],
        ("", "pods"): ["list", "watch"],
        # Dynamic Resource Allocation's free counts (docs/dra.md): read-only, cluster-wide
        ("resource.k8s.io", "resourceslices"): ["list", "watch"],
        ("resource.k8s.io", "deviceclasses"): ["list", "watch"],
        ("resource.k8s.io", "resourceclaims"): ["list", "watch"],
        # ... and the admins' DeviceTaintRules, which taint devices for those counts (docs/dra.md)
        ("resource.k8s.io", "devicetaintrules"): ["list", "watch"],
    }
    assert not any(set(rule) - {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": namespace}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}

    hub = f"system:serviceaccount:{namespace}:hub"
    assert not sar(kube, hub, namespace, verb="list", resource="nodes"), "the hub may already list nodes: the test would prove nothing"
    created = []
    try:
        for doc, plural in ((role, "clusterroles"), (binding, "clusterrolebindings")):
            kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{plural}", doc)
            created.append(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{doc['metadata']['name']}")
        # RBAC reaches the authorizer through an informer: wait until the binding is in force.
        wait_for(lambda: sar(kube, hub, namespace, verb="watch", resource="nodes"), "the ClusterRoleBinding to take effect")

        def may(verb: str, resource: str, namespace: str = "", subresource: str = "") -> bool:
            attributes = {"verb": verb, "resource": resource, "namespace": namespace, "subresource": subresource}
            return sar(kube, hub, ns, **{k: v for k, v in attributes.items() if v})

        ns = namespace
        allowed = [
            ("get", "nodes"),
            ("list", "nodes"),
            ("watch", "nodes"),
            ("list", "pods"),  # no namespace: all namespaces
            ("watch", "pods"),
            ("list", "pods", "kube-system"),
            ("watch", "pods", ns),
        ]
        denied = [
            ("delete", "pods"),
            ("delete", "pods", ns),
            ("create", "pods", ns),
            ("get", "pods", "kube-system"),
            ("update", "nodes"),
            ("patch", "nodes"),
            ("delete", "nodes"),
            ("get", "secrets"),
            ("get", "secrets", ns),
            ("list", "secrets", "kube-system"),
            ("create", "pods", ns, "eviction"),
        ]
        assert [a for a in allowed if not may(*a)] == []
        assert [d for d in denied if may(*d)] == []
        # Only the hub's ServiceAccount: its namespace's default account gets nothing.
        assert not sar(kube, f"system:serviceaccount:{namespace}:default", namespace, verb="list", resource="nodes")
    finally:
        for path in reversed(created):
            kube.request("DELETE", path)


def test_chart_values_name_the_service_account_and_reject_typos(tmp_path):
    rendered = helm(
        "template",
        "rbac",
        str(CHART),
        "--namespace",
        "tools",
        "--set",
        "hub.serviceAccount.name=my-jupyterhub-hub",
        "--set",
        "hub.namespace=jhub",
        home=tmp_path,
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(rendered.stdout) if d}
    assert docs["ClusterRoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "my-jupyterhub-hub", "namespace": "jhub"}]
    assert docs["ClusterRole"]["metadata"]["name"] == "gpuspawner:jhub:my-jupyterhub-hub"

    typo = helm("template", "rbac", str(CHART), "--set", "hub.serviceaccount.name=x", home=tmp_path)
    assert typo.returncode != 0 and "serviceaccount" in typo.stderr, typo.stdout + typo.stderr


def test_chart_kueue_reads_only_when_enabled(tmp_path):
    """kueue.enabled adds to the ClusterRole reads of Kueue's four kinds and of a queue's pending
    workloads (docs/kueue.md), and a Role in the hub's namespace that patches pods/status."""

    def rules(*sets: str) -> list[dict]:
        args = [a for s in sets for a in ("--set", s)]
        rendered = helm("template", "r", str(CHART), "--namespace", "jhub", *args, home=tmp_path)
        assert rendered.returncode == 0, rendered.stderr
        (role,) = [d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "ClusterRole"]
        return role["rules"]

    off = rules()
    assert not any("kueue.x-k8s.io" in rule["apiGroups"] for rule in off)  # off by default
    on = rules("kueue.enabled=true")
    assert on[: len(off)] == off
    assert on[len(off) :] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads", "localqueues", "clusterqueues", "resourceflavors", "cohorts"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["visibility.kueue.x-k8s.io"],
            "resources": ["clusterqueues/pendingworkloads", "localqueues/pendingworkloads"],
            "verbs": ["get"],
        },
    ]
    # and in the hub's namespace only, the one write: Kueue's finalizer off a pod Kueue left behind
    rendered = helm(
        "template", "r", str(CHART), "--namespace", "jhub", "--set", "kueue.enabled=true", "--set", "dra.enabled=true", home=tmp_path
    )
    roles = {d["metadata"]["name"]: d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "Role"}
    kueue_role = next(r for name, r in roles.items() if name.endswith("-kueue"))
    assert kueue_role["metadata"]["namespace"] == "jhub" and len(roles) == 2  # beside the DRA Role, not instead of it
    assert kueue_role["rules"] == [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]
    lint = helm("lint", "--strict", str(CHART), "--set", "kueue.enabled=true", home=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    typo = helm("template", "r", str(CHART), "--set", "kueue.enable=true", home=tmp_path)
    assert typo.returncode != 0 and "enable" in typo.stderr, typo.stdout + typo.stderr


def test_chart_karpenter_reads_pools_only_when_enabled(tmp_path):
    """karpenter.enabled adds to the ClusterRole reads of Karpenter's NodePools (list, watch: the
    inventory's discovery of pools) and NodeClaims (get: a waiting spawn's progress; list, watch:
    the nodes each pool has now) (docs/autoscaling.md); nothing else changes."""
    rendered = {}
    for name, sets in (("off", []), ("on", ["--set", "karpenter.enabled=true"])):
        out = helm("template", "r", str(CHART), "--namespace", "jhub", *sets, home=tmp_path)
        assert out.returncode == 0, out.stderr
        (role,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ClusterRole"]
        rendered[name] = role["rules"]
    assert not any("karpenter.sh" in rule["apiGroups"] for rule in rendered["off"])  # off by default
    assert rendered["on"] == [
        *rendered["off"],
        {"apiGroups": ["karpenter.sh"], "resources": ["nodepools"], "verbs": ["list", "watch"]},
        {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["get", "list", "watch"]},
    ]
    lint = helm("lint", "--strict", str(CHART), "--set", "karpenter.enabled=true", home=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@cluster
def test_chart_dra_role_lets_the_hub_manage_claim_templates_in_its_namespace_only(kube, namespace, tmp_path):
    """With dra.enabled the hub may make, own, list and delete ResourceClaimTemplates and read
    ResourceClaims in its own namespace (docs/dra.md), and nothing more."""
    assert [d["kind"] for d in yaml.safe_load_all(helm("template", "r", str(CHART), home=tmp_path).stdout) if d] == [
        "ClusterRole",
        "ClusterRoleBinding",
    ]  # off by default
    lint = helm("lint", "--strict", str(CHART), "--set", "dra.enabled=true", home=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = helm("template", "r", str(CHART), "--namespace", namespace, "--set", "dra.enabled=true", home=tmp_path)
    docs = {d["kind"]: d for d in yaml.safe_load_all(rendered.stdout) if d}
    role, binding = docs["Role"], docs["RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
    hub = f"system:serviceaccount:{namespace}:hub"

    def may(verb: str, resource: str, ns: str) -> bool:
        return sar(kube, hub, namespace, verb=verb, resource=resource, group="resource.k8s.io", namespace=ns)

    created = []
    try:
        for doc, plural in ((role, "roles"), (binding, "rolebindings")):
            kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{plural}", doc)
            created.append(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{plural}/{doc['metadata']['name']}")
        wait_for(lambda: may("create", "resourceclaimtemplates", namespace), "the RoleBinding to take effect")
        allowed = [(v, "resourceclaimtemplates") for v in ("create", "delete", "patch", "list")] + [("get", "resourceclaims")]
        denied = [
            ("update", "resourceclaims"),
            ("delete", "resourceclaims"),
            ("create", "resourceclaims"),
            ("get", "resourceclaimtemplates"),
        ]
        assert [a for a in allowed if not may(*a, namespace)] == []
        assert [d for d in denied if may(*d, namespace)] == []
        assert not may("create", "resourceclaimtemplates", "kube-system")  # its namespace only
    finally:
        for path in reversed(created):
            kube.request("DELETE", path)
