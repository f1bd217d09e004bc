"""The spawner as the hub reads it (through :class:`gpuspawner.hub.seam.Spawner`): its settings
parsed and checked (each once per value: a page view asks many times), its user and groups,
the hub's one inventory, its server's record and its key among the reservations, and what its
saved state keeps of the hub's (:func:`saved_state`, :func:`load_state`).

Everything here is derived from the seam's settings and state; nothing calls back up.
"""

from __future__ import annotations

import functools
from typing import Any

from gpuspawner.capacity.access import Requester, named
from gpuspawner.capacity.checks import config_problems as check_settings
from gpuspawner.capacity.kueuequeues import KueueRouting
from gpuspawner.core.imagefit import ImageNeeds, ImageNeedsError, parse_rules
from gpuspawner.core.settingskey import SettingsKey
from gpuspawner.hub import metrics
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.seam import Spawner
from gpuspawner.hub.spawnstate import server_record, user_label
from gpuspawner.names.vocabulary import BUDGET_LEDGER_KEY, RECORD_KEY, STOP_NOTICE_KEY
from gpuspawner.offerings.catalog import TRAITS as CATALOG_TRAITS
from gpuspawner.offerings.catalog import CatalogConfig
from gpuspawner.pod.podspec import hub_id_problem

#: The settings :func:`gpuspawner.capacity.checks.config_problems` checks.
CHECKED_TRAITS: tuple[str, ...] = ("offerings", "offering_overrides", "user_quota", "group_quotas", "site_timezone", "admission")
CHECKED_TRAITS += ("memory_guard_kinds", "memory_guard_user_env", "user_gpu_budget", "group_gpu_budgets", "queue_timeout", "start_timeout")
CHECKED_TRAITS += ("kueue_queues", "kueue_priority_classes", "image_requirements")


def config_problems(spawner: Spawner) -> list[str]:
    """What is wrong with this hub's GPUSpawner settings (see :mod:`gpuspawner.capacity.checks`;
    checked once per settings: a view asks several times)."""
    return list(_config_problems(SettingsKey(({name: getattr(spawner, name) for name in CHECKED_TRAITS}, spawner.hub_id))))


def catalog_config(spawner: Spawner) -> CatalogConfig:
    """The settings the catalog is built from."""
    return CatalogConfig.from_settings({trait: getattr(spawner, trait) for trait in CATALOG_TRAITS})


def kueue_routing(spawner: Spawner) -> KueueRouting:
    """The queue mapping (empty while the settings are wrong: config_problems refuses the spawn first).

    Checked and made again only when the settings differ from those it was made from (a page
    view asks once per offering)."""
    return _kueue_routing(SettingsKey((spawner.kueue_queues, spawner.kueue_priority_classes)))


def image_rules(spawner: Spawner) -> tuple[ImageNeeds, ...]:
    """``image_requirements`` parsed (none while they are wrong: config_problems refuses the spawn first)."""
    try:
        return parse_rules(spawner.image_requirements)
    except ImageNeedsError:
        return ()


def inventory(spawner: Spawner) -> Inventory:
    """This process's one watch-based cache of Nodes and Pods."""
    return Inventory.shared(spawner.api, spawner.vgpu_class_labels)


def user_groups(spawner: Spawner) -> list[tuple[str, Any]]:
    """(name, group) of the user's groups, whatever shape the hub's User gives them in."""
    return named(getattr(spawner.user, "groups", None))


def requester(spawner: Spawner) -> Requester:
    """The user as the offerings' policies read them (and their groups, for the metrics)."""
    user = spawner.user
    groups = frozenset(name for name, _ in user_groups(spawner))
    metrics.observe_groups(user_label(user.name), groups)  # keyed as the pod label the inventory reads
    return Requester(name=user.name, groups=groups, admin=bool(getattr(user, "admin", False)))


def record(spawner: Spawner, url: str | None = None) -> dict[str, Any]:
    """What other services (the culler, the inventory) may read about this server's GPU."""
    return server_record(spawner.spawn_state, spawner.pod_name, spawner.namespace, url)


def saved_state(spawner: Spawner, state: dict[str, Any]) -> dict[str, Any]:
    """KubeSpawner's ``state`` plus what this server holds, kept across hub restarts: its record
    (the spawn's now, else the one loaded), its GPU-hour ledger and its stop notice."""
    kept = record(spawner) if spawner.spawn_state.choice is not None else spawner.spawn_state.saved_record
    if kept:
        state[RECORD_KEY] = kept
    if spawner.gpu_usage:
        state[BUDGET_LEDGER_KEY] = list(spawner.gpu_usage)
    if spawner.stop_notice:
        state[STOP_NOTICE_KEY] = dict(spawner.stop_notice)
    return state


def load_state(spawner: Spawner, state: dict[str, Any]) -> None:
    """What :func:`saved_state` added, back on the spawner (after KubeSpawner's ``load_state``); the
    record also into ``user_options``, which the hub's REST API serves (the start that wrote it
    leaves the database's copy of the options to JupyterHub: see lifecycle.start)."""
    spawner.spawn_state.saved_record = state.get(RECORD_KEY)
    if spawner.spawn_state.saved_record and RECORD_KEY not in (spawner.user_options or {}):
        spawner.user_options = {**(spawner.user_options or {}), RECORD_KEY: spawner.spawn_state.saved_record}
    spawner.gpu_usage = list(state.get(BUDGET_LEDGER_KEY) or [])
    spawner.stop_notice = state.get(STOP_NOTICE_KEY) or None


def reservation_key(spawner: Spawner) -> str:
    """The key of ``spawner``'s server in the quota ledger and the index's reservations."""
    return f"{spawner.namespace}/{spawner.pod_name}"


def release_reservation(spawner: Spawner) -> None:
    """Give back units reserved for this pod, in the inventory if one runs (never starts one)."""
    running = Inventory.running(spawner.api)
    if running is not None:
        running.index.release(reservation_key(spawner))


@functools.lru_cache(maxsize=64)
def _kueue_routing(settings: SettingsKey) -> KueueRouting:
    try:
        return KueueRouting.from_settings(*settings.value)
    except ValueError:
        return KueueRouting()


@functools.lru_cache(maxsize=64)
def _config_problems(checked: SettingsKey) -> tuple[str, ...]:
    section, hub_id = checked.value
    return (*check_settings(section), *filter(None, [hub_id_problem(hub_id)]))
