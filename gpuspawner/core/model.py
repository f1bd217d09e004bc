"""The offering model: one thing a user can pick on the spawn page. Pure.

An :class:`Offering` is plain, immutable data: what Kubernetes resources a pod
asks for, which nodes it may land on, what the user is told about it and who
may take it. Offerings come from two places, both turned into this one type:

* the admin's ``c.GPUSpawner.offerings`` (a list of dicts, validated by
  :func:`gpuspawner.offerings.config.offering_from_config`, which names the entry and
  field that is wrong);
* discovery from the cluster's GPU labels (:mod:`gpuspawner.offerings.discovery`).

The resource names, labels and taints are those of NVIDIA's device plugin and GPU
Feature Discovery (:mod:`gpuspawner.core.nodeclass`; docs/architecture.md, "NVIDIA's
conventions").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuspawner.core.wording import isolation_phrase
from gpuspawner.names.nvidia import GPU
from gpuspawner.names.selectors import Terms, absent, all_of, and_terms, terms_to_k8s
from gpuspawner.names.vocabulary import Isolation, Kind

#: Kubernetes auto-tolerates only the exact extended resource a pod requests, so a
#: MIG or ``.shared`` request still needs this to land on a ``nvidia.com/gpu``-tainted node.
DEFAULT_GPU_TOLERATION: Mapping[str, str] = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}

#: What an offering's slug may be: a DNS label (it becomes a pod label value).
SLUG_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class DeviceAlternative:
    """One choice of a "this, or else that" request (``firstAvailable``, resource.k8s.io/v1; GA
    since Kubernetes 1.36): the scheduler takes the first choice it can satisfy, in order.
    ``name`` is its subrequest's name (a DNS label; the allocation says
    ``<request>/<name>``), ``label`` what the user is told they get ("MIG 2g.10gb")."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    label: str = ""
    #: What NVML's name of such a device contains (a MIG profile, a product), for the user's GPU view.
    match: str = ""


#: The most subrequests one request may list (``FirstAvailableDeviceRequestMaxSize``).
MAX_ALTERNATIVES = 8


def subrequest_name(label: str, taken: tuple[str, ...] | list[str] = ()) -> str:
    """A DNS label for a choice's subrequest, from its words ("MIG 2g.10gb" -> "mig-2g-10gb"), unique among ``taken``."""
    base = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:60] or "choice"
    name, n = base, 2
    while name in taken:
        name, n = f"{base[:57]}-{n}", n + 1
    return name


