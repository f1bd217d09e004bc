"""The canonical GPU offerings of the unit tests, one of each kind: their configs (as a site
writes them in ``c.GPUSpawner.offerings``) and :func:`offering`, which builds one.

A test takes these unless it needs a deliberately different shape (its slugs or display
names show in what it asserts, say); then its own definition says why.
"""

from __future__ import annotations

from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.offerings.config import offering_from_config

#: A quarter of a time-sliced T4 (nvidia.com/gpu.shared).
T4_SHARE: dict[str, Any] = {"slug": "t4", "kind": "shared", "replicas": 4, "display_name": "T4 1/4 share"}
#: The smallest A100 MIG slice (nvidia.com/mig-1g.5gb).
MIG_1G: dict[str, Any] = {"slug": "mig1", "kind": "mig", "profile": "1g.5gb", "display_name": "MIG 1g.5gb"}
#: A bigger A100 MIG slice (nvidia.com/mig-3g.20gb).
MIG_3G: dict[str, Any] = {"slug": "mig3", "kind": "mig", "profile": "3g.20gb", "display_name": "MIG 3g.20gb"}
#: Whole H100s, 1, 2, 4 or 8 at a time (nvidia.com/gpu).
H100: dict[str, Any] = {"slug": "h100", "kind": "full", "display_name": "H100", "counts": [1, 2, 4, 8]}


def offering(config: dict[str, Any], index: int = 0, **changes: Any) -> Offering:
    """The offering ``config`` (with ``changes``) describes, as entry ``index`` of the site's list."""
    return offering_from_config({**config, **changes}, index)
