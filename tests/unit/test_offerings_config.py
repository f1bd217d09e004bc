"""Admin config -> Offering: shortcuts per kind, validation messages, overrides, merge, catalog.

Pure: plain dicts in, dataclasses out. Every error must name the entry index, the slug
(when there is one) and the field, so an admin can find the line in jupyterhub_config.py.
"""

from __future__ import annotations

import pytest

from gpuspawner.core.model import CPU_OFFERING, DEFAULT_GPU_TOLERATION, Offering
from gpuspawner.core.nodeclass import GKE_ACCELERATOR_LABEL, GKE_PARTITION_LABEL, mig_profile_of, mig_profile_parts, mig_resource_name
from gpuspawner.core.wording import memory_phrase, share_phrase
from gpuspawner.devcluster.nodes import standard_nodes
from gpuspawner.names.nvidia import GPU, GPU_SHARED, PRODUCT_LABEL
from gpuspawner.names.vocabulary import Isolation, Kind
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog, merge
from gpuspawner.offerings.config import offering_from_config, offerings_from_config
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.offerings.overrides import apply_overrides

DEFAULT_TOL = dict(DEFAULT_GPU_TOLERATION)


def build(raw, index=0):
    return offering_from_config(raw, index)


def config_error(raw, index=0) -> str:
    with pytest.raises(OfferingConfigError) as info:
        offering_from_config(raw, index)
    return str(info.value)


# ----------------------------------------------------------------------------- MIG names


@pytest.mark.parametrize(
    "profile, resource",
    [
        ("1g.5gb", "nvidia.com/mig-1g.5gb"),
        ("3g.20gb", "nvidia.com/mig-3g.20gb"),
        ("7g.80gb", "nvidia.com/mig-7g.80gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),  # '+' becomes '.'
        ("1g.12gb-me", "nvidia.com/mig-1g.12gb-me"),  # '-me' stays
    ],
)
def test_mig_resource_name_follows_device_plugin(profile, resource):
    assert mig_resource_name(profile) == resource


@pytest.mark.parametrize(
    "resource, profile",
    [
        ("nvidia.com/mig-3g.20gb", "3g.20gb"),
        ("nvidia.com/mig-1g.10gb.me", "1g.10gb+me"),
        ("nvidia.com/mig-1g.12gb-me", "1g.12gb-me"),
        ("nvidia.com/gpu", None),
        ("nvidia.com/gpu.shared", None),
        ("nvidia.com/mig-1g.5gb.count", None),
        ("nvidia.com/mig-1g.5gb.memory", None),
    ],
)
def test_mig_profile_of(resource, profile):
    assert mig_profile_of(resource) == profile


def test_mig_profile_round_trips_through_resource_name():
    for profile in ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.10gb+me", "2g.12gb+me"):
        assert mig_profile_of(mig_resource_name(profile)) == profile


@pytest.mark.parametrize(
    "profile, parts",
    [
        ("1g.5gb", (1, 5)),
        ("3g.20gb", (3, 20)),
        ("7g.80gb", (7, 80)),
        ("1g.10gb+me", (1, 10)),
        ("1c.3g.20gb", (3, 20)),
        ("3g", None),
        ("gpu", None),
        ("", None),
        ("3G.20GB", None),
    ],
)
def test_mig_profile_parts(profile, parts):
    assert mig_profile_parts(profile) == parts


# ------------------------------------------------------------------- kinds and shortcuts


def test_full_with_product_selects_nodes_of_that_product_and_keeps_counts_sorted_unique():
    o = build({"slug": "a100", "kind": "full", "product": "NVIDIA-A100-SXM4-40GB", "counts": [4, 1, 2, 2]})
    assert o.kind is Kind.FULL
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}
    assert o.counts == (1, 2, 4)
    assert o.tolerations == (DEFAULT_TOL,)
    assert o.isolation is Isolation.EXCLUSIVE
    assert o.display_name == "a100"  # defaults to the slug
    assert o.source == "config"
    assert o.limits_for(4) == {GPU: 4}


