"""The spawn page keeps each card it rendered (gpuspawner.hub.form) and is shared by every user
of the hub process: against the devcluster's real inventory, a user's page never shows another
user's allowed offerings or holdings, and never a count from before an inventory event, in
whatever order the users' pages are made (issue 39)."""

from __future__ import annotations

import asyncio
import os
import secrets
import time

import pytest
from jupyterhub.objects import Hub
from traitlets.config import Config

from gpuspawner.spawner import GPUSpawner
from tests.integration.test_spawner import User
from tests.unit.test_form import option_node, parse

pytestmark = pytest.mark.cluster

H100 = "gpu-nvidia-h100-80gb-hbm3"
RESTRICTED = {
    "slug": "half-v100",
    "kind": "custom",
    "display_name": "Half a V100",
    "resources": {"nvidia.com/vgpu": 500},
    "groups": ["researchers"],
}


def spawner_for(devcluster, namespace: str, name: str, groups=(), user=None, **gpu_config) -> GPUSpawner:
    os.environ["KUBECONFIG"] = str(devcluster.kubeconfig)
    config = Config()
    config.KubeSpawner.namespace = namespace
    config.KubeSpawner.start_timeout = 60
    config.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
    config.GPUSpawner.inventory_ready_timeout = 60.0
    config.GPUSpawner.offerings = [RESTRICTED]
    for key, value in gpu_config.items():
        setattr(config.GPUSpawner, key, value)
    user = user or User(f"{name}{secrets.token_hex(3)}", groups=groups)
    spawner = GPUSpawner(hub=Hub(), user=user, config=config)
    spawner.server = spawner.user.server
    return spawner


