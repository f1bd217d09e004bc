"""This hub's offerings now and what one user may have of them: the admin's and the
discovered ones, counted by the hub's one watch of Nodes and Pods
(:class:`~gpuspawner.hub.inventory.Inventory`) for the notebook pod the hub makes, within what
the user's Kueue queue still admits; the user's choice among them; and, once per hub process,
the admin's DRA offerings that match no device.

How a catalog is built is :mod:`gpuspawner.offerings.catalog`'s; the spawner is read through
the seam (:class:`gpuspawner.hub.seam.Spawner`) for its traits and the user.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gpuspawner.capacity.access import allowed
from gpuspawner.capacity.index import ClusterIndex, Health
from gpuspawner.core.imagefit import fitted, needs_for
from gpuspawner.core.model import UNCOUNTED, Availability, Offering, QueueRoom
from gpuspawner.core.settingskey import SettingsKey
from gpuspawner.core.wording import MISCONFIGURED_MESSAGE, unreachable_message
from gpuspawner.dra.devices import unmatched
from gpuspawner.dra.shares import sized
from gpuspawner.hub import metrics
from gpuspawner.hub.kueuevisibility import KueueWaiting
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.hub.seam import Spawner
from gpuspawner.hub.spawnview import catalog_config, config_problems, image_rules, inventory, kueue_routing, requester, user_groups
from gpuspawner.names.vocabulary import Refusal
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
from gpuspawner.offerings.choice import Choice, ChoiceError, parse_choice
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.page.useroptions import check_profile
from gpuspawner.pod.notebook import NOTEBOOK_TRAITS, Notebook

#: The warnings about the admin's DRA selectors this hub process has logged (each once).
_unmatched_logged: set[str] = set()


async def catalog(spawner: Spawner) -> list[Offering]:
    """Every offering this hub has now (configured + discovered), in display order.

    Raises OfferingConfigError (logged; users see a short message) if the settings are wrong.
    """
    if not config_problems(spawner) and catalog_config(spawner).needs_inventory() and not inventory(spawner).ready:
        await inventory(spawner).wait_answered(spawner.inventory_ready_timeout)  # at once unless the hub has just started
    return catalog_now(spawner)


def catalog_now(spawner: Spawner) -> list[Offering]:
    """Every offering the hub of ``spawner`` has now, in display order, from what is known now.
    Raises OfferingConfigError if the settings are wrong."""
    problems = config_problems(spawner)
    if problems:
        raise OfferingConfigError("; ".join(problems))
    config = catalog_config(spawner)
    if not config.needs_inventory():
        return build_catalog(config)  # nothing to discover or count: no cluster-wide watch
    watch = inventory(spawner)
    if config.discover:  # Karpenter's pools, where the cluster has them (capacity.karpenterpools)
        watch.watch_pools()
    try:  # free counts fit the notebook's own cpu/memory guarantees, selector and tolerations beside the GPU
        watch.index.set_notebook(Notebook.from_settings({n: getattr(spawner, n) for n in NOTEBOOK_TRAITS}))
    except ValueError as exc:
        raise OfferingConfigError(str(exc)) from None
    offerings = _built(config, watch.index)
    if not watch.forbidden:
        metrics.observe_catalog(watch.index, offerings, spawner.hub_id, rebuild=lambda: catalog_now(spawner))
        routing = kueue_routing(spawner)
        if routing.enabled:  # who waits in Kueue for these offerings' GPUs (fair turns)
            namespace = None if spawner.enable_user_namespaces else spawner.namespace
            KueueWaiting.shared(spawner.api, watch, namespace, routing, offerings)
    for warning in unmatched(offerings, watch.index.dra):
        # Known only once the slices are listed; it may match later.
        if warning not in _unmatched_logged:
            _unmatched_logged.add(warning)
            spawner.log.warning("GPUSpawner: %s", warning)
    return offerings


#: Catalogs built lately, by what they were built from (:func:`_built`).
_BUILT: OrderedDict[tuple[Any, ...], tuple[tuple[Offering, ...], list[Offering]]] = OrderedDict()
#: Catalogs kept: one per distinct settings (a hook's per-user traits each make one).
BUILT_KEPT = 64


def _built(config: CatalogConfig, index: ClusterIndex) -> list[Offering]:
    """The catalog of ``config`` over ``index``'s discovered offerings, the very objects of the last
    build until the settings or what was discovered change (a pod event changes neither): the
    counts then find each offering's rows by identity, and a page view or a spawn in a storm
    builds nothing. Kept by the admin's offerings as parsed (the same objects while the settings
    are equal), the rest of the settings by value, and the index's :meth:`ClusterIndex.discovery`."""
    configured = tuple(config.configured())
    key = (
        tuple(map(id, configured)),
        SettingsKey((config.overrides, config.discover, config.include_cpu, tuple(config.vgpu_class_labels))),
        id(index),
        index.discovery(),
    )
    kept = _BUILT.get(key)
    if kept is not None and all(a is b for a, b in zip(kept[0], configured, strict=True)):
        _BUILT.move_to_end(key)
        return list(kept[1])
    offerings = build_catalog(config, discovered=index.discovered() if config.discover else None)
    offerings = [sized(o, index.dra.matching(o)) for o in offerings]  # an admin's memory share: its GPUs' memory
    _BUILT[key] = (configured, offerings)  # (the parsed offerings kept: their ids are not reused while kept)
    while len(_BUILT) > BUILT_KEPT:
        _BUILT.popitem(last=False)
    return list(offerings)


