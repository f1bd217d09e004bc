""" "This, or else that" (firstAvailable): the offering config, the claim the spawner sends, the
counts, the page's words, the record and the user's GPU view (gpuspawner.dra.alternatives)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpuspawner.capacity.access import Requester
from gpuspawner.capacity.allocation import allocated_devices
from gpuspawner.devcluster import dradriver as d
from gpuspawner.dra.alternatives import choice_words, choices, chosen_label
from gpuspawner.dra.claimspec import device_claim_spec
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import ENV_CHOICES, ENV_OFFERING
from gpuspawner.notebook_ext.offering import offering_from_env, with_choice
from gpuspawner.notebook_ext.summary import status_line
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.page.cards import option_views
from gpuspawner.pod.podspec import pod_changes
from tests.unit.test_dra import claim, slices_of, state

A100 = d.DRA_NODES[2]  # one A100 in the balanced layout: 2g.10gb, 1g.5gb x2, 3g.20gb
ENTRY = {
    "slug": "mig-3g-or-2g",
    "kind": "mig",
    "display_name": "A100 · MIG 3g.20gb or 2g.10gb",
    "product": "NVIDIA A100-SXM4-40GB",
    "profile": "3g.20gb",
    "dra": {"alternatives": [{"profile": "2g.10gb"}]},
}


def offering():
    return offering_from_config(ENTRY, 0)


def test_the_config_lists_the_choices_in_order_and_the_claim_asks_for_the_first_available():
    alternatives = offering().claim.alternatives
    assert [(a.name, a.label, a.device_class, a.match) for a in alternatives] == [
        ("mig-3g-20gb", "MIG 3g.20gb", dn.CLASS_MIG, "3g.20gb"),
        ("mig-2g-10gb", "MIG 2g.10gb", dn.CLASS_MIG, "2g.10gb"),
    ]
    (request,) = device_claim_spec(offering().claim, 1)["devices"]["requests"]
    assert "exactly" not in request and [s["name"] for s in request["firstAvailable"]] == ["mig-3g-20gb", "mig-2g-10gb"]
    second = request["firstAvailable"][1]
    assert second["deviceClassName"] == dn.CLASS_MIG and second["count"] == 1
    assert any("'2g.10gb'" in s["cel"]["expression"] for s in second["selectors"])
    assert any("NVIDIA A100-SXM4-40GB" in s["cel"]["expression"] for s in second["selectors"])


@pytest.mark.parametrize(
    "alternatives, words",
    [
        ([], "must list 1 to 7 more choices"),
        ([{"selector": "device.attributes['gpu.nvidia.com'].type == 'mig'"}], "needs a 'label'"),
        ([{"colour": "red"}], "keys among"),
        ([{"profile": "2g.10gb", "selector": "device.attributes["}], "['alternatives'][0]['selector'][0]"),
    ],
)
def test_wrong_alternatives_say_what_to_write(alternatives, words):
    entry = {k: v for k, v in ENTRY.items() if k != "product"}  # (a product would be the label)
    with pytest.raises(OfferingConfigError) as failed:
        offering_from_config({**entry, "dra": {"alternatives": alternatives}}, 0)
    assert words in str(failed.value)


def test_counts_are_the_union_of_the_choices_and_the_page_says_each_choices_count():
    dra = state(slices=slices_of(A100))
    mine = offering()
    assert dra.availability(mine).free == 2  # the 3g.20gb and the 2g.10gb
    frees = [dra.availability(o).free for o in choices(mine)]
    assert choice_words(mine.claim, frees) == "MIG 3g.20gb (1 free), or MIG 2g.10gb if none is free (1 free)"
    dra.claim_event("ADDED", claim("other", (A100.name, "gpu-0-mig-3g20gb-9-4")))
    (row,) = option_views([mine], Requester("ann"), dra.availability, datetime.now(UTC))
    assert row.description.startswith("MIG 3g.20gb (0 free), or MIG 2g.10gb if none is free (1 free).")
    assert row.free == 1


def test_the_record_and_the_gpu_view_say_which_choice_the_pod_got():
    mine = offering()
    allocated = claim("c", (A100.name, "gpu-0-mig-2g10gb-14-0"))
    allocated["status"]["allocation"]["devices"]["results"][0]["request"] = "gpuspawner-gpu/mig-2g-10gb"
    (device,) = allocated_devices(allocated, slices_of(A100))
    assert device["request"] == "gpuspawner-gpu/mig-2g-10gb"
    assert chosen_label(mine.claim, device["request"]) == "MIG 2g.10gb"
    assert chosen_label(mine.claim, "gpuspawner-gpu") is None
    env = pod_changes(mine).env
    assert json.loads(env[ENV_CHOICES]) == [["MIG 3g.20gb", "3g.20gb"], ["MIG 2g.10gb", "2g.10gb"]]
    assert "{" not in env[ENV_CHOICES]  # KubeSpawner expands braces in env values
    seen = offering_from_env({**env, ENV_OFFERING: mine.slug})
    nvml = [{"name": "NVIDIA A100-SXM4-40GB MIG 2g.10gb", "memory_used_bytes": 0, "memory_total_bytes": 10 * 2**30}]
    shown = with_choice(seen, nvml)
    assert shown["got"] == "MIG 2g.10gb"
    assert status_line(shown, nvml, None, datetime.now(UTC)).startswith("MIG 2g.10gb · ")
    assert "got" not in with_choice(seen, {"unavailable": "no NVML"})


def test_the_documented_example_is_valid_and_counts_both_choices():
    from types import SimpleNamespace

    from gpuspawner.offerings.config import offerings_from_config
    from gpuspawner.tools.configdoc import DRA_SECTION

    code = DRA_SECTION.split("```python\n")[2].split("```", 1)[0]
    c = SimpleNamespace(GPUSpawner=SimpleNamespace())
    exec(code, {"c": c})
    (documented,) = offerings_from_config(c.GPUSpawner.offerings)
    assert state(slices=slices_of(A100)).availability(documented).capacity == 2


def test_alternatives_over_partitionable_gpus_are_counted_in_the_allocators_order():
    """Issue 41: on an empty dynamic-MIG A100 every claim gets a 3g.20gb while one fits (two), after
    which no 1g.5gb fits either (the 3g.20gbs hold all eight memory slices): 2, not the union's count;
    each choice alone has its own count (2 and 7), which the page shows beside it."""
    from tests.unit.test_dra_counters import dynamic_slices
    from tests.unit.test_dra_counters import state as counters_state

    one = d.DraNode("one", d.A100_40GB, 1, dynamic_mig=True)
    entry = {**ENTRY, "slug": "3g-or-1g", "dra": {"alternatives": [{"profile": "1g.5gb"}]}}
    mine = offering_from_config(entry, 0)
    dra = counters_state(dynamic_slices(one), pool="one")
    assert dra.availability(mine).free == 2 and dra.availability(mine).capacity == 2
    assert [dra.availability(o).free for o in choices(mine)] == [2, 7]
    # One 1g.5gb taken by someone at slice 0: a 3g.20gb at 4-7, then 1g.5gbs at 1, 2 and 3.
    dra = counters_state(dynamic_slices(one), "gpu-0-mig-1g5gb-19-0", pool="one")
    assert dra.availability(mine).free == 4


def test_an_alternative_that_picks_a_product_by_selector_must_name_it_or_the_entrys_product_would_stay():
    entry = {
        **ENTRY,
        "dra": {
            "alternatives": [{"selector": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'", "label": "H100"}]
        },
    }
    with pytest.raises(OfferingConfigError) as failed:
        offering_from_config(entry, 0)
    assert "['alternatives'][0]['product']" in str(failed.value) and "NVIDIA A100-SXM4-40GB" in str(failed.value)
    entry["dra"]["alternatives"][0]["product"] = "NVIDIA H100 80GB HBM3"
    entry["dra"]["alternatives"][0]["selector"] = "device.attributes['gpu.nvidia.com'].type == 'gpu'"
    assert len(offering_from_config(entry, 0).claim.alternatives) == 2


def test_check_config_refuses_the_contradicting_alternative_at_start_up():
    from traitlets.config import Config

    from gpuspawner import check_config

    config = Config()
    selector = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    config.GPUSpawner.offerings = [{**ENTRY, "dra": {"alternatives": [{"selector": selector, "label": "H100"}]}}]
    with pytest.raises(Exception) as refused:
        check_config(config)
    assert "c.GPUSpawner.offerings[0]" in str(refused.value) and "['alternatives'][0]['product']" in str(refused.value)
