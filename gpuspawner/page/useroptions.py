"""Which ``user_options`` keys a spawn may carry, and KubeSpawner's profile choice, checked. Pure.

JupyterHub takes a REST API request's ``user_options`` as they come and stores
them in its database, where every ``/hub/api/users`` answer repeats them. The
form path only ever produces the keys the spawner reads; the API path must not
be a way around that. So the keys kept are:

* gpuspawner's own: ``offering`` and ``count``;
* KubeSpawner's, when a ``profile_list`` is configured: ``profile`` and, for each
  profile option, ``<option>`` and ``<option>--unlisted-choice`` (KubeSpawner's
  ``user_options`` names for the form's ``profile-option-*`` fields);
* keys the admin declares: the keys of a dict ``Spawner.apply_user_options``
  (JupyterHub's own way to name them) and ``GPUSpawner.extra_user_options``
  (for a callable ``apply_user_options`` or a ``pre_spawn_hook``).

Everything else is dropped, before JupyterHub stores or serves it. The values of
the kept keys are bounded: options with a value longer than :data:`MAX_VALUE_CHARS`
(as JSON) are not stored at all -- the hub's row keeps what it held -- and a start
with them is refused (400). Within the bound, values are stored as they are:
JupyterHub reuses stored options for a start without any (``PUT`` then ``POST``),
and that start must get the same answer as the first one (never a default in the
place of a value that was refused).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.core import wording
from gpuspawner.names.vocabulary import COUNT_KEY, OFFERING_KEY
from gpuspawner.offerings.choice import MALFORMED, ChoiceError, shown

PROFILE_KEY = "profile"
UNLISTED_SUFFIX = "--unlisted-choice"
#: The longest unlisted profile choice (e.g. an image name) accepted.
MAX_UNLISTED_CHARS = 1024
#: The longest value (as JSON) of any kept key that is stored: an offering's slug, a count, a
#: profile choice and an unlisted one (MAX_UNLISTED_CHARS) fit many times over.
MAX_VALUE_CHARS = 4096
#: Option names of a callable ``profile_list`` are unknown until it is called: keys shaped like one are kept.
_OPTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class KnownKeys:
    """The ``user_options`` keys a spawn may carry (see the module docstring)."""

    names: frozenset[str]
    #: The profile_list is a callable (its option names are not known here): keep option-shaped keys.
    profile_options_unknown: bool = False

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if key in self.names:
            return True
        if self.profile_options_unknown:
            name = key[: -len(UNLISTED_SUFFIX)] if key.endswith(UNLISTED_SUFFIX) else key
            return bool(_OPTION_NAME.match(name))
        return False


def known_keys(profile_list: Any, declared: Iterable[str] = ()) -> KnownKeys:
    """The keys kept for a spawner whose ``profile_list`` is ``profile_list`` (a list, a callable or empty)."""
    names = {OFFERING_KEY, COUNT_KEY, *declared}
    if callable(profile_list):
        return KnownKeys(frozenset(names | {PROFILE_KEY}), profile_options_unknown=True)
    if profile_list:
        names.add(PROFILE_KEY)
        for profile in profile_list:
            for option in profile.get("profile_options") or {}:
                names.update((option, f"{option}{UNLISTED_SUFFIX}"))
    return KnownKeys(frozenset(names))


def split_known(options: Mapping[str, Any] | None, keys: KnownKeys) -> tuple[dict[str, Any], list[str]]:
    """(the options with known keys, the other keys in their order)."""
    kept, dropped = {}, []
    for key, value in (options or {}).items():
        if key in keys:
            kept[key] = value
        else:
            dropped.append(key)
    return kept, dropped


def oversized(options: Mapping[str, Any]) -> list[str]:
    """The keys of ``options`` whose value is longer than :data:`MAX_VALUE_CHARS` as JSON."""
    return [key for key, value in options.items() if len(json.dumps(value, default=str)) > MAX_VALUE_CHARS]


def too_long_message(keys: Iterable[Any]) -> str:
    """The 400's words for options whose values under ``keys`` are over the bound."""
    return wording.too_long(describe_keys(keys), MAX_VALUE_CHARS)


