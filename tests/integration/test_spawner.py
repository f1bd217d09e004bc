"""GPUSpawner against the devcluster: each offering's pod lands, by the real
scheduler's decision, on its node class and nowhere else; spawner objects reused
across spawns never leak GPU settings; bad choices never reach the cluster."""

from __future__ import annotations

import os
import secrets
from datetime import UTC
from pathlib import Path

import pytest
from jupyterhub.objects import Hub, Server
from traitlets.config import Config

from gpuspawner.capacity.counts import availability
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.offerings.catalog import build_catalog
from gpuspawner.pod.memguard import GUARD_ENV, path_prefix
from gpuspawner.pod.podspec import merge_affinity_terms
from gpuspawner.spawner import GPUSpawner

pytestmark = pytest.mark.cluster

#: Discovered offering -> the one simulated node that may serve it (nodes.yaml).
EXPECTED_NODE = {
    "cpu": "cpu-worker",
    "shared-nvidia-l4-shared-mps-4x": "gpu-l4-mps",
    "shared-tesla-t4-shared-time-slicing-4x": "gpu-t4-ts-shared",
    "shared-tesla-t4-time-slicing-4x": "gpu-t4-ts-renamed",
    "mig-nvidia-a100-sxm4-40gb-1g-5gb": "gpu-a100-mig",
    "mig-nvidia-a100-sxm4-40gb-2g-10gb": "gpu-a100-mig",
    "mig-nvidia-a100-sxm4-40gb-3g-20gb": "gpu-a100-mig",
    "mig-gke-nvidia-tesla-a100-1g-5gb": "gke-a100-mig-1g",
    "gpu-nvidia-h100-80gb-hbm3": "gpu-h100-8x",
    "gpu-nvidia-tesla-a100": "gke-a100-whole",
    "vgpu-vgpu-type-v100-8g-8gb": "gpu-v100-vgpu-class",
    "vgpu-nvidia-a10-24q": "gpu-a10-vgpu",
    "half-v100": "gpu-v100-fractional",
    "bitfusion-half": "cpu-worker",
}

SITE_OFFERINGS = [
    {"slug": "half-v100", "kind": "custom", "display_name": "Half a V100", "resources": {"nvidia.com/vgpu": 500}},
    {
        "slug": "bitfusion-half",
        "kind": "custom",
        "display_name": "Half a remote GPU (Bitfusion)",
        "command_prefix": ["bitfusion", "run", "-n", "1", "-p", "0.5", "--"],
        "tolerations": [],
    },
]


class User:
    """The parts of JupyterHub's User that a spawner reads."""

    def __init__(self, name: str, groups=(), admin=False):
        self.name = name
        self.escaped_name = name
        self.id = abs(hash(name)) % 100000
        self.url = f"/user/{name}/"
        self.admin = admin
        self.groups = [type("Group", (), {"name": g})() for g in groups]
        self.server = Server(base_url=f"/user/{name}/")


def make_spawner(devcluster, namespace, **gpu_config) -> GPUSpawner:
    os.environ["KUBECONFIG"] = str(devcluster.kubeconfig)
    config = Config()
    config.KubeSpawner.namespace = namespace
    config.KubeSpawner.start_timeout = 60
    config.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
    config.KubeSpawner.node_selector = {"site": "any"} if gpu_config.pop("site_selector", False) else {}
    config.GPUSpawner.inventory_ready_timeout = 60.0  # a loaded test machine may list slowly; not what these tests are about
    for key, value in gpu_config.items():
        setattr(config.GPUSpawner, key, value)
    name = f"u{secrets.token_hex(3)}"
    spawner = GPUSpawner(hub=Hub(), user=User(name), config=config)
    spawner.server = spawner.user.server
    return spawner


async def pod_of(spawner: GPUSpawner) -> dict:
    response = await spawner.api.read_namespaced_pod(spawner.pod_name, spawner.namespace, _preload_content=False)
    import json

    return json.loads(await response.read())


