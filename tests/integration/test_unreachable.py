"""A graceful API-server shutdown is an outage to the hub (issue 25, item 3).

On SIGTERM kube-apiserver refuses new connections but keeps its watches open for a while,
so the inventory's watch still looks live. Here the inventory keeps its watch on the
devcluster's API server while the spawner's own client points at a closed port: the spawn's
first request is refused there. The spawn is a 503 with the reason and Retry-After, the
inventory's counts stop being live at once (the page says so, in the site's time zone, and
the next spawn is refused before it asks the cluster anything), and once something answers
on that address again the counts are live and spawns work.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime
from urllib.parse import urlparse

import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from gpuspawner.core.wording import counts_notice
from gpuspawner.devcluster.ports import free_port
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.scheduling import SpawnRefused
from tests.compat.test_without_cluster_rbac import until
from tests.integration.test_spawner import make_spawner

pytestmark = pytest.mark.cluster
T4 = "shared-tesla-t4-time-slicing-4x"


async def forward(port: int, host: str, target: int, delay: float = 0.0) -> asyncio.Server:
    """A TCP forwarder from 127.0.0.1:``port`` to ``host``:``target`` (the API server answering there
    again); with ``delay``, its answers come that many seconds late (an API server, or a hub, too
    loaded to answer a request in time), while requests pass at once."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, late: float) -> None:
        try:
            while data := await reader.read(65536):
                if late:
                    await asyncio.sleep(late)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, target)
        await asyncio.gather(pipe(reader, up_writer, 0.0), pipe(up_reader, writer, delay))

    return await asyncio.start_server(serve, "127.0.0.1", port)


async def test_a_spawn_whose_request_is_refused_is_a_503_and_the_cluster_counts_as_unreachable(devcluster, kube, namespace):
    spawner = make_spawner(devcluster, namespace, site_timezone="Europe/Zurich")
    inventory = spawner.inventory
    await until(lambda: inventory.health.ready, "the inventory to sync")
    live = spawner.api.api_client.configuration
    port = free_port()
    closed = copy.copy(live)
    closed.host = f"https://127.0.0.1:{port}"
    client = ApiClient(closed)
    Inventory._instances[closed.host] = inventory  # the same inventory, its watch still on the live API server
    forwarder = None
    try:
        spawner.api = CoreV1Api(client)
        spawner.user_options = {"offering": T4}
        with pytest.raises(SpawnRefused) as refused:
            await spawner.start()
        assert refused.value.status_code == 503 and refused.value.headers == {"Retry-After": "30"}
        zone = spawner.now().strftime("%Z")
        message = str(refused.value)
        assert message.startswith("The GPU cluster cannot be reached (since ") and f" {zone}, " in message, message
        assert inventory.ready  # the watch still looks live ...
        health = inventory.health  # ... but the counts are not, and the page says so in its zone
        assert not health.ready and "Connect" in health.error
        as_of = datetime.fromtimestamp(health.as_of, spawner.now().tzinfo)
        assert counts_notice(health, spawner.now()).startswith(
            f"The GPU cluster cannot be reached: the free counts are as of {as_of:%H:%M:%S} {zone} ("
        )
        assert not kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        assert await spawner.poll() == 1  # the hub's cleanup asks the cluster nothing

        again = make_spawner(devcluster, namespace, site_timezone="Europe/Zurich")
        again.api = CoreV1Api(client)
        again.user_options = {"offering": T4}
        with pytest.raises(SpawnRefused) as second:
            await again.start()
        assert second.value.status_code == 503

        # The API server answers on that address again: the counts are live, spawns work.
        target = urlparse(live.host)
        forwarder = await forward(port, target.hostname, target.port)
        await until(lambda: inventory.health.ready, "the counts to be live again")
        third = make_spawner(devcluster, namespace, site_timezone="Europe/Zurich")
        third.api = CoreV1Api(client)
        third.user_options = {"offering": T4}
        await third.start()
        await third.stop(now=True)
    finally:
        Inventory._instances.pop(closed.host, None)
        if forwarder is not None:
            forwarder.close()
        await client.close()


async def test_a_spawn_whose_requests_time_out_while_the_watches_answer_is_too_slow_not_unreachable(devcluster, kube, namespace):
    """Found by bench.scale at 1,000 nodes: an overloaded hub's pod creation timed out, and every
    spawn after it was refused for a minute as if the cluster were gone. The API server was
    answering the watches all along: that one spawn is refused as too slow, the counts stay live,
    and the next spawn starts."""
    spawner = make_spawner(devcluster, namespace)
    spawner.k8s_api_request_timeout = 1
    spawner.k8s_api_request_retry_timeout = 3
    inventory = spawner.inventory
    await until(lambda: inventory.health.ready, "the inventory to sync")
    live = spawner.api.api_client.configuration
    target = urlparse(live.host)
    port = free_port()
    forwarder = await forward(port, target.hostname, target.port, delay=2.5)
    slow = copy.copy(live)
    slow.host = f"https://127.0.0.1:{port}"
    client = ApiClient(slow)
    Inventory._instances[slow.host] = inventory  # the same inventory, its watch on the live API server
    try:
        spawner.api = CoreV1Api(client)
        spawner.user_options = {"offering": T4}
        with pytest.raises(SpawnRefused) as refused:
            await spawner.start()
        assert refused.value.status_code == 503, refused.value
        assert str(refused.value).startswith("The cluster is answering too slowly right now"), refused.value
        assert inventory.health.ready and not inventory.unreachable  # nobody else is told the cluster is gone
        assert not spawner.spawn_state.refused  # so the hub's cleanup polls for the pod a request may have made, and stops it

        again = make_spawner(devcluster, namespace)
        again.user_options = {"offering": T4}
        await again.start()  # through the live client: admitted, counted live, started
        await again.stop(now=True)
    finally:
        Inventory._instances.pop(slow.host, None)
        forwarder.close()
        await client.close()
        for pod in kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]:
            kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0")