def test_mig_mixed_is_the_default_strategy():
    o = build({"slug": "mig3", "kind": "mig", "profile": "3g.20gb", "product": "NVIDIA-A100-SXM4-40GB"})
    assert dict(o.resources) == {"nvidia.com/mig-3g.20gb": 1}
    assert dict(o.node_selector) == {PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}
    assert o.memory_mib == 19968  # NVIDIA's table for an A100 40GB's 3g.20gb, not 20 * 1024
    assert o.compute_share == "3/7 of the GPU's compute"
    assert o.isolation is Isolation.HARDWARE
    assert o.counts == (1,)


def test_mig_mixed_plus_me_profile_gets_dot_me_resource():
    o = build({"slug": "mig-me", "kind": "mig", "profile": "1g.10gb+me"})
    assert dict(o.resources) == {"nvidia.com/mig-1g.10gb.me": 1}
    assert dict(o.node_selector) == {}
    assert o.memory_mib is None  # 1g.10gb has other memory on other GPUs, and no product is named


def test_mig_single_strategy_selects_on_product_mig_suffix():
    o = build({"slug": "s1", "kind": "mig", "profile": "1g.5gb", "mig_strategy": "single", "product": "NVIDIA-A100-SXM4-40GB"})
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}


def test_mig_gke_strategy_selects_partition_size_and_accelerator():
    o = build({"slug": "g1", "kind": "mig", "profile": "1g.5gb", "mig_strategy": "gke", "product": "nvidia-tesla-a100"})
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {GKE_PARTITION_LABEL: "1g.5gb", GKE_ACCELERATOR_LABEL: "nvidia-tesla-a100"}
    o2 = build({"slug": "g2", "kind": "mig", "profile": "2g.10gb", "mig_strategy": "gke"})
    assert dict(o2.node_selector) == {GKE_PARTITION_LABEL: "2g.10gb"}


def test_shared_defaults_to_renamed_time_slicing_without_isolation():
    o = build({"slug": "t4", "kind": "shared", "product": "Tesla-T4", "replicas": 4})
    assert dict(o.resources) == {GPU_SHARED: 1}
    assert dict(o.node_selector) == {PRODUCT_LABEL: "Tesla-T4"}
    assert o.isolation is Isolation.NONE
    assert o.compute_share == "1/4 of the GPU (time-sliced)" == share_phrase(4, "time-slicing")


def test_shared_not_renamed_uses_plain_gpu_and_shared_product_suffix():
    o = build({"slug": "t4s", "kind": "shared", "product": "Tesla-T4", "rename_by_default": False})
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {PRODUCT_LABEL: "Tesla-T4-SHARED"}


def test_shared_mps_is_partly_isolated():
    o = build({"slug": "l4", "kind": "shared", "sharing": "mps", "replicas": 2, "product": "NVIDIA-L4"})
    assert o.isolation is Isolation.PARTIAL
    assert o.compute_share == "1/2 of the GPU (MPS share)"


def test_explicit_isolation_and_compute_share_win_over_derived():
    o = build({"slug": "l4", "kind": "shared", "sharing": "mps", "isolation": "none", "compute_share": "some"})
    assert o.isolation is Isolation.NONE
    assert o.compute_share == "some"


def test_vgpu_with_site_class_selector():
    o = build({"slug": "v100-8g", "kind": "vgpu", "node_selector": {"vgpu.type": "v100-8g-8GB"}})
    assert dict(o.resources) == {GPU: 1}
    assert dict(o.node_selector) == {"vgpu.type": "v100-8g-8GB"}
    assert o.isolation is Isolation.VM
    assert o.tolerations == (DEFAULT_TOL,)


def test_vgpu_with_product_only_selects_the_product():
    o = build({"slug": "a10q", "kind": "vgpu", "product": "NVIDIA-A10-24Q"})
    assert dict(o.node_selector) == {PRODUCT_LABEL: "NVIDIA-A10-24Q"}