async def test_each_offering_lands_on_its_node_class_and_nowhere_else(devcluster, kube, namespace):
    nodes = kube.request("GET", "/api/v1/nodes")["items"]
    spawner = make_spawner(devcluster, namespace, offerings=SITE_OFFERINGS)
    catalog = build_catalog(spawner.catalog_config, nodes)
    assert {o.slug for o in catalog} == set(EXPECTED_NODE), "discovery found other offerings than nodes.yaml holds"
    for offering in catalog:
        if offering.resources:  # which nodes could serve it at all (CPU: any untainted node)
            assert availability(offering, nodes, []).nodes == (EXPECTED_NODE[offering.slug],), offering.slug
        spawner = make_spawner(devcluster, namespace, offerings=SITE_OFFERINGS)
        spawner.user_options = {"offering": offering.slug}
        await spawner.start()
        try:
            pod = await pod_of(spawner)
            assert pod["spec"]["nodeName"] == EXPECTED_NODE[offering.slug], offering.slug
            container = pod["spec"]["containers"][0]
            limits = container["resources"].get("limits", {})
            gpu_limits = {k: v for k, v in limits.items() if "/" in k}
            assert gpu_limits == {k: str(v) for k, v in offering.resources.items()}, offering.slug
            assert pod["metadata"]["labels"]["gpuspawner.io/offering"] == offering.slug
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["GPUSPAWNER_OFFERING"] == offering.slug
            assert "NVIDIA_VISIBLE_DEVICES" not in env
            if offering.placement_terms:  # e.g. whole GPUs kept off shared, MIG and vGPU nodes of the same product
                terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                assert terms == merge_affinity_terms([], offering.placement_terms), offering.slug
            if offering.slug == "gpu-nvidia-tesla-a100":  # GKE whole GPUs: never on the partitioned pool of the same accelerator
                assert all(
                    {"key": "cloud.google.com/gke-gpu-partition-size", "operator": "DoesNotExist"} in t["matchExpressions"] for t in terms
                )
            if offering.command_prefix:
                assert container["args"][: len(offering.command_prefix)] == list(offering.command_prefix)
            record = spawner.user_options["gpuspawner"]
            assert record["offering"] == offering.slug and record["pod"] == spawner.pod_name
            assert record["url"].startswith(f"http://{pod['status']['podIP']}:8888/user/")
        finally:
            await spawner.stop(now=True)


async def test_whole_gpu_counts_are_limits(devcluster, namespace):
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = {"offering": "gpu-nvidia-h100-80gb-hbm3", "count": "4"}
    await spawner.start()
    try:
        pod = await pod_of(spawner)
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == "4"
        assert resources["requests"]["nvidia.com/gpu"] == "4"
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    finally:
        await spawner.stop(now=True)


async def test_cpu_spawn_after_gpu_spawn_on_the_same_spawner_has_no_gpu(devcluster, namespace):
    spawner = make_spawner(devcluster, namespace, offering_overrides={"shared-tesla-t4-time-slicing-4x": {"extra_tolerations": []}})
    spawner.user_options = {"offering": "shared-tesla-t4-time-slicing-4x"}
    await spawner.start()
    gpu_pod = await pod_of(spawner)
    assert gpu_pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    # a quarter of the T4's 15360 MiB, 1920 per process, less 512 for its CUDA context
    assert_guarded(gpu_pod, fraction="0.091", mib="1408")
    await spawner.stop(now=True)
    spawner.clear_state()

    spawner.user_options = {"offering": "cpu"}
    await spawner.start()
    try:
        pod = await pod_of(spawner)
        container = pod["spec"]["containers"][0]
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            assert not [k for k in (resources.get(section) or {}) if k.startswith("nvidia.com/")], resources
        assert not (pod["spec"].get("nodeSelector") or {})
        assert not any(
            t.get("key", "").startswith(("nvidia.com", "node-role.kubernetes.io/gpu")) for t in pod["spec"].get("tolerations") or []
        )
        assert pod["spec"]["nodeName"] == "cpu-worker"
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["GPUSPAWNER_OFFERING"] == "cpu" and "GPUSPAWNER_GPU_COUNT" not in env
        assert spawner.extra_resource_limits == {} and spawner.node_selector == {}
        # nothing of the memory guard either
        assert not [k for k in env if k in GUARD_VARIABLES], env
        assert not [v for v in pod["spec"].get("volumes") or [] if v["name"] == "gpuspawner-memguard"]
        assert not [m for m in container.get("volumeMounts") or [] if m["name"] == "gpuspawner-memguard"]
        assert "gpuspawner.io/memguard-hook" not in (pod["metadata"].get("annotations") or {})
        assert spawner.volumes == [] and spawner.volume_mounts == [] and spawner.extra_annotations == {}
    finally:
        await spawner.stop(now=True)


GUARD_VARIABLES = set(GUARD_ENV)  # (the exact values are spelled out in assert_guarded)
HOOK = Path(__file__).resolve().parents[2] / "gpuspawner" / "pod" / "memguard_hook.py"


