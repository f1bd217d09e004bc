"""Offering + choice -> pod changes; user_options -> Choice; who may use what."""

from __future__ import annotations

import pytest

from gpuspawner.capacity.access import Requester, allowed, may_use
from gpuspawner.core.model import CPU_OFFERING, DEFAULT_GPU_TOLERATION
from gpuspawner.names.nvidia import GPU, PRODUCT_LABEL
from gpuspawner.names.vocabulary import (
    COUNT_KEY,
    ENV_COUNT,
    ENV_KIND,
    ENV_OFFERING,
    LABEL_KIND,
    LABEL_OFFERING,
    OFFERING_KEY,
    RECORD_KEY,
)
from gpuspawner.offerings.choice import Choice, ChoiceError, parse_choice, parse_count, shown
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.pod.podspec import FORBIDDEN_ENV, merge_tolerations, pod_changes

DEFAULT_TOL = dict(DEFAULT_GPU_TOLERATION)
SKU_TOL = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}


def make(raw):
    return offering_from_config(raw, 0)


H100 = make(
    {
        "slug": "h100",
        "kind": "full",
        "display_name": "H100 80GB",
        "product": "NVIDIA-H100-80GB-HBM3",
        "counts": [1, 2, 4, 8],
        "extra_tolerations": [SKU_TOL],
    }
)
MIG = make({"slug": "mig-3g", "kind": "mig", "display_name": "A100 · MIG 3g.20gb", "profile": "3g.20gb"})
SECRET = make({"slug": "secret-a100", "kind": "full", "display_name": "Secret A100", "groups": ["hpc"]})
HIDDEN = make({"slug": "old-t4", "kind": "full", "display_name": "Old T4", "hidden": True})
CPU = CPU_OFFERING


# ----------------------------------------------------------------------------- podspec


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_full_limits_are_per_unit_times_count_as_strings(count):
    changes = pod_changes(H100, count)
    assert dict(changes.limits) == {GPU: str(count)}
    assert all(isinstance(v, str) for v in changes.limits.values())
    assert changes.env[ENV_COUNT] == str(count)


def test_per_unit_above_one_multiplies():
    pair = make({"slug": "pair", "kind": "full", "resources": {GPU: 2}, "counts": [1, 3]})
    assert dict(pod_changes(pair, 3).limits) == {GPU: "6"}


