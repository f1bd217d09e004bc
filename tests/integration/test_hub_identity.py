"""Two hubs on one devcluster (issue 25, item 1): each keeps its own pods and still removes
its own orphans, in one shared namespace and with per-user namespaces; a hub whose database
is lost deletes nothing; a renamed user's pod is followed; a hub without an identity does not
reconcile where pods may be anyone's; one hub's pods never count against another's quotas.

Each hub is a GPUSpawner configuration with its own ``hub_id`` and its own JupyterHub
database (JupyterHub's tables, in memory), whose users have the same ids as the other's.
The reconcilers are GPUSpawner's own (``orphan_io``, ``hub_servers_from_db``), asked one
round at a time with no grace, so nothing here waits on a clock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from typing import Any

import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub as HubObject
from jupyterhub.objects import Server
from kubernetes_asyncio.client import V1Container, V1ObjectMeta, V1Pod, V1PodSpec
from traitlets.config import Config

from gpuspawner.capacity.admission import QuotaLedger
from gpuspawner.hub import admitting, hubid, orphans
from gpuspawner.hub.orphans import OrphanReconciler, hub_servers_from_db
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.spawner import GPUSpawner
from tests.conftest import fresh_namespace, wait_for

pytestmark = pytest.mark.cluster
T4 = "shared-tesla-t4-time-slicing-4x"


class HubUser:
    """The parts of JupyterHub's User a spawner reads, for one row of a hub's database."""

    def __init__(self, row: Any, db: Any = None) -> None:
        self.name = self.escaped_name = row.name
        self.id, self.created = row.id, row.created
        self.url = f"/user/{row.name}/"
        self.admin = False
        self.groups: list[Any] = []
        self.server = Server(base_url=self.url)
        if db is not None:
            self.db = db


class Hub:
    """One hub on the devcluster: its identity, its database, its spawners and its reconciler."""

    def __init__(
        self, devcluster, namespace: str, hub_id: str | None, user_namespaces: bool = False, db: Any = None, **gpu_config: Any
    ) -> None:
        """``hub_id`` None: not configured (derived and kept in the hub's database); ``db``: another
        hub's database (the same hub restarted)."""
        self.devcluster, self.namespace, self.hub_id = devcluster, namespace, hub_id
        self.user_namespaces, self.gpu_config = user_namespaces, gpu_config
        self.db = db if db is not None else orm.new_session_factory("sqlite:///:memory:")()
        self.ledger = QuotaLedger()  # a hub process's own (GPUSpawner's is one per process)

    def user(self, name: str) -> Any:
        row = orm.User(name=name)
        self.db.add(row)
        self.db.commit()
        return row

    def spawner(self, user: Any) -> GPUSpawner:
        os.environ["KUBECONFIG"] = str(self.devcluster.kubeconfig)
        config = Config()
        config.KubeSpawner.namespace = self.namespace
        config.KubeSpawner.enable_user_namespaces = self.user_namespaces
        config.KubeSpawner.start_timeout = 60
        config.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
        if self.hub_id is not None:
            config.GPUSpawner.hub_id = self.hub_id
        config.GPUSpawner.inventory_ready_timeout = 60.0
        for key, value in self.gpu_config.items():
            setattr(config.GPUSpawner, key, value)
        spawner = GPUSpawner(hub=HubObject(), user=user, config=config)
        spawner.server = spawner.user.server
        spawner.quota_ledger = self.ledger
        return spawner

    async def start(self, row: Any, offering: str = "cpu", running: bool = True) -> GPUSpawner:
        """Start ``row``'s server; ``running``: the database has it (else its pod is an orphan)."""
        spawner = self.spawner(self.hub_user(row))
        spawner.user_options = {"offering": offering}
        await spawner.start()
        if running:
            self.db.add(orm.Spawner(user=row, name="", server=orm.Server(), state={"pod_name": spawner.pod_name}))
            self.db.commit()
        return spawner

    def hub_user(self, row: Any) -> HubUser:
        """``row``'s user as the hub has it: with the hub's database where its identity is derived from it."""
        return HubUser(row, db=self.db if self.hub_id is None else None)

    def reconciler(self) -> OrphanReconciler:
        nobody = type("Row", (), {"name": "reconciler", "id": 0, "created": None})()
        list_objects, delete_object = self.spawner(self.hub_user(nobody)).orphan_io()
        return OrphanReconciler(list_objects, lambda: hub_servers_from_db(self.db), delete_object, grace=0, interval=3600)


@pytest.fixture
def other_namespace(kube):
    yield from fresh_namespace(kube, f"t-{secrets.token_hex(4)}")


def live_pods(kube, namespaces: set[str]) -> set[str]:
    return {
        f"{ns}/{p['metadata']['name']}"
        for ns in namespaces
        for p in kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        if "deletionTimestamp" not in p["metadata"]
    }


def where(spawner: GPUSpawner) -> str:
    return f"{spawner.namespace}/{spawner.pod_name}"


@pytest.mark.parametrize("user_namespaces", [False, True], ids=["one-namespace", "per-user-namespaces"])
async def test_each_hub_keeps_its_own_pods_and_removes_its_own_orphans(devcluster, kube, namespace, user_namespaces):
    tag = secrets.token_hex(3)
    a = Hub(devcluster, namespace, f"a-{tag}", user_namespaces)
    b = Hub(devcluster, namespace, f"b-{tag}", user_namespaces)
    # The same user ids in both databases (1 and 2); the names differ, as pod names in one namespace must.
    ann, carl = a.user(f"ann-{tag}"), a.user(f"carl-{tag}")
    bea, dora = b.user(f"bea-{tag}"), b.user(f"dora-{tag}")
    assert (ann.id, carl.id) == (bea.id, dora.id) == (1, 2)
    started: list[GPUSpawner] = []
    try:
        kept_a = await a.start(ann)
        orphan_a = await a.start(carl, running=False)  # its server is gone from A's database
        kept_b = await b.start(bea)
        orphan_b = await b.start(dora, running=False)
        started = [kept_a, orphan_a, kept_b, orphan_b]
        namespaces = {s.namespace for s in started}

        removed_a = await a.reconciler().check()
        removed_b = await b.reconciler().check()
        assert [where_(o) for o in removed_a] == [where(orphan_a)]
        assert [where_(o) for o in removed_b] == [where(orphan_b)]
        wait_for(lambda: live_pods(kube, namespaces) == {where(kept_a), where(kept_b)}, "the two orphans to go", timeout=60)
        pod = kube.request("GET", f"/api/v1/namespaces/{kept_a.namespace}/pods/{kept_a.pod_name}")
        assert pod["metadata"]["labels"]["gpuspawner.io/hub"] == a.hub_id
        assert pod["metadata"]["annotations"]["gpuspawner.io/hub-user"] == f"1/{ann.created.isoformat()}"

        # A's database is lost (same identity, nothing in it): it deletes nothing.
        lost = Hub(devcluster, namespace, a.hub_id, user_namespaces)
        assert await lost.reconciler().check() == [] and await lost.reconciler().check() == []
        # A renames ann while her server runs: the pod is followed, not deleted.
        ann.name = f"anna-{tag}"
        a.db.commit()
        assert await a.reconciler().check() == [] and await b.reconciler().check() == []
        assert live_pods(kube, namespaces) == {where(kept_a), where(kept_b)}
    finally:
        for spawner in started:
            await spawner.stop(now=True)
        if user_namespaces:
            for ns in {s.namespace for s in started} - {namespace}:
                kube.request("DELETE", f"/api/v1/namespaces/{ns}")


def where_(ref: Any) -> str:
    return f"{ref.namespace}/{ref.name}"


async def test_without_an_identity_the_reconciler_does_not_run_where_pods_may_be_anyones(devcluster, namespace, caplog):
    hub = Hub(devcluster, namespace, "", user_namespaces=True)
    saved = orphans.running, orphans.said_why_not
    orphans.running, orphans.said_why_not = None, False
    try:
        logger = logging.getLogger("traitlets")  # the spawner's log outside a hub (it does not propagate)
        logger.addHandler(caplog.handler)
        try:
            hub.spawner(HubUser(hub.user("ann"), db=hub.db))
        finally:
            logger.removeHandler(caplog.handler)
        assert orphans.running is None
        assert "the orphan reconciler does not run" in caplog.text and "c.GPUSpawner.hub_id" in caplog.text
        with_id = Hub(devcluster, namespace, "prod.jhub", user_namespaces=True)
        with_id.spawner(HubUser(with_id.user("ann"), db=with_id.db))
        assert orphans.running is not None
    finally:
        if orphans.running is not None:
            await orphans.running.stop()
        orphans.running, orphans.said_why_not = saved


async def test_another_hubs_pod_of_a_user_of_the_same_name_is_not_on_this_hubs_quota(devcluster, kube, namespace, other_namespace):
    """A user named alike on two hubs (KubeSpawner's username label is the same): hub B's
    quota of one GPU unit counts none of what the user holds on hub A."""
    tag = secrets.token_hex(3)
    a = Hub(devcluster, namespace, f"a-{tag}")
    b = Hub(devcluster, other_namespace, f"b-{tag}", user_quota={"total": 1})
    on_a = await a.start(a.user(f"ann-{tag}"), offering=T4)
    try:
        spawner = b.spawner(HubUser(b.user(f"ann-{tag}")))
        index = spawner.inventory.index
        wait_for(lambda: where(on_a) in index.pods, "the inventory to see A's pod bound", timeout=60)
        catalog = {o.slug: o for o in await spawner.catalog()}
        bound = admitting.bound_holdings(spawner, catalog)
        assert where(on_a) not in bound
        decision = admitting.check_quota(spawner, catalog[T4], 1, bound, {})
        assert decision.action == "admit", decision.message
        # ... while A's own quota does count it.
        mine = a.spawner(HubUser(a.db.query(orm.User).one()))
        assert where(on_a) in admitting.bound_holdings(mine, catalog)
    finally:
        await on_a.stop(now=True)


async def test_a_pod_made_before_the_upgrade_is_still_this_hubs_after_it(devcluster, kube, namespace):
    """Issue 38: a hub without an identity (every hub outside zero-to-jupyterhub before it) made
    ann's pod: KubeSpawner's name, no hub label, ann's user key. Upgraded and restarted on the same
    database with no hub_id set, it derives its identity from that database: ann's running server
    keeps its pod's name (its saved state), the quotas count the pod, and the reconciler keeps it
    while the server runs and removes it as an orphan once the server is gone. Another hub in the
    namespace (its own database, a user of the same id and name) neither counts nor deletes it."""
    tag = secrets.token_hex(3)
    quiet = {"reconcile_orphan_pods": False}  # (no process-wide reconciler: this test asks its own, one round at a time)
    before = Hub(devcluster, namespace, "", **quiet)  # no identity: the pods carry none
    ann = before.user(f"ann-{tag}")
    old = await before.start(ann, offering=T4)
    legacy = old.pod_name
    assert legacy == f"jupyter-ann-{tag}"  # KubeSpawner's own name
    labels = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{legacy}")["metadata"]["labels"]
    assert "gpuspawner.io/hub" not in labels
    other = Hub(devcluster, namespace, None, **quiet)
    try:
        after = Hub(devcluster, namespace, None, db=before.db, **quiet)  # the same hub, upgraded: hub_id not set
        row = after.db.query(orm.Spawner).one()
        spawner = after.spawner(after.hub_user(ann))
        spawner.load_state(row.state)  # what JupyterHub does for a running server after a restart
        assert spawner.hub_id.startswith(f"{namespace}.") and spawner.pod_name == legacy
        assert after.spawner(after.hub_user(ann)).hub_id == spawner.hub_id  # one identity per database
        newcomer = after.spawner(after.hub_user(after.user(f"carl-{tag}")))
        assert newcomer.pod_name.startswith(f"jupyter-carl-{tag}-") and newcomer.pod_name != f"jupyter-carl-{tag}"
        # The quotas count it ...
        index = spawner.inventory.index
        wait_for(lambda: where(old) in index.pods, "the inventory to see the pod bound", timeout=60)
        catalog = {o.slug: o for o in await spawner.catalog()}
        assert where(old) in admitting.bound_holdings(spawner, catalog)
        # ... and another hub's do not, though its ann has the same id and name.
        theirs = other.spawner(other.hub_user(other.user(f"ann-{tag}")))
        assert theirs.hub_id not in ("", spawner.hub_id)
        assert where(old) not in admitting.bound_holdings(theirs, catalog)
        # The reconcilers: neither deletes it while ann's server runs; the other hub never.
        assert await after.reconciler().check() == [] and await other.reconciler().check() == []
        after.db.delete(row)  # ann's server is gone from the hub's database: an orphan of this hub's
        after.db.commit()
        assert await other.reconciler().check() == []
        assert [where_(o) for o in await after.reconciler().check()] == [where(old)]
        wait_for(lambda: where(old) not in live_pods(kube, {namespace}), "the orphan to go", timeout=60)
    finally:
        await old.stop(now=True)


async def test_a_pod_of_the_name_made_after_the_check_is_read_on_the_creates_409_never_deleted(devcluster, kube, namespace):
    """Issue 38: the create's 409 AlreadyExists (a pod of that name made since the check before
    creating) is read: another hub's pod refuses the spawn (409, naming that hub) and KubeSpawner's
    delete-and-retry never runs; only this server's own leftover goes to KubeSpawner's way."""
    tag = secrets.token_hex(3)
    quiet = {"reconcile_orphan_pods": False}
    a, b = Hub(devcluster, namespace, f"a-{tag}", **quiet), Hub(devcluster, namespace, f"b-{tag}", **quiet)
    theirs = await b.start(b.user(f"ann-{tag}"))
    mine = await a.start(a.user(f"ann-{tag}"))
    try:
        uid = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{theirs.pod_name}")["metadata"]["uid"]
        asked: list[str] = []

        async def kubespawner_create(pod: Any, timeout: int) -> bool:
            asked.append(pod.metadata.name)
            return False

        def bare(name: str) -> V1Pod:  # a pod of that name (the create is refused 409 before anything else counts)
            return V1Pod(metadata=V1ObjectMeta(name=name), spec=V1PodSpec(containers=[V1Container(name="notebook", image="busybox")]))

        again = a.spawner(HubUser(a.db.query(orm.User).one()))  # A's ann, a spawn that lost the race for B's pod's name
        with pytest.raises(SpawnRefused) as refused:
            await hubid.create_pod(again, kubespawner_create, bare(theirs.pod_name), 30)
        assert refused.value.status_code == 409 and f"is taken by a pod of the hub 'b-{tag}'" in str(refused.value)
        assert asked == [] and again.spawn_state.refused  # (so the hub's cleanup asks the cluster nothing)
        assert kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{theirs.pod_name}")["metadata"]["uid"] == uid
        # A's own leftover of this very server: KubeSpawner's way (it deletes and makes it again).
        assert await hubid.create_pod(again, kubespawner_create, bare(mine.pod_name), 30) is False
        assert asked == [mine.pod_name]
        # A's pod made by this very start's earlier try, whose answer never came (a slow API server,
        # the create retried): it carries this start's stamp, and is taken as made, not deleted.
        stamp = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{mine.pod_name}")["metadata"]["annotations"][
            "gpuspawner.io/spawn"
        ]
        assert stamp == mine.spawn_state.spawn_id
        again.spawn_state.spawn_id = stamp
        assert await hubid.create_pod(again, kubespawner_create, bare(mine.pod_name), 30) is True
        assert asked == [mine.pod_name]  # KubeSpawner's delete-and-make-again was not asked
        # A stop of a server whose saved pod name B's pod now holds deletes nothing of B's.
        again.pod_name = theirs.pod_name
        await again.stop(now=True)
        assert kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{theirs.pod_name}")["metadata"]["uid"] == uid
    finally:
        await theirs.stop(now=True)
        await mine.stop(now=True)


