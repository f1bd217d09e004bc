"""Dynamic MIG offerings on the real control plane: the simulated NVIDIA driver publishes a node of
two A100-40GBs partitioned on demand (every placement of every profile, taking from one counter
set per GPU: gpuspawner.devcluster.dradriver, ``DYNAMIC_MIG_NODES``), the real kube-scheduler
picks the placements, and the spawner's free counts per profile follow what it took.
"""

from __future__ import annotations

import asyncio

import pytest

from gpuspawner.devcluster.dradriver import DYNAMIC_MIG_NODES, SimulatedDriver
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.names.dranames import ATTR_PARENT_UUID, qualified
from tests.integration.test_dra_spawn import claim_of, make_spawner, nothing_left, slice_devices

pytestmark = pytest.mark.cluster

NODE = DYNAMIC_MIG_NODES[0].name
#: The admin's dynamic MIG offerings: one per profile (c.GPUSpawner.offerings, the ``dra`` field).
OFFERINGS = [
    {"slug": "mig-4g", "kind": "mig", "display_name": "A100 · MIG 4g.20gb", "profile": "4g.20gb", "dra": {}},
    {"slug": "mig-3g", "kind": "mig", "display_name": "A100 · MIG 3g.20gb", "profile": "3g.20gb", "dra": {}},
    {"slug": "mig-7g", "kind": "mig", "display_name": "A100 · MIG 7g.40gb", "profile": "7g.40gb", "dra": {}},
    # Two 3g.20gb of one GPU: the counts know nodes, not GPUs, so only the scheduler can say no.
    {
        "slug": "mig-3g-pair",
        "kind": "full",
        "display_name": "A100 · 2 x MIG 3g.20gb of one GPU",
        "counts": [2],
        "dra": {
            "device_class": "mig.nvidia.com",
            "selector": "device.attributes['gpu.nvidia.com'].profile == '3g.20gb'",
            "match_attributes": [qualified(ATTR_PARENT_UUID)],
        },
    },
]


@pytest.fixture(scope="module")
def dynamic_mig_driver(kube):
    driver = SimulatedDriver(kube, DYNAMIC_MIG_NODES)
    driver.install()
    try:
        yield driver
    finally:
        driver.uninstall()


def spawner_for(devcluster, namespace, slug: str):
    spawner = make_spawner(devcluster, namespace)
    spawner.offerings = OFFERINGS
    spawner.user_options = {"offering": slug}
    return spawner


async def free_counts(spawner) -> dict[str, int | None]:
    catalog = await spawner.catalog()
    await spawner.inventory.wait_ready(60)
    return {o.slug: spawner.availability(o).free for o in catalog if o.slug.startswith("mig-")}


async def settled_counts(spawner, expected: dict[str, int]) -> dict[str, int | None]:
    """The free counts once the inventory has seen the claims allocated so far (its watch lags the API server;
    waited on for at most half a minute, then returned as they are)."""
    counts: dict[str, int | None] = {}
    for _ in range(300):
        counts = await free_counts(spawner)
        if counts == expected:
            break
        await asyncio.sleep(0.1)
    return counts


def gpu_of(result: dict) -> str:
    return result["device"].split("-mig-")[0]


async def test_dynamic_mig_spawns_take_placements_the_counts_follow_and_the_rest_is_refused(
    devcluster, kube, dynamic_mig_driver, namespace
):
    first = spawner_for(devcluster, namespace, "mig-4g")
    started = [first]
    try:
        empty = {"mig-4g": 2, "mig-3g": 4, "mig-7g": 2, "mig-3g-pair": 4}
        assert await settled_counts(first, empty) == empty
        await first.start()
        (result,) = claim_of(kube, namespace, first.pod_name)["status"]["allocation"]["devices"]["results"]
        device = slice_devices(kube, NODE)[result["device"]]
        assert result["pool"] == NODE and result["device"].endswith("-mig-4g20gb-5-0")
        assert device["consumesCounters"][0]["counterSet"] == f"{gpu_of(result)}-counter-set"
        (recorded,) = first.user_options["gpuspawner"]["devices"]
        assert recorded["mig_profile"] == "4g.20gb" and recorded["uuid"] == device["attributes"]["parentUUID"]["string"]
        # that GPU keeps memory slices 4-7: room for one 3g.20gb, none for a 7g.40gb; the other GPU is whole
        after_one = {"mig-4g": 1, "mig-3g": 3, "mig-7g": 1, "mig-3g-pair": 3}
        assert await settled_counts(first, after_one) == after_one

        second = spawner_for(devcluster, namespace, "mig-4g")
        started.append(second)
        await second.start()
        (other,) = claim_of(kube, namespace, second.pod_name)["status"]["allocation"]["devices"]["results"]
        assert gpu_of(other) != gpu_of(result)  # the other GPU
        after_two = {"mig-4g": 0, "mig-3g": 2, "mig-7g": 0, "mig-3g-pair": 2}
        assert await settled_counts(first, after_two) == after_two

        # One more than free: refused at once, naming what is still free; nothing is made for it.
        one_more = spawner_for(devcluster, namespace, "mig-4g")
        with pytest.raises(SpawnRefused) as refused:
            await one_more.start()
        assert refused.value.status_code == 409 and "Free now: A100 · MIG 3g.20gb (2)" in str(refused.value), str(refused.value)
        await one_more.stop(now=True)
        # Two 3g.20gb fit the node, one on each GPU, but not on one GPU: the counts know GPUs (issue 41), so the
        # spawn is refused at once, before a pod is made (it used to be admitted and refused by the scheduler).
        pair = spawner_for(devcluster, namespace, "mig-3g-pair")
        pair.user_options = {"offering": "mig-3g-pair", "count": 2}
        assert first.availability(next(o for o in await first.catalog() if o.slug == "mig-3g-pair")).largest_free == 1
        with pytest.raises(SpawnRefused) as refused:
            await pair.start()
        message = str(refused.value)
        assert refused.value.status_code == 409
        assert message.startswith("No 2 x A100 · 2 x MIG 3g.20gb of one GPU") and "(2 of 4 free)" in message, message
        await pair.stop(now=True)
    finally:
        for spawner in started:
            await spawner.stop(now=True)
    assert await nothing_left(kube, namespace) == {"pods": [], "resourceclaimtemplates": [], "resourceclaims": []}
    assert await settled_counts(first, empty) == empty  # every placement back
