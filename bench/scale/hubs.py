"""The two hubs of a scale run: GPUSpawner, and plain KubeSpawner with the equivalent ``profile_list``.

Both are real JupyterHubs behind a real configurable-http-proxy (:class:`HubProcess`), with the same
settings but the spawner: JupyterHub's default concurrent spawn limit (100), zero-to-jupyterhub's
``cleanup_servers = False`` (a restarted hub keeps its users' servers), the same image, port and
timeouts, a service token for the benchmark, and their own Kubernetes identity (audited by the API
server, so every request they make is counted by it).

The choices a user can make are the same on both: for each GPU offering GPUSpawner discovers, a
KubeSpawner profile with the limits, node selection, affinity and tolerations the offering's pod
gets (``pod.podspec.pod_changes``, as ``bench/start_bench.py`` configures KubeSpawner), "No GPU",
and two requests no node can take (a node label no node has; 16 GPUs on an 8-GPU node).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
from gpuspawner.pod.podspec import merge_affinity_terms, pod_changes

#: an offering only the inventory-lag probes take (the storm leaves it alone, so its count moves by the probes only)
PROBE_OFFERING = "vgpu-vgpu-type-v100-8g-8gb"
#: a label no node has: only the scheduler can say no
NOWHERE = {"example.org/fpga": "true"}
H100 = "gpu-nvidia-h100-80gb-hbm3"
#: GPUSpawner's orphan reconciler in the benchmark's hub: a pod a timed-out request made after its
#: spawn was refused is deleted this long after (the check for pods without a server waits it out)
ORPHAN_GRACE, ORPHAN_CHECK = 30, 10
#: the audited Kubernetes identity of the hub under test
HUB_CLIENT = "gpuspawner-hub"
#: KubeSpawner's hub's own identity where both hubs run at once (``--paired``), so each one's requests are counted apart
KUBE_CLIENT = "kubespawner-hub"


@dataclass(frozen=True)
class Choice:
    """One thing a user asks for, as each spawner's API and form take it."""

    name: str
    kind: str  # gpu | cpu | refuse
    gpu_options: dict  # user_options for GPUSpawner's REST API
    gpu_form: dict  # GPUSpawner's form fields
    kube_profile: str  # KubeSpawner's profile slug (API and form)
    units: int = 0  # how many the cluster has (GPU offerings; of an empty cluster)


def choices(nodes: list[dict]) -> tuple[list[Choice], list[dict]]:
    """The storm's choices and KubeSpawner's ``profile_list`` for the same cluster."""
    index = ClusterIndex()
    index.replace(nodes=nodes, pods=[])
    catalog = build_catalog(CatalogConfig(), discovered=index.discovered())
    out: list[Choice] = []
    profiles: list[dict] = [{"display_name": "No GPU", "slug": "cpu", "default": True, "kubespawner_override": {}}]
    out.append(Choice("cpu", "cpu", {"offering": "cpu"}, {"offering": "cpu"}, "cpu"))
    for offering in catalog:
        if not offering.resources or offering.slug == PROBE_OFFERING:
            continue
        changes = pod_changes(offering, 1)
        profiles.append(
            {
                "display_name": offering.display_name,
                "slug": offering.slug,
                "kubespawner_override": {
                    "extra_resource_limits": dict(changes.limits),
                    "extra_resource_guarantees": dict(changes.limits),
                    "node_selector": dict(changes.node_selector),
                    "tolerations": [dict(t) for t in changes.tolerations],
                    "node_affinity_required": merge_affinity_terms([], changes.node_affinity),
                },
            }
        )
        units = index.availability(offering).free
        out.append(Choice(offering.slug, "gpu", {"offering": offering.slug}, {"offering": offering.slug}, offering.slug, units))
    h100 = next(p for p in profiles if p["slug"] == H100)
    too_many = json.loads(json.dumps(h100))
    too_many.update(slug="h100-x16", display_name="16 x H100")
    too_many["kubespawner_override"]["extra_resource_limits"] = {"nvidia.com/gpu": "16"}
    too_many["kubespawner_override"]["extra_resource_guarantees"] = {"nvidia.com/gpu": "16"}
    profiles.append(too_many)
    out.append(Choice("16 x H100", "refuse", {"offering": H100, "count": 16}, {"offering": H100, f"count-{H100}": "16"}, "h100-x16"))
    profiles.append({"display_name": "FPGA", "slug": "fpga", "kubespawner_override": {"node_selector": dict(NOWHERE)}})
    out.append(Choice("FPGA (no node has one)", "refuse", {"offering": "fpga"}, {"offering": "fpga"}, "fpga"))
    return out, profiles