def assert_guarded(pod: dict, fraction: str, mib: str, **more: str) -> None:
    """The pod as the API server stored it carries the memory guard: its exact variables, the
    hook's source as an annotation and the downwardAPI volume that projects it (``more``: the
    variables that differ, e.g. JAX's fraction where the user's profile may set it)."""
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert {k: v for k, v in env.items() if k in GUARD_VARIABLES} == {
        "GPUSPAWNER_MEMORY_FRACTION": fraction,
        "GPUSPAWNER_MEMORY_MIB": mib,
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
        **more,
    }
    # no PYTHONPATH of the pod's own (it would replace the image's): the command's shell prefix
    # puts the hook in front of whatever the image has there
    assert "PYTHONPATH" not in env
    assert container["args"][: len(path_prefix())] == list(path_prefix())
    assert pod["metadata"]["annotations"]["gpuspawner.io/memguard-hook"] == HOOK.read_text()
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "gpuspawner-memguard"]
    (item,) = volume["downwardAPI"]["items"]
    assert item["path"] == "sitecustomize.py"
    assert item["fieldRef"]["fieldPath"] == "metadata.annotations['gpuspawner.io/memguard-hook']"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "gpuspawner-memguard"]
    assert mount["mountPath"] == "/opt/gpuspawner/memguard" and mount["readOnly"] is True


async def test_an_mps_share_is_guarded_and_a_profile_env_wins_only_where_allowed(devcluster, namespace):
    slug = "shared-nvidia-l4-shared-mps-4x"
    profiles = [
        {
            "display_name": "Big JAX",
            "slug": "bigjax",
            "default": True,
            "kubespawner_override": {"environment": {"XLA_CLIENT_MEM_FRACTION": "0.9"}},
        }
    ]
    for user_env, jax_fraction in ((False, "0.102"), (True, "0.9")):
        spawner = make_spawner(devcluster, namespace, offering_overrides={slug: {"memory_guard": {"user_env": user_env}}})
        spawner.profile_list = profiles
        spawner.user_options = {"offering": slug, "profile": "bigjax"}
        await spawner.start()
        try:
            pod = await pod_of(spawner)
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            # one JAX fraction, under the name every jaxlib reads, whichever spelling the profile used
            assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == jax_fraction and "XLA_CLIENT_MEM_FRACTION" not in env, user_env
            # the L4's 23032 MiB (4 MPS clients of GFD's 5758) in 4 clients of 2 processes: 2879 MiB
            # each, within the MPS daemon's 5758 for a client; 2367 of it for the framework
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2879M" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
            assert env["GPUSPAWNER_MEMORY_MIB"] == "2367" and env["GPUSPAWNER_MEMORY_FRACTION"] == "0.102"
        finally:
            await spawner.stop(now=True)
    assert_guarded(
        pod,
        fraction="0.102",
        mib="2367",
        XLA_PYTHON_CLIENT_MEM_FRACTION="0.9",
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25",
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2879M",
    )


@pytest.mark.parametrize(
    "options, message, status",
    [
        ({"offering": "no-such-gpu"}, "not offered to you", 403),
        ({"offering": "<script>alert(1)</script>"}, "not a valid GPU option", 400),
        ({"offering": "gpu-nvidia-h100-80gb-hbm3", "count": "3"}, "not 3", 400),
        ({"offering": "gpu-nvidia-h100-80gb-hbm3", "count": "-1"}, "whole number", 400),
        ({"offering": ["cpu", "gpu-nvidia-h100-80gb-hbm3"]}, "exactly one", 400),
    ],
)
async def test_bad_choices_are_refused_before_any_pod_exists(devcluster, kube, namespace, options, message, status):
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = options
    with pytest.raises(SpawnRefused) as info:
        await spawner.start()
    assert message in str(info.value) and info.value.status_code == status
    assert info.value.jupyterhub_message == str(info.value)  # what the hub answers with
    assert "<" not in str(info.value)
    assert kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"] == []


async def test_restricted_offering_is_refused_like_an_unknown_one(devcluster, kube, namespace):
    overrides = {"gpu-nvidia-h100-80gb-hbm3": {"groups": ["researchers"]}}
    spawner = make_spawner(devcluster, namespace, offering_overrides=overrides)
    spawner.user_options = {"offering": "gpu-nvidia-h100-80gb-hbm3"}
    with pytest.raises(SpawnRefused, match="not offered to you") as info:
        await spawner.start()
    assert info.value.status_code == 403
    assert kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"] == []

    member = make_spawner(devcluster, namespace, offering_overrides=overrides)
    member.user.groups = [type("Group", (), {"name": "researchers"})()]
    member.user_options = {"offering": "gpu-nvidia-h100-80gb-hbm3"}
    await member.start()
    try:
        assert (await pod_of(member))["spec"]["nodeName"] == "gpu-h100-8x"
    finally:
        await member.stop(now=True)


