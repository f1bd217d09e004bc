""" "This, or else that": an offering whose claim lists alternatives (``firstAvailable``). Pure.

A ResourceClaim request may list subrequests instead of one ``exactly`` (``resource.k8s.io/v1``
``DeviceRequest.firstAvailable``, at most 8; feature ``DRAPrioritizedList``, beta since 1.34
and GA since 1.36): the scheduler's allocator tries them in order and takes the first it can
satisfy on the node, and the allocation names what it took as ``<request>/<subrequest>``
(``status.allocation.devices.results[].request``). The offering is one choice on the page,
whose words say what the user may get ("MIG 3g.20gb (1 free), or MIG 2g.10gb if none is free
(2 free)"); the record says what they did get (:func:`chosen_label`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuspawner.core.model import DeviceAlternative, DeviceClaim, Offering
from gpuspawner.names.vocabulary import CLAIM_NAME


def choices(offering: Offering) -> list[Offering]:
    """One offering per alternative (its claim that choice alone), for the per-choice free counts."""
    claim = offering.claim
    if claim is None or not claim.alternatives:
        return [offering]
    return [
        replace(offering, claim=replace(claim, device_class=a.device_class, selectors=a.selectors, alternatives=()))
        for a in claim.alternatives
    ]


def choice_words(claim: DeviceClaim, free: Sequence[int | None]) -> str:
    """ "MIG 3g.20gb (1 free), or MIG 2g.10gb if none is free (2 free)"; without counts where unknown."""
    parts = []
    for i, (alternative, n) in enumerate(zip(claim.alternatives, free, strict=True)):
        count = f" ({n} free)" if n is not None else ""
        parts.append(f"{alternative.label}{count}" if i == 0 else f"{alternative.label} if none is free{count}")
    return ", or ".join(parts)


def chosen(claim: DeviceClaim | None, request: str) -> DeviceAlternative | None:
    """The alternative an allocation result's ``request`` (``<request>/<subrequest>``) names."""
    if claim is None or not claim.alternatives:
        return None
    main, _, sub = request.partition("/")
    if main != CLAIM_NAME:
        return None
    return next((a for a in claim.alternatives if a.name == sub), None)


def chosen_label(claim: DeviceClaim | None, request: str) -> str | None:
    """What the user got, in the page's words ("MIG 2g.10gb"), or None for a claim without alternatives."""
    found = chosen(claim, request)
    return found.label if found is not None else None