def hub_config(
    base: str,
    spawner: str,
    namespace: str,
    port: int,
    token: str,
    profiles: list[dict],
    start_timeout: int,
    db_url: str = "",
    padding: int = 0,
) -> str:
    """``base`` (:meth:`HubProcess.base_config`) plus the run's settings; ``spawner``: gpu | kube;
    ``db_url``: the hub's database where not its own sqlite file (PostgreSQL: bench.scale.postgres);
    ``padding``: that many more choices on each side's page, nobody's spawn (:func:`site_offerings`
    for GPUSpawner, :func:`site_profiles` for KubeSpawner)."""
    common = (
        (f"c.JupyterHub.db_url = {db_url!r}\n" if db_url else "")
        + f"""
c.JupyterHub.concurrent_spawn_limit = 100  # JupyterHub's default
c.JupyterHub.cleanup_servers = False  # zero-to-jupyterhub's: a restarted hub keeps the servers
c.JupyterHub.log_level = "INFO"
c.JupyterHub.services = [{{"name": "bench", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "bench", "scopes": ["admin:users", "admin:servers", "admin:server_state", "read:metrics", "access:servers"], "services": ["bench"]}}]
c.KubeSpawner.namespace = {namespace!r}
c.KubeSpawner.image = "quay.io/jupyter/minimal-notebook:2025-11-17"
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeSpawner.port = {port}
c.KubeSpawner.start_timeout = {start_timeout}
c.KubeSpawner.http_timeout = 30
"""
    )
    if spawner == "gpu":
        extra = f"""
c.JupyterHub.spawner_class = "gpu"
c.GPUSpawner.discover_offerings = True
c.GPUSpawner.default_offering = "cpu"
c.GPUSpawner.offerings = [{{"slug": "fpga", "kind": "custom", "display_name": "FPGA", "command_prefix": ["fpga-run"], "node_selector": {NOWHERE!r}}}] + {site_offerings(padding)!r}
c.GPUSpawner.orphan_pod_grace_seconds = {ORPHAN_GRACE}  # (300 by default: the benchmark waits this out before it looks)
c.GPUSpawner.orphan_pod_check_seconds = {ORPHAN_CHECK}
"""
    else:
        extra = f"""
c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.KubeSpawner.profile_list = {profiles + site_profiles(padding)!r}
"""
    return base + common + extra


def site_offerings(n: int) -> list[dict]:
    """``n`` configured offerings beside the discovered ones (whole H100s, each its own card); every tenth for
    one group only: a site's page of many offerings (bench.page_bench, ``bench.scale --offerings``)."""
    return [
        {
            "slug": f"site-{i}",
            "kind": "custom",
            "display_name": f"Site accelerator {i}",
            "resources": {"nvidia.com/gpu": 1},
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            **({"groups": [f"group{i % 10}"]} if i % 10 == 0 else {}),
        }
        for i in range(max(0, n))
    ]


def site_profiles(n: int) -> list[dict]:
    """KubeSpawner's ``n`` profiles of the same kind of GPU limits, node selector and toleration (beside
    :func:`site_offerings`)."""
    return [
        {
            "display_name": f"Profile {i}",
            "slug": f"p{i}",
            "description": "One whole GPU of a kind",
            "kubespawner_override": {
                "extra_resource_limits": {"nvidia.com/gpu": "1"},
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
        for i in range(n)
    ]
