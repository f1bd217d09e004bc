"""The configuration reference is generated from the traits' help and must not drift."""

from pathlib import Path

from gpuspawner.tools.configdoc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_is_up_to_date():
    assert DOC.read_text() == render(), "docs/config.md is stale: run `python -m gpuspawner.tools.configdoc > docs/config.md`"


def test_every_gpuspawner_option_is_documented_with_help():
    text = render()
    for name in (
        "offerings",
        "offering_overrides",
        "discover_offerings",
        "admission",
        "user_quota",
        "group_quotas",
        "site_timezone",
        "vgpu_class_labels",
        "default_offering",
    ):
        assert f"## `{name}`" in text
    assert "help" not in [line.strip() for line in text.splitlines()]
