"""What an older API server drops from a claim, and what the dropped fields need
(gpuspawner.dra.gates). The stored objects are shaped as kube-apiserver 1.34 stores them with
its DRAConsumableCapacity gate off (tests/integration/test_dra_spawn.py sees it for real on
`make test-oldest-k8s`)."""

from __future__ import annotations

import copy

from gpuspawner.core.model import DeviceClaim
from gpuspawner.dra.claimspec import device_claim_spec
from gpuspawner.dra.gates import dropped, needs


def _spec_with_capacity() -> dict:
    spec = device_claim_spec(DeviceClaim(device_class="gpu.nvidia.com"), 1)
    spec["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "8Gi"}}
    return spec


def test_a_field_the_server_did_not_keep_is_named_by_its_path_and_its_feature():
    sent = _spec_with_capacity()
    stored = copy.deepcopy(sent)
    del stored["devices"]["requests"][0]["exactly"]["capacity"]
    lost = dropped(sent, stored)
    assert lost == ["devices.requests[0].exactly.capacity"]
    assert (
        needs(lost)
        == "a share of a device's capacity (consumable capacity): gate DRAConsumableCapacity, on by default from Kubernetes 1.36"
    )


def test_defaults_the_server_added_and_values_it_changed_are_not_losses():
    sent = _spec_with_capacity()
    stored = copy.deepcopy(sent)
    stored["devices"]["requests"][0]["exactly"]["adminAccess"] = False  # added by defaulting
    stored["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "8589934592"
    assert dropped(sent, stored) == []


def test_an_empty_field_or_a_missing_list_item_and_an_unknown_field():
    assert dropped({"a": {}, "b": [], "c": None}, {}) == []
    lost = dropped({"devices": {"requests": [{"name": "gpu"}, {"name": "other"}]}}, {"devices": {"requests": [{"name": "gpu"}]}})
    assert lost == ["devices.requests[1]"]
    assert needs(lost) == "devices.requests[1]: a field this API server does not keep"
    assert needs(["x.firstAvailable", "y.firstAvailable"]).count("DRAPrioritizedList") == 1
