"""What the spawn page shows per offering, for one user, now; and the default choice."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from gpuspawner.capacity.access import Requester
from gpuspawner.core.model import CPU_OFFERING, UNCOUNTED, Availability
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.page.cards import availability_text, default_choice, option_views

ZURICH = ZoneInfo("Europe/Zurich")
TUESDAY_NOON = datetime(2026, 11, 24, 12, 0, tzinfo=ZURICH)
TUESDAY_NIGHT = datetime(2026, 11, 24, 22, 0, tzinfo=ZURICH)

# Not tests/offerings.py's: the page's slugs, names, groups, windows and queue are what it asserts.
H100 = offering_from_config(
    {
        "slug": "h100",
        "kind": "full",
        "display_name": "H100",
        "product": "NVIDIA-H100",
        "counts": [1, 2, 4, 8],
        "memory_mib": 81920,
        "groups": ["researchers"],
        "windows": ["Mon-Fri 19:00-07:00", "Sat,Sun 00:00-24:00"],
    },
    0,
)
MIG = offering_from_config({"slug": "mig-1g", "kind": "mig", "profile": "1g.5gb", "display_name": "MIG 1g"}, 1)
MIG3 = offering_from_config({"slug": "mig-3g", "kind": "mig", "profile": "3g.20gb", "display_name": "MIG 3g", "admission": "queue"}, 2)
T4 = offering_from_config(
    {"slug": "t4", "kind": "shared", "replicas": 4, "display_name": "T4 share", "scalable_nodes": 3, "scale_up_minutes": 5}, 3
)
SECRET = offering_from_config({"slug": "secret", "kind": "full", "hidden": True}, 4)

AVAIL = {
    "h100": Availability(capacity=8, allocated=5, free=3, largest_free=3),
    "mig-1g": Availability(capacity=2, allocated=0, free=2, largest_free=1),
    "mig-3g": Availability(capacity=1, allocated=1, free=0, largest_free=0),
    "t4": Availability(capacity=0, allocated=0, free=0, largest_free=0),
    "secret": Availability(capacity=1, allocated=0, free=1, largest_free=1),
}
CATALOG = [CPU_OFFERING, T4, MIG, MIG3, H100, SECRET]
STUDENT = Requester("ada", frozenset({"students"}))
RESEARCHER = Requester("bob", frozenset({"researchers"}))


def availability(offering):
    return AVAIL.get(offering.slug, UNCOUNTED)


def rows(who=RESEARCHER, now=TUESDAY_NIGHT, **kw):
    return {r.slug: r for r in option_views(CATALOG, who, availability, now, **kw)}


def test_availability_texts():
    assert availability_text(H100, AVAIL["h100"], "block", 0) == ("3 of 8 free", "")
    assert availability_text(MIG3, AVAIL["mig-3g"], "block", 2) == ("queue: 2 waiting", "")  # the offering says queue
    assert availability_text(MIG3, AVAIL["mig-3g"], "block", 0) == ("none free: you would be first in the queue", "")
    assert availability_text(T4, AVAIL["t4"], "block", 0) == ("a new node starts for you, about 5 min", "")
    assert availability_text(MIG, Availability(2, 2, 0, 0), "block", 0) == ("none free", "none free right now")
    assert availability_text(MIG, Availability(2, 2, 0, 0), "warn", 0) == ("none free: your server would wait", "")
    assert availability_text(CPU_OFFERING, UNCOUNTED, "block", 0) == ("", "")


def test_hidden_never_shown_and_forbidden_shown_disabled_or_hidden():
    shown = rows(who=STUDENT)
    assert "secret" not in shown
    assert shown["h100"].disabled_reason == "not allowed for your groups"
    assert "h100" not in rows(who=STUDENT, hide_forbidden=True)
    assert rows(who=Requester("root", admin=True))["h100"].disabled_reason == ""


def test_a_choice_the_user_may_not_start_promises_no_queue_place_count_or_wait():
    # issue 29: the 3g slice (admission 'queue', none free) told a student both "not allowed
    # for your groups" and "you would be first in the queue"
    restricted = offering_from_config(
        {"slug": "mig-3g", "kind": "mig", "profile": "3g.20gb", "admission": "queue", "groups": ["researchers"]}, 2
    )
    catalog = [restricted, T4, H100]
    student = {r.slug: r for r in option_views(catalog, STUDENT, availability, TUESDAY_NIGHT)}
    assert (student["mig-3g"].availability, student["mig-3g"].disabled_reason) == ("", "not allowed for your groups")
    assert (student["h100"].availability, student["h100"].disabled_reason) == ("", "not allowed for your groups")
    researcher = {r.slug: r for r in option_views(catalog, RESEARCHER, availability, TUESDAY_NIGHT)}
    assert researcher["mig-3g"].availability == "none free: you would be first in the queue"  # theirs to queue for
    # closed by its time window or over quota: what is free, but no queue place nor scale-up
    day = {r.slug: r for r in option_views(catalog, RESEARCHER, availability, TUESDAY_NOON)}
    assert (day["h100"].availability, day["h100"].disabled) == ("3 of 8 free", True)
    over = {r.slug: r for r in option_views(catalog, RESEARCHER, availability, TUESDAY_NIGHT, quota_reason=lambda o: "over your quota")}
    assert (over["mig-3g"].availability, over["t4"].availability) == ("none free", "none free")


def test_time_window_closes_an_offering_with_the_reason():
    day = rows(now=TUESDAY_NOON)["h100"]
    assert day.disabled_reason.startswith("only available Mon-Fri 19:00-07:00 and Sat,Sun 00:00-24:00")
    assert rows(now=TUESDAY_NIGHT)["h100"].disabled_reason == ""


def test_quota_reason_and_counts_that_fit():
    shown = rows(quota_reason=lambda o: "over your quota" if o.slug == "mig-1g" else "")
    assert shown["mig-1g"].disabled_reason == "over your quota"
    assert shown["h100"].counts == (1, 2)  # 3 free on the best node: 4 and 8 do not fit now
    assert shown["mig-3g"].counts == (1,)


def test_rows_carry_plain_words():
    mig = rows()["mig-1g"]
    # NVIDIA's 4864 MiB of a 1g.5gb (issue 29), never the "5gb" of its name
    assert (mig.memory, mig.compute_share) == ("MIG: 4.8 GB, enforced by the hardware", "1/7 of the GPU's compute")
    assert mig.isolation == "hardware isolated (own memory and compute)"
    shared = rows()["t4"].isolation
    assert shared.startswith("no isolation: shares memory and compute with other users")
    # issue #25: co-tenants of a shared GPU are told what they give up in confidentiality
    assert "they see your GPU processes" in shared and "GPU fault" in shared and "not for confidential work" in shared
    assert "not for confidential" not in mig.isolation


def test_default_choice_order():
    shown = option_views(CATALOG, RESEARCHER, availability, TUESDAY_NIGHT)
    by = {o.slug: o for o in CATALOG}
    refused = {"offering": "h100", "count": "2"}  # the form shown again after a refusal keeps the choice
    assert default_choice(shown, "mig-1g", {"offering": "mig-1g"}, by, refused) == ("h100", 2)
    assert default_choice(shown, "h100", {"offering": "mig-1g"}, by, {"offering": "gone"}) == ("h100", 1)
    assert default_choice(shown, "h100", {"offering": "mig-1g"}, by) == ("h100", 1)  # else the admin's default
    assert default_choice(shown, "", {"offering": "h100", "count": "2"}, by) == ("h100", 2)  # then the last choice
    assert default_choice(shown, "", {"offering": "h100", "count": "8"}, by) == ("h100", 1)  # a count that no longer fits
    assert default_choice(shown, "", {"offering": "gone"}, by) == ("mig-1g", 1)  # then the smallest free GPU
    cpu_only = option_views([CPU_OFFERING, MIG3], STUDENT, availability, TUESDAY_NIGHT)
    assert default_choice(cpu_only, "", None, {"cpu": CPU_OFFERING, "mig-3g": MIG3}) == ("cpu", 1)  # else No GPU