def describe_keys(keys: Iterable[Any], limit: int = 8) -> str:
    """Keys for a log line: each quoted safely and short, at most ``limit`` of them, then a count."""
    keys = list(keys)
    shown_keys = ", ".join(repr(shown(k, 40)) for k in keys[:limit])
    return shown_keys + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def check_profile(options: Mapping[str, Any], profile_list: list[dict[str, Any]]) -> None:
    """Refuse a profile, or a profile option choice, that ``profile_list`` does not have.

    ``profile_list`` is KubeSpawner's initialized list (every profile has a ``slug``,
    one is the default). KubeSpawner itself answers these with a ValueError naming
    every profile, a KeyError or a TypeError; here they are :class:`ChoiceError`
    (400) with a short message. The unlisted-choice checks (enabled? matches the
    regex?) stay KubeSpawner's.
    """
    if not profile_list:
        return
    slug = options.get(PROFILE_KEY)
    slugs = [p["slug"] for p in profile_list]
    if slug is None or slug == "":
        profile = next((p for p in profile_list if p.get("default")), profile_list[0])
    elif not isinstance(slug, str):
        raise ChoiceError(wording.profile_not_a_name(", ".join(slugs[:8])), MALFORMED)
    elif slug not in slugs:
        raise ChoiceError(wording.profile_unknown(shown(slug), ", ".join(slugs[:8])), MALFORMED)
    else:
        profile = profile_list[slugs.index(slug)]
    for name, option in (profile.get("profile_options") or {}).items():
        title = option.get("display_name") or name
        unlisted = options.get(f"{name}{UNLISTED_SUFFIX}")
        choice = options.get(name)
        if unlisted is not None and unlisted != "":
            if not isinstance(unlisted, str) or len(unlisted) > MAX_UNLISTED_CHARS:
                raise ChoiceError(wording.unlisted_not_text(title, shown(unlisted)), MALFORMED)
        elif choice is not None and choice != "":
            choices = list(option.get("choices") or {})
            if not isinstance(choice, str) or choice not in choices:
                raise ChoiceError(
                    wording.not_a_profile_choice(
                        shown(choice), title, profile.get("display_name") or profile["slug"], ", ".join(choices[:8])
                    ),
                    MALFORMED,
                )


def profile_image(options: Mapping[str, Any], profile_list: list[dict[str, Any]], image: str) -> str:
    """The image a spawn with ``options`` runs: ``image`` (``c.KubeSpawner.image``) as the chosen
    profile and its option choices override it, the way KubeSpawner's ``load_user_options``
    applies their ``kubespawner_override`` (an unlisted choice's ``{value}`` filled in; a
    callable override is left out: its image is known at start). ``profile_list`` is
    KubeSpawner's initialized list; the choice is assumed checked (:func:`check_profile`)."""
    if not profile_list:
        return image
    slug = options.get(PROFILE_KEY)
    profile = next((p for p in profile_list if p.get("slug") == slug), None)
    if profile is None:
        profile = next((p for p in profile_list if p.get("default")), profile_list[0])
    image = _override_image(profile.get("kubespawner_override"), image)
    for name, option in (profile.get("profile_options") or {}).items():
        unlisted = options.get(f"{name}{UNLISTED_SUFFIX}")
        choices = option.get("choices") or {}
        choice = options.get(name)
        if isinstance(unlisted, str) and unlisted:
            override = (option.get("unlisted_choice") or {}).get("kubespawner_override") or {}
            template = override.get("image")
            if isinstance(template, str):
                try:
                    image = template.format(value=unlisted)
                except (KeyError, IndexError, ValueError):
                    pass  # KubeSpawner refuses it at start
        elif isinstance(choice, str) and choice in choices:
            image = _override_image(choices[choice].get("kubespawner_override"), image)
        else:
            default = next((c for c in choices.values() if c.get("default")), None)
            image = _override_image((default or {}).get("kubespawner_override"), image)
    return image


def _override_image(override: Any, image: str) -> str:
    value = override.get("image") if isinstance(override, Mapping) else None
    return value if isinstance(value, str) and value else image


def profile_images(profile_list: list[dict[str, Any]], image: str) -> dict[str, str]:
    """Which image each choice of KubeSpawner's form runs, for the spawn page's script: ``""`` the
    form's default, ``<profile slug>`` a profile with its default option choices, and
    ``<profile slug>--<option>=<choice>`` a choice that overrides the image (the field names of
    KubeSpawner's form: ``profile``, ``profile-option-<slug>--<option>``). Unlisted choices are
    not known before they are typed: the start checks them."""
    out = {"": profile_image({}, profile_list, image)}
    for profile in profile_list:
        slug = profile.get("slug")
        if not isinstance(slug, str):
            continue
        out[slug] = profile_image({PROFILE_KEY: slug}, profile_list, image)
        for name, option in (profile.get("profile_options") or {}).items():
            for choice, spec in (option.get("choices") or {}).items():
                overridden = _override_image(spec.get("kubespawner_override") if isinstance(spec, Mapping) else None, "")
                if overridden:
                    out[f"{slug}--{name}={choice}"] = overridden
    return out
