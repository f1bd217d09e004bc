"""The spawn page's free count under the real Kueue (issue #27): the smaller of what is free on the
nodes and what the user's queue still allows, and which one limits; a 'block' spawn the queue
allows none of is refused (409) naming the queue, in the page's words.

A GPUSpawner in this process, on a devcluster of this module's own with Kueue v0.17.0: a
ResourceFlavor for the H100 node (8 GPUs), a ClusterQueue with 2 of them, a LocalQueue
``ml-course`` in the hub's namespace, and ``kueue_queues`` sending the H100 offering there (the others count the nodes only).

On a second devcluster without Kueue (its API not served: 404), the hub's watch says so, the
nodes' count stands and the page says the queue's limit is unknown.

The spawner's event loop runs in a thread of its own, so that its watches go on while the
test waits (``wait_for``) for them to see a change.
"""

from __future__ import annotations

import asyncio
import functools
import html
import secrets
import threading

import pytest

from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.nodes import standard_nodes
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.optionalstreams import KUEUE_NOT_SERVED
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.page.cards import availability_text
from tests.conftest import fresh_namespace, wait_for
from tests.integration.test_spawner import make_spawner
from tests.kueue.test_kueue_devcluster import queues as make_queues

pytestmark = pytest.mark.cluster
H100 = "gpu-nvidia-h100-80gb-hbm3"  # the discovered offering of gpu-h100-8x (8 GPUs)


@pytest.fixture(scope="module")
def ns(kube):
    yield from fresh_namespace(kube, f"kc-{secrets.token_hex(3)}")


@pytest.fixture(scope="module")
def loop():
    """An event loop in a thread of its own; ``run(coro)`` runs a coroutine there and waits for it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture(scope="module")
def queues(kube, ns):
    """A ResourceFlavor for the H100 node, a ClusterQueue with 2 of its GPUs, LocalQueue ml-course in ``ns``."""
    make_queues(kube, ns, gpus=2)
    return "ml-course"


def in_loop(loop):
    """``run(coro)``: run a coroutine in ``loop``'s thread and wait for its result."""

    def run(coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    return run


def test_the_page_says_the_queue_limits_its_count_drops_and_a_block_spawn_is_refused(cluster, ns, loop, queues):
    run = in_loop(loop)

    async def awaited(call):
        return await call()  # (start() and stop() make their task in the loop that runs them)

    async def spawner():
        return make_spawner(cluster, ns, kueue_queues={"offerings": {H100: queues}}, admission="block")

    async def badge() -> str:
        """The spawn page as the user sees it (unescaped), from what the hub's watches hold."""
        return html.unescape(await (await spawner())._render_gpu_form())

    def page_says(text: str) -> str | None:
        page = run(badge())
        return page if text in page else None

    started = []
    try:
        # 8 free on the node, the queue allows 2: the queue limits, and the page says so
        wait_for(lambda: page_says("8 free on the nodes; your queue 'ml-course' allows 2 more"), "the page to say the queue allows 2", 60)

        # a server takes one GPU: Kueue admits it, and the count drops on both sides
        first = run(spawner())
        first.user_options = {"offering": H100}
        run(awaited(first.start))
        started.append(first)
        pod = first.spawn_state.pod_changes
        assert pod is not None and pod.labels["kueue.x-k8s.io/queue-name"] == "ml-course"
        wait_for(lambda: page_says("7 free on the nodes; your queue 'ml-course' allows 1 more"), "the page to say the queue allows 1", 60)

        second = run(spawner())
        second.user_options = {"offering": H100}
        run(awaited(second.start))
        started.append(second)
        wait_for(
            lambda: page_says("6 free on the nodes; your queue 'ml-course' allows none more"), "the page to say the queue allows none", 60
        )

        # 'block': the queue allows none, so the spawn is refused at once, in the page's words
        third = run(spawner())
        third.user_options = {"offering": H100}
        with pytest.raises(SpawnRefused) as refused:
            run(awaited(third.start))
        assert refused.value.status_code == 409 and "taken just now" not in str(refused.value)  # the queue, not a race
        assert "your queue 'ml-course' allows none more" in str(refused.value) and "6 free on the nodes" in str(refused.value), str(
            refused.value
        )
    finally:
        for server in started:
            run(awaited(functools.partial(server.stop, now=True)))


def test_without_kueue_the_nodes_are_counted_and_the_queue_limit_is_unknown(tmp_path_factory, loop):
    """A cluster that does not serve Kueue's API (404): the hub's watch says so, the nodes' count
    stands, and the page says the queue's limit is unknown (never an error, never a made-up number)."""
    from kubernetes_asyncio import client, config

    run = in_loop(loop)
    plain = DevCluster(tmp_path_factory.mktemp("no-kueue"))
    try:
        plain.up(nodes=standard_nodes())

        async def watching() -> tuple[Inventory, object]:
            api = await config.new_client_from_config(str(plain.kubeconfig))
            inventory = Inventory(client.CoreV1Api(api))
            inventory.start()
            inventory.watch_kueue("default")
            return inventory, api

        inventory, api = run(watching())
        try:
            kueue = inventory.index.kueue
            wait_for(lambda: inventory.ready and kueue.unavailable, "the inventory to find Kueue's API not served", 60)
            assert kueue.unavailable == KUEUE_NOT_SERVED
            h100 = next(o for o in inventory.index.discovered() if o.slug == H100)
            room = kueue.room(h100, inventory.index.notebook, "default", "ml-course")
            assert not room.known
            avail = inventory.index.availability(h100).within(room)
            assert avail.free == 8 and inventory.health.ready
            assert availability_text(h100, avail, "block", 0) == ("8 of 8 free on the nodes; your queue's limit is unknown", "")
        finally:
            run(inventory.stop())
            run(api.close())
    finally:
        plain.down(quiet=True)
