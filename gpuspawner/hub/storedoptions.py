"""Which ``user_options`` a server keeps: the keys a spawn may carry (gpuspawner's, the
profile's, the site's ``extra_user_options``), what the hub may store, values over the bound
left out, and the hub's stored options put back after a refusal of the options themselves.

What the keys are is :mod:`gpuspawner.page.useroptions`'; the spawner is read through the seam
(``spawner``: :class:`gpuspawner.hub.seam.Spawner`) for its traits, its record and the hub's
database row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import object_session
from sqlalchemy.orm.exc import UnmappedInstanceError

from gpuspawner.hub import spawnview
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.hub.seam import Spawner
from gpuspawner.names.vocabulary import RECORD_KEY, STOP_NOTICE_KEY, Refusal
from gpuspawner.page.useroptions import KnownKeys, describe_keys, known_keys, oversized, split_known, too_long_message


class NotStored(ValueError):
    """``user_options`` that must not be stored (a value over the bound); ``str()`` says why."""


def profile_values(profile_list: Any) -> Any:
    """KubeSpawner's ``profile_list`` as a list (a dict's values in the order of its keys; a list or
    a callable as it is), as KubeSpawner reads it (its ``_sorted_dict_values``)."""
    if isinstance(profile_list, dict):
        return [profile_list[key] for key in sorted(profile_list.keys())]
    return profile_list


def known(spawner: Spawner) -> KnownKeys:
    """The ``user_options`` keys a spawn may carry."""
    declared = list(spawner.extra_user_options)
    if isinstance(spawner.apply_user_options, dict):
        declared += list(spawner.apply_user_options)
    return known_keys(profile_values(spawner.profile_list), declared)


def storable(spawner: Spawner, options: dict[str, Any]) -> dict[str, Any]:
    """What of ``options`` the hub may store for this server (called as it is stored; see
    :mod:`gpuspawner.hub.hubhooks`). The other keys are named in one log line. Raises
    :class:`NotStored` when a kept key's value is over the bound
    (``useroptions.MAX_VALUE_CHARS``): then nothing of ``options`` is stored."""
    kept, dropped = split(spawner, options, stored_record_is_ours=False)
    if dropped:
        spawner.log.warning("%s: user_options keys dropped, not stored: %s", spawner.log_name, describe_keys(dropped))
    too_long = _too_long(kept)
    if too_long:
        spawner.log.warning("%s: user_options not stored: the value of %s is too long", spawner.log_name, describe_keys(too_long))
        raise NotStored(too_long_message(too_long))
    return kept


def validated(spawner: Spawner, options: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``options`` as ``spawner.user_options`` may hold them, whoever sets them (the hub serves
    them in its REST API while the spawner lives): known keys only, and no value over the
    bound (left out; returned second, and the start refuses); the other values are checked at
    start."""
    kept = split(spawner, options)[0]
    too_long = tuple(_too_long(kept))
    return {k: v for k, v in kept.items() if k not in too_long}, too_long


def split(spawner: Spawner, options: dict[str, Any], stored_record_is_ours: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Split ``options`` into known keys and the rest; the ``gpuspawner`` record is kept only
    when this spawner wrote it: it is the running server's record (this spawn's, or the one its
    saved state holds), or (for the hub's copy) the one in the database row, which only this
    spawner stores (see :func:`storable`)."""
    kept, dropped = split_known(options, known(spawner))
    if RECORD_KEY in dropped:
        record = options[RECORD_KEY]
        state = getattr(spawner, "spawn_state", None)  # (none yet while traitlets sets user_options in __init__)
        ours = state is not None and state.choice is not None and record == spawnview.record(spawner)
        if not ours and state is not None and state.saved_record is not None:
            ours = record == state.saved_record  # (the running server's record from its saved state: after a restart)
        if not ours and stored_record_is_ours and spawner.orm_spawner is not None:
            ours = record == (spawner.orm_spawner.user_options or {}).get(RECORD_KEY)
        if ours:
            kept[RECORD_KEY] = record
            dropped.remove(RECORD_KEY)
    return kept, dropped


def _too_long(kept: dict[str, Any]) -> list[str]:
    """The kept keys whose values are over the bound (the record, which only the spawner
    writes, is not held to it)."""
    return oversized({k: v for k, v in kept.items() if k != RECORD_KEY})


def put_back(spawner: Spawner, before: dict[str, Any] | None, refusal: SpawnRefused) -> None:
    """After a refusal of the options themselves (malformed, not offered), the hub's row and
    the spawner hold what they held before the refused request; a refusal for the state of
    things (quota, capacity, window, the cluster) keeps them, for the next try."""
    if before is None or refusal.reason not in (Refusal.MALFORMED, Refusal.NOT_OFFERED):
        return
    spawner.user_options = before
    store(spawner)
    spawner.options_before = None


def store_notice(spawner: Spawner) -> None:
    """Write the spawner's ``stop_notice`` into the hub's row's saved state, committed at once
    (see :func:`store`): what the home page reads survives a hub that stops before its own save.
    Only the notice: the rest of the state is JupyterHub's to save (a record written here would
    count as held by a restarted hub's quotas)."""
    row = spawner.orm_spawner
    if row is None or not spawner.stop_notice:
        return
    row.state = {**(row.state or {}), STOP_NOTICE_KEY: dict(spawner.stop_notice)}
    _commit(row)


def stored_for_start(spawner: Spawner, before: dict[str, Any]) -> None:
    """JupyterHub stored a start's options over ``before`` (see hubhooks): a start refused
    for the options themselves puts ``before`` back (:func:`put_back`)."""
    spawner.options_before = dict(before)


def store(spawner: Spawner) -> None:
    """Write the spawner's ``user_options`` to the hub's row (what its REST API serves), committed
    at once. Left uncommitted for JupyterHub's next commit, the row is dirty while other requests
    finish, and JupyterHub's handlers roll back a session they find dirty (``BaseHandler.finish``:
    "Rolling back dirty objects"): the write was lost, and the rollback expired every object the
    session holds, so the next requests reloaded each user and server from the database (found in
    a 600-spawn storm on a 3,000-user hub: 53 rollbacks, and the hub's CPU doubled)."""
    row = spawner.orm_spawner
    if row is None:
        return
    row.user_options = dict(spawner.user_options)
    _commit(row)


def _commit(row: Any) -> None:
    try:
        session = object_session(row)
    except UnmappedInstanceError:  # (a stand-in row, in tests)
        return
    if session is not None:
        session.commit()
