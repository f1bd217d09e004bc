"""The spawn page kept whole: a view in which nothing the page shows has changed is answered
with the HTML made before, without building the catalog or a single row (issue 39).

A page is kept by a key (:func:`view_key`) made of everything the page reads, each by value or
by a serial that moves whenever it does:

- the spawner's settings: every configurable trait by its value now, written out (``marshal``,
  or the ``repr`` of what marshal cannot write, as :class:`gpuspawner.core.settingskey.SettingsKey`
  does: a hook's change, even in place, is a new key), and the hub's identity;
- who asks: the user's groups and admin flag (:meth:`GPUSpawner.requester`), their name where the
  page reads it (a quota is set, or an offering is open to users by name: :func:`names_users`),
  and which of their servers it is. Users whose pages cannot differ share a key (the same groups,
  no last or refused choice, no quota, no offering by name: a lab's class whose pages the counts
  move together is one page made once per event, not once per student); no user is ever shown a
  page made for another's policy, quota or choice;
- the user's last and just-refused choices (the checked card);
- the counts: the index's :attr:`~gpuspawner.capacity.index.ClusterIndex.changes`, which takes a
  new value at every node, pod, DRA or Kueue event that changed anything, every relist, every
  reservation made or given back, and the inventory's health (live, lost since when, forbidden;
  DRA and Kueue listed or not);
- the quota ledger's grants (where a quota is set) and the members of the user's groups that
  have one, and who waits in each offering's queue;
- the clock, to the minute (windows open and close on minutes), or to the second while the page
  says how old the counts are;
- KubeSpawner's own form as it renders for this view (a callable ``profile_list`` included).

A user with a GPU-hour or cost budget gets a page made on each view: the budget's usage moves with the
clock and Prometheus. So does a hub whose ``profile_list`` is a callable (it may answer other
profiles, with other images, on each call), and a view whose key changed while the page was being
made (it is shown, not kept).
"""

from __future__ import annotations

import marshal
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from traitlets import HasTraits

from gpuspawner.hub import budgets, spawnview
from gpuspawner.hub.admitting import group_members
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.scheduling import WaitQueue
from gpuspawner.hub.seam import Spawner

#: Keys kept: one per user and server whose page was viewed lately (a key is small; equal pages
#: are kept once).
PAGES_KEPT = 4096
#: Characters of distinct pages kept (about 210 KiB a page at 200 offerings): the least recently
#: viewed go first beyond it.
PAGE_CHARS_KEPT = 48 * 2**20


class PageCache:
    """Whole pages by :func:`view_key`; a page that reads the same for several keys is kept once."""

    def __init__(self, size: int = PAGES_KEPT, max_chars: int = PAGE_CHARS_KEPT) -> None:
        self.size, self.max_chars = size, max_chars
        self.pages: OrderedDict[Hashable, str] = OrderedDict()
        self._copies: dict[str, list[Any]] = {}  # each distinct page -> [the one copy kept, keys holding it]
        self.chars = 0
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> str | None:
        page = self.pages.get(key)
        if page is None:
            self.misses += 1
            return None
        self.pages.move_to_end(key)
        self.hits += 1
        return page

    def put(self, key: Hashable, html: str) -> None:
        old = self.pages.pop(key, None)
        if old is not None:
            self._drop(old)
        copy = self._copies.get(html)
        if copy is None:
            copy = self._copies[html] = [html, 0]
            self.chars += len(html)
        copy[1] += 1
        self.pages[key] = copy[0]
        while self.pages and (len(self.pages) > self.size or self.chars > self.max_chars):
            _, page = self.pages.popitem(last=False)
            self._drop(page)

    def _drop(self, page: str) -> None:
        copy = self._copies[page]
        copy[1] -= 1
        if not copy[1]:
            del self._copies[page]
            self.chars -= len(page)


#: This process's pages (one hub, one event loop: no lock needed).
PAGES = PageCache()


