"""The spawn page's view models, and the fields its form posts. Pure.

The spawner turns offerings and their availability into these plain values
(:mod:`gpuspawner.page.cards`); :mod:`gpuspawner.hub.form` only displays them. Nothing here
knows HTML: every string is plain text, escaped by the template.

Fields the form posts (``multipart/form-data``, as JupyterHub's spawn.html sends it),
named in :mod:`gpuspawner.names.vocabulary`:

* ``offering``: the chosen offering's slug (radio buttons; always one value).
* ``count-<slug>``: how many GPUs, for whole-GPU offerings only (one
  ``<select>`` per whole-GPU offering, so the form needs no JavaScript). The
  spawner reads ``count-<chosen slug>`` and falls back to ``count`` (API
  clients and older forms); :func:`user_options_from_form` does exactly that.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from gpuspawner.core.wording import group_title, isolation_phrase
from gpuspawner.names.vocabulary import COUNT_FIELD_PREFIX, COUNT_KEY, OFFERING_KEY, Isolation, Kind


@dataclass(frozen=True)
class OptionView:
    """One offering as the spawn page shows it. Plain text only: the template escapes it."""

    slug: str
    kind: str
    display_name: str
    description: str
    memory: str  # wording.memory_truth: "MIG: 10 GB, enforced by the hardware", or ""
    compute_share: str  # "3/7 of the GPU's compute"
    isolation: str  # wording.isolation_phrase
    availability: str  # "3 of 8 free", "none free", "a new node starts for you, about 5 min", "" for CPU
    free: int | None
    capacity: int | None
    disabled_reason: str  # "" if selectable, else e.g. "none free right now"
    counts: tuple[int, ...]  # allowed counts that fit right now (whole GPUs; others (1,))
    hour_cost: str = ""  # with a GPU-hour budget: "2 GPU-hours per hour" (budgets.cost_text), else ""
    price: str = ""  # the admin's price_per_hour: "5.00 per hour", else ""
    #: What the card says for each image KubeSpawner's form may choose, as JSON ({image: [availability,
    #: disabled reason, availability tone]}; c.GPUSpawner.image_requirements), for the page's script; ""
    #: when images need nothing.
    by_image: str = ""

    def __hash__(self) -> int:
        """The fields' hash, worked out once per row (a page view looks each card up by its row)."""
        kept = self.__dict__.get("_hash")
        if kept is None:
            kept = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", kept)  # (not a field: equality and replace() ignore it)
        return int(kept)

    @property
    def disabled(self) -> bool:
        return bool(self.disabled_reason)

    @property
    def count_field(self) -> str:
        """``count-<slug>`` for whole-GPU offerings (the user picks how many), else ""."""
        return f"{COUNT_FIELD_PREFIX}{self.slug}" if self.kind == Kind.FULL else ""

    @property
    def facts(self) -> tuple[str, ...]:
        """Memory, compute share and price, the non-empty ones, once each (one line under the name)."""
        return tuple(dict.fromkeys(part for part in (self.memory, self.compute_share, self.price) if part))

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
        return self.isolation == isolation_phrase(Isolation.NONE)


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
    #: KubeSpawner's own form: a ``markupsafe.Markup`` (a str) is inserted as-is, a plain str is escaped
    extra_html: str = ""
    refresh_seconds: int = 15  # 0 turns the live refresh off
    budget: str = ""  # the user's GPU-hour budget and use (budgets.standing_text; "" without a budget)
    #: Which image each choice of KubeSpawner's form runs, as JSON (useroptions.profile_images); "" when
    #: images need nothing (the cards then never change with the profile).
    images: str = ""


def with_images(rows: Sequence[OptionView], by_image: Mapping[str, Sequence[OptionView]]) -> list[OptionView]:
    """``rows`` (the form's default image) with what each card says for every image of ``by_image``
    (the rows for that image, one per card, in the same order)."""
    out = []
    for i, row in enumerate(rows):
        said = {image: [other[i].availability, other[i].disabled_reason, other[i].availability_tone] for image, other in by_image.items()}
        out.append(replace(row, by_image=json.dumps(said, sort_keys=True)))
    return out


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
    return tuple(GroupView(kind=k, title=group_title(k), options=tuple(by_kind[k])) for k in kinds)


def user_options_from_form(formdata: Mapping[str, Any]) -> dict[str, Any]:
    """The spawn form's POST -> ``user_options`` (``offering`` and ``count``).

    ``formdata`` is JupyterHub's: field name -> list of strings. The count is read
    from ``count-<chosen slug>``, falling back to ``count``; the other offerings'
    count fields are dropped. Every other field (e.g. KubeSpawner's profile)
    passes through untouched. Nothing is validated here: a single value is
    unwrapped, several stay a list so that validation can refuse them.
    """
    out = {key: value for key, value in formdata.items() if key != COUNT_KEY and not key.startswith(COUNT_FIELD_PREFIX)}
    if OFFERING_KEY not in formdata:
        return out
    slug = _unwrap(formdata[OFFERING_KEY])
    out[OFFERING_KEY] = slug
    count_key = f"{COUNT_FIELD_PREFIX}{slug}" if isinstance(slug, str) else None
    if count_key and count_key in formdata:
        out[COUNT_KEY] = _unwrap(formdata[count_key])
    elif COUNT_KEY in formdata:
        out[COUNT_KEY] = _unwrap(formdata[COUNT_KEY])
    return out


def _unwrap(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value
