"""The spawn page's cards as a reader sees them, and where their words disagree (issue 29).

Used by the unit test that renders the page for the demo's cluster (tests/unit/test_page_words.py)
and by the end-to-end test that reads it from the running demo (tests/e2e/test_page_words_e2e.py):
both check the same rules on the same HTML.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from tests.unit.test_form import parse

_FIGURE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?) (GB|MiB)\b")
_NAME_MEMORY = re.compile(r"(?<![\w.])(\d{1,4}) ?GB\b")
_PROFILE = re.compile(r"\bMIG (\d+g\.\d+gb(?:\+me)?)")
#: What a badge may not say on a card the user cannot start: a queue place, a wait, a scale-up.
PROMISES = ("queue", "wait", "scale-up", "new node", "first")


@dataclass(frozen=True)
class Card:
    slug: str
    kind: str
    name: str
    facts: str  # memory and compute share, as one line
    badge: str  # "" where the page shows none
    reason: str  # "" where the choice is selectable
    description: str

    @property
    def memory(self) -> str | None:
        """The first memory figure of the card's facts, as written ("4.8 GB"), or None."""
        match = _FIGURE.search(self.facts)
        return f"{match.group(1)} {match.group(2)}" if match else None

    @property
    def profile(self) -> str | None:
        match = _PROFILE.search(self.name)
        return match.group(1) if match else None


def fragment(page: str) -> str:
    """gpuspawner's part of a whole spawn page (JupyterHub's own HTML around it is not ours to check):
    from its ``<div class="gpuspawner"`` to the end of its script (whose "</" are escaped)."""
    start = page.index('<div class="gpuspawner"')
    end = page.index("</script>", start)
    return page[start : page.index("</div>", end) + len("</div>")]


def cards(html: str) -> dict[str, Card]:
    """Each option of the rendered form (or of a whole spawn page) by slug, with what its reader sees
    (hidden parts as "")."""
    root = parse(fragment(html))
    out = {}
    for group in root.find_all("fieldset"):
        kind = group.attrs.get("data-kind") or ""
        for option in [n for n in group.iter() if n.tag == "div" and n.has("data-slug")]:
            slug = option.attrs["data-slug"] or ""
            out[slug] = Card(
                slug=slug,
                kind=kind,
                name=_shown(option, "gs-name"),
                facts=_shown(option, "gs-facts"),
                badge=_shown(option, "gs-avail"),
                reason=_shown(option, "gs-reason"),
                description=_shown(option, "gs-description"),
            )
    return out


def _shown(option, cls: str) -> str:
    """The words of the option's element of class ``cls``; "" if it has none or it is hidden."""
    found = [n for n in option.iter() if cls in n.classes()]
    return found[0].words if found and not found[0].has("hidden") else ""


def disagreements(shown: dict[str, Card]) -> list[str]:
    """Where the page contradicts itself: one MIG profile of one GPU with two memory figures, a
    whole GPU whose name says its memory but whose card shows none (or another), a choice the
    user may not start that promises a queue place or a wait, a forbidden one with any badge."""
    problems = []
    by_profile: dict[tuple[str, str], dict[str, str | None]] = defaultdict(dict)
    for card in shown.values():
        if card.kind == "mig" and card.profile:
            gpu = card.name.split(" · ")[0]
            by_profile[(gpu, card.profile)][card.slug] = card.memory
        said = _NAME_MEMORY.search(card.name)
        if card.kind == "full" and said:
            if card.memory is None:
                problems.append(f"{card.slug}: its name says {said.group(0)}, its card shows no memory")
            elif card.memory.endswith(" GB") and round(float(card.memory[:-3])) != int(said.group(1)):
                problems.append(f"{card.slug}: its name says {said.group(0)}, its card {card.memory}")
        if card.reason:
            promised = [p for p in PROMISES if p in card.badge.lower()]
            if promised:
                problems.append(f"{card.slug}: disabled ({card.reason!r}) but its badge says {card.badge!r}")
        if card.reason == "not allowed for your groups" and card.badge:
            problems.append(f"{card.slug}: not allowed for the user, yet its badge says {card.badge!r}")
    for (gpu, profile), figures in by_profile.items():
        if len(set(figures.values())) > 1:
            problems.append(f"{gpu} MIG {profile}: the cards say {figures}")
    return problems