def view_key(spawner: Spawner, extra_html: str, settings: tuple[bytes | str, ...] | None = None) -> tuple[Any, ...] | None:
    """Everything the spawn page of ``spawner`` reads now (see the module's docstring); None where
    the page is made on each view (a GPU-hour or cost budget, a callable ``profile_list``). ``extra_html``:
    KubeSpawner's form for this view; ``settings``: :func:`settings_now` as this view already wrote
    them out (the key made again after the page, to see whether anything moved meanwhile: the
    settings are the key's dearest part, and they are not what moves while a page is made)."""
    if budgets.any_budget(spawner) or callable(spawner.profile_list):
        return None  # (a callable profile_list may give other profiles, and their images, on each call)
    settings = settings if settings is not None else settings_now(spawner)
    orm = spawner.orm_spawner
    last = spawner.user_options or (orm.user_options if orm else None)
    inventory = Inventory.running(spawner.api)
    counts: tuple[Any, ...] = ()
    live = True
    if inventory is not None:
        index, health = inventory.index, inventory.health
        counts = (index.changes, health, inventory.forbidden, index.dra.synced, tuple(index.kueue.synced.items()), index.kueue.unavailable)
        live = health.ready or bool(health.forbidden)
    quotas: tuple[Any, ...] = ()
    if spawner.user_quota or spawner.group_quotas:
        ledger = spawner.quota_ledger
        members = tuple((group, tuple(names)) for group, names in group_members(spawner).items())
        quotas = (tuple(ledger.grants.items()), ledger.restored, members)
    now = spawner.now()
    clock = now.replace(second=0, microsecond=0) if live else now.replace(microsecond=0)  # (the notice says the counts' age)
    who = spawnview.requester(spawner)
    if not quotas and not names_users(spawner):
        who = replace(who, name="")  # (nothing the page shows reads the name: users alike share one key)
    return (
        settings,
        who,
        spawner.name,
        repr(last),
        repr(spawner.refused_options),
        counts,
        quotas,
        WaitQueue.lengths(),
        clock,
        extra_html,
    )


def names_users(spawner: Spawner) -> bool:
    """Whether an offering is open to users by name (``users`` in an entry or an override): then
    the page depends on who asks beyond their groups and admin flag."""
    return any(entry.get("users") for entry in spawner.offerings if isinstance(entry, dict)) or any(
        override.get("users") for override in spawner.offering_overrides.values() if isinstance(override, dict)
    )


def settings_now(spawner: Spawner) -> tuple[bytes | str, ...]:
    """Every configurable trait of ``spawner`` as its value is now, written out: two settings that
    differ in anything are never equal (marshal's bytes read back to the value; a value it cannot
    write, a hook say, by its ``repr``). A few times cheaper than the ``repr`` of them all. The
    spawner's own methods are written by name (their ``repr`` names the object: no two users' would
    match), and :data:`PER_SERVER_TRAITS` are left out."""
    written: list[bytes | str] = [spawner.hub_id]
    for name in _configurable(type(spawner)):
        value = getattr(spawner, name)
        if getattr(value, "__self__", None) is spawner:  # the spawner's own method (options_form's default): the same code for every user
            value = ("method", getattr(getattr(value, "__func__", value), "__qualname__", repr(type(value))))
        try:
            written.append(marshal.dumps(value, 2))  # (version 2: no back-references, the same value the same bytes)
        except ValueError:
            written.append(repr(value))
    return tuple(written)


#: Configurable traits whose value is the server's own and that no page reads: KubeSpawner derives
#: ``ssl_alt_names`` from the pod's name, so in the key they would keep apart the pages of users alike.
PER_SERVER_TRAITS = frozenset({"ssl_alt_names"})


@lru_cache(maxsize=8)
def _configurable(cls: type[HasTraits]) -> tuple[str, ...]:
    return tuple(sorted(set(cls.class_trait_names(config=True)) - PER_SERVER_TRAITS))
