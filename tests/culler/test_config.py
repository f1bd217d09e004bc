"""The traitlets application: upstream options kept, ours added, the example's role."""

from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.culler import REQUIRED_SCOPES, GpuCuller
from gpuspawner.culler.policy import DEFAULT_KIND_TIMEOUTS

EXAMPLE = Path(__file__).resolve().parents[2] / "hub_config" / "culler_service_example.py"


def app(argv, config=None):
    a = GpuCuller(config=config) if config else GpuCuller()
    a.initialize(argv)
    return a


def test_defaults_are_the_issue_s():
    a = app([])
    p = a.policy()
    assert {k: p.kind_timeouts[k] for k in ("full", "mig", "shared", "vgpu", "custom")} == {
        "full": 1800,
        "mig": 3600,
        "shared": 7200,
        "vgpu": 3600,
        "custom": 3600,
    }
    assert p.default_timeout == DEFAULT_KIND_TIMEOUTS["cpu"] == 8 * 3600
    assert not a.dry_run and not a.cull_users


def test_upstream_flags_and_ours_on_the_command_line():
    a = app(
        [
            "--timeout=600",
            "--cull-every=30",
            "--max-age=7200",
            "--concurrency=3",
            "--api-page-size=100",
            "--remove-named-servers=true",
            "--dry-run",
            "--kind-timeout",
            "mig=60",
            "--kind-timeout",
            "full=0",
            "--offering-timeout",
            "t4-shared=86400",
            "--kernel-timeout=900",
            "--prometheus-url=http://prom:9090",
            "--gpu-window=300",
            "--metrics-port=9901",
        ]
    )
    p = a.policy()
    assert (a.cull_every, a.max_age, a.concurrency, a.api_page_size) == (30, 7200, 3, 100)
    assert a.remove_named_servers and a.dry_run
    assert p.kind_timeouts["mig"] == 60 and p.kind_timeouts["full"] == 0
    assert p.kind_timeouts["shared"] == 7200  # merged over the defaults
    assert p.default_timeout == 600 and p.offering_timeouts == {"t4-shared": 86400}
    assert p.kernel_timeout == 900 and a.gpu_settings().window_s == 300
    assert a.prometheus_url == "http://prom:9090" and a.metrics_port == 9901


def test_idle_culler_config_section_still_applies():
    c = Config()
    c.IdleCuller.timeout = 1234
    c.IdleCuller.cull_users = True
    a = app([], config=c)
    assert a.timeout == 1234 and a.cull_users


def test_example_service_registers_the_minimal_role():
    c = Config()
    c.JupyterHub.services = []
    c.JupyterHub.load_roles = []
    exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"), {"get_config": lambda: c})
    [svc, pages] = c.JupyterHub.services
    [role, user_role, pages_role] = c.JupyterHub.load_roles
    assert svc["name"] == "gpu-culler" and svc["command"][1:3] == ["-m", "gpuspawner.culler"]
    # telling users: every user may call the service (each reads only their own actions and
    # leases); the pages' token reads everyone's and extends a lease for its page's user, and
    # nothing else
    assert user_role == {"name": "user", "scopes": ["self", "access:services!service=gpu-culler"]}
    assert pages["name"] == pages_role["services"][0] == "gpu-culler-pages" and len(pages["api_token"]) >= 32
    assert sorted(pages_role["scopes"]) == [
        "access:services!service=gpu-culler",
        "custom:gpu-culler:extend-leases",
        "custom:gpu-culler:read-actions",
    ]
    assert {"custom:gpu-culler:read-actions", "custom:gpu-culler:extend-leases"} <= set(c.JupyterHub.custom_scopes)
    [(path, handler, kwargs)] = c.JupyterHub.extra_handlers  # the page where users extend their leases
    assert path == "/gpuspawner/leases" and handler.__name__ == "LeasesPage" and callable(kwargs["source"])
    assert role["services"] == ["gpu-culler"]
    assert sorted(role["scopes"]) == sorted(REQUIRED_SCOPES)
    assert "admin:users" not in role["scopes"] and "admin:servers" not in role["scopes"]
    # every flag in the example parses
    a = app(svc["command"][3:])
    assert a.dry_run and a.prometheus_selector == 'exported_namespace="jhub"'


def test_missing_url_or_token_fails_fast(monkeypatch, capsys):
    monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    a = GpuCuller()
    a.initialize([])
    a.url = None
    assert "no hub API URL" in a.config_problem()
    with pytest.raises(SystemExit) as e:
        a.start()
    assert e.value.code == 2
    a.url = "http://127.0.0.1:8081/hub/api"
    assert "no API token" in a.config_problem()


