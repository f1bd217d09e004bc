"""The scale benchmark's own bookkeeping (bench/scale): what it counts and what --check fails on."""

from __future__ import annotations

import json

from bench.scale.__main__ import Audit, fates, mix, problems, spread, summary
from bench.scale.hubs import HUB_CLIENT, Choice, choices
from bench.scale.storm import form_error, from_the_proxy, parse_free
from gpuspawner.devcluster.nodes import many_nodes, node_classes


def test_the_mix_is_half_api_half_form_and_never_asks_more_gpus_than_an_offering_has():
    options = [
        Choice("cpu", "cpu", {}, {}, "cpu"),
        Choice("a", "gpu", {}, {}, "a", units=4),
        Choice("b", "gpu", {}, {}, "b", units=100),
        Choice("no", "refuse", {}, {}, "no"),
    ]
    plan = mix(400, options, seed=1, held={"b": 70})
    assert sum(1 for channel, _ in plan if channel == "api") == 200
    taken = {name: sum(1 for _, c in plan if c.name == name) for name in "ab"}
    assert taken == {"a": 3, "b": 5}  # three quarters of 4; three quarters of 100 less the 70 held
    assert 0.1 < sum(1 for _, c in plan if c.kind == "refuse") / 400 < 0.2


def test_the_impossible_share_can_be_set_and_zero_leaves_every_spawn_servable():
    options = [Choice("cpu", "cpu", {}, {}, "cpu"), Choice("b", "gpu", {}, {}, "b", units=1000), Choice("no", "refuse", {}, {}, "no")]
    assert mix(400, options, seed=1) == mix(400, options, seed=1, impossible=0.15)  # the default draws as before
    assert not [c for _, c in mix(400, options, seed=1, impossible=0) if c.kind == "refuse"]
    half = sum(1 for _, c in mix(400, options, seed=1, impossible=0.5) if c.kind == "refuse") / 400
    assert 0.4 < half < 0.6
    served = [c.kind for _, c in mix(400, options, seed=1, impossible=0)]
    assert 0.25 < served.count("cpu") / 400 < 0.35  # the GPU and no-GPU draws keep their proportions (25 : 60)


def test_the_profile_list_has_a_profile_for_every_choice_with_the_offerings_limits():
    gpu = [c for c in node_classes() if c["x-gpuspawner-class"] != "cpu"]
    options, profiles = choices(list(many_nodes(len(gpu), gpu)))
    slugs = {p["slug"] for p in profiles}
    assert {c.kube_profile for c in options} <= slugs
    h100 = next(p for p in profiles if p["slug"] == "gpu-nvidia-h100-80gb-hbm3")["kubespawner_override"]
    assert h100["extra_resource_limits"] == {"nvidia.com/gpu": "1"} and h100["tolerations"]
    assert next(c for c in options if c.name == "gpu-nvidia-h100-80gb-hbm3").units == 8