def test_custom_resources_hami_style():
    o = build({"slug": "hami", "kind": "custom", "resources": {"nvidia.com/gpumem": 4000, "nvidia.com/gpucores": "30"}})
    assert dict(o.resources) == {"nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30}  # digit strings become ints
    assert o.isolation is Isolation.SITE
    assert dict(o.node_selector) == {}


def test_custom_command_prefix_without_resources():
    o = build({"slug": "bitfusion", "kind": "custom", "command_prefix": ["bitfusion", "run", "-n", "1", "-p", "0.5", "--"]})
    assert dict(o.resources) == {}
    assert o.command_prefix == ("bitfusion", "run", "-n", "1", "-p", "0.5", "--")


def test_cpu_offering_has_no_gpu_and_no_toleration():
    o = build({"slug": "cpu", "kind": "cpu"})
    assert o.kind is Kind.CPU and not o.is_gpu
    assert dict(o.resources) == {}
    assert o.tolerations == ()
    assert o.isolation is Isolation.NO_GPU


def test_explicit_resources_and_node_selector_win_over_shortcuts():
    o = build(
        {
            "slug": "x",
            "kind": "mig",
            "profile": "3g.20gb",
            "product": "A100",
            "resources": {"example.com/mig": 2},
            "node_selector": {"pool": "mig"},
        }
    )
    assert dict(o.resources) == {"example.com/mig": 2}
    assert dict(o.node_selector) == {"pool": "mig"}


def test_tolerations_replace_default_and_extra_tolerations_add():
    sku = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    replaced = build({"slug": "a", "kind": "full", "tolerations": [sku]})
    assert replaced.tolerations == (sku,)
    added = build({"slug": "b", "kind": "full", "extra_tolerations": [sku]})
    assert added.tolerations == (DEFAULT_TOL, sku)


def test_memory_and_text_fields_are_kept():
    o = build(
        {
            "slug": "a",
            "kind": "full",
            "display_name": "A100 · whole",
            "description": "d",
            "memory_mib": 40960,
            "env": {"X": "1"},
            "labels": {"l": "v"},
            "annotations": {"a": "b"},
            "groups": ["ml"],
            "users": ["ann"],
            "hidden": True,
        }
    )
    assert (o.display_name, o.description, o.memory_mib) == ("A100 · whole", "d", 40960)
    assert (dict(o.env), dict(o.labels), dict(o.annotations)) == ({"X": "1"}, {"l": "v"}, {"a": "b"})
    assert (o.groups, o.users, o.hidden) == (("ml",), ("ann",), True)
    assert memory_phrase(o.memory_mib) == "40 GB GPU memory"


def test_memory_phrase_below_one_gib():
    assert Offering(slug="s", kind=Kind.CUSTOM, display_name="s", memory_mib=512).memory_mib == 512
    assert memory_phrase(512) == "512 MiB GPU memory"
    assert memory_phrase(CPU_OFFERING.memory_mib) == ""


def test_summary_is_json_ready():
    o = build({"slug": "a", "kind": "full", "counts": [1, 2]})
    s = o.summary()
    assert s["slug"] == "a" and s["kind"] == "full"
    assert s["limits"] == {GPU: "1"}
    assert s["counts"] == [1, 2]
    assert s["tolerations"] == [DEFAULT_TOL]
    assert s["isolation"] == "exclusive" and s["isolation_phrase"] == "the whole GPU is yours"


# ------------------------------------------------------------------ validation messages

WHERE_3 = "c.GPUSpawner.offerings[3] (slug 'a100')"


def test_unknown_field_names_index_slug_and_suggests():
    msg = config_error({"slug": "a100", "kind": "full", "node_selecter": {"a": "b"}}, 3)
    assert msg.startswith(WHERE_3)
    assert "unknown field 'node_selecter'" in msg
    assert "did you mean 'node_selector'?" in msg


def test_unknown_field_for_kind_suggests_or_lists_fields():
    # 'profile' exists, but not for kind 'full'
    msg = config_error({"slug": "a100", "kind": "full", "profile": "3g.20gb"}, 3)
    assert msg.startswith(WHERE_3)
    assert "unknown field 'profile'" in msg
    # nothing close: the message lists the fields of the kind
    msg = config_error({"slug": "a100", "kind": "cpu", "zzzzzz": 1}, 3)
    assert "unknown field 'zzzzzz'" in msg
    assert "fields for kind 'cpu' are [" in msg and "'display_name'" in msg


def test_wrong_kind_lists_kinds():
    msg = config_error({"slug": "a100", "kind": "gpu"}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'kind'" in msg
    assert "['cpu', 'shared', 'mig', 'full', 'vgpu', 'custom']" in msg
    assert "'gpu'" in msg


def test_missing_kind_and_missing_slug():
    msg = config_error({"slug": "a100"}, 3)
    assert msg.startswith(WHERE_3) and "field 'kind' is required" in msg
    msg = config_error({"kind": "full"}, 5)
    assert msg.startswith("c.GPUSpawner.offerings[5]: field 'slug' is required")


@pytest.mark.parametrize("slug", ["A100", "a_100", "-a", "a-", "a" * 64, "", "a b"])
def test_bad_slug(slug):
    msg = config_error({"slug": slug, "kind": "full"}, 1)
    assert msg.startswith("c.GPUSpawner.offerings[1]")
    assert "field 'slug'" in msg


def test_entry_not_a_dict_names_index_and_type():
    msg = config_error(["slug", "a"], 2)
    assert msg.startswith("c.GPUSpawner.offerings[2]: must be a dict, got list")


def test_whole_list_must_be_a_list():
    with pytest.raises(OfferingConfigError, match=r"must be a list of dicts, got dict"):
        offerings_from_config({"slug": "a"})


@pytest.mark.parametrize(
    "counts, problem",
    [
        ([0], "must be a positive integer, got 0"),
        ([-2], "must be a positive integer, got -2"),
        ([True], "must be a positive integer, got True"),
        (["2"], "must be a positive integer, got '2'"),
        ([1.5], "must be a positive integer, got 1.5"),
        ([], "must be a non-empty list"),
        (2, "must be a non-empty list"),
        ("1,2", "must be a non-empty list"),
    ],
)
def test_bad_counts(counts, problem):
    msg = config_error({"slug": "a100", "kind": "full", "counts": counts}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'counts'" in msg
    assert problem in msg


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("mig", {"profile": "1g.5gb"}),
        ("shared", {}),
        ("vgpu", {"product": "NVIDIA-A10-24Q"}),
        ("custom", {"resources": {"x.com/y": 1}}),
        ("cpu", {}),
    ],
)
def test_counts_only_for_full(kind, extra):
    msg = config_error({"slug": "a100", "kind": kind, "counts": [1, 2], **extra}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'counts' applies to whole GPUs only" in msg
    # [1] is fine for every kind
    assert build({"slug": "a100", "kind": kind, "counts": [1], **extra}).counts == (1,)


@pytest.mark.parametrize("profile", ["3g", "big", "20gb", "3g20gb", 3])
def test_bad_mig_profile(profile):
    msg = config_error({"slug": "a100", "kind": "mig", "profile": profile}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'profile'" in msg


def test_mig_profile_with_trailing_garbage_is_rejected():
    # An extended resource name is 'prefix/name' with name [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?:
    # 'nvidia.com/mig-3g.20gb x' can never exist, so the profile must be refused at config time
    # (today mig_profile_parts only anchors the start of the profile).
    msg = config_error({"slug": "a100", "kind": "mig", "profile": "3g.20gb x"}, 3)
    assert "field 'profile'" in msg


def test_mig_profile_required():
    msg = config_error({"slug": "a100", "kind": "mig"}, 3)
    assert msg.startswith(WHERE_3) and "field 'profile' is required" in msg


def test_mig_single_without_product():
    msg = config_error({"slug": "a100", "kind": "mig", "profile": "1g.5gb", "mig_strategy": "single"}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'product' is required with mig_strategy 'single'" in msg


def test_bad_mig_strategy():
    msg = config_error({"slug": "a100", "kind": "mig", "profile": "1g.5gb", "mig_strategy": "none"}, 3)
    assert "field 'mig_strategy' must be 'mixed', 'single' or 'gke', got 'none'" in msg


def test_custom_without_resources():
    msg = config_error({"slug": "a100", "kind": "custom"}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'resources' is required for a custom offering" in msg


def test_vgpu_without_selector():
    msg = config_error({"slug": "a100", "kind": "vgpu"}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'node_selector' is required for a vgpu offering" in msg
    msg = config_error({"slug": "a100", "kind": "vgpu", "node_selector": {}}, 3)
    assert "field 'node_selector' is required" in msg


def test_shared_not_renamed_needs_product_or_selector():
    # rename_by_default False: shares are plain nvidia.com/gpu, told apart from whole GPUs only by
    # the '-SHARED' product label. Without product or node_selector the offering selects every GPU
    # node, whole GPUs included (same reason mig_strategy 'single' requires product).
    msg = config_error({"slug": "a100", "kind": "shared", "rename_by_default": False}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'product'" in msg


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("sharing", "vgpu", "field 'sharing' must be 'time-slicing' or 'mps'"),
        ("replicas", 0, "field 'replicas' must be a positive integer, got 0"),
        ("replicas", "4", "field 'replicas' must be a positive integer, got '4'"),
        ("rename_by_default", "yes", "field 'rename_by_default' must be true or false, got 'yes'"),
    ],
)
def test_bad_shared_fields(field, value, problem):
    msg = config_error({"slug": "a100", "kind": "shared", field: value}, 3)
    assert msg.startswith(WHERE_3)
    assert problem in msg


def test_cpu_with_resources():
    msg = config_error({"slug": "a100", "kind": "cpu", "resources": {"nvidia.com/gpu": 1}}, 3)
    assert "field 'resources' must be empty for a cpu offering" in msg


@pytest.mark.parametrize(
    "resources, problem",
    [
        ({}, "must be a non-empty dict"),
        ([("nvidia.com/gpu", 1)], "must be a non-empty dict"),
        ({"gpu": 1}, "extended resource names look like 'vendor.com/name'"),
        ({"nvidia.com/gpu": 0}, "must be a positive integer, got 0"),
        ({"nvidia.com/gpu": 0.5}, "cannot be fractional"),
        ({"nvidia.com/gpu": "500m"}, "cannot be fractional"),
        ({"nvidia.com/gpu": True}, "must be a positive integer, got True"),
    ],
)
def test_bad_resources(resources, problem):
    msg = config_error({"slug": "a100", "kind": "custom", "resources": resources}, 3)
    assert msg.startswith(WHERE_3)
    assert "field 'resources" in msg
    assert problem in msg


@pytest.mark.parametrize(
    "tolerations",
    [
        {"key": "sku"},  # not a list
        "sku=gpu:NoSchedule",
        [{"key": "sku", "operator": "In", "value": "gpu"}],  # bad operator
        [{"key": "sku", "values": ["gpu"]}],  # unknown key
        ["sku"],  # not a dict
    ],
)
def test_bad_tolerations(tolerations):
    for name in ("tolerations", "extra_tolerations"):
        msg = config_error({"slug": "a100", "kind": "full", name: tolerations}, 3)
        assert msg.startswith(WHERE_3)
        assert f"field '{name}'" in msg


def test_toleration_with_misspelt_effect_is_rejected():
    # The API server refuses a pod whose toleration effect is not NoSchedule, PreferNoSchedule or
    # NoExecute; catching it at config time beats a failed spawn.
    msg = config_error(
        {"slug": "a100", "kind": "full", "extra_tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedul"}]},
        3,
    )
    assert msg.startswith(WHERE_3)
    assert "field 'extra_tolerations'" in msg


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("display_name", 5, "field 'display_name' must be a non-empty string, got 5"),
        ("groups", "admins", "field 'groups' must be a list of non-empty strings, got 'admins'"),
        ("users", [""], "field 'users' must be a list of non-empty strings"),
        ("env", {"A": 1}, "field 'env' must be a dict of strings to strings"),
        ("labels", ["a"], "field 'labels' must be a dict of strings to strings"),
        ("hidden", "no", "field 'hidden' must be true or false, got 'no'"),
        ("memory_mib", -1, "field 'memory_mib' must be a positive integer, got -1"),
        ("isolation", "total", "field 'isolation' must be one of ['exclusive'"),
        ("command_prefix", "bitfusion run", "field 'command_prefix' must be a list of non-empty strings"),
        ("node_selector", {"a": 1}, "field 'node_selector' must be a dict of strings to strings"),
    ],
)
def test_bad_common_fields(field, value, problem):
    msg = config_error({"slug": "a100", "kind": "full", field: value}, 3)
    assert msg.startswith(WHERE_3)
    assert problem in msg


def test_duplicate_slugs_name_both_entries():
    with pytest.raises(OfferingConfigError) as info:
        offerings_from_config(
            [
                {"slug": "cpu", "kind": "cpu"},
                {"slug": "a100", "kind": "full"},
                {"slug": "a100", "kind": "mig", "profile": "1g.5gb"},
            ]
        )
    msg = str(info.value)
    assert msg.startswith("c.GPUSpawner.offerings[2]")
    assert "slug 'a100' is already used by entry 1" in msg


def test_error_in_later_entry_names_that_entry():
    with pytest.raises(OfferingConfigError) as info:
        offerings_from_config([{"slug": "cpu", "kind": "cpu"}, {"slug": "bad", "kind": "mig", "profile": "x"}])
    assert str(info.value).startswith("c.GPUSpawner.offerings[1] (slug 'bad'): field 'profile'")


def test_valid_list_keeps_order():
    out = offerings_from_config([{"slug": "b", "kind": "full"}, {"slug": "a", "kind": "cpu"}])
    assert [o.slug for o in out] == ["b", "a"]


# -------------------------------------------------------------------------- overrides


def _discovered():
    return [
        build({"slug": "gpu-h100", "kind": "full", "display_name": "H100 80GB", "counts": [1, 2, 4, 8]}),
        build({"slug": "mig-a100-1g", "kind": "mig", "profile": "1g.5gb", "display_name": "A100 · MIG 1g.5gb"}),
    ]


def test_override_rename_hide_restrict():
    out = apply_overrides(
        _discovered(),
        {
            "gpu-h100": {"display_name": "H100 (ask first)", "groups": ["hpc"], "users": ["ann"], "description": "big"},
            "mig-a100-1g": {"hidden": True},
        },
    )
    assert [o.slug for o in out] == ["gpu-h100", "mig-a100-1g"]
    h100, mig = out
    assert (h100.display_name, h100.description, h100.groups, h100.users) == ("H100 (ask first)", "big", ("hpc",), ("ann",))
    assert h100.hidden is False
    assert mig.hidden is True and mig.display_name == "A100 · MIG 1g.5gb"


def test_override_counts_for_full_only():
    out = apply_overrides(_discovered(), {"gpu-h100": {"counts": [2, 1]}})
    assert out[0].counts == (1, 2)
    with pytest.raises(OfferingConfigError) as info:
        apply_overrides(_discovered(), {"mig-a100-1g": {"counts": [1, 2]}})
    msg = str(info.value)
    assert msg.startswith("c.GPUSpawner.offering_overrides['mig-a100-1g']")
    assert "field 'counts' applies to whole-GPU offerings only" in msg


def test_override_counts_validated():
    with pytest.raises(OfferingConfigError, match=r"field 'counts' must be a positive integer, got 0"):
        apply_overrides(_discovered(), {"gpu-h100": {"counts": [0]}})


def test_override_env_labels_merge_and_tolerations_append():
    sku = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    base = [build({"slug": "a", "kind": "full", "env": {"A": "1", "B": "2"}, "labels": {"x": "1"}})]
    (o,) = apply_overrides(base, {"a": {"env": {"B": "3", "C": "4"}, "labels": {"y": "2"}, "extra_tolerations": [sku]}})
    assert dict(o.env) == {"A": "1", "B": "3", "C": "4"}
    assert dict(o.labels) == {"x": "1", "y": "2"}
    assert o.tolerations == (DEFAULT_TOL, sku)


def test_override_unknown_field_refused_even_for_missing_slug():
    with pytest.raises(OfferingConfigError) as info:
        apply_overrides([], {"not-there": {"resources": {GPU: 2}}})
    msg = str(info.value)
    assert msg.startswith("c.GPUSpawner.offering_overrides['not-there']")
    assert "field 'resources' cannot be overridden" in msg


def test_override_for_missing_slug_is_not_an_error():
    before = _discovered()
    assert apply_overrides(before, {"gone": {"hidden": True}}) == before


def test_override_must_be_dict_of_dicts():
    with pytest.raises(OfferingConfigError, match=r"must be a dict of slug -> dict, got list"):
        apply_overrides(_discovered(), [("gpu-h100", {})])
    with pytest.raises(OfferingConfigError, match=r"offering_overrides\['gpu-h100'\]: must be a dict, got str"):
        apply_overrides(_discovered(), {"gpu-h100": "hidden"})


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"hidden": "yes"}, "field 'hidden' must be true or false"),
        ({"groups": "admins"}, "field 'groups' must be a list of non-empty strings"),
        ({"display_name": ""}, "field 'display_name' must be a non-empty string"),
    ],
)
def test_override_bad_values(change, problem):
    with pytest.raises(OfferingConfigError) as info:
        apply_overrides(_discovered(), {"gpu-h100": change})
    assert str(info.value).startswith("c.GPUSpawner.offering_overrides['gpu-h100']")
    assert problem in str(info.value)