async def test_a_create_whose_answer_came_late_is_found_in_the_pod_watch_not_made_again(devcluster, kube, namespace, caplog):
    """Issue 39: on a hub whose event loop is slow, a pod creation's answer can come after the
    create's timeout although the API server made the pod (a storm on two cores: dozens a run). The
    next try finds the pod with this start's stamp in the pod watch and takes it as made: no second
    create, no read, no 409, and the server starts."""
    tag = secrets.token_hex(3)
    a = Hub(devcluster, namespace, f"a-{tag}", reconcile_orphan_pods=False)
    spawner = a.spawner(a.hub_user(a.user(f"cy-{tag}")))
    spawner.user_options = {"offering": "cpu"}
    api = spawner.api  # (KubeSpawner's shared client: put back below)
    create, read = api.create_namespaced_pod, api.read_namespaced_pod
    creates: list[str] = []
    reads: list[str] = []

    async def answer_lost(namespace: str, body: Any, *args: Any, **kwargs: Any) -> Any:
        creates.append(body.metadata.name)
        made = await create(namespace, body, *args, **kwargs)
        if len(creates) > 1:
            return made
        key = f"{namespace}/{body.metadata.name}"
        while key not in spawner.pod_reflector.pods:  # the watch has it: only the answer is missing now
            await asyncio.sleep(0.05)
        raise TimeoutError  # (as asyncio.wait_for ends a create whose answer does not come in time)

    async def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(name)
        return await read(name, *args, **kwargs)

    api.create_namespaced_pod, api.read_namespaced_pod = answer_lost, counted
    caplog.set_level(logging.INFO)
    spawner.log.addHandler(caplog.handler)
    try:
        await spawner.start()
        assert creates == [spawner.pod_name] and reads == []
        assert "created by the try whose answer was late, is in the pod watch; taken as made" in caplog.text
        pod = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{spawner.pod_name}")
        assert pod["metadata"]["annotations"]["gpuspawner.io/spawn"] == spawner.spawn_state.spawn_id
        assert spawner.spawn_state.slow_creations == 1
    finally:
        api.create_namespaced_pod, api.read_namespaced_pod = create, read
        spawner.log.removeHandler(caplog.handler)
        await spawner.stop(now=True)