def health(spawner: Spawner) -> Health:
    """How far the counts can be trusted; live when none are needed (no watch is started)."""
    return inventory(spawner).health if catalog_config(spawner).needs_inventory() else Health(ready=True)


def counts(spawner: Spawner) -> ClusterIndex | None:
    """The live counts, or None where there are none: no offering needs them (no watch
    is started then), or the hub may not read the cluster (see Inventory.forbidden)."""
    if not catalog_config(spawner).needs_inventory():
        return None
    watch = inventory(spawner)
    return None if watch.forbidden else watch.index


def availability(spawner: Spawner, offering: Offering, through_queue: bool = True) -> Availability:
    """Capacity and free units of ``offering`` now; uncounted where there are no counts.
    Where this user's server of it goes through a Kueue queue (and ``through_queue``), the
    smaller of the nodes' count and what the queue still admits (see :func:`queue_room`)."""
    index = counts(spawner)
    avail = index.availability(offering) if index is not None else UNCOUNTED
    room = queue_room(spawner, offering) if through_queue else None
    return avail.within(room) if room is not None else avail


def availabilities(spawner: Spawner) -> Callable[[Offering], Availability]:
    """:func:`availability` for the many offerings of one view: what the settings say (the counts
    to read, whether any server goes through a Kueue queue) read once, not once per offering."""
    if kueue_routing(spawner).enabled:
        return lambda offering: availability(spawner, offering)
    index = counts(spawner)
    return index.availability if index is not None else lambda offering: UNCOUNTED


def queue_room(spawner: Spawner, offering: Offering) -> QueueRoom | None:
    """What the Kueue LocalQueue this user's server of ``offering`` goes to still admits, from
    the inventory's watch of Kueue's queues (started here, once); None where it goes through
    no queue (docs/kueue.md). Cohort borrowing is not counted (capacity.kueuequota)."""
    if not offering.takes_units:
        return None
    routing = kueue_routing(spawner)
    queue = routing.queue_for(offering, (name for name, _ in user_groups(spawner))) if routing.enabled else ""
    if not queue or not catalog_config(spawner).needs_inventory():
        return None
    watch = inventory(spawner)
    watch.watch_kueue(None if spawner.enable_user_namespaces else spawner.namespace)
    return watch.index.kueue.room(offering, watch.index.notebook, spawner.namespace, queue)


def image_fit(spawner: Spawner, offering: Offering, image: str) -> tuple[Offering, str]:
    """``offering`` for ``image`` (on the nodes and devices that can run it), and why none can
    ("" where one can, where the image needs nothing, or where there are no counts)."""
    if not spawner.image_requirements:  # (no rules: every image needs nothing, the common case)
        return offering, ""
    needs = needs_for(image, image_rules(spawner))
    index = counts(spawner)
    if index is None:
        return fitted(offering, needs), ""
    return index.fit(offering, needs)


def default_slug(spawner: Spawner, offerings: dict[str, Offering]) -> str | None:
    """The offering a spawn that names none gets (``default_offering``, else "No GPU", else the first)."""
    if spawner.default_offering and spawner.default_offering in offerings:
        return spawner.default_offering
    cpu = [slug for slug, o in offerings.items() if not o.is_gpu]
    return cpu[0] if cpu else next(iter(offerings), None)


def misconfigured(spawner: Spawner, exc: OfferingConfigError) -> SpawnRefused:
    """The refusal of a spawn while the settings are wrong (the admin reads why in the log)."""
    spawner.log.error("GPUSpawner configuration error: %s", exc)
    return SpawnRefused(MISCONFIGURED_MESSAGE, Refusal.MISCONFIGURED)


def choose(spawner: Spawner, user_options: dict[str, Any], offerings: list[Offering]) -> Choice:
    """The offering and count ``user_options`` ask for, if this user may take it from
    ``offerings``. Raises :class:`SpawnRefused`: 503 when the cluster cannot be reached, 400
    malformed, 403 not offered to this user."""
    found = health(spawner)
    if not found.ready and not found.forbidden:  # no pod can be made, and the counts cannot be trusted
        raise SpawnRefused(unreachable_message(found, spawner.now()), Refusal.UNREACHABLE)
    mine = allowed(offerings, requester(spawner))
    try:
        return parse_choice(user_options, mine, default_slug(spawner, mine))
    except ChoiceError as exc:
        raise SpawnRefused(str(exc), exc.reason) from None


def check_profile_choice(options: dict[str, Any], profile_list: list[dict[str, Any]]) -> None:
    """KubeSpawner's profile choice in ``options`` checked against ``profile_list`` (400)."""
    try:
        check_profile(options, profile_list)
    except ChoiceError as exc:
        raise SpawnRefused(str(exc), exc.reason) from None