def test_multi_resource_limits():
    hami = make({"slug": "hami", "kind": "custom", "resources": {"nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30}})
    assert dict(pod_changes(hami).limits) == {"nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"}


def test_mig_changes():
    changes = pod_changes(MIG)
    assert dict(changes.limits) == {"nvidia.com/mig-3g.20gb": "1"}
    assert changes.tolerations == (DEFAULT_TOL,)  # the MIG request still needs the nvidia.com/gpu toleration
    assert dict(changes.node_selector) == {}


def test_selector_and_tolerations_are_copied():
    changes = pod_changes(H100, 2)
    assert dict(changes.node_selector) == {PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}
    assert changes.tolerations == (DEFAULT_TOL, SKU_TOL)
    changes.tolerations[0]["key"] = "changed"
    changes.node_selector[PRODUCT_LABEL] = "changed"
    assert H100.tolerations[0]["key"] == GPU
    assert H100.node_selector[PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"


def test_count_not_offered_is_refused():
    with pytest.raises(ValueError, match=r"h100: count 3 is not one of \[1, 2, 4, 8\]"):
        pod_changes(H100, 3)
    with pytest.raises(ValueError):
        pod_changes(MIG, 2)


def test_env_has_offering_and_never_device_visibility_even_if_admin_set_it():
    o = make(
        {
            "slug": "t4",
            "kind": "full",
            "env": {
                "NVIDIA_VISIBLE_DEVICES": "all",
                "CUDA_VISIBLE_DEVICES": "0",
                "NVIDIA_DRIVER_CAPABILITIES": "all",
                "HF_HOME": "/data/hf",
                ENV_OFFERING: "spoofed",
                ENV_KIND: "spoofed",
            },
        }
    )
    env = dict(pod_changes(o).env)
    assert env == {
        "HF_HOME": "/data/hf",
        ENV_OFFERING: "t4",
        ENV_KIND: "full",
        ENV_COUNT: "1",
        "GPUSPAWNER_DISPLAY_NAME": "t4",
        "GPUSPAWNER_OFFERING_WORDS": "the whole GPU is yours",
    }
    assert not FORBIDDEN_ENV & set(env)
    assert "NVIDIA_VISIBLE_DEVICES" not in env


def test_overridden_env_still_cannot_set_visible_devices():
    from gpuspawner.offerings.overrides import apply_overrides

    (o,) = apply_overrides([H100], {"h100": {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}})
    assert dict(o.env) == {"NVIDIA_VISIBLE_DEVICES": "all"}
    assert "NVIDIA_VISIBLE_DEVICES" not in pod_changes(o).env


def test_cpu_changes_have_no_gpu():
    changes = pod_changes(CPU)
    assert dict(changes.limits) == {}
    assert changes.tolerations == ()
    assert dict(changes.env) == {
        ENV_OFFERING: "cpu",
        ENV_KIND: "cpu",
        "GPUSPAWNER_DISPLAY_NAME": CPU.display_name,
        "GPUSPAWNER_OFFERING_WORDS": "no GPU",
    }
    assert ENV_COUNT not in changes.env
    assert dict(changes.labels) == {LABEL_OFFERING: "cpu", LABEL_KIND: "cpu"}


def test_labels_name_offering_and_kind_and_cannot_be_spoofed():
    o = make(
        {
            "slug": "mig-1g",
            "kind": "mig",
            "profile": "1g.5gb",
            "labels": {"team": "ml", LABEL_OFFERING: "h100", LABEL_KIND: "full"},
            "annotations": {"note": "x"},
        }
    )
    changes = pod_changes(o)
    assert dict(changes.labels) == {"team": "ml", LABEL_OFFERING: "mig-1g", LABEL_KIND: "mig"}
    assert dict(changes.annotations) == {"note": "x"}


def test_command_prefix_passes_through():
    bf = make({"slug": "bitfusion", "kind": "custom", "command_prefix": ["bitfusion", "run", "-n", "1", "-p", "0.5", "--"]})
    changes = pod_changes(bf)
    assert changes.command_prefix == ("bitfusion", "run", "-n", "1", "-p", "0.5", "--")
    assert dict(changes.limits) == {}
    assert ENV_COUNT not in changes.env  # no Kubernetes GPU resource to count


def test_merge_tolerations_keeps_base_and_adds_missing():
    base = [{"key": "a", "operator": "Exists"}, DEFAULT_TOL]
    out = merge_tolerations(base, (DEFAULT_TOL, SKU_TOL, SKU_TOL))
    assert out == [{"key": "a", "operator": "Exists"}, DEFAULT_TOL, SKU_TOL]


# ------------------------------------------------------------------------------ choice


OFFERED = {o.slug: o for o in (CPU, H100, MIG, HIDDEN)}


def choose(options, offerings=OFFERED, default="cpu"):
    return parse_choice(options, offerings, default)


def refusal(options, offerings=OFFERED, default="cpu") -> str:
    with pytest.raises(ChoiceError) as info:
        parse_choice(options, offerings, default)
    return str(info.value)


def test_rest_api_scalars():
    assert choose({"offering": "h100", "count": 4}) == Choice(H100, 4)
    assert choose({"offering": "mig-3g"}) == Choice(MIG, 1)


def test_form_post_lists_of_one_and_bytes():
    assert choose({"offering": ["h100"], "count": ["2"]}) == Choice(H100, 2)
    assert choose({"offering": [b"h100"], "count": [b" 8 "]}) == Choice(H100, 8)


def test_default_when_no_offering_key():
    assert choose({}) == Choice(CPU, 1)
    assert choose(None, default="h100") == Choice(H100, 1)  # the first allowed count
    assert choose({"profile": "kubespawner-profile"}, default="mig-3g") == Choice(MIG, 1)


def test_no_default_and_no_choice():
    assert refusal({}, default=None) == "No GPU option was chosen and this hub has no default. Pick one on the spawn page."


def test_record_key_is_ignored():
    # GPUSpawner writes user_options['gpuspawner'] at start; it is never the user's choice.
    assert RECORD_KEY == "gpuspawner"
    assert choose({RECORD_KEY: {"offering": "h100", "count": 8}}) == Choice(CPU, 1)
    assert choose({RECORD_KEY: {"offering": "h100"}, "offering": "mig-3g"}) == Choice(MIG, 1)


def test_unknown_and_forbidden_slug_get_the_same_message():
    catalog = {o.slug: o for o in (CPU, H100, MIG, SECRET)}
    alice = Requester(name="alice", groups=frozenset({"students"}))
    for_alice = allowed(catalog.values(), alice)
    assert "secret-a100" not in for_alice
    forbidden = refusal({"offering": "secret-a100"}, offerings=for_alice)
    without = {k: v for k, v in catalog.items() if k != "secret-a100"}
    unknown = refusal({"offering": "secret-a100"}, offerings=without)
    assert forbidden == unknown
    assert forbidden == (
        "The GPU option 'secret-a100' is not offered to you on this hub (it may have been removed or renamed since "
        "you last used it). Available: A100 · MIG 3g.20gb, H100 80GB, No GPU."
    )
    assert "Secret A100" not in forbidden


def test_hidden_offerings_are_not_listed_as_available():
    msg = refusal({"offering": "gone"})
    assert "Old T4" not in msg
    assert msg.endswith("Available: A100 · MIG 3g.20gb, H100 80GB, No GPU.")
    assert refusal({"offering": "gone"}, offerings={}).endswith("Available: none.")


def test_forbidden_default_is_refused():
    msg = refusal({}, offerings={"cpu": CPU}, default="h100")
    assert msg.startswith("The GPU option 'h100' is not offered to you")


@pytest.mark.parametrize("count", [0, 3, 16, "3", ["5"]])
def test_count_not_allowed(count):
    msg = refusal({"offering": "h100", "count": count})
    assert msg.startswith("H100 80GB can be taken 1, 2, 4, 8 at a time, not ")


def test_count_for_non_full_must_be_one():
    assert refusal({"offering": "mig-3g", "count": 2}) == "A100 · MIG 3g.20gb can be taken 1 at a time, not 2."
    assert choose({"offering": "mig-3g", "count": "1"}) == Choice(MIG, 1)


@pytest.mark.parametrize("key, what", [("offering", "GPU option"), ("count", "GPU count")])
def test_lists_of_two_values(key, what):
    options = {"offering": "h100", "count": "1", key: ["1", "2"] if key == "count" else ["h100", "cpu"]}
    assert refusal(options) == f"Please choose exactly one {what} (got 2)."
    options[key] = []
    assert refusal(options) == f"Please choose exactly one {what} (got 0)."


@pytest.mark.parametrize("value", [True, False, [True]])
def test_bool_count_is_not_a_number(value):
    assert refusal({"offering": "h100", "count": value}) == "The number of GPUs must be a whole number such as 1 or 2."


@pytest.mark.parametrize(
    "value, text", [(1.0, "1.0"), ("two", "two"), ("1e3", "1e3"), ("-1", "-1"), ("1000", "1000"), (None, "None"), ({"n": 1}, "??n?: 1?")]
)
def test_non_numeric_count(value, text):
    assert refusal({"offering": "h100", "count": value}) == f"The number of GPUs must be a whole number such as 1 or 2, not '{text}'."


@pytest.mark.parametrize("raw, value", [(1, 1), (8, 8), ("2", 2), (" 4 ", 4), (["8"], 8), (b"2", 2), (0, 0)])
def test_parse_count_values(raw, value):
    assert parse_count(raw) == value


@pytest.mark.parametrize("raw", [-1, -3, 1000, 10**400])
def test_parse_count_refuses_negative_and_huge_ints(raw):
    with pytest.raises(ChoiceError, match="must be a whole number such as 1 or 2") as info:
        parse_count(raw)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("slug", ["<script>alert(1)</script>", "H100", "h100 ", "../etc", "", 5, None, {"a": "<b>"}, ["<i>"]])
def test_invalid_slug_is_refused_without_markup(slug):
    msg = refusal({"offering": slug})
    assert "is not a valid GPU option" in msg
    assert "<" not in msg and ">" not in msg


def test_shown_strips_markup_and_truncates():
    assert shown("<b>x</b>") == "?b?x?/b?"
    assert shown("a" * 50) == "a" * 40 + "…"
    assert shown('ok-1.2_3:/x "&;') == "ok-1.2_3:/x ???"


def test_choice_round_trips_through_user_options():
    c = choose({"offering": "h100", "count": "2"})
    assert c.as_user_options() == {OFFERING_KEY: "h100", COUNT_KEY: 2}
    assert choose(c.as_user_options()) == c


def test_other_user_options_pass_through_untouched():
    options = {"offering": "h100", "profile": "big-image", "image": "x"}
    assert choose(options) == Choice(H100, 1)
    assert options == {"offering": "h100", "profile": "big-image", "image": "x"}


# ------------------------------------------------------------------------------ policy


def test_may_use_groups_users_admin():
    restricted = make({"slug": "r", "kind": "full", "groups": ["hpc"], "users": ["bob"]})
    assert may_use(restricted, Requester("ann", frozenset({"hpc", "x"})))
    assert may_use(restricted, Requester("bob"))
    assert not may_use(restricted, Requester("carl", frozenset({"students"})))
    assert may_use(restricted, Requester("root", admin=True))
    assert may_use(H100, Requester("anyone"))


def test_allowed_keeps_order_and_filters():
    catalog = [CPU, SECRET, H100]
    assert list(allowed(catalog, Requester("a"))) == ["cpu", "h100"]
    assert list(allowed(catalog, Requester("a", frozenset({"hpc"})))) == ["cpu", "secret-a100", "h100"]


# ------------------------------------------------- regressions found by test_form_fuzz.py


@pytest.mark.parametrize("raw", ["1\x1f", "\x1c2", ["4\x1e"], b"8\x1d"])
def test_count_with_ascii_separator_whitespace_is_a_refusal_not_a_crash(raw):
    # re's \s matches \x1c-\x1f, int() does not accept them: today a bare ValueError (a 500).
    with pytest.raises(ChoiceError) as info:
        parse_count(raw)
    assert "whole number" in str(info.value)


@pytest.mark.parametrize("options", [["offering", "h100"], "h100", 3, b"\x00", [("offering", "h100", "x")]])
def test_options_that_are_not_a_dict_are_a_refusal_not_a_crash(options):
    # POST /users/:name/server with a JSON body that is not an object ends up here as user_options.
    with pytest.raises(ChoiceError):
        parse_choice(options, OFFERED, "cpu")


@pytest.mark.parametrize("count", [10**400, -(10**400), 10**4301], ids=["1e400", "-1e400", "1e4301"])
def test_huge_count_gives_a_short_refusal(count):
    # The refusal quotes the count in full: 400+ characters, and past 4300 digits str() itself
    # raises ValueError ("Exceeds the limit (4300 digits) for integer string conversion").
    with pytest.raises(ChoiceError) as info:
        parse_choice({"offering": "h100", "count": count}, OFFERED, None)
    assert len(str(info.value)) < 400


def test_env_tells_the_notebook_the_offering_in_the_spawn_pages_words():
    o = make(
        {"slug": "h100-mig-1g-10gb", "kind": "mig", "display_name": "MIG 1g.10gb", "profile": "1g.10gb", "product": "NVIDIA-H100-80GB-HBM3"}
    )
    env = pod_changes(o).env
    assert env["GPUSPAWNER_DISPLAY_NAME"] == "MIG 1g.10gb"
    # NVIDIA's 9984 MiB of an H100's 1g.10gb, as the spawn page writes it (issue 29), not the name's "10gb"
    assert env["GPUSPAWNER_OFFERING_WORDS"] == "9.8 GB GPU memory · 1/7 of the GPU's compute · hardware isolated (own memory and compute)"