async def test_a_create_asks_the_api_server_nothing_before_it_and_reads_only_on_its_409(devcluster, kube, namespace):
    """Issue 39: a spawn's pod is created without a read before it (the API server's 409 says whether
    the name is held; one request per spawn fewer under a storm); the name another hub's pod holds is
    read once, on that 409, and the spawn refused."""
    tag = secrets.token_hex(3)
    quiet = {"reconcile_orphan_pods": False}
    a, b = Hub(devcluster, namespace, f"a-{tag}", **quiet), Hub(devcluster, namespace, f"b-{tag}", **quiet)
    theirs = await b.start(b.user(f"bo-{tag}"))
    spawner = a.spawner(a.hub_user(a.user(f"bo-{tag}")))
    reads: list[str] = []
    read = spawner.api.read_namespaced_pod

    async def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(name)
        return await read(name, *args, **kwargs)

    spawner.api.read_namespaced_pod = counted
    try:
        fresh = V1Pod(
            metadata=V1ObjectMeta(name=f"fresh-{tag}"), spec=V1PodSpec(containers=[V1Container(name="notebook", image="busybox")])
        )
        assert await spawner._make_create_pod_request(fresh, 30) is True
        assert reads == []
        held = V1Pod(
            metadata=V1ObjectMeta(name=theirs.pod_name), spec=V1PodSpec(containers=[V1Container(name="notebook", image="busybox")])
        )
        with pytest.raises(SpawnRefused) as refused:
            await spawner._make_create_pod_request(held, 30)
        assert refused.value.status_code == 409 and reads == [theirs.pod_name]
    finally:
        spawner.api.read_namespaced_pod = read
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/fresh-{tag}")
        await theirs.stop(now=True)
