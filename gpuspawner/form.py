"""The spawn page's view layer: plain view data in, an HTML fragment out.

JupyterHub's ``spawn.html`` puts :attr:`Spawner.options_form` inside its own
``<form method="post">`` with its own Start button, so :func:`render_form`
returns a fragment with neither. The spawner builds a :class:`FormView` (what
is offered, what is free, what is selected, why something cannot be picked)
and this module only displays it: Jinja2 with autoescaping, the template in
``ui/templates/gpuspawner_form.html``, a little CSS and JS from ``ui/static``
inlined (JupyterHub does not serve our static folder).

Fields the form posts (``multipart/form-data``, as spawn.html sends it):

* ``offering``: the chosen offering's slug (radio buttons; always one value).
* ``count-<slug>``: how many GPUs, for whole-GPU offerings only (one
  ``<select>`` per whole-GPU offering, so the form needs no JavaScript). The
  spawner reads ``count-<chosen slug>`` and falls back to ``count`` (API
  clients and older forms); :func:`user_options_from_form` does exactly that.

The page refreshes free counts by itself (``ui/static/gpuspawner.js``): it
re-fetches the spawn page's path *without its query string* (JupyterHub spawns
on a GET that carries query arguments) and copies availability, disabled state,
reasons, count choices and the notice about the counts' age (when the cluster
cannot be reached) into the page without touching the user's selection.
The server re-validates everything on submit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from .offerings import Isolation, Kind

#: The form field holding the chosen offering's slug.
OFFERING_FIELD = "offering"
#: Prefix of the per-offering GPU count field: ``count-<slug>``.
COUNT_FIELD_PREFIX = "count-"
#: The plain count field (API clients; fallback when ``count-<slug>`` is absent).
COUNT_FIELD = "count"

TEMPLATE = "gpuspawner_form.html"


@dataclass(frozen=True)
class OptionView:
    """One offering as the spawn page shows it. Plain text only: the template escapes it."""

    slug: str
    kind: str
    display_name: str
    description: str
    memory: str  # "20 GB GPU memory" or ""
    compute_share: str  # "3/7 of the GPU's compute"
    isolation: str  # Isolation.phrase
    availability: str  # "3 of 8 free", "none free", "free after scale-up, about 5 min", "" for CPU
    free: int | None
    capacity: int | None
    disabled_reason: str  # "" if selectable, else e.g. "none free right now"
    counts: tuple[int, ...]  # allowed counts that fit right now (whole GPUs; others (1,))

    @property
    def disabled(self) -> bool:
        return bool(self.disabled_reason)

    @property
    def count_field(self) -> str:
        """``count-<slug>`` for whole-GPU offerings (the user picks how many), else ""."""
        return f"{COUNT_FIELD_PREFIX}{self.slug}" if self.kind == Kind.FULL.value else ""

    @property
    def facts(self) -> tuple[str, ...]:
        """Memory and compute share, the non-empty ones, once each (one line under the name)."""
        return tuple(dict.fromkeys(part for part in (self.memory, self.compute_share) if part))

    @property
    def isolation_line(self) -> str:
        """The isolation phrase on its own line, unless a fact already says it (CPU: "no GPU")."""
        return "" if self.isolation in self.facts else self.isolation

    @property
    def availability_tone(self) -> str:
        """How the availability badge looks: ok (free now), wait (after a wait), off, info."""
        if self.disabled_reason:
            return "off"
        if self.free is not None and self.free > 0:
            return "ok"
        if self.free == 0:
            return "wait"
        return "info"

    @property
    def isolation_warning(self) -> bool:
        """True where neighbours on the same GPU can starve this user (worth a visual cue)."""
        return self.isolation == Isolation.NONE.phrase


@dataclass(frozen=True)
class GroupView:
    kind: str
    title: str
    options: tuple[OptionView, ...]


@dataclass(frozen=True)
class FormView:
    groups: tuple[GroupView, ...]
    selected: str | None
    selected_count: int
    message: str = ""  # an error shown above the choices (plain text)
    notice: str = ""  # why the free counts are not live, and how old they are (plain text; "" when live)
    extra_html: Markup | str = ""  # KubeSpawner's own form, as Markup (inserted as-is); a plain str is escaped
    refresh_seconds: int = 15  # 0 turns the live refresh off


def group_options(options: Iterable[OptionView], order: Sequence[str]) -> tuple[GroupView, ...]:
    """Group options by kind in ``order`` (kind values), keeping their order within a group.

    Empty groups are skipped; kinds not named in ``order`` come last, in the
    order in which they first appear (so nothing offered is silently dropped).
    """
    by_kind: dict[str, list[OptionView]] = {}
    for option in options:
        by_kind.setdefault(option.kind, []).append(option)
    kinds = [k for k in dict.fromkeys(order) if k in by_kind]
    kinds += [k for k in by_kind if k not in kinds]
    return tuple(GroupView(kind=k, title=_group_title(k), options=tuple(by_kind[k])) for k in kinds)


def _group_title(kind: str) -> str:
    try:
        return Kind(kind).group_title
    except ValueError:
        return kind


def ui_dir() -> Path:
    """The ``ui`` folder: inside the installed package (wheel), else the repository's."""
    import gpuspawner

    package = Path(gpuspawner.__file__).resolve().parent
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
    return (ui_dir() / "static" / name).read_text(encoding="utf-8")


def render_form(view: FormView) -> str:
    """The options-form fragment for ``view`` (no ``<form>``, no submit button)."""
    env = _environment(str(ui_dir() / "templates"))
    selected = _selected_option(view)
    script = _static("gpuspawner.js").replace("</", "<\\/")  # cannot close the <script> early
    return env.get_template(TEMPLATE).render(
        view=view,
        checked=selected.slug if selected else None,
        count_for=lambda option: _initial_count(option, view),
        style=Markup(_static("gpuspawner.css")),
        script=Markup(script),
        offering_field=OFFERING_FIELD,
    )


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


def user_options_from_form(formdata: Mapping[str, Any]) -> dict[str, Any]:
    """The spawn form's POST -> ``user_options`` (``offering`` and ``count``).

    ``formdata`` is JupyterHub's: field name -> list of strings. The count is read
    from ``count-<chosen slug>``, falling back to ``count``; the other offerings'
    count fields are dropped. Every other field (e.g. KubeSpawner's profile)
    passes through untouched. Nothing is validated here: a single value is
    unwrapped, several stay a list so that validation can refuse them.
    """
    out = {
        key: value
        for key, value in formdata.items()
        if key != COUNT_FIELD and not key.startswith(COUNT_FIELD_PREFIX)
    }
    if OFFERING_FIELD not in formdata:
        return out
    slug = _unwrap(formdata[OFFERING_FIELD])
    out[OFFERING_FIELD] = slug
    count_key = f"{COUNT_FIELD_PREFIX}{slug}" if isinstance(slug, str) else None
    if count_key and count_key in formdata:
        out[COUNT_FIELD] = _unwrap(formdata[count_key])
    elif COUNT_FIELD in formdata:
        out[COUNT_FIELD] = _unwrap(formdata[COUNT_FIELD])
    return out


def _unwrap(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value