@pytest.mark.parametrize("change", [{"hidden": "yes"}, {"groups": "admins"}, {"display_name": ""}])
def test_catalog_config_validates_override_values_before_any_slug_matches(change):
    # CatalogConfig.configured() says "Overrides are validated even when no discovered slug matches
    # yet", but only field names are: a bad value slips through until the node it names appears,
    # and then build_catalog fails on a live hub.
    with pytest.raises(OfferingConfigError) as info:
        CatalogConfig(offerings=[], overrides={"gpu-h100": change}).configured()
    assert "offering_overrides['gpu-h100']" in str(info.value)


# ------------------------------------------------------------------- merge and catalog


def test_merge_configured_wins_and_comes_first():
    configured = [build({"slug": "gpu-h100", "kind": "full", "display_name": "Mine"})]
    discovered = _discovered()
    out = merge(configured, discovered)
    assert [o.slug for o in out] == ["gpu-h100", "mig-a100-1g"]
    assert out[0].display_name == "Mine"


def test_catalog_from_standard_nodes_with_overrides_and_cpu():
    cfg = CatalogConfig(
        offerings=[{"slug": "bitfusion", "kind": "custom", "command_prefix": ["bitfusion", "run", "-n", "1", "--"]}],
        overrides={
            "gpu-nvidia-h100-80gb-hbm3": {"display_name": "H100", "groups": ["hpc"], "counts": [1, 2]},
            "vgpu-nvidia-a10-24q": {"hidden": True},
        },
    )
    out = build_catalog(cfg, standard_nodes())
    slugs = [o.slug for o in out]
    assert slugs[0] == "cpu" and slugs[1] == "bitfusion"
    by = {o.slug: o for o in out}
    assert by["gpu-nvidia-h100-80gb-hbm3"].display_name == "H100"
    assert by["gpu-nvidia-h100-80gb-hbm3"].groups == ("hpc",)
    assert by["gpu-nvidia-h100-80gb-hbm3"].counts == (1, 2)
    assert by["vgpu-nvidia-a10-24q"].hidden is True
    assert len(slugs) == len(set(slugs)) == 13  # cpu + bitfusion + 11 discovered


def test_catalog_without_discovery_or_cpu_is_an_error():
    with pytest.raises(OfferingConfigError, match="GPUSpawner has nothing to offer"):
        build_catalog(CatalogConfig(discover=False, include_cpu=False), None)


def test_catalog_keeps_configured_cpu_instead_of_builtin():
    out = build_catalog(CatalogConfig(offerings=[{"slug": "small", "kind": "cpu", "display_name": "Small"}], discover=False), None)
    assert [o.slug for o in out] == ["small"]
