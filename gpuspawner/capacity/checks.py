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
from gpuspawner.capacity.budgets import budget_problems
from gpuspawner.names.vocabulary import AdmissionPolicy
from gpuspawner.offerings.catalog import CatalogConfig
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.pod.memguard import DEFAULT_KINDS, GuardConfigError, GuardDefaults


class GPUSpawnerConfigError(ValueError):
    """One or more GPUSpawner settings are wrong; the message lists each."""


def config_problems(section: Mapping[str, Any]) -> list[str]:
    """Problems in a GPUSpawner settings mapping (trait name -> value); empty if none."""
    problems = []
    try:
        CatalogConfig.from_settings(section).configured()
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
