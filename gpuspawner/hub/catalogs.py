"""This hub's offerings now: the admin's and the discovered ones, counted by the hub's one
watch of Nodes and Pods (:class:`~gpuspawner.hub.inventory.Inventory`) for the notebook pod
the hub makes; and, once per hub process, the admin's DRA offerings that match no device.

How a catalog is built is :mod:`gpuspawner.offerings.catalog`'s; the spawner passes itself
(``spawner``) for its traits and its inventory.
"""

from __future__ import annotations

from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.dra.devices import unmatched
from gpuspawner.dra.shares import sized
from gpuspawner.hub import metrics
from gpuspawner.hub.kueuewaiting import KueueWaiting
from gpuspawner.offerings.catalog import build_catalog
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.pod.notebook import NOTEBOOK_TRAITS, Notebook

#: The warnings about the admin's DRA selectors this hub process has logged (each once).
_unmatched_logged: set[str] = set()


def catalog_now(spawner: Any) -> list[Offering]:
    """Every offering the hub of ``spawner`` has now, in display order, from what is known now.
    Raises OfferingConfigError if the settings are wrong."""
    problems = spawner.config_problems()
    if problems:
        raise OfferingConfigError("; ".join(problems))
    config = spawner.catalog_config
    if not config.needs_inventory():
        return build_catalog(config)  # nothing to discover or count: no cluster-wide watch
    inventory = spawner.inventory
    try:  # free counts fit the notebook's own cpu/memory guarantees, selector and tolerations beside the GPU
        inventory.index.set_notebook(Notebook.from_settings({n: getattr(spawner, n) for n in NOTEBOOK_TRAITS}))
    except ValueError as exc:
        raise OfferingConfigError(str(exc)) from None
    discovered = inventory.index.discovered() if spawner.discover_offerings else None
    catalog = build_catalog(config, discovered=discovered)
    catalog = [sized(o, inventory.index.dra.matching(o)) for o in catalog]  # an admin's memory share: its GPUs' memory
    if not inventory.forbidden:
        metrics.observe_catalog(inventory.index, catalog, spawner.hub_id, rebuild=lambda: catalog_now(spawner))
        if spawner.kueue_routing.enabled:  # who waits in Kueue for these offerings' GPUs (fair turns)
            KueueWaiting.shared(spawner, catalog)
    for warning in unmatched(catalog, inventory.index.dra):
        # Known only once the slices are listed; it may match later.
        if warning not in _unmatched_logged:
            _unmatched_logged.add(warning)
            spawner.log.warning("GPUSpawner: %s", warning)
    return catalog
