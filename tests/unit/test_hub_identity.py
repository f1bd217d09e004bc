"""A hub's identity on the cluster (issue 25, item 1), the quota ledger after a restart (item 6)
and the bound on stored user_options (item 6): the pure parts."""

from __future__ import annotations

import logging
from datetime import datetime

from gpuspawner.capacity.admission import Held, QuotaLedger, QuotaRequest, Quotas
from gpuspawner.core.model import Offering
from gpuspawner.hub.hubhooks import RefusalsOnOneLine
from gpuspawner.names.vocabulary import Kind
from gpuspawner.page.useroptions import MAX_VALUE_CHARS, oversized
from gpuspawner.pod.podspec import default_hub_id, hub_id_problem, hub_selector, identity, user_key


def test_zero_to_jupyterhubs_release_and_namespace_name_the_hub():
    assert default_hub_id({"HELM_RELEASE_NAME": "jhub", "POD_NAMESPACE": "course-a"}) == "course-a.jhub"
    assert default_hub_id({"HELM_RELEASE_NAME": "jhub"}) == "jhub"
    assert default_hub_id({"POD_NAMESPACE": "course-a"}) == ""  # not zero-to-jupyterhub: no identity
    long = default_hub_id({"HELM_RELEASE_NAME": "r" * 53, "POD_NAMESPACE": "n" * 63})
    other = default_hub_id({"HELM_RELEASE_NAME": "r" * 53, "POD_NAMESPACE": "n" * 62 + "m"})
    assert len(long) <= 63 and not hub_id_problem(long) and long != other


def test_a_hub_id_must_be_a_label_value():
    assert hub_id_problem("") == "" and hub_id_problem("prod.jhub_2") == ""
    assert "label value" in hub_id_problem("prod/jhub") and hub_id_problem("x" * 64) and hub_id_problem("-jhub")


def test_the_selectors_keep_to_this_hubs_objects():
    assert hub_selector("prod.jhub", "gpuspawner.io/offering") == "gpuspawner.io/offering,gpuspawner.io/hub=prod.jhub"
    assert hub_selector("", "gpuspawner.io/offering=t4") == "gpuspawner.io/offering=t4,!gpuspawner.io/hub"


def test_the_stamp_names_the_hub_and_the_user_by_id_and_creation_time():
    created = datetime(2026, 1, 2, 3, 4, 5, 678901)
    assert user_key(7, created) == "7/2026-01-02T03:04:05.678901"
    assert user_key(7) == "7"
    assert identity("prod.jhub", "7/x") == ({"gpuspawner.io/hub": "prod.jhub"}, {"gpuspawner.io/hub-user": "7/x"})
    assert identity("", "7/x") == ({}, {"gpuspawner.io/hub-user": "7/x"})


H100 = Offering(slug="h100", kind=Kind.FULL, display_name="H100", resources={"nvidia.com/gpu": 1}, counts=(1, 2, 4))


def test_restored_grants_count_what_the_saved_records_hold():
    """After a restart the ledger holds the running servers' true counts (a DRA server of 4
    GPUs, a pod not bound yet) and refuses as the hub before the restart did."""
    ledger = QuotaLedger()
    ledger.restore({"jhub/jupyter-ann": Held("full", 4, "ann")})
    decision = ledger.check(QuotaRequest("jhub/jupyter-ann--two", H100, 1, "ann", Quotas({"total": 4}), {}, {}))
    assert decision.action == "refuse" and "already hold 4" in decision.message
    ledger.grants["jhub/jupyter-bob"] = Held("full", 1, "bob")
    ledger.restore({"jhub/jupyter-bob": Held("full", 2, "bob")})  # a grant made in this process wins
    assert ledger.grants["jhub/jupyter-bob"].units == 1 and ledger.restored


def test_values_over_the_bound_are_named():
    assert oversized({"offering": "x" * MAX_VALUE_CHARS, "count": 1}) == ["offering"]
    assert oversized({"offering": "h100", "image": ["y" * 100] * 100}) == ["image"]


def test_jupyterhubs_patch_line_keeps_no_body():
    record = logging.LogRecord(
        "JupyterHub", logging.INFO, "users.py", 855, "Setting user_options on ann/notes {'offering': 'xxxx'}", None, None
    )
    assert RefusalsOnOneLine().filter(record)
    assert record.getMessage() == "Setting user_options on ann/notes (the request body is not logged)"


def test_what_counts_as_the_api_server_not_answering():
    import aiohttp
    from kubernetes_asyncio.client.rest import ApiException

    from gpuspawner.hub.scheduling import unreachable_cause

    refused = ConnectionRefusedError(111, "Connection refused")
    assert unreachable_cause(refused) is refused
    assert isinstance(unreachable_cause(aiohttp.ServerDisconnectedError()), aiohttp.ServerDisconnectedError)
    gave_up = TimeoutError("Could not create pod jhub/jupyter-ann")  # KubeSpawner's exponential_backoff
    assert unreachable_cause(gave_up) is gave_up
    try:
        try:
            raise refused
        except OSError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert unreachable_cause(wrapped) is refused
    assert unreachable_cause(TimeoutError("pod jhub/jupyter-ann did not start in 60 seconds!")) is None
    assert unreachable_cause(ApiException(status=500, reason="Internal Server Error")) is None


