"""Check an admin's GPUSpawner settings, all at once, with messages that name the setting.

Used in three places:

* at the end of ``jupyterhub_config.py``, ``gpuspawner.check_config(c)`` makes the hub
  refuse to start with a broken GPU config (JupyterHub creates spawners only when a
  user spawns, so nothing else can check at start-up);
* by ``gpuspawner offerings --config FILE`` (exit status 2);
* by GPUSpawner itself: with a broken config it logs the problems and refuses GPU
  spawns with a message for the user, instead of failing with a server error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpuspawner.capacity.admission import validate_quota
from gpuspawner.capacity.budgetmath import budget_problems
from gpuspawner.capacity.kueuequeues import KueueRouting, mix_problems, routing_problems
from gpuspawner.core.imagefit import ImageNeedsError, parse_rules
from gpuspawner.names.vocabulary import AdmissionPolicy
from gpuspawner.offerings.catalog import CatalogConfig
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.pod.memguard import DEFAULT_KINDS, GuardConfigError, GuardDefaults


class GPUSpawnerConfigError(ValueError):
    """One or more GPUSpawner settings are wrong; the message lists each."""


def config_problems(section: Mapping[str, Any]) -> list[str]:
    """Problems in a GPUSpawner settings mapping (trait name -> value); empty if none."""
    problems = []
    configured = []
    try:
        configured = CatalogConfig.from_settings(section).configured()
    except OfferingConfigError as exc:
        problems.append(str(exc))
    try:
        validate_quota(section.get("user_quota", {}), "c.GPUSpawner.user_quota")
    except ValueError as exc:
        problems.append(str(exc))
    groups = section.get("group_quotas", {})
    if not isinstance(groups, Mapping):
        problems.append(f"c.GPUSpawner.group_quotas must be a dict of group -> quota dict, got {groups!r}")
    else:
        for group, quota in groups.items():
            try:
                validate_quota(quota, f"c.GPUSpawner.group_quotas[{group!r}]")
            except ValueError as exc:
                problems.append(str(exc))
    problems += budget_problems(section.get("user_gpu_budget", {}), section.get("group_gpu_budgets", {}))
    zone = section.get("site_timezone", "UTC")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        problems.append(f"c.GPUSpawner.site_timezone: unknown time zone {zone!r}; use a name like 'Europe/Zurich'")
    kinds = section.get("memory_guard_kinds", sorted(DEFAULT_KINDS))
    try:
        if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)):
            raise GuardConfigError(f"c.GPUSpawner.memory_guard_kinds must be a list of kinds such as ['shared', 'custom'], got {kinds!r}")
        GuardDefaults.from_settings(kinds, section.get("memory_guard_user_env", False))
    except GuardConfigError as exc:
        problems.append(str(exc))
    policy = section.get("admission", AdmissionPolicy.BLOCK.value)
    if policy not in tuple(AdmissionPolicy):
        problems.append(f"c.GPUSpawner.admission must be one of {[p.value for p in AdmissionPolicy]}, got {policy!r}")
    problems += queue_problems(section)
    problems += kueue_problems(section, configured)
    try:
        parse_rules(section.get("image_requirements", {}))
    except ImageNeedsError as exc:
        problems.append(str(exc))
    return problems


def kueue_problems(section: Mapping[str, Any], configured: list[Any]) -> list[str]:
    """The queue mapping's own problems, then a mix with the hub's settings that cannot work (see
    :func:`gpuspawner.capacity.kueuequeues.mix_problems`)."""
    queues, priorities = section.get("kueue_queues", {}), section.get("kueue_priority_classes", {})
    problems = routing_problems(queues, priorities)
    if problems:
        return problems
    routing = KueueRouting.from_settings(queues, priorities)
    return mix_problems(routing, configured, section.get("admission", AdmissionPolicy.BLOCK.value))


#: JupyterHub's ``Spawner.start_timeout`` and GPUSpawner's ``queue_timeout`` when not set
DEFAULT_START_TIMEOUT, DEFAULT_QUEUE_TIMEOUT = 60, 300


def queue_problems(section: Mapping[str, Any]) -> list[str]:
    """A queue that waits as long as JupyterHub's ``start_timeout`` or longer cannot work: the
    hub gives the waiting spawn up first, with its own "timed out" and no word of the queue.
    Each place that queues (``admission``, an offering, an override) is checked."""
    start = section.get("start_timeout", DEFAULT_START_TIMEOUT)
    default_policy = section.get("admission", AdmissionPolicy.BLOCK.value)
    default_wait = section.get("queue_timeout", DEFAULT_QUEUE_TIMEOUT)
    if not isinstance(start, int | float) or isinstance(start, bool):
        return []  # (a wrong start_timeout is JupyterHub's to refuse)
    places: list[tuple[str, Any, Any]] = [("c.GPUSpawner.admission", default_policy, default_wait)]
    for entry in section.get("offerings", []) if isinstance(section.get("offerings"), list) else []:
        if isinstance(entry, Mapping):
            where = f"c.GPUSpawner.offerings[slug={entry.get('slug')!r}]"
            places.append((where, entry.get("admission", default_policy), entry.get("queue_timeout") or default_wait))
    overrides = section.get("offering_overrides", {})
    for slug, entry in overrides.items() if isinstance(overrides, Mapping) else []:
        if isinstance(entry, Mapping) and ("admission" in entry or "queue_timeout" in entry):
            where = f"c.GPUSpawner.offering_overrides[{slug!r}]"
            places.append((where, entry.get("admission", default_policy), entry.get("queue_timeout") or default_wait))
    problems = []
    for where, policy, wait in places:
        if policy != AdmissionPolicy.QUEUE.value or not isinstance(wait, int | float) or isinstance(wait, bool):
            continue
        if wait >= start:
            problems.append(
                f"{where}: a spawn may wait {wait:g} s in the queue, but c.KubeSpawner.start_timeout is {start:g} s, so"
                ' JupyterHub gives the waiting spawn up first ("timed out", nothing about the queue); set start_timeout'
                f" to the queue's wait plus the time a server takes to start (e.g. {int(wait) + 300})"
            )
    return problems


def gpuspawner_section(config: Any) -> dict[str, Any]:
    """The settings GPUSpawner would see: ``c.KubeSpawner.*`` then ``c.GPUSpawner.*`` over it."""
    section: dict[str, Any] = {}
    for name in ("Spawner", "KubeSpawner", "GPUSpawner"):
        if config is not None and name in config:
            section.update({k: v for k, v in config[name].items()})
    return section


def check_config(config: Any) -> None:
    """Raise :class:`GPUSpawnerConfigError` listing every problem in ``config``'s GPUSpawner settings.

    Put ``from gpuspawner import check_config; check_config(c)`` at the end of
    ``jupyterhub_config.py`` so a broken GPU config stops the hub at start-up.
    """
    problems = config_problems(gpuspawner_section(config))
    if problems:
        raise GPUSpawnerConfigError("GPUSpawner configuration is wrong:\n  - " + "\n  - ".join(problems))