async def test_a_broken_offering_config_is_named_and_never_a_server_error(devcluster, kube, namespace):
    from traitlets.config import Config

    from gpuspawner import check_config
    from gpuspawner.capacity.checks import GPUSpawnerConfigError

    broken = [{"slug": "a", "kind": "cpu"}, {"slug": "b", "kind": "mig", "profile": "huge"}]
    # At hub start-up: check_config(c) at the end of jupyterhub_config.py stops the hub.
    config = Config()
    config.GPUSpawner.offerings = broken
    config.GPUSpawner.user_quota = {"gpus": 2}
    with pytest.raises(GPUSpawnerConfigError) as info:
        check_config(config)
    assert "offerings[1] (slug 'b'): field 'profile'" in str(info.value)
    assert "user_quota: unknown key 'gpus'" in str(info.value)
    # Without it, the spawner still never fails with a server error: users get a short message.
    spawner = make_spawner(devcluster, namespace, offerings=broken)
    assert any("field 'profile'" in p for p in spawner.config_problems())
    spawner.user_options = {"offering": "a"}
    with pytest.raises(SpawnRefused, match="misconfigured; please tell your administrator") as info:
        await spawner.start()
    assert info.value.status_code == 503
    assert "misconfigured" in await spawner._render_gpu_form()
    assert kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"] == []


async def test_kubespawner_image_choice_works_beside_the_gpu_choice(devcluster, namespace):
    profiles = [
        {
            "display_name": "Python",
            "slug": "python",
            "default": True,
            "kubespawner_override": {"image": "quay.io/jupyter/scipy-notebook:2025-11-17"},
        },
        {
            "display_name": "PyTorch",
            "slug": "pytorch",
            "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook:cuda12-2025-11-17"},
        },
    ]
    spawner = make_spawner(devcluster, namespace)
    spawner.profile_list = profiles
    form = await spawner._render_gpu_form()
    assert 'name="offering"' in form and 'value="pytorch"' in form  # both choices on one page
    options = spawner.options_from_form(  # KubeSpawner's contract: synchronous, a dict, checked at start
        {"offering": ["mig-nvidia-a100-sxm4-40gb-2g-10gb"], "profile": ["pytorch"], "_xsrf": ["x"], "evil": ["<b>"]}
    )
    assert options == {"profile": "pytorch", "offering": "mig-nvidia-a100-sxm4-40gb-2g-10gb"}
    spawner.user_options = options
    await spawner.start()
    assert spawner.user_options["count"] == 1
    try:
        pod = await pod_of(spawner)
        container = pod["spec"]["containers"][0]
        assert container["image"] == "quay.io/jupyter/pytorch-notebook:cuda12-2025-11-17"
        assert container["resources"]["limits"]["nvidia.com/mig-2g.10gb"] == "1"
    finally:
        await spawner.stop(now=True)


async def test_a_running_server_is_stopped_by_a_closing_window_only_when_configured(devcluster, namespace):
    from datetime import datetime, timedelta
    from urllib.parse import urlparse

    today = datetime.now(UTC)
    day = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[today.weekday()]
    offerings = [{"slug": "night-h100", "kind": "full", "product": "NVIDIA-H100-80GB-HBM3", "windows": [f"{day} 00:00-24:00"]}]
    for configured in (False, True):
        spawner = make_spawner(devcluster, namespace, offerings=offerings, site_timezone="UTC", stop_outside_window=configured)
        spawner.user_options = {"offering": "night-h100"}
        url = urlparse(await spawner.start())
        spawner.server.ip, spawner.server.port = url.hostname, url.port  # as the hub records it
        try:
            assert await spawner.poll() is None  # inside the window
            spawner.now = lambda: today + timedelta(days=1)  # the window has closed
            assert await spawner.poll() == (0 if configured else None)
        finally:
            await spawner.stop(now=True)


async def test_user_options_hold_known_keys_only_from_the_start(devcluster, namespace):
    """JupyterHub builds a spawner with the stored user_options (e.g. after a restart): the profile
    keys stay (the profile_list is configured by then), junk goes, and the record this spawner's
    server wrote stays because the database row holds the same one."""
    from jupyterhub import orm

    os.environ["KUBECONFIG"] = str(devcluster.kubeconfig)
    config = Config()
    config.KubeSpawner.namespace = namespace
    config.KubeSpawner.profile_list = {
        "1-python": {
            "display_name": "Python",
            "slug": "python",
            "default": True,  # the dict form
            "profile_options": {"image": {"display_name": "Image", "choices": {"a": {}}}},
        }
    }
    record = {"offering": "cpu", "kind": "cpu", "count": 1, "pod": "jupyter-ada", "url": "http://10.0.0.1:8888/user/ada/"}
    stored = {"offering": "cpu", "profile": "python", "image": "a", "junk": "x" * 100, "gpuspawner": record}
    row = orm.Spawner(name="", user_options=stored)  # the hub's database row (not stored)
    spawner = GPUSpawner(hub=Hub(), user=User("ada"), config=config, user_options=dict(stored), orm_spawner=row)
    assert spawner.user_options == {"offering": "cpu", "profile": "python", "image": "a", "gpuspawner": record}
    spawner.user_options = {"offering": "cpu", "gpuspawner": {**record, "pod": "someone-else"}}
    assert spawner.user_options == {"offering": "cpu"}  # a record nobody here wrote
