"""Two hooks into JupyterHub beyond the Spawner API, for what that API cannot do.

* **Unknown ``user_options`` keys are never stored.** JupyterHub writes a REST API
  request's ``user_options`` into its database (``orm.Spawner.user_options``) before
  any spawner code runs (``User.spawn``, and ``PUT``/``PATCH`` of a named server).
  A SQLAlchemy ``set`` listener on that column hands each new value to the row's
  GPUSpawner (:func:`gpuspawner.hub.storedoptions.storable`), which returns what may be
  stored. Rows of other spawner classes are left as they are. Options with a value over
  the bound (``useroptions.MAX_VALUE_CHARS``) are not stored at all: a ``PUT``/``PATCH`` of
  a server that is not running is answered 400, and a start keeps the row as it was (the
  start itself then refuses them with 400). A start refused for its options themselves
  (400 malformed, 403 not offered) puts back what the row held before it: refused options
  are never the "last options" JupyterHub reuses or serves.
* **A refusal is one log line.** JupyterHub logs a refused form POST (and a refused
  ``/hub/spawn?...`` start) with ``exc_info=True``, a traceback for what is an answer,
  not a crash; likewise a REST API request whose body is not JSON; and a start refused
  after the form once in ``User.spawn`` and twice more on the page. A filter on the hub's
  logger puts the refusal's (or the JSON error's) message on its line instead of its
  traceback and drops the page's echoes of a refused start; every other exception keeps
  its traceback. JupyterHub's own log line for a ``PATCH`` of a server's ``user_options``
  ("Setting user_options on <user>/<server> <the body>") keeps its first part only: a
  request body is never echoed into the log.
"""

from __future__ import annotations

import json
import logging
import weakref
from typing import Any

from gpuspawner.hub import storedoptions
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.hub.seam import Spawner
from gpuspawner.hub.storedoptions import NotStored
from gpuspawner.names.vocabulary import Refusal

_ATTRIBUTE = "_gpuspawner_owner"
#: How JupyterHub's PATCH handler begins its log line, which goes on with the request's user_options.
_PATCH_ECHO = "Setting user_options on "
_installed = False


def saved_records(db: Any, key: str) -> list[tuple[str, dict[str, Any]]]:
    """(user name, record) of every server that exists in the hub's database (starting,
    running or stopping) and has the record ``key`` in its saved state (or, where the state
    has none, in its stored ``user_options``). ``db``: the hub's own SQLAlchemy session."""
    from jupyterhub import orm

    out = []
    for row in db.query(orm.Spawner).filter(orm.Spawner.server_id.isnot(None)):
        record = (row.state or {}).get(key) or (row.user_options or {}).get(key)
        if row.user is not None and isinstance(record, dict):
            out.append((row.user.name, record))
    return out


def own_row(spawner: Spawner) -> None:
    """Make ``spawner`` the one that filters what is stored in its ``orm_spawner`` row."""
    _install_listener()
    orm_spawner = getattr(spawner, "orm_spawner", None)
    if orm_spawner is not None:
        setattr(orm_spawner, _ATTRIBUTE, weakref.ref(spawner))


def _install_listener() -> None:
    global _installed
    if _installed:
        return
    from jupyterhub import orm
    from sqlalchemy import event

    event.listen(orm.Spawner.user_options, "set", _filter_stored, retval=True)
    _installed = True


def _filter_stored(target: Any, value: Any, oldvalue: Any, initiator: Any) -> Any:
    ref = getattr(target, _ATTRIBUTE, None)
    spawner: Spawner | None = ref() if ref is not None else None
    if spawner is None or not isinstance(value, dict):
        return value
    try:
        stored = storedoptions.storable(spawner, value)
    except NotStored as exc:
        if getattr(target, "server", None) is None:  # a PUT or PATCH of a server that does not run: answer 400
            raise SpawnRefused(str(exc), Refusal.MALFORMED) from None
        # a start (User.spawn stores the options after it made the server): keep the row as it was
        return oldvalue if isinstance(oldvalue, dict) else {}
    if getattr(target, "server", None) is not None:  # a start's options: put back if it refuses them
        storedoptions.stored_for_start(spawner, oldvalue if isinstance(oldvalue, dict) else {})
    return stored


class RefusalsOnOneLine(logging.Filter):
    """Replace the traceback of a logged :class:`SpawnRefused` (or a client's malformed JSON)
    by its message, on the same line.

    A refusal at start (``load_user_options``, marked ``during_start``) is logged by
    ``User.spawn``; the spawn page's handler then logs the same failure twice more when it
    shows the form again (``_wrap_spawn_single_user``'s "Error starting server ..." and the
    POST's or query's "Failed to spawn ..." with the exception): those echoes are dropped.
    A refusal of the form itself (``options_from_form``) keeps its one line.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_PATCH_ECHO) and not record.args:
            record.msg = record.msg.split(" {", 1)[0][:300] + " (the request body is not logged)"
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, SpawnRefused) and getattr(exc, "during_start", False) and record.funcName in ("_post", "get"):
            return False  # the spawn page's echo of a refused start, already logged by User.spawn
        if record.funcName == "_wrap_spawn_single_user" and str(record.msg).startswith("Error starting server"):
            return False  # the same echo, for any start that failed within the page's first second
        if isinstance(exc, (SpawnRefused, json.JSONDecodeError)):
            record.msg = f"{record.getMessage()}: {exc}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def log_refusals_on_one_line(log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Add :class:`RefusalsOnOneLine` to the hub's logger and to asyncio's (once each).

    asyncio's: when a spawn outlasts the page's ``slow_spawn_timeout`` (a busy hub) and is then
    refused, nobody awaits JupyterHub's finish-spawn task, and asyncio logs "Task exception was
    never retrieved" with the refusal's traceback, an echo of what ``User.spawn`` logged."""
    logger = log.logger if isinstance(log, logging.LoggerAdapter) else log
    for each in (logger, logging.getLogger("asyncio")):
        if not any(isinstance(f, RefusalsOnOneLine) for f in each.filters):
            each.addFilter(RefusalsOnOneLine())


def hub_log_for_gpuspawner(log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Send what gpuspawner's own modules log (the inventory's lists and outages, the orphan
    reconciler, Kueue's streams: loggers named ``gpuspawner.*``) to the hub's log handlers, at the
    hub's level, so they read like the hub's own lines; without this only their warnings reach
    stderr, bare, through Python's last-resort handler. Once, and never where the site has
    configured the ``gpuspawner`` logger itself."""
    hub = log.logger if isinstance(log, logging.LoggerAdapter) else log
    ours = logging.getLogger("gpuspawner")
    handlers = [h for h in hub.handlers if not isinstance(h, logging.NullHandler)]
    if ours.handlers or not handlers or hub.propagate:
        return  # (a hub logger that propagates shares the root's handlers, which ours reach already)
    for handler in handlers:
        ours.addHandler(handler)
    ours.setLevel(hub.getEffectiveLevel())  # (still propagated: a root handler, pytest's say, sees them too)