def test_the_audit_counts_only_the_hubs_requests_between_two_marks(tmp_path):
    log = tmp_path / "audit.log"
    events = [
        {"user": {"username": HUB_CLIENT}, "verb": "create", "objectRef": {"resource": "pods"}},
        {"user": {"username": "gpuspawner-admin"}, "verb": "create", "objectRef": {"resource": "pods"}},
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    audit = Audit(log)
    mark = audit.mark()
    with log.open("a") as f:
        for e in [*events, {"user": {"username": HUB_CLIENT}, "verb": "watch", "objectRef": {"resource": "pods"}}]:
            f.write(json.dumps(e) + "\n")
        f.write(
            json.dumps({"user": {"username": HUB_CLIENT}, "verb": "get", "objectRef": {"resource": "pods", "subresource": "log"}}) + "\n"
        )
    assert audit.between(mark, audit.mark()) == {"create pods": 1, "watch pods": 1, "get pods/log": 1}


def test_check_fails_on_a_lost_spawn_a_wrong_count_and_an_unserved_fitting_request():
    ok = {"spawner": "gpu", "stuck": [], "outcomes": {"gpu:ready": 3, "refuse:refused": 1}, "recount": [], "lag_misses": []}
    assert problems([ok]) == []
    assert problems([{**ok, "outcomes": {"gpu:lost": 1}}])
    assert problems([{**ok, "outcomes": {"gpu:refused": 1}}])
    assert problems([{**ok, "outcomes": {"gpu:refused": 1}}], faults=True) == []  # stopped with words, in a restart
    assert problems([{**ok, "recount": ["x: the hub says 1, a recount 2"]}])
    assert problems([{**ok, "stuck": ["u1: pending spawn"]}])
    assert problems([{**ok, "spawner": "kube", "outcomes": {"gpu:failed": 1}}]) == []  # KubeSpawner's own timeouts are its figures


def test_the_proxys_own_error_is_told_apart_from_the_hubs_answers():
    assert from_the_proxy(503, "Service Unavailable")
    assert from_the_proxy(404, "")
    assert not from_the_proxy(503, {"status": 503, "message": "The GPU cluster cannot be reached"})
    assert from_the_proxy(404, "<html><title>JupyterHub</title>404</html>")  # the proxy's 404, with the hub's error page
    assert not from_the_proxy(503, "<html><title>JupyterHub</title>503</html>")
    assert not from_the_proxy(409, "x")


def test_the_hubs_words_are_read_from_its_form_and_metrics():
    page = '<form id="spawn_form"></form><p class="spawn-error-msg text-danger">Nothing is free: <b>0</b> of 4</p>'
    assert form_error(page) == "Nothing is free: 0 of 4"
    text = 'gpuspawner_offering_free{kind="vgpu",offering="v100"} 3.0\ngpuspawner_offering_free{kind="mig",offering="v100-mig"} 1.0\n'
    assert parse_free(text, "v100") == 3.0 and parse_free(text, "nope") is None


def test_jupyterhubs_concurrent_spawn_limit_is_waited_out_as_it_asks():
    from bench.scale.storm import throttled

    assert throttled(429, {"status": 429, "message": "Too many users trying to log in right now. Try again in 40 seconds."}) == 40.0
    assert throttled(429, "<p>Too many users trying to log in right now. Try again in 7 seconds.</p>") == 7.0
    assert throttled(429, {"status": 429, "message": "Over your GPU quota: 2 of 2 held"}) is None  # a refusal, not a wait
    assert throttled(409, "Too many users") is None


def storm(spawner: str, outcomes: dict[str, int], page_p50: float, cpu: float, slow: int = 0) -> dict:
    return {
        "spawner": spawner,
        "outcomes": outcomes,
        "slow_refusals": slow,
        "page_p50": page_p50,
        "hub_cpu_s": cpu,
        "load": "1.0 1.0 1.0",
    }


def test_every_spawns_fate_is_a_row_with_both_spawners_counts():
    lossy = storm(
        "gpu", {"gpu:ready": 90, "gpu:refused": 4, "gpu:failed": 2, "gpu:lost": 1, "cpu:ready": 3, "refuse:refused": 10}, 0.1, 10, slow=3
    )
    assert fates(lossy) == {
        "fitting": 100,
        "served": 93,
        "refused as slow": 3,
        "refused or stopped otherwise": 1,
        "failed (timeout, error)": 2,
        "lost (no verdict)": 1,
        "impossible, refused with words": 10,
    }


def test_the_summary_prints_medians_spread_and_ratios_over_the_repeats(capsys):
    assert spread([3.0, 1.0, 2.0]) == "2.00 [1.00 - 3.00]" and spread([1.0, 2.0]) == "1.50 [1.00 - 2.00]" and spread([]) == "-"
    runs = [
        [storm("kube", {"gpu:ready": 10}, 0.010, 5.0), storm("gpu", {"gpu:ready": 10}, 0.020, 10.0)],
        [storm("gpu", {"gpu:ready": 9, "gpu:failed": 1}, 0.030, 9.0), storm("kube", {"gpu:ready": 10}, 0.010, 5.0)],
        [storm("kube", {"gpu:ready": 10}, 0.020, 5.0), storm("gpu", {"gpu:ready": 10}, 0.020, 10.0)],
    ]
    summary(runs)
    out = capsys.readouterr().out
    page = next(line for line in out.splitlines() if line.startswith("spawn page p50"))
    assert "10.00 [10.00 - 20.00]" in page and "20.00 [20.00 - 30.00]" in page and page.endswith("2.00 [1.00 - 3.00]")
    cpu = next(line for line in out.splitlines() if line.startswith("hub CPU s per served spawn"))
    assert "0.50 [0.50 - 0.50]" in cpu and "1.00 [1.00 - 1.00]" in cpu  # per served spawn: 9 s for 9 served
    failed = next(line for line in out.splitlines() if "failed (timeout, error)" in line)
    assert failed.split()[-3:] == ["0", "/", "0"] and "0 / 1" in failed
