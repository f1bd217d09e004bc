"""The user's choice (form post or API ``user_options``) -> a validated :class:`Choice`. Pure.

Every input is hostile until proven otherwise: unknown or forbidden offerings,
counts that are not allowed, wrong types, markup. Errors are
:class:`ChoiceError` with a message fit to show the user (no markup echoed
back, no internals), and nothing here raises anything else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.core import wording
from gpuspawner.core.model import SLUG_RE, Offering
from gpuspawner.names.vocabulary import COUNT_KEY, OFFERING_KEY, Refusal

# gpuspawner reads the ``user_options`` keys OFFERING_KEY and COUNT_KEY; everything else
# (e.g. a KubeSpawner profile, the record under RECORD_KEY) passes through untouched.


#: ChoiceError reasons: the request is malformed (a count of "1e9", a list for an
#: offering), or it names nothing this user may take (unknown and forbidden alike).
MALFORMED = Refusal.MALFORMED
NOT_OFFERED = Refusal.NOT_OFFERED


class ChoiceError(ValueError):
    """The user's choice cannot be honoured; ``str()`` is the message to show them.

    ``reason`` is :data:`MALFORMED` or :data:`NOT_OFFERED`; the spawner turns it
    into the HTTP status (see :mod:`gpuspawner.hub.scheduling`).
    """

    def __init__(self, message: str, reason: str = MALFORMED):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Choice:
    offering: Offering
    count: int = 1

    def as_user_options(self) -> dict[str, Any]:
        return {OFFERING_KEY: self.offering.slug, COUNT_KEY: self.count}


def shown(value: Any, limit: int = 40) -> str:
    """A value safe to quote back to the user: plain characters, short."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**limit:
        return "a very large number"
    text = re.sub(r"[^A-Za-z0-9 ._:/-]", "?", str(value))
    return text[:limit] + ("…" if len(text) > limit else "")


def _single(value: Any, name: str) -> Any:
    """Form posts give lists; the REST API gives scalars. Accept one value only."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ChoiceError(wording.not_one(name, len(value)))
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value


def parse_count(raw: Any) -> int:
    value = _single(raw, "GPU count")
    if isinstance(value, bool):
        raise ChoiceError(wording.COUNT_NOT_WHOLE)
    if isinstance(value, int):
        if not 0 <= value <= 999:
            raise ChoiceError(wording.count_not_whole(shown(value)))
        return value
    if isinstance(value, str):
        text = value.strip(" \t\r\n")
        if re.fullmatch(r"[0-9]{1,3}", text):
            return int(text)
    raise ChoiceError(wording.count_not_whole(shown(value)))


def parse_choice(
    user_options: Mapping[str, Any] | None,
    offerings: Mapping[str, Offering],
    default_slug: str | None,
) -> Choice:
    """Resolve ``user_options`` against the offerings the user may take.

    ``offerings`` must already be filtered by policy (what this user may use):
    a forbidden slug and an unknown one get the same answer, so the error does
    not reveal offerings the user cannot see. With no ``offering`` key the
    default is used (an API spawn without options).
    """
    if user_options is not None and not isinstance(user_options, Mapping):
        raise ChoiceError(wording.OPTIONS_NOT_UNDERSTOOD)
    options = dict(user_options or {})
    if OFFERING_KEY in options:
        slug = _single(options[OFFERING_KEY], "GPU option")
        if not isinstance(slug, str) or not SLUG_RE.match(slug):
            raise ChoiceError(wording.not_a_choice(shown(slug)))
    else:
        slug = default_slug
        if slug is None:
            raise ChoiceError(wording.NO_CHOICE_NO_DEFAULT, NOT_OFFERED)
    offering = offerings.get(slug)
    if offering is None:
        names = ", ".join(sorted(o.display_name for o in offerings.values() if not o.hidden)[:8])
        raise ChoiceError(wording.not_offered(shown(slug), names), NOT_OFFERED)
    count = parse_count(options[COUNT_KEY]) if COUNT_KEY in options else offering.counts[0]
    if count not in offering.counts:
        allowed = ", ".join(str(c) for c in offering.counts)
        raise ChoiceError(wording.count_not_offered(offering.display_name, allowed, count))
    return Choice(offering=offering, count=count)
