"""GPUSpawner with offerings served through Dynamic Resource Allocation, on the real control
plane: the simulated NVIDIA DRA driver publishes ResourceSlices (tests/conftest.py,
``dra_driver``), the real kube-scheduler allocates the claims Kubernetes' resourceclaim
controller makes from the spawner's templates, kwok runs the pods (the kubelet's prepare step
is not exercised). Afterwards nothing the spawner made is left in the namespace.
"""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest
from jupyterhub.objects import Hub, Server
from traitlets.config import Config

from gpuspawner.capacity.allocation import pod_claim_name
from gpuspawner.hub import admitting, claimlife
from gpuspawner.hub.orphans import HubRecords, OrphanReconciler
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names.dranames import ATTR_UUID, qualified
from gpuspawner.pod.podspec import user_key
from gpuspawner.spawner import GPUSpawner

pytestmark = pytest.mark.cluster

H100 = "NVIDIA H100 80GB HBM3"
#: The admin's DRA offerings (c.GPUSpawner.offerings, the ``dra`` field; docs/dra.md).
OFFERINGS = [
    {"slug": "dra-h100", "kind": "full", "display_name": "H100 (DRA)", "product": H100, "counts": [1, 2], "dra": {}},
    {"slug": "dra-a100-1g-5gb", "kind": "mig", "display_name": "A100 · MIG 1g.5gb (DRA)", "profile": "1g.5gb", "dra": {}},
    # Two H100s that must share one UUID: counted free (two on one node), never allocatable.
    {
        "slug": "dra-h100-twin",
        "kind": "full",
        "display_name": "H100 twin (DRA)",
        "product": H100,
        "counts": [2],
        "dra": {"match_attributes": [qualified(ATTR_UUID)]},
    },
    # Two servers time-slice one L4 (NVIDIA's GpuConfig sharing, on the claim they share).
    {"slug": "dra-l4-shared", "kind": "shared", "display_name": "L4 · 1/2 (DRA)", "product": "NVIDIA L4", "replicas": 2, "dra": {}},
]


class User:
    def __init__(self, name: str):
        self.name = self.escaped_name = name
        self.id = abs(hash(name)) % 100000
        self.url = f"/user/{name}/"
        self.admin = False
        self.groups = []
        self.server = Server(base_url=f"/user/{name}/")


def make_spawner(devcluster, namespace: str, name: str | None = None) -> GPUSpawner:
    os.environ["KUBECONFIG"] = str(devcluster.kubeconfig)
    config = Config()
    config.KubeSpawner.namespace = namespace
    config.KubeSpawner.start_timeout = 60
    config.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
    config.GPUSpawner.discover_offerings = False  # the DRA offerings above are the catalog's GPUs
    config.GPUSpawner.offerings = OFFERINGS
    config.GPUSpawner.inventory_ready_timeout = 60.0  # a loaded test machine may list slowly
    spawner = GPUSpawner(hub=Hub(), user=User(name or f"u{secrets.token_hex(3)}"), config=config)
    spawner.server = spawner.user.server
    return spawner


def left_in(kube, namespace: str) -> dict[str, list[str]]:
    """What the spawner could have left behind: pods, claim templates, claims."""
    paths = {
        "pods": f"/api/v1/namespaces/{namespace}/pods",
        "resourceclaimtemplates": f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        "resourceclaims": f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
    }
    return {kind: sorted(o["metadata"]["name"] for o in kube.request("GET", path)["items"]) for kind, path in paths.items()}


async def nothing_left(kube, namespace: str) -> dict[str, list[str]]:
    """What is left once Kubernetes' garbage collector and claim controller have caught up
    (they act asynchronously; waited on for at most a minute, then returned as it is)."""
    for _ in range(600):
        left = left_in(kube, namespace)
        if not any(left.values()):
            break
        await asyncio.sleep(0.1)
    return left


def claim_of(kube, namespace: str, pod_name: str) -> dict:
    pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
    return kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{pod_claim_name(pod)}")


def slice_devices(kube, pool: str) -> dict[str, dict]:
    """The devices of ``pool`` by name (a slice of counter sets, dynamic MIG's, has none)."""
    slices = kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return {d["name"]: d for s in slices if s["spec"]["pool"]["name"] == pool for d in s["spec"].get("devices") or []}


