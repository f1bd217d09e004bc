"""The admin's offerings are parsed once per settings, and a change of the settings (even in place) is seen at once."""

from __future__ import annotations

import pytest

from gpuspawner.offerings.catalog import CatalogConfig
from gpuspawner.offerings.entry import OfferingConfigError


def entry(**kw):
    return {"slug": "half-v100", "kind": "custom", "display_name": "Half a V100", "resources": {"nvidia.com/vgpu": 500}, **kw}


def test_the_same_settings_give_the_same_offerings_and_a_changed_setting_new_ones():
    offerings = [entry()]
    config = CatalogConfig(offerings=offerings, discover=False)
    first = config.configured()
    assert [o.display_name for o in first] == ["Half a V100"]
    first.append(None)  # a caller's list is its own
    assert [o.display_name for o in config.configured()] == ["Half a V100"]
    offerings[0]["display_name"] = "Half a V100 (site)"  # edited in place, as a hook may
    assert [o.display_name for o in CatalogConfig(offerings=offerings, discover=False).configured()] == ["Half a V100 (site)"]


def test_a_wrong_setting_is_refused_every_time():
    config = CatalogConfig(offerings=[entry(kind="nonsense")], discover=False)
    for _ in range(2):
        with pytest.raises(OfferingConfigError):
            config.configured()