async def wait_for_async(check, what: str, timeout: float) -> None:
    """Poll ``check`` on the event loop (the hub's watch runs on it) until it holds; fail with ``what``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def card(html: str, slug: str):
    return option_node(parse(html), slug)


async def test_a_card_never_shows_another_users_allowed_offerings(devcluster, namespace):
    researcher = spawner_for(devcluster, namespace, "researcher", groups=["researchers"])
    student = spawner_for(devcluster, namespace, "student", groups=["students"])
    for spawner in (researcher, student, researcher, student, student, researcher):
        restricted = card(await spawner.get_options_form(), "half-v100")
        if spawner is researcher:
            assert "gs-disabled" not in restricted.attrs["class"], restricted.words
            assert "not allowed" not in restricted.words
        else:
            assert "gs-disabled" in restricted.attrs["class"]
            assert restricted.find(data_gs_reason="").words == "not allowed for your groups"


def free_of(spawner: GPUSpawner, slug: str) -> int | None:
    return spawner.availability(next(o for o in spawner.catalog_now() if o.slug == slug)).free


async def test_a_card_never_shows_another_users_holdings_or_a_count_from_before_an_event(devcluster, namespace):
    """Alice's first server holds her quota's one GPU: the page of her second server says so
    (a server's own holding is not counted against it), Bob's does not, and everyone's H100
    count is the one after Alice's pod was bound, then after it is gone."""
    running = spawner_for(devcluster, namespace, "alice", user_quota={"total": 1})
    alice = spawner_for(devcluster, namespace, "alice", user=running.user, user_quota={"total": 1})
    alice.pod_name = f"{running.pod_name}--second"  # her named server "second" (KubeSpawner's pod name for it)
    bob = spawner_for(devcluster, namespace, "bob", user_quota={"total": 1})
    await bob.catalog()  # the inventory has answered
    free = free_of(bob, H100)
    assert free, "the devcluster's H100 node has a free GPU"
    before = {s: await s.get_options_form() for s in (alice, bob)}  # every card of both rendered and kept
    for html in before.values():
        assert card(html, H100).find(data_gs_avail="").words == f"{free} of 8 free"
        assert "over your quota" not in parse(html).words

    running.user_options = {"offering": H100}
    await running.start()
    try:
        await wait_for_async(lambda: free_of(bob, H100) == free - 1, "the hub counts Alice's pod", timeout=60)
        for spawner in (bob, alice, bob, alice):
            html = await spawner.get_options_form()
            h100 = card(html, H100)
            assert h100.find(data_gs_avail="").words == f"{free - 1} of 8 free"
            assert f"{free} of 8 free" not in parse(html).words
            if spawner is alice:
                assert h100.find(data_gs_reason="").words == "over your quota"
            else:
                assert "over your quota" not in parse(html).words and "gs-disabled" not in h100.attrs["class"]
    finally:
        await running.stop(now=True)
    await wait_for_async(lambda: free_of(bob, H100) == free, "the hub counts Alice's pod gone", timeout=60)
    for spawner in (alice, bob):
        html = await spawner.get_options_form()
        assert card(html, H100).find(data_gs_avail="").words == f"{free} of 8 free"
        assert "over your quota" not in parse(html).words


async def test_a_kept_page_is_never_served_after_a_reservation_or_a_group_change(devcluster, namespace):
    """The page is kept whole between views (gpuspawner.hub.pagecache): units an admitted spawn
    holds before its pod exists (a reservation: no watch event) show on the next view, and so
    does the giving back; a user added to a group sees that group's offering at once."""
    ada = spawner_for(devcluster, namespace, "ada", groups=["students"])
    await ada.catalog()
    free = free_of(ada, H100)
    assert free, "the devcluster's H100 node has a free GPU"
    for _ in range(2):  # the second view is the kept page
        html = await ada.get_options_form()
        assert card(html, H100).find(data_gs_avail="").words == f"{free} of 8 free"
        assert "gs-disabled" in card(html, "half-v100").attrs["class"]
    index = ada.inventory.index
    h100 = next(o for o in ada.catalog_now() if o.slug == H100)
    assert index.reserve(f"{namespace}/page-cache-reservation", h100, 1) is not None
    try:
        assert card(await ada.get_options_form(), H100).find(data_gs_avail="").words == f"{free - 1} of 8 free"
    finally:
        index.release(f"{namespace}/page-cache-reservation")
    assert card(await ada.get_options_form(), H100).find(data_gs_avail="").words == f"{free} of 8 free"
    ada.user.groups.append(type("Group", (), {"name": "researchers"})())  # the admin added her to a group
    restricted = card(await ada.get_options_form(), "half-v100")
    assert "gs-disabled" not in restricted.attrs["class"] and "not allowed" not in restricted.words


async def test_students_alike_share_one_kept_page_and_one_named_in_an_offering_gets_her_own(devcluster, namespace):
    """Two students of one group, with no quota and no last choice, read the same page: the second's
    view is the first's page, kept (a class's pages are made once per event, not once per student).
    Where an offering is open to one of them by name, each gets their own page, with their own card."""
    from gpuspawner.hub.pagecache import PAGES

    ann, bea = (spawner_for(devcluster, namespace, name, groups=["students"]) for name in ("ann", "bea"))
    await ann.catalog()
    first = await ann.get_options_form()
    hits = PAGES.hits
    assert await bea.get_options_form() == first and PAGES.hits == hits + 1
    named = {**RESTRICTED, "groups": [], "users": [ann.user.name]}
    ann = spawner_for(devcluster, namespace, "ann", groups=["students"], user=ann.user, offerings=[named])
    bea = spawner_for(devcluster, namespace, "bea", groups=["students"], user=bea.user, offerings=[named])
    assert "gs-disabled" not in card(await ann.get_options_form(), "half-v100").attrs["class"]
    misses = PAGES.misses
    restricted = card(await bea.get_options_form(), "half-v100")
    assert PAGES.misses == misses + 1 and "gs-disabled" in restricted.attrs["class"]
    assert restricted.find(data_gs_reason="").words == "not allowed for your groups"


async def test_the_page_is_answered_without_a_turn_of_the_event_loop(devcluster, namespace):
    """A view, made or kept, finishes in the handler's own turn of the event loop, as KubeSpawner's
    static profile list does: JupyterHub's way with a callable form (a task of its own) costs two
    turns, each behind everything else the hub has to do (under a storm, hundreds of ms)."""

    def at_once(spawner: GPUSpawner) -> str:
        view = spawner.get_options_form()
        try:
            view.send(None)
        except StopIteration as done:
            return str(done.value)
        view.close()
        raise AssertionError("the view waited for a turn of the event loop")

    ann, bea = (spawner_for(devcluster, namespace, name, groups=["students"]) for name in ("ann", "bea"))
    await ann.catalog()
    made = at_once(ann)
    assert card(made, "half-v100") is not None
    assert at_once(bea) == made  # kept