async def test_a_dra_spawn_gets_devices_of_its_kind_from_the_scheduler_and_stop_leaves_nothing(devcluster, kube, dra_driver, namespace):
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = {"offering": "dra-h100", "count": 2}
    await spawner.start()
    try:
        pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{spawner.pod_name}")
        assert pod["spec"]["resourceClaims"] == [{"name": "gpuspawner-gpu", "resourceClaimTemplateName": spawner.pod_name}]
        notebook = pod["spec"]["containers"][0]
        assert notebook["resources"]["claims"] == [{"name": "gpuspawner-gpu"}]
        assert not any("nvidia.com" in k for k in notebook["resources"].get("limits", {}))
        template = kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{spawner.pod_name}")
        assert [(o["kind"], o["name"], o["uid"]) for o in template["metadata"]["ownerReferences"]] == [
            ("Pod", spawner.pod_name, pod["metadata"]["uid"])
        ]
        assert template["metadata"]["labels"]["hub.jupyter.org/username"] == spawner.user.name
        claim = claim_of(kube, namespace, spawner.pod_name)
        results = claim["status"]["allocation"]["devices"]["results"]
        devices = slice_devices(kube, "dra-h100")
        assert len(results) == 2 and {r["pool"] for r in results} == {pod["spec"]["nodeName"]} == {"dra-h100"}
        assert all(devices[r["device"]]["attributes"]["productName"] == {"string": H100} for r in results)
        assert claim["metadata"]["labels"]["gpuspawner.io/offering"] == "dra-h100"
        record = spawner.user_options["gpuspawner"]
        assert record["claim_template"] == spawner.pod_name
        assert sorted(d["device"] for d in record["devices"]) == sorted(r["device"] for r in results)
        assert {d["uuid"] for d in record["devices"]} == {devices[r["device"]]["attributes"]["uuid"]["string"] for r in results}
    finally:
        await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_a_mig_offering_gets_a_mig_device_of_its_profile(devcluster, kube, dra_driver, namespace):
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = {"offering": "dra-a100-1g-5gb"}
    await spawner.start()
    try:
        (result,) = claim_of(kube, namespace, spawner.pod_name)["status"]["allocation"]["devices"]["results"]
        device = slice_devices(kube, result["pool"])[result["device"]]
        assert device["attributes"]["type"] == {"string": "mig"} and device["attributes"]["profile"] == {"string": "1g.5gb"}
        (recorded,) = spawner.user_options["gpuspawner"]["devices"]
        assert recorded["mig_profile"] == "1g.5gb" and recorded["uuid"] == device["attributes"]["parentUUID"]["string"]
    finally:
        await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_an_impossible_request_is_refused_with_the_schedulers_reason_and_leaves_nothing(devcluster, kube, dra_driver, namespace):
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = {"offering": "dra-h100-twin", "count": 2}
    with pytest.raises(SpawnRefused) as refused:
        await spawner.start()
    message = str(refused.value)
    assert refused.value.status_code == 409
    # kube-scheduler's own reason, as its DRA plugin words it (the post-filter's words dropped)
    assert "The scheduler says: 0/" in message and message.endswith("cannot allocate all claims.")
    assert "H100 twin (DRA) cannot run now." in message
    await spawner.stop(now=True)  # what the hub does after a failed start
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_a_hub_restart_in_between_leaks_nothing(devcluster, kube, dra_driver, namespace):
    first = make_spawner(devcluster, namespace)
    first.user_options = {"offering": "dra-h100", "count": 1}
    await first.start()
    state = first.get_state()
    # The hub restarts: a new spawner object for the same server, from the saved state, stops it.
    after = make_spawner(devcluster, namespace, name=first.user.name)
    after.load_state(state)
    await after.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_a_template_whose_pod_was_never_made_is_removed_by_the_orphan_reconciler(devcluster, kube, dra_driver, namespace):
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = {"offering": "dra-h100", "count": 1}
    await spawner.load_user_options()
    # The hub stops right after making the template, before the pod: only the template exists.
    pod = await spawner.get_pod_manifest()
    meta = pod.metadata
    from gpuspawner.dra.claimspec import claim_template

    claim = spawner.choice.offering.claim
    await claimlife.claim_templates(spawner).create(claim_template(claim, 1, spawner.pod_name, meta.labels, meta.annotations))
    assert left_in(kube, namespace)["resourceclaimtemplates"] == [spawner.pod_name]
    list_objects, delete_object = spawner.orphan_io()
    users = {user_key(spawner.user.id): spawner.user.name}  # the hub knows the user, but has no such server
    reconciler = OrphanReconciler(list_objects, lambda: HubRecords({}, users), delete_object, grace=0, interval=1)
    orphans = await reconciler.check()
    assert [o.key for o in orphans] == [f"ResourceClaimTemplate:{namespace}/{spawner.pod_name}"]
    await spawner.stop(now=True)  # gives back what load_user_options reserved
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_the_claim_is_added_after_what_the_admin_configured_in_the_pod(devcluster, kube, dra_driver, namespace):
    spawner = make_spawner(devcluster, namespace)
    spawner.extra_pod_config = {"resourceClaims": [{"name": "scratch", "resourceClaimTemplateName": "site-scratch"}]}
    spawner.extra_container_config = {"resources": {"claims": [{"name": "scratch"}]}}
    spawner.user_options = {"offering": "dra-h100", "count": 1}
    await spawner.load_user_options()
    admitting.release_reservation(spawner)  # (no pod is made here: the reservation of this load is given back)
    pod = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
    assert pod["spec"]["resourceClaims"] == [
        {"name": "scratch", "resourceClaimTemplateName": "site-scratch"},
        {"name": "gpuspawner-gpu", "resourceClaimTemplateName": spawner.pod_name},
    ]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "scratch"}, {"name": "gpuspawner-gpu"}]
    spawner.user_options = {"offering": "cpu"}  # the same spawner object, a CPU spawn next: no claim at all
    await spawner.load_user_options()
    pod = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
    assert pod["spec"]["resourceClaims"] == [{"name": "scratch", "resourceClaimTemplateName": "site-scratch"}]
    await spawner.stop(now=True)


