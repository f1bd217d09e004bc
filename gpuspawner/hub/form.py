"""The spawn page's view layer: plain view data in, an HTML fragment out.

JupyterHub's ``spawn.html`` puts :attr:`Spawner.options_form` inside its own
``<form method="post">`` with its own Start button, so :func:`render_form`
returns a fragment with neither. The spawner builds a :class:`FormView` (what
is offered, what is free, what is selected, why something cannot be picked)
and this module only displays it: Jinja2 with autoescaping, the template in
``ui/templates/gpuspawner_form.html``, a little CSS and JS from ``ui/static``
inlined (JupyterHub does not serve our static folder).

The view models and the fields the form posts are :mod:`gpuspawner.page.views`'s (pure);
this is the one module that uses a template engine.

The page refreshes free counts by itself (``ui/static/gpuspawner.js``): it
re-fetches the spawn page's path *without its query string* (JupyterHub spawns
on a GET that carries query arguments) and copies availability, disabled state,
reasons, count choices and the notice about the counts' age (when the cluster
cannot be reached) into the page without touching the user's selection.
The server re-validates everything on submit.

A view renders only the cards it has not rendered before. Each card (``gpuspawner_card.html``) is
kept by what it shows: its :class:`OptionView` (every word and number on it, plain text), whether
it is checked and its initial count. Two users share a card's HTML only where their cards would
read the same, and a card whose free count, reason or price changed has another key, so an
inventory event costs one card's render at the next view, and a view in which nothing changed
renders no card at all; the rest of the page (the frame, the notice, KubeSpawner's form) is
rendered on each view, as before.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, Template
from markupsafe import Markup

from gpuspawner.names.vocabulary import OFFERING_KEY
from gpuspawner.page.views import FormView, GroupView, OptionView

TEMPLATE = "gpuspawner_form.html"
CARD_TEMPLATE = "gpuspawner_card.html"
#: Cards kept (about 2 KiB each): 200 offerings in a few states each for a hub's groups, and more.
CARDS_KEPT = 4096


def ui_dir() -> Path:
    """The ``ui`` folder: inside the installed package (wheel), else the repository's."""
    return _find_ui(__file__)


@lru_cache(maxsize=4)
def _find_ui(module_file: str) -> Path:
    """:func:`ui_dir` for this module at ``module_file`` (looked for once per process, not per page view)."""
    package = Path(module_file).resolve().parents[1]  # gpuspawner/
    for candidate in (package / "ui", package.parent / "ui"):
        if (candidate / "templates" / TEMPLATE).is_file():
            return candidate
    raise FileNotFoundError(
        f"gpuspawner's spawn-page templates are missing: looked for {TEMPLATE} in "
        f"{package / 'ui' / 'templates'} and {package.parent / 'ui' / 'templates'}. Reinstall gpuspawner."
    )


@lru_cache(maxsize=1)
def _environment(templates: str) -> Environment:
    return Environment(
        loader=FileSystemLoader(templates),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _static(name: str) -> str:
    path = ui_dir() / "static" / name
    return _read(str(path), path.stat().st_mtime_ns)  # read again only when the file changes


@lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int) -> str:
    return Path(path).read_text(encoding="utf-8")


def render_form(view: FormView) -> str:
    """The options-form fragment for ``view`` (no ``<form>``, no submit button)."""
    env = _environment(str(ui_dir() / "templates"))
    selected = _selected_option(view)
    checked = selected.slug if selected else None
    script = _static("gpuspawner.js").replace("</", "<\\/")  # cannot close the <script> early
    card_template: list[Template] = []  # looked up at the first card (a view may have none)

    def cards(group: GroupView) -> Markup:
        """The group's cards, one after the other (joined here: one template call per group, not per card)."""
        if not card_template:
            card_template.append(env.get_template(CARD_TEMPLATE))  # the same object until the file changes
        get, template = _CARDS.get, card_template[0]
        return Markup("\n".join(get(template, option, option.slug == checked, _initial_count(option, view)) for option in group.options))

    return env.get_template(TEMPLATE).render(
        view=view,
        cards=cards,
        style=Markup(_static("gpuspawner.css")),
        script=Markup(script),
    )


class CardCache:
    """Rendered cards, kept by everything they show (see the module's docstring); the least
    recently shown go first beyond ``size``."""

    def __init__(self, size: int = CARDS_KEPT) -> None:
        self.size = size
        self.cards: OrderedDict[tuple[Any, ...], Markup] = OrderedDict()
        self.renders = 0  # cards rendered (not found): what a view cost in templates

    def get(self, template: Template, option: OptionView, checked: bool, count: int | None) -> Markup:
        key = (template, option, checked, count)
        found = self.cards.get(key)
        if found is not None:
            self.cards.move_to_end(key)
            return found
        self.renders += 1
        html = Markup(_unindented(template.render(option=option, checked=checked, count=count, offering_field=OFFERING_KEY)))
        self.cards[key] = html
        if len(self.cards) > self.size:
            self.cards.popitem(last=False)
        return html


def _unindented(html: str) -> str:
    """The card without the template's indentation (a line's leading spaces; the line break stays, so
    the page reads and lays out the same): a third of a page of 200 cards that every view sends."""
    return _INDENT.sub("\n", html)


_INDENT = re.compile(r"\n[ \t]+")

#: This process's rendered cards (one hub, one event loop: no lock needed).
_CARDS = CardCache()


def _selected_option(view: FormView) -> OptionView | None:
    """The option to check: the selected one, unless it cannot be picked right now."""
    for group in view.groups:
        for option in group.options:
            if option.slug == view.selected and not option.disabled:
                return option
    return None


def _initial_count(option: OptionView, view: FormView) -> int | None:
    if not option.counts:
        return None
    if option.slug == view.selected and view.selected_count in option.counts:
        return view.selected_count
    return option.counts[0]
