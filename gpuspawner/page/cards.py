"""What the spawn page shows for each offering, for one user, now. Pure.

Turns offerings, their live availability and the policy answers (allowed? within
its time window? within quota? queued?) into :class:`~gpuspawner.page.views.OptionView`
rows (:mod:`gpuspawner.page.views`), and picks the default choice. A :class:`RowCache` the
caller keeps gives back the rows of earlier views that read the same (the hub keeps one).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from gpuspawner.capacity.access import Requester, may_use
from gpuspawner.core import wording
from gpuspawner.core.model import Availability, Offering
from gpuspawner.core.products import product_name
from gpuspawner.core.windows import window_state
from gpuspawner.core.wording import isolation_phrase, memory_truth, queue_words
from gpuspawner.dra.alternatives import choice_words, choices
from gpuspawner.names.vocabulary import COUNT_KEY, OFFERING_KEY, AdmissionPolicy, Kind
from gpuspawner.page.views import OptionView


def availability_text(offering: Offering, avail: Availability, policy: str, queued: int) -> tuple[str, str]:
    """(badge text, disabled reason) for an offering the user may take now: the badge may promise
    a queue place or a wait (``admission``), as the start would keep that promise."""
    if not avail.counted:  # nothing to count (CPU), or the hub may not read the cluster
        return (wording.FREE_COUNT_UNAVAILABLE if offering.takes_units else ""), ""
    free = avail.free or 0
    policy = offering.admission or policy
    room = avail.queue
    if avail.queue_limits and room is not None:  # Kueue's quota is the smaller: say so, beside the nodes' count
        text = queue_words(room.queue, room.free or 0, avail.node_free or 0, room.borrowed, room.cohort)
        if free > 0:
            return text, ""
        if policy != AdmissionPolicy.BLOCK:  # Kueue holds the server until its quota allows it
            return wording.queue_wait_words(text), ""
        return text, wording.queue_full_words(room.queue)
    if free > 0:
        return wording.free_words(free, avail.capacity, avail.queue_unknown), ""
    if offering.pool is not None and offering.pool.at_limit:
        return wording.POOL_AT_LIMIT_BADGE, wording.POOL_AT_LIMIT
    if offering.scalable_nodes:
        return wording.scale_up_words(offering.scale_up_minutes), ""
    if policy == AdmissionPolicy.QUEUE:
        return wording.queued_words(queued), ""
    if policy == AdmissionPolicy.WARN:
        return wording.NONE_FREE_WAIT, ""
    return wording.NONE_FREE, wording.NONE_FREE_NOW


def _with_choices(offering: Offering, availability: Callable[[Offering], Availability]) -> str:
    """The description, after what an offering with alternatives may give ("MIG 3g.20gb (1 free),
    or MIG 2g.10gb if none is free (2 free)."; :mod:`gpuspawner.dra.alternatives`)."""
    claim = offering.claim
    pool = wording.pool_size_words(offering.pool.limit, offering.display_name) if offering.pool is not None else ""
    description = f"{offering.description} {pool}".strip()
    if claim is None or not claim.alternatives:
        return description
    words = choice_words(claim, [availability(o).free for o in choices(offering)])
    return f"{words}. {description}".strip()


def count_text(avail: Availability) -> str:
    """The badge of a choice the user may not start now (outside its time window, over quota):
    what is free, and no queue place, wait or scale-up promised, for none would be kept."""
    if not avail.counted:
        return ""
    free = avail.free or 0
    return wording.free_words(free, avail.capacity) if free > 0 else wording.NONE_FREE


def option_views(
    catalog: Iterable[Offering],
    who: Requester,
    availability: Callable[[Offering], Availability],
    now: datetime,
    default_policy: str = AdmissionPolicy.BLOCK,
    quota_reason: Callable[[Offering], str] = lambda o: "",
    queue_length: Callable[[str], int] = lambda slug: 0,
    hide_forbidden: bool = False,
    hour_cost: Callable[[Offering], str] = lambda o: "",
    image_reason: Callable[[Offering], str] = lambda o: "",
    kept: RowCache | None = None,
) -> list[OptionView]:
    """One row per offering the page shows (hidden ones never; forbidden ones disabled or hidden).

    ``availability`` counts, and ``image_reason`` says why none of an offering's nodes can run
    the image the form starts with (gpuspawner.core.imagefit; "" where one can). ``kept``: rows
    of earlier views, one reading as before used again (:class:`RowCache`)."""
    rows = []
    for offering in catalog:
        if offering.hidden:
            continue
        allowed = may_use(offering, who)
        if not allowed and hide_forbidden:
            continue
        avail = availability(offering)
        text, reason = availability_text(offering, avail, default_policy, queue_length(offering.slug))
        if not allowed:  # no count, queue place or wait on a choice the user may never take
            text, reason = "", wording.NOT_ALLOWED
        elif closed := window_state(offering.windows, now) or quota_reason(offering):
            text, reason = count_text(avail), closed
        elif misfit := image_reason(offering):  # none of its nodes can run the image: no promise either
            text, reason = wording.NOT_FOR_IMAGE, misfit
        counts = offering.counts
        if offering.kind is Kind.FULL and avail.counted and not offering.scalable_nodes and (avail.free or 0) > 0:
            counts = tuple(c for c in offering.counts if c <= (avail.largest_free or 0)) or offering.counts[:1]
        description, cost = _with_choices(offering, availability), hour_cost(offering)
        key = (id(offering), text, reason, avail.free, avail.capacity, counts, description, cost)
        row = kept.get(offering, key) if kept is not None else None
        if row is None:
            row = OptionView(
                slug=offering.slug,
                kind=offering.kind.value,
                display_name=offering.display_name,
                description=description,
                memory=memory_truth(
                    offering.kind,
                    offering.memory_mib,
                    offering.sharing,
                    offering.replicas,
                    product_name(offering.product) if offering.product else "",
                ),
                compute_share=offering.compute_share,
                isolation=isolation_phrase(offering.isolation),
                availability=text,
                free=avail.free,
                capacity=avail.capacity,
                disabled_reason=reason,
                counts=counts,
                hour_cost=cost,
                price="" if offering.price_per_hour is None else wording.price_words(offering.price_per_hour),
            )
            if kept is not None:
                kept.put(offering, key, row)
        rows.append(row)
    return rows


class RowCache:
    """Rows made lately (:func:`option_views`), each by its offering (the very object) and
    everything else the row reads (the count's words and figures, the reason it cannot be picked,
    the counts offered, the description, the cost), the least recently shown going first beyond
    ``size``: a view in which an offering's row reads as before gets the very row of the last
    view, and so the card rendered for it (gpuspawner.hub.form), without making either again."""

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self.rows: OrderedDict[tuple[Any, ...], tuple[Offering, OptionView]] = OrderedDict()

    def get(self, offering: Offering, key: tuple[Any, ...]) -> OptionView | None:
        found = self.rows.get(key)
        if found is None or found[0] is not offering:  # (the offering is kept with its row: its id is not reused meanwhile)
            return None
        self.rows.move_to_end(key)
        return found[1]

    def put(self, offering: Offering, key: tuple[Any, ...], row: OptionView) -> None:
        self.rows[key] = (offering, row)
        if len(self.rows) > self.size:
            self.rows.popitem(last=False)


def default_choice(
    rows: list[OptionView],
    admin_default: str,
    last: Mapping[str, Any] | None,
    offerings: Mapping[str, Offering],
    refused: Mapping[str, Any] | None = None,
) -> tuple[str | None, int]:
    """A just-refused choice if still selectable (the form shown again keeps it), else the admin's
    default, else the user's last choice if still selectable, else the smallest free GPU, else No GPU."""
    selectable = {r.slug: r for r in rows if not r.disabled}

    def still_selectable(choice: Mapping[str, Any] | None) -> tuple[str, int] | None:
        slug = choice.get(OFFERING_KEY) if choice else None
        if choice is None or not isinstance(slug, str) or slug not in selectable:
            return None
        count = choice.get(COUNT_KEY, 1)
        counts = selectable[slug].counts
        return slug, int(count) if str(count).isdigit() and int(count) in counts else counts[0]

    found = still_selectable(refused)
    if found:
        return found
    if admin_default in selectable:
        return admin_default, selectable[admin_default].counts[0]
    found = still_selectable(last)
    if found:
        return found
    gpus = [r for r in selectable.values() if r.kind != Kind.CPU and (r.free or 0) > 0]
    if gpus:
        smallest = min(gpus, key=lambda r: (offerings[r.slug].memory_mib or 10**9, r.slug))
        return smallest.slug, smallest.counts[0]
    cpu = [r for r in selectable.values() if r.kind == Kind.CPU]
    if cpu:
        return cpu[0].slug, 1
    first = next(iter(selectable.values()), None)
    return (first.slug, first.counts[0]) if first else (None, 1)
