"""Two hooks into JupyterHub beyond the Spawner API, for what that API cannot do.

* **Unknown ``user_options`` keys are never stored.** JupyterHub writes a REST API
  request's ``user_options`` into its database (``orm.Spawner.user_options``) before
  any spawner code runs (``User.spawn``, and ``PUT``/``PATCH`` of a named server).
  A SQLAlchemy ``set`` listener on that column hands each new value to the row's
  GPUSpawner (:meth:`GPUSpawner.storable_user_options`), which returns what may be
  stored. Rows of other spawner classes are left as they are.
* **A refusal is one log line.** JupyterHub logs a refused form POST (and a refused
  ``/hub/spawn?...`` start) with ``exc_info=True``, a traceback for what is an answer,
  not a crash; likewise a REST API request whose body is not JSON; and a start refused
  after the form once in ``User.spawn`` and twice more on the page. A filter on the hub's
  logger puts the refusal's (or the JSON error's) message on its line instead of its
  traceback and drops the page's echoes of a refused start; every other exception keeps
  its traceback.
"""

from __future__ import annotations

import json
import logging
import weakref
from typing import Any

from .scheduling import SpawnRefused

_ATTRIBUTE = "_gpuspawner_owner"
_installed = False


def own_row(spawner: Any) -> None:
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
    spawner = ref() if ref is not None else None
    if spawner is None or not isinstance(value, dict):
        return value
    return spawner.storable_user_options(value)


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


def log_refusals_on_one_line(log: logging.Logger | logging.LoggerAdapter) -> None:
    """Add :class:`RefusalsOnOneLine` to the hub's logger (once)."""
    logger = log.logger if isinstance(log, logging.LoggerAdapter) else log
    if not any(isinstance(f, RefusalsOnOneLine) for f in logger.filters):
        logger.addFilter(RefusalsOnOneLine())