async def test_a_hub_that_may_not_create_templates_refuses_with_what_to_do(devcluster, kube, dra_driver, namespace, monkeypatch, caplog):
    """The API server's 403 (the hub lacks the chart's dra.enabled Role): the user reads a short
    refusal, the log says what to grant; nothing is left behind."""
    from kubernetes_asyncio.client.rest import ApiException

    from gpuspawner.hub.claims import ClaimTemplates

    async def forbidden(self, manifest):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(ClaimTemplates, "create", forbidden)
    await refused_as_misconfigured(devcluster, kube, namespace)
    assert "cannot create ResourceClaimTemplate" in caplog.text and "dra.enabled=true" in caplog.text


async def refused_as_misconfigured(devcluster, kube, namespace: str) -> None:
    """A spawn of one DRA H100 is refused with the short words for users (503), and the stop
    the hub makes after it leaves nothing behind."""
    spawner = make_spawner(devcluster, namespace)
    spawner.user_options = {"offering": "dra-h100", "count": 1}
    with pytest.raises(SpawnRefused) as refused:
        await spawner.start()
    assert refused.value.status_code == 503 and "misconfigured" in str(refused.value)
    await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_a_claim_field_an_older_server_drops_refuses_the_spawn_with_the_release_it_needs(
    devcluster, kube, dra_driver, namespace, monkeypatch, caplog, k8s_release
):
    """An API server whose DRAConsumableCapacity gate is off (1.34, 1.35: off by default) keeps a
    template without its ``capacity.requests`` instead of refusing it: the claim would get a whole
    GPU. The spawn is refused, the log names the field, the gate and the release; nothing is left.
    (`make test-oldest-k8s` runs it; on 1.36 and newer the field is kept.)"""
    if k8s_release >= (1, 36):
        pytest.skip(f"Kubernetes {k8s_release[0]}.{k8s_release[1]} keeps capacity.requests (DRAConsumableCapacity on from 1.36)")
    made = claimlife.claim_template

    def with_a_share(*args, **kwargs):
        template = made(*args, **kwargs)
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "8Gi"}}
        return template

    monkeypatch.setattr(claimlife, "claim_template", with_a_share)
    await refused_as_misconfigured(devcluster, kube, namespace)
    assert "without spec.devices.requests[0].exactly.capacity" in caplog.text
    assert "gate DRAConsumableCapacity, on by default from Kubernetes 1.36" in caplog.text


async def test_servers_of_a_shared_offering_share_one_claim_which_goes_with_the_last(devcluster, kube, dra_driver, namespace):
    spawners = [make_spawner(devcluster, namespace) for _ in range(3)]
    for spawner in spawners:
        spawner.user_options = {"offering": "dra-l4-shared"}
        await spawner.start()
    try:
        names = [spawner.user_options["gpuspawner"]["shared_claim"] for spawner in spawners]
        assert names[0] == names[1] != names[2]  # two servers per claim, then a new claim
        claims = {n: claim_of(kube, namespace, s.pod_name) for n, s in zip(names, spawners, strict=True)}
        first = claims[names[0]]
        assert sorted(r["name"] for r in first["status"]["reservedFor"]) == sorted(s.pod_name for s in spawners[:2])
        assert first["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] == "TimeSlicing"
        (one,) = first["status"]["allocation"]["devices"]["results"]
        (other,) = claims[names[2]]["status"]["allocation"]["devices"]["results"]
        assert (one["pool"], one["device"]) != (other["pool"], other["device"])
        assert not left_in(kube, namespace)["resourceclaimtemplates"]  # shared servers make no template
        await spawners[0].stop(now=True)
        assert names[0] in left_in(kube, namespace)["resourceclaims"]  # its other server still runs on it
    finally:
        for spawner in spawners:
            await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}


async def test_an_admin_selector_that_matches_no_published_device_is_logged_once(devcluster, kube, dra_driver, namespace, caplog):
    """Known only once the hub has listed the slices: the hub's log then names the offering and
    its selectors, once per hub process however often the catalog is built."""
    spawner = make_spawner(devcluster, namespace)
    spawner.offerings = [
        *OFFERINGS,
        {
            "slug": "dra-huge",
            "kind": "full",
            "display_name": "A GPU with 1 TiB",
            "dra": {"selector": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('1Ti')) >= 0"},
        },
    ]
    catalog = await spawner.catalog()
    for _ in range(600):  # the slices' watch answers beside the nodes' and pods'
        if spawner.inventory.index.dra.synced:
            break
        await asyncio.sleep(0.1)
    for _ in range(3):
        catalog = await spawner.catalog()
    assert "dra-huge" in {o.slug for o in catalog}  # offered all the same: such a GPU may appear later
    said = [r.getMessage() for r in caplog.records if "dra-huge" in r.getMessage()]
    assert len(said) == 1 and "its DRA selectors match none of the" in said[0], said
    assert not any("'dra-h100'" in r.getMessage() for r in caplog.records)  # offerings that match say nothing