def test_a_too_short_token_lifetime_is_refused_with_a_reason():
    from traitlets import TraitError

    with pytest.raises(TraitError, match="at least 60 seconds"):
        GpuCuller(server_token_lifetime=30)


def test_bad_notice_and_action_log_settings_are_refused_with_what_to_do():
    from traitlets import TraitError

    for kw, words in (
        ({"warn_before_seconds": -1}, "must be 0 \\(no warnings\\)"),
        ({"action_log_max_entries": 0}, "at least 1"),
        ({"action_log_retention_days": 0}, "more than 0"),
    ):
        with pytest.raises(TraitError, match=words):
            GpuCuller(**kw)
    a = app(["--GpuCuller.warn_before_seconds=900", "--GpuCuller.action_log_path=/var/lib/culler/actions.jsonl"])
    assert a.warn_before_seconds == 900 and a.make_action_log().path.name == "actions.jsonl"


def test_gpu_idle_limit_and_token_lifetime_flags():
    a = app(
        [
            "--gpu-idle-limit=7200",
            "--offering-gpu-idle-limit",
            "t4-shared=0",
            "--server-token-lifetime=900",
        ]
    )
    p = a.policy()
    assert p.gpu_idle_limit == 7200 and p.offering_gpu_idle_limits == {"t4-shared": 0}
    assert a.server_token_lifetime == 900
    assert app([]).policy().gpu_idle_limit == 4 * 3600


def test_scope_problems_name_too_much_and_too_little():
    from gpuspawner.culler.settings import scope_problems

    assert scope_problems(list(REQUIRED_SCOPES)) == []
    # what the hub lists for the role (expanded, filtered forms included)
    assert scope_problems([*REQUIRED_SCOPES, "read:tokens", "tokens!group=gpu"]) == []
    old_role = ["list:users", "read:users:activity", "read:servers", "delete:servers", "access:servers"]
    problems = scope_problems(old_role)
    assert len(problems) == 2
    assert "'access:servers', which it does not need" in problems[0]
    assert "lacks 'tokens'" in problems[1] and "held back" in problems[1]
    assert any("admin:users" in p for p in scope_problems(list(REQUIRED_SCOPES), cull_users=True))
    # issue #25: unfiltered, the culler's token could mint one for an admin
    assert "tokens!group=gpu-users" in REQUIRED_SCOPES and "tokens" not in REQUIRED_SCOPES
    [unfiltered] = scope_problems([*REQUIRED_SCOPES, "tokens"])
    assert "unfiltered 'tokens'" in unfiltered and "become admin" in unfiltered


def test_fair_turns_flags():
    a = app(["--reclaim-for-waiting-after=900", "--offering-gpu-lease", "h100=14400"])
    p = a.policy()
    assert p.reclaim_for_waiting_after == 900 and p.offering_gpu_leases == {"h100": 14400}
    with pytest.raises(TraitError, match="offering_gpu_leases"):
        GpuCuller(offering_gpu_leases={"h100": -1})


def test_lease_extension_flags_and_what_is_refused():
    a = app(
        [
            "--gpu-lease-extensions=2",
            "--offering-gpu-lease-extensions",
            "h100=1",
            "--gpu-lease-extension=1800",
            "--offering-gpu-lease-ends",
            "t4=reclaim",
        ]
    )
    p = a.policy()
    assert (p.gpu_lease_extensions, dict(p.offering_gpu_lease_extensions), p.gpu_lease_extension) == (2, {"h100": 1}, 1800)
    assert dict(p.offering_gpu_lease_ends) == {"t4": "reclaim"}
    for bad, words in (
        ({"offering_gpu_lease_ends": {"t4": "pause"}}, r"offering_gpu_lease_ends: \['t4'\]: give 'stop' or 'reclaim'"),
        ({"offering_gpu_lease_extensions": {"h100": -1}}, r"offering_gpu_lease_extensions: \['h100'\] must be 0 \(none\) or more"),
        ({"gpu_lease_extension": -5}, "gpu_lease_extension: -5 must be 0 or more"),
    ):
        with pytest.raises(TraitError, match=words):
            GpuCuller(**bad)


def test_the_logger_drops_what_its_level_hides_and_keeps_what_it_shows():
    """traitlets leaves its logger at DEBUG and filters in the handler: every debug line of a
    cycle (thousands of servers) would build its record. The logger follows --log-level."""
    import logging

    quiet = app(["--log-level=WARN"])
    assert not quiet.log.isEnabledFor(logging.INFO)
    assert quiet.log.isEnabledFor(logging.WARNING)
    loud = app(["--log-level=DEBUG"])
    assert loud.log.isEnabledFor(logging.DEBUG)
    default = app([])
    assert default.log.isEnabledFor(logging.INFO) and not default.log.isEnabledFor(logging.DEBUG)
