"""The record: what GPUSpawner writes about a server's GPU, in one dataclass every side reads.

GPUSpawner writes it as JSON under ``user_options["gpuspawner"]`` (the hub's REST API serves
it in every server model) and into the server's saved state; the culler reads it
(:mod:`gpuspawner.culler.contract`), and so does a restarted hub (its quotas and the claim
clean-up, :mod:`gpuspawner.hub.spawnstate`). The JSON keys are ``vocabulary.RECORD_*``. Pure,
stdlib only: the culler may import it.

Reading never raises: a record comes back over the network and from the hub's database,
so :meth:`GpuRecord.from_json` keeps what is well-formed and names what is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.names.vocabulary import (
    RECORD_CLAIM_TEMPLATE,
    RECORD_COST,
    RECORD_COUNT,
    RECORD_DEVICES,
    RECORD_KIND,
    RECORD_NAMESPACE,
    RECORD_OFFERING,
    RECORD_POD,
    RECORD_PRICE,
    RECORD_RESOURCES,
    RECORD_SHARED_CLAIM,
    RECORD_URL,
)


@dataclass(frozen=True)
class GpuRecord:
    """One server's GPU, as GPUSpawner recorded it when the server started."""

    offering: str | None
    kind: str | None
    count: int | None = None
    #: extended-resource limits, name -> quantity string
    resources: Mapping[str, str] = field(default_factory=dict)
    pod: str | None = None
    namespace: str | None = None
    #: the server's direct address (for the culler's kernel view), or None
    url: str | None = None
    #: Dynamic Resource Allocation: the ResourceClaimTemplate this server made, or the shared
    #: ResourceClaim its pod joined
    claim_template: str | None = None
    shared_claim: str | None = None
    #: Dynamic Resource Allocation: the devices allocated to the pod's claim (``vocabulary.DEVICE_*``
    #: keys); None when not read
    devices: tuple[Mapping[str, str], ...] | None = None
    #: what an hour of the server costs against a GPU-hour budget; None when not written
    cost: float | None = None
    #: what an hour of the server costs against a cost budget (0: no price); None when not written
    price: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as it is written (optional keys only when set)."""
        out: dict[str, Any] = {
            RECORD_OFFERING: self.offering,
            RECORD_KIND: self.kind,
            RECORD_COUNT: self.count,
            RECORD_RESOURCES: dict(self.resources),
            RECORD_POD: self.pod,
            RECORD_NAMESPACE: self.namespace,
            RECORD_URL: self.url,
        }
        if self.claim_template:
            out[RECORD_CLAIM_TEMPLATE] = self.claim_template
        if self.shared_claim:
            out[RECORD_SHARED_CLAIM] = self.shared_claim
        if self.devices is not None:
            out[RECORD_DEVICES] = [dict(d) for d in self.devices]
        if self.cost is not None:
            out[RECORD_COST] = self.cost
        if self.price is not None:
            out[RECORD_PRICE] = self.price
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> tuple[GpuRecord, dict[str, str]]:
        """The record in ``raw``, and what was wrong with it by key (those fields are left
        out); never raises."""
        problems: dict[str, str] = {}
        count = raw.get(RECORD_COUNT)
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            problems[RECORD_COUNT] = f"{RECORD_COUNT!r} is {count!r}, not a whole number of units"
            count = None
        resources = raw.get(RECORD_RESOURCES)
        if resources is not None and not isinstance(resources, Mapping):
            problems[RECORD_RESOURCES] = f"{RECORD_RESOURCES!r} is not a mapping"
            resources = None
        devices = raw.get(RECORD_DEVICES) or None  # (none and an empty list alike: not read)
        if devices is not None and (not isinstance(devices, list) or not all(isinstance(d, Mapping) for d in devices)):
            problems[RECORD_DEVICES] = f"{RECORD_DEVICES!r} is not a list of devices"
            devices = None
        cost, price = (_per_hour(raw, key, problems) for key in (RECORD_COST, RECORD_PRICE))
        record = cls(
            offering=_text(raw.get(RECORD_OFFERING)),
            kind=_text(raw.get(RECORD_KIND)),
            count=count,
            resources={str(k): str(v) for k, v in (resources or {}).items()},
            pod=_text(raw.get(RECORD_POD)),
            namespace=_text(raw.get(RECORD_NAMESPACE)),
            url=_text(raw.get(RECORD_URL)),
            claim_template=_text(raw.get(RECORD_CLAIM_TEMPLATE)),
            shared_claim=_text(raw.get(RECORD_SHARED_CLAIM)),
            devices=tuple({str(k): str(v) for k, v in d.items()} for d in devices) if devices is not None else None,
            cost=cost,
            price=price,
        )
        return record, problems

    @property
    def takes_units(self) -> bool:
        """Whether the server holds units a quota counts: resources, or a DRA claim."""
        return bool(self.resources or self.claim_template or self.shared_claim)


def _per_hour(raw: Mapping[str, Any], key: str, problems: dict[str, str]) -> float | None:
    """``raw[key]``, a cost per hour of 0 or more (None: absent, or wrong and said in ``problems``)."""
    value = raw.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
        problems[key] = f"{key!r} is {value!r}, not a cost per hour of 0 or more"
        return None
    return float(value) if value is not None else None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None
