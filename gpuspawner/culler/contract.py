"""The culler's reading of the record GPUSpawner writes (:class:`gpuspawner.names.record.GpuRecord`).

GPUSpawner records the chosen offering in the server's ``user_options`` (returned
by the hub's REST API in every server model, scope ``read:servers``)::

    user_options = {
      "offering": "<slug>", "count": 1, ...,        # the user's validated choice
      "gpuspawner": {                                 # written by GPUSpawner at start()
         "offering": "<slug>", "kind": "full|mig|shared|vgpu|custom|cpu",
         "resources": {"nvidia.com/mig-3g.20gb": "1"},
         "pod": "<pod name>", "namespace": "<ns>",
         "url": "http://<pod ip>:<port>/user/<name>/",  # direct address, for the kernel API
         "gpu_hour_cost": 1.0,                        # per hour, against a GPU-hour budget
         "price_per_hour": 5.0,                       # per hour, against a cost budget
         # Dynamic Resource Allocation only: the claim's allocated devices, read by the
         # spawner from the claim's status and the driver's ResourceSlice
         "devices": [{"driver": "gpu.nvidia.com", "pool": "<node>", "device": "gpu-0",
                      "uuid": "GPU-...", "mig_profile": "1g.5gb"}],
      }
    }

A server without the ``gpuspawner`` key is a plain server: kind ``cpu``, no GPU
view, no kernel view (there is no direct address to ask).
The record is one dataclass, :class:`gpuspawner.names.record.GpuRecord`, which the spawner
writes and this module reads (its keys are ``vocabulary.RECORD_*``); :class:`ServerOffering`
is what the culler makes of it: the record, read conservatively (an unknown kind as
``custom``, a URL that is not http(s) as none), and whether a server has one at all. If the
record changes, change :class:`GpuRecord` and :func:`parse_offering` and nothing else in the
culler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.names.nvidia import is_device_resource
from gpuspawner.names.record import GpuRecord
from gpuspawner.names.vocabulary import (
    GPU_KINDS,
    OFFERING_KEY,
    RECORD_DEVICES,
    RECORD_KEY,
    SHARING_KINDS,
    Kind,
)


@dataclass(frozen=True)
class ServerOffering:
    """What the culler needs to know about one server's offering."""

    kind: str
    slug: str | None = None
    pod: str | None = None
    namespace: str | None = None
    #: direct address of the single-user server (ends with "/"), or None
    url: str | None = None
    resources: Mapping[str, str] = field(default_factory=dict)
    #: True when the spawner wrote the ``gpuspawner`` key
    declared: bool = False
    #: a problem found while parsing (logged by the caller), or None
    problem: str | None = None
    #: Dynamic Resource Allocation: the pod's allocated devices (``vocabulary.DEVICE_*`` keys);
    #: the GPU view then finds the pod's series by device, not by pod name
    devices: tuple[Mapping[str, str], ...] = ()
    #: what an hour of it costs against its user's GPU-hour budget (None: not recorded)
    hourly_cost: float | None = None
    #: what an hour of it costs against its user's cost budget, in the site's money (0: the
    #: offering has no price; None: not recorded, a hub older than cost budgets)
    hourly_price: float | None = None

    @property
    def is_gpu(self) -> bool:
        return self.kind in GPU_KINDS

    @property
    def shares_gpu(self) -> bool:
        """Other pods use the same GPU unisolated (time-slicing, MPS, a fractional resource)."""
        return self.kind in SHARING_KINDS

    @property
    def expected_devices(self) -> int | None:
        """How many GPU devices (GPUs or MIG instances) dcgm-exporter should show
        for the pod, from its resources (or its DRA devices); None when that cannot
        be told (no resources, or a site's fractional resource)."""
        if self.devices:
            return len(self.devices)
        n = 0
        for key, value in self.resources.items():
            if is_device_resource(key):
                try:
                    n += int(value)
                except ValueError:
                    return None
        return n or None


#: the kinds a contract may name (built once: ``tuple(Kind)`` per server cost 0.1 ms, a
#: third of a second a cycle at 3,000 servers)
_KINDS = frozenset(Kind)


def _str_or_none(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def parse_offering(user_options: Mapping[str, Any] | None) -> ServerOffering:
    """Read the spawner's contract out of a server model's ``user_options``.

    Never raises: a malformed contract gives the most conservative reading
    (an unknown kind is read as ``custom``, a GPU kind, so that the server is
    only stopped with a known-idle GPU view) and says why in ``problem``.
    """
    if not isinstance(user_options, Mapping):
        return ServerOffering(kind=Kind.CPU)
    slug = _str_or_none(user_options.get(OFFERING_KEY))
    contract = user_options.get(RECORD_KEY)
    if contract is None:
        return ServerOffering(kind=Kind.CPU, slug=slug)
    if not isinstance(contract, Mapping):
        return ServerOffering(
            kind=Kind.CUSTOM,
            slug=slug,
            declared=True,
            problem=f"user_options[{RECORD_KEY!r}] is a {type(contract).__name__}, not a mapping; treated as kind 'custom'",
        )
    record, problems = GpuRecord.from_json(contract)
    problem = None
    kind = record.kind
    if kind not in _KINDS:
        problem = f"unknown offering kind {kind!r}; treated as kind 'custom'"
        kind = Kind.CUSTOM
    url = record.url
    if url is not None:
        if not url.startswith(("http://", "https://")):
            problem = f"server url {url!r} is not http(s); kernel view disabled"
            url = None
        elif not url.endswith("/"):
            url += "/"
    if RECORD_DEVICES in problems:
        problem = f"user_options[{RECORD_KEY!r}][{RECORD_DEVICES!r}] is not a list of devices; its GPU is looked up by pod name"
    return ServerOffering(
        kind=kind,
        slug=record.offering or slug,
        pod=record.pod,
        namespace=record.namespace,
        url=url,
        resources=record.resources,
        declared=True,
        problem=problem,
        devices=record.devices or (),
        hourly_cost=record.cost,
        hourly_price=record.price,
    )