async def test_a_failed_request_makes_live_looking_counts_not_live_until_one_answers():
    from gpuspawner.hub.inventory import Inventory

    inventory = Inventory(api=object(), dra_api=object())
    for kind in ("nodes", "pods"):
        inventory._set_synced(kind, True)  # the watches look live
    assert inventory.health.ready
    answers = [ConnectionRefusedError("refused"), None]

    async def probe() -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    inventory.call_failed("ClientConnectorError: refused", probe, retry=0)
    health = inventory.health
    assert inventory.ready and not health.ready and health.error == "ClientConnectorError: refused" and health.as_of
    await inventory._probe_task
    assert answers == [] and inventory.health.ready and inventory.unreachable == ""


# ----------------------------------------------------------------- issue 38: an identity every hub has


def test_a_derived_identity_is_the_namespace_and_the_databases_value():
    from gpuspawner.pod.podspec import derived_hub_id

    assert derived_hub_id("course-a", "3f9a2c1b") == "course-a.3f9a2c1b"
    long, other = derived_hub_id("n" * 63, "3f9a2c1b"), derived_hub_id("n" * 63, "00000000")
    assert len(long) <= 63 and not hub_id_problem(long) and long != other


def test_the_default_pod_name_carries_six_characters_of_the_identity():
    from gpuspawner.pod.podspec import default_pod_name_template, hub_suffix

    a, b = default_pod_name_template("course-a.3f9a2c1b"), default_pod_name_template("course-a.77aa0e12")
    assert a.startswith("jupyter-{user_server}-") and len(a) == len("jupyter-{user_server}-") + 6
    assert a != b and a == default_pod_name_template("course-a.3f9a2c1b")  # stable, and one per hub
    assert a.endswith(hub_suffix("course-a.3f9a2c1b"))
    assert default_pod_name_template("") == "jupyter-{user_server}"  # no identity: KubeSpawner's own


def test_only_this_servers_own_pod_may_be_replaced():
    """Whose pod has the name a spawn wants: "" only for this hub's (or, made before the hub had
    an identity, unlabelled) pod of this very user; anything else is named, never deleted."""
    from gpuspawner.pod.podspec import pod_taken_by

    me, hub = "7/2026-01-02T03:04:05", "ns.aaaa"
    label = "gpuspawner.io/hub"
    note = "gpuspawner.io/hub-user"
    assert pod_taken_by({label: hub}, {note: me}, hub, me) == ""
    assert pod_taken_by({}, {note: me}, hub, me) == ""  # made before the upgrade: still this hub's
    assert pod_taken_by({label: "ns.bbbb"}, {note: me}, hub, me) == "a pod of the hub 'ns.bbbb'"
    assert pod_taken_by({label: "ns.bbbb"}, {note: "7/other"}, hub, me) == "a pod of the hub 'ns.bbbb'"
    assert pod_taken_by({}, {note: "7/2025-12-31T00:00:00"}, hub, me) == "a pod not made by this hub"  # another database's user 7
    assert pod_taken_by({}, {}, hub, me) == "a pod not made by this hub"  # KubeSpawner's, or anyone's
    assert "another user record (8/x)" in pod_taken_by({label: hub}, {note: "8/x"}, hub, me)
    assert pod_taken_by({}, {note: me}, "", me) == ""  # a hub without an identity, its own pod
    assert pod_taken_by({label: "ns.bbbb"}, {note: me}, "", me) == "a pod of the hub 'ns.bbbb'"


def test_the_identity_kept_in_the_database_survives_a_restart_and_differs_between_databases(tmp_path):
    """Kept in JupyterHub's own database (a sqlite file, opened as the hub opens it): the same after
    the hub is started again on it, another for another database, in the same namespace."""
    from jupyterhub import orm

    from gpuspawner.hub import hubid

    def hub_session(path):
        return orm.new_session_factory(f"sqlite:///{path}")()  # JupyterHub's own schema check passes with our table

    first = hub_session(tmp_path / "a.sqlite")
    made = hubid.stored_hub_id(first, "jhub")
    assert made.startswith("jhub.") and len(made) == len("jhub.") + 8 and not hub_id_problem(made)
    first.close()
    again = hub_session(tmp_path / "a.sqlite")  # the hub restarted: a new engine, nothing cached for it
    assert hubid.stored_hub_id(again, "other-namespace") == made  # kept, whatever the namespace now
    assert again.execute(hubid.select(hubid.TABLE.c.value)).scalars().all() == [made]
    other = hub_session(tmp_path / "b.sqlite")
    assert hubid.stored_hub_id(other, "jhub") not in ("", made)
