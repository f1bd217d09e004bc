"""Orphaned GPU pods (pure decision, and the reconciler's rounds with in-memory I/O)."""

from __future__ import annotations

import logging

from gpuspawner.hub.orphans import ORPHANS, HubRecords, OrphanReconciler, PodRef, find_orphans


def hub(servers: dict | None = None, users: tuple[str, ...] = ("ann", "bob")) -> HubRecords:
    """This hub's database: its servers, and its users (keyed 1/..., 2/... as podspec.user_key writes them)."""
    return HubRecords(servers or {}, {f"{i}/2026-01-0{i}T00:00:00": name for i, name in enumerate(users, 1)})


def pod(name: str, user: str, server: str = "", deleting: bool = False, annotated: bool = True, kind: str = "", key: str = "") -> dict:
    notes = {"hub.jupyter.org/username": user, "hub.jupyter.org/servername": server} if annotated else {}
    if key:
        notes["gpuspawner.io/hub-user"] = key
    meta = {"name": name, "namespace": "jhub", "annotations": notes, "labels": {"gpuspawner.io/offering": "t4"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    return {"metadata": meta, **({"kind": kind} if kind else {})}


def refs(*pods: dict) -> list[PodRef]:
    return [r for r in map(PodRef.from_pod, pods) if r is not None]


def test_a_pod_is_an_orphan_only_after_the_grace_period():
    pods = refs(pod("jupyter-ann", "ann"))
    orphans, seen = find_orphans(pods, hub(), {}, now=100.0, grace=60)
    assert orphans == [] and seen == {"jhub/jupyter-ann": 100.0}
    orphans, seen = find_orphans(pods, hub(), seen, now=159.0, grace=60)
    assert orphans == []
    orphans, seen = find_orphans(pods, hub(), seen, now=160.0, grace=60)
    assert [o.key for o in orphans] == ["jhub/jupyter-ann"]


def test_owned_pods_are_kept_and_forgotten_when_their_server_is_back():
    pods = refs(pod("jupyter-ann", "ann"), pod("jupyter-ann--train", "ann", "train"))
    servers = {("ann", ""): "jupyter-ann", ("ann", "train"): None}  # None: pod name not saved yet (starting)
    assert find_orphans(pods, hub(servers), {"jhub/jupyter-ann": 0.0}, now=1000.0, grace=60) == ([], {})


def test_a_server_running_under_another_pod_name_does_not_own_the_old_pod():
    pods = refs(pod("old-pod-name", "ann"))
    orphans, _ = find_orphans(pods, hub({("ann", ""): "jupyter-ann"}), {"jhub/old-pod-name": 0.0}, now=61.0, grace=60)
    assert [o.name for o in orphans] == ["old-pod-name"]


def test_a_renamed_users_pod_is_followed_by_the_user_key():
    """JupyterHub keeps a user's id and creation time through a rename: the pod stamped
    "ann" is the server of "anna" now, and is kept; once that server is gone it is an orphan."""
    pods = refs(pod("jupyter-ann", "ann", key="1/2026-01-01T00:00:00"))
    renamed = hub({("anna", ""): "jupyter-ann"}, users=("anna", "bob"))
    assert find_orphans(pods, renamed, {}, now=1000.0, grace=0) == ([], {})
    orphans, _ = find_orphans(pods, hub({}, users=("anna", "bob")), {}, now=1000.0, grace=0)
    assert [o.name for o in orphans] == ["jupyter-ann"]


def test_a_pod_whose_user_this_database_does_not_have_is_never_an_orphan():
    """An empty (lost) database, or a pod of another database whose user has the same id and
    name but another creation time: not known to be this hub's, so never deleted."""
    stamped = refs(pod("jupyter-ann", "ann", key="1/2025-05-05T00:00:00"), pod("jupyter-bob", "bob", key="9/2026-01-09T00:00:00"))
    legacy = refs(pod("jupyter-cat", "cat"))  # no key (made before keys were stamped): matched by name
    assert find_orphans(stamped + legacy, hub(), {}, now=1000.0, grace=0) == ([], {})
    assert find_orphans(stamped + legacy, hub(users=()), {}, now=1000.0, grace=0) == ([], {})


def test_pods_being_deleted_or_without_hub_annotations_are_not_ours_to_judge():
    assert refs(pod("a", "ann", deleting=True), pod("b", "bob", annotated=False)) == []


class FakeCluster:
    def __init__(self, pods: list[dict]) -> None:
        self.pods = {(p.get("kind", "Pod"), p["metadata"]["name"]): p for p in pods}
        self.deleted: list[str] = []
        self.down = False

    async def list_pods(self) -> list[dict]:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        return list(self.pods.values())

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        self.deleted.append(f"{namespace}/{name}" if kind == "Pod" else f"{kind}:{namespace}/{name}")
        self.pods.pop((kind, name))


def counted(action: str) -> float:
    return ORPHANS.labels(action)._value.get()


async def test_reconciler_deletes_orphans_logs_each_and_counts_them(caplog):
    cluster = FakeCluster([pod("jupyter-ann", "ann"), pod("jupyter-bob", "bob")])
    now = [0.0]
    reconciler = OrphanReconciler(
        cluster.list_pods,
        lambda: hub({("bob", ""): "jupyter-bob"}),
        cluster.delete,
        grace=30,
        interval=1,
        clock=lambda: now[0],
        log=logging.getLogger("t"),
    )
    before = counted("deleted")
    assert await reconciler.check() == []
    now[0] = 31.0
    with caplog.at_level(logging.WARNING):
        orphans = await reconciler.check()
    assert [o.key for o in orphans] == ["jhub/jupyter-ann"] and cluster.deleted == ["jhub/jupyter-ann"]
    assert "deleted orphaned GPU pod jhub/jupyter-ann: no server ann in the hub for 30s" in caplog.text
    assert counted("deleted") == before + 1
    assert list(cluster.pods) == [("Pod", "jupyter-bob")]


async def test_a_claim_template_is_judged_like_the_pod_it_is_named_after(caplog):
    """A DRA offering's template whose pod was never made (the hub stopped in between) is an
    orphan once its server is gone; the running server's template is kept."""
    cluster = FakeCluster(
        [
            pod("jupyter-ann", "ann", kind="ResourceClaimTemplate"),
            pod("jupyter-bob", "bob", kind="ResourceClaimTemplate"),
            pod("jupyter-bob", "bob"),
        ]
    )
    reconciler = OrphanReconciler(cluster.list_pods, lambda: hub({("bob", ""): "jupyter-bob"}), cluster.delete, grace=0, interval=1)
    with caplog.at_level(logging.WARNING):
        orphans = await reconciler.check()
    assert [o.key for o in orphans] == ["ResourceClaimTemplate:jhub/jupyter-ann"]
    assert cluster.deleted == ["ResourceClaimTemplate:jhub/jupyter-ann"]
    assert sorted(cluster.pods) == [("Pod", "jupyter-bob"), ("ResourceClaimTemplate", "jupyter-bob")]
    assert "deleted orphaned ResourceClaimTemplate jhub/jupyter-ann: no server ann in the hub" in caplog.text


async def test_dry_run_only_logs_and_a_failed_delete_is_tried_again(caplog):
    cluster = FakeCluster([pod("jupyter-ann", "ann")])
    dry = OrphanReconciler(cluster.list_pods, hub, cluster.delete, grace=0, interval=1, dry_run=True)
    before = counted("would_delete")
    with caplog.at_level(logging.WARNING):
        await dry.check()
    assert cluster.deleted == [] and counted("would_delete") == before + 1
    assert "DRY RUN: would delete orphaned GPU pod jhub/jupyter-ann" in caplog.text

    real = OrphanReconciler(cluster.list_pods, hub, cluster.delete, grace=0, interval=1)
    real.first_seen = {"jhub/jupyter-ann": -1.0}
    cluster.down = True
    failed = counted("failed")
    try:
        await real.check()
    except ConnectionRefusedError:
        pass  # listing fails first: the loop logs it and tries again next round
    cluster.down = False
    await real.check()
    assert cluster.deleted == ["jhub/jupyter-ann"] and counted("failed") == failed
