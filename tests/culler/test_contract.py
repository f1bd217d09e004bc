"""The spawner -> culler contract in user_options."""

from gpuspawner.culler.contract import parse_offering


def test_full_contract():
    o = parse_offering(
        {
            "offering": "a100-mig-3g",
            "count": 1,
            "gpuspawner": {
                "offering": "a100-mig-3g",
                "kind": "mig",
                "resources": {"nvidia.com/mig-3g.20gb": "1"},
                "pod": "jupyter-alice",
                "namespace": "jhub",
                "url": "http://10.1.2.3:8888/user/alice",
            },
        }
    )
    assert (o.kind, o.slug, o.pod, o.namespace) == ("mig", "a100-mig-3g", "jupyter-alice", "jhub")
    assert o.url == "http://10.1.2.3:8888/user/alice/"  # always ends with /
    assert o.resources == {"nvidia.com/mig-3g.20gb": "1"}
    assert o.declared and o.is_gpu and o.problem is None


def test_no_contract_is_a_plain_cpu_server():
    for opts in (None, {}, {"offering": "a100-full"}, "garbage"):
        o = parse_offering(opts)
        assert o.kind == "cpu" and not o.is_gpu and o.url is None and not o.declared
    assert parse_offering({"offering": "a100-full"}).slug == "a100-full"


def test_cpu_kind_with_url_keeps_its_kernel_view():
    o = parse_offering({"gpuspawner": {"kind": "cpu", "url": "http://10.0.0.9:8888/user/bob/"}})
    assert o.kind == "cpu" and not o.is_gpu and o.url


def test_malformed_contracts_read_conservatively():
    unknown = parse_offering({"gpuspawner": {"kind": "quantum", "pod": "p"}})
    assert unknown.kind == "custom" and unknown.is_gpu and "unknown offering kind 'quantum'" in unknown.problem
    not_a_dict = parse_offering({"gpuspawner": ["mig"]})
    assert not_a_dict.kind == "custom" and "not a mapping" in not_a_dict.problem
    bad_url = parse_offering({"gpuspawner": {"kind": "full", "url": "javascript:alert(1)"}})
    assert bad_url.url is None and "not http(s)" in bad_url.problem
    assert parse_offering({"gpuspawner": {"kind": "full", "resources": "x"}}).resources == {}