@dataclass(frozen=True)
class DeviceClaim:
    """What an offering served through Dynamic Resource Allocation asks for (``resource.k8s.io/v1``).

    One request of a ResourceClaim: ``count`` devices (the user's count) of ``device_class``
    that meet every CEL expression in ``selectors``; devices of one request share the values
    of ``match_attributes`` (fully qualified attribute names, e.g.
    ``gpu.nvidia.com/productName``); ``config`` holds the driver's opaque configurations
    (``{"driver": ..., "parameters": {...}}``, e.g. NVIDIA's ``GpuConfig`` with a sharing
    strategy). An offering with a claim asks for no extended resource and selects no node:
    the scheduler's allocator places it. ``replicas``: how many pods one device serves (an
    admin's time-sliced or MPS share, where pods share one claim; 1: each claim has its devices
    to itself); the offering's ``replicas`` key, named as NVIDIA's sharing config names it.
    ``capacity``: what each device must give of its consumable capacity (the request's
    ``capacity.requests``, e.g. ``{"memory": "8Gi"}``: a GPU-memory share of a device that
    allows multiple allocations); ``tolerations``: the request's device tolerations (a device
    tainted NoSchedule or NoExecute is allocated only to a claim that tolerates the taint).
    """

    device_class: str
    selectors: tuple[str, ...] = ()
    match_attributes: tuple[str, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()
    replicas: int = 1
    #: "This, or else that": every choice in order, the first being ``device_class`` and
    #: ``selectors`` themselves; empty: one choice (``exactly``). See :mod:`gpuspawner.dra.alternatives`.
    alternatives: tuple[DeviceAlternative, ...] = ()
    capacity: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class GuardSetting:
    """The admin's word on an offering's memory guard (its ``memory_guard`` field; see
    :mod:`gpuspawner.pod.memguard`). ``None`` everywhere means "the spawner's default".

    ``enabled``: guard this offering or not (default: whether its kind is in
    ``c.GPUSpawner.memory_guard_kinds``); ``fraction``: the cap, as a fraction of each GPU's
    memory (default: the offering's share, 1/replicas for a time-sliced or MPS share);
    ``user_env``: whether a variable the user's chosen profile sets wins over the guard's
    (default: ``c.GPUSpawner.memory_guard_user_env``).
    """

    enabled: bool | None = None
    fraction: float | None = None
    user_env: bool | None = None


@dataclass(frozen=True, kw_only=True)
class PodFields:
    """The pod settings an offering carries beyond the GPU it asks for, declared once: an
    :class:`Offering` holds them as the admin (or discovery) wrote them, and
    :class:`gpuspawner.pod.podspec.PodChanges` holds what a spawn adds to KubeSpawner's settings.
    Keyword-only, so a subclass's own fields may come first."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: Required node-affinity terms beyond ``node_selector`` (ORed terms of ANDed requirements):
    #: what keeps a whole GPU off time-sliced, MPS, MIG and vGPU nodes of the same product.
    node_affinity: Terms = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Words run before the notebook's command (e.g. a wrapper that sets the GPU up).
    command_prefix: tuple[str, ...] = ()


@dataclass(frozen=True)
class Offering(PodFields):
    """One choice on the spawn page and everything needed to turn it into a pod.

    ``resources`` is per unit; a user picks ``count`` units out of ``counts``
    (whole GPUs only; every other kind is exactly one unit). Its pod settings
    (``node_selector``, ``env`` ...) are those of :class:`PodFields`.
    """

    slug: str
    kind: Kind
    display_name: str
    description: str = ""
    resources: Mapping[str, int] = field(default_factory=dict)
    counts: tuple[int, ...] = (1,)
    #: Node labels that must NOT be present (node affinity DoesNotExist), e.g. GKE's partition label
    #: for whole GPUs on a pool whose accelerator label MIG pools share.
    absent_labels: tuple[str, ...] = ()
    #: Served through Dynamic Resource Allocation instead of extended resources (None: device plugin).
    claim: DeviceClaim | None = None
    # What the user is told.
    product: str | None = None
    memory_mib: int | None = None
    compute_share: str = ""
    isolation: Isolation = Isolation.EXCLUSIVE
    #: A time-sliced or MPS share: how many users share one GPU (``replicas``, as the offering's
    #: config key and NVIDIA's sharing config name it: the node's ``nvidia.com/gpu.replicas``; None: unknown),
    #: and how ("time-slicing" or "mps"; "" for other kinds). ``memory_mib`` is then the whole
    #: GPU's memory for time-slicing (nothing splits it) and one client's limit for MPS.
    replicas: int | None = None
    sharing: str = ""
    #: A GPU-memory share (``sharing`` "memory", a DRA claim asking ``capacity.requests.memory``):
    #: the whole device's memory; ``memory_mib`` is then the share.
    device_memory_mib: int | None = None
    #: The admin's settings of the cooperative memory limits (docs/memory-guard.md).
    memory_guard: GuardSetting = field(default_factory=GuardSetting)
    # Who may take it (empty: everyone).
    groups: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    hidden: bool = False
    # What to do when none is free (None: the spawner's default), and autoscaled pools.
    admission: str | None = None
    queue_timeout: int | None = None
    scalable_nodes: int = 0
    scale_up_minutes: int = 0
    #: The autoscaled pools (Karpenter's NodePools) that serve it, as discovery read them (None: no such pool).
    pool: PoolSize | None = None
    windows: tuple[str, ...] = ()
    #: What one hour of one unit costs against a GPU-hour budget (None: 1 per GPU unit, 0 without a GPU).
    gpu_hour_cost: float | None = None
    #: What one unit costs per hour, as the admin says (None: not said); the card shows it.
    price_per_hour: float | None = None
    source: str = "config"

    @property
    def is_gpu(self) -> bool:
        return self.kind is not Kind.CPU

    def hourly_cost(self, count: int = 1) -> float:
        """What an hour of ``count`` units costs against a GPU-hour budget."""
        if self.gpu_hour_cost is not None:
            return self.gpu_hour_cost * count
        return float(count) if self.is_gpu else 0.0

    @property
    def takes_units(self) -> bool:
        """Whether its pod takes counted GPU units -- extended resources, or devices through a
        DRA claim -- so that capacity, admission and quotas apply (a CPU or command-prefix-only
        offering takes none)."""
        return bool(self.resources) or self.claim is not None

    @functools.cached_property
    def placement_terms(self) -> Terms:
        """The required node-affinity terms of this offering's pod (``node_affinity`` and ``absent_labels``);
        made once per offering (the counts look its rows up by them on every page view)."""
        return and_terms(self.node_affinity, all_of(*(absent(k) for k in self.absent_labels)))

    def limits_for(self, count: int) -> dict[str, int]:
        """Extended-resource limits for ``count`` units (requests must equal limits)."""
        return {name: qty * count for name, qty in self.resources.items()}

    def summary(self) -> dict[str, Any]:
        """JSON-ready description (the CLI's ``--json`` and the spawn page use it)."""
        return {
            "slug": self.slug,
            "kind": self.kind.value,
            "display_name": self.display_name,
            "description": self.description,
            "limits": {k: str(v) for k, v in self.resources.items()},
            "counts": list(self.counts),
            "node_selector": dict(self.node_selector),
            "node_affinity": terms_to_k8s(self.placement_terms),
            "tolerations": [dict(t) for t in self.tolerations],
            "memory_mib": self.memory_mib,
            "compute_share": self.compute_share,
            "isolation": self.isolation.value,
            "isolation_phrase": isolation_phrase(self.isolation),
            "groups": list(self.groups),
            "users": list(self.users),
            "hidden": self.hidden,
            "source": self.source,
        }


CPU_OFFERING = Offering(
    slug="cpu",
    kind=Kind.CPU,
    display_name="No GPU",
    description="CPU only. Pick this for data preparation, plotting and anything that does not use CUDA.",
    isolation=Isolation.NO_GPU,
    compute_share="no GPU",
    source="builtin",
)


@dataclass(frozen=True)
class QueueRoom:
    """What a Kueue LocalQueue still admits of one offering now (docs/kueue.md).

    ``free``: how many more one-unit servers its ClusterQueue's quota admits, borrowing within
    its cohort included; ``largest``: the most units one server may take; both None when not
    known, and ``unknown`` says why (Kueue not installed, the hub may not read its queues, not
    listed yet, a DRA offering). ``borrowed``: how many of ``free`` only by borrowing from the
    cohort ``cohort``.
    """

    queue: str
    free: int | None = None
    largest: int | None = None
    unknown: str = ""
    borrowed: int = 0
    cohort: str = ""

    @property
    def known(self) -> bool:
        return self.free is not None


@dataclass(frozen=True)
class PoolSize:
    """The autoscaled pools (Karpenter's NodePools) that serve an offering, together: their node
    limit (None: one of them has none) and the nodes they have now (NodeClaims, in flight ones too)."""

    limit: int | None
    nodes: int

    @property
    def room(self) -> int | None:
        """How many nodes they may still add (None: no limit)."""
        return None if self.limit is None else max(0, self.limit - self.nodes)

    @property
    def at_limit(self) -> bool:
        """Whether they may add no node (``limits.nodes`` reached: nodes now >= limit)."""
        return self.room == 0


@dataclass(frozen=True)
class Availability:
    """Units of one offering: how many exist, are taken and are free, and where.

    Where the offering goes through a Kueue queue (:meth:`within`), ``free`` and
    ``largest_free`` are the smaller of the nodes' and the queue's, ``queue`` is what the
    queue allows and ``node_free`` what the nodes alone have free.
    """

    capacity: int | None
    allocated: int | None
    free: int | None
    largest_free: int | None
    nodes: tuple[str, ...] = ()
    queue: QueueRoom | None = None
    node_free: int | None = None

    @property
    def counted(self) -> bool:
        return self.capacity is not None

    def within(self, room: QueueRoom) -> Availability:
        """These counts through the queue ``room``: the smaller of the nodes' and the queue's."""
        if not self.counted or not room.known:
            return replace(self, queue=room, node_free=self.free)
        return replace(
            self,
            free=min(self.free or 0, room.free or 0),
            largest_free=min(self.largest_free or 0, room.largest or 0),
            queue=room,
            node_free=self.free,
        )

    @property
    def queue_limits(self) -> bool:
        """Whether the queue is what limits the free count: it allows fewer than the nodes have
        free, or none at all."""
        room = self.queue
        return room is not None and room.known and self.counted and ((room.free or 0) < (self.node_free or 0) or not room.free)

    @property
    def queue_unknown(self) -> bool:
        """Whether the offering goes through a queue whose limit cannot be read now."""
        return self.queue is not None and not self.queue.known


UNCOUNTED = Availability(capacity=None, allocated=None, free=None, largest_free=None)
