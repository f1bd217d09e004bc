"""The names that cross a module boundary, each defined once. Pure; imports nothing of gpuspawner.

What one part of gpuspawner writes and another reads (the spawner and the culler, the
spawner and the inventory or the orphan reconciler, the spawn form and the choice) must
agree on a name; a name spelled twice drifts. So every such name lives here: the offering
kinds, the pod's labels, annotations and environment, the ``user_options`` keys, the
record GPUSpawner keeps of a server, and the admin's admission policies. The words are
those of the spawn page and docs/config.md.

Tests spell the literals out on purpose where they check the wire format.
"""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """What sort of GPU an offering gives (docs/config.md, ``kind``); the spawn page groups by it.

    The order is the spawn page's (no GPU first, then the cheapest GPU share).
    A ``StrEnum``: a kind is written into JSON, pod labels and metrics as its plain value.
    """

    CPU = "cpu"  #: no GPU
    SHARED = "shared"  #: a time-sliced or MPS share of a GPU
    MIG = "mig"  #: a MIG slice
    FULL = "full"  #: whole GPUs
    VGPU = "vgpu"  #: a vGPU class
    CUSTOM = "custom"  #: a site's own resource (fractional GPUs, Bitfusion, ...)


#: The kinds whose pod holds (part of) a GPU.
GPU_KINDS: frozenset[Kind] = frozenset(k for k in Kind if k is not Kind.CPU)


class Isolation(StrEnum):
    """How well a user is protected from the neighbours on the same GPU (docs/config.md, ``isolation``)."""

    EXCLUSIVE = "exclusive"
    HARDWARE = "hardware"
    PARTIAL = "partial"
    NONE = "none"
    VM = "vm"
    SITE = "site"
    NO_GPU = "no-gpu"


class AdmissionPolicy(StrEnum):
    """What the admin wants when no unit of an offering is free (``c.GPUSpawner.admission``,
    an offering's ``admission``). Not to be confused with the decision admission takes
    (:mod:`gpuspawner.capacity.admission`: admit, warn, queue or refuse)."""

    BLOCK = "block"  #: refuse at once
    WARN = "warn"  #: start anyway and say it may wait
    QUEUE = "queue"  #: wait in line for the next free unit, up to a time limit


class StopReason(StrEnum):
    """Why the culler stops a server (or reclaims its kernels): the ``stop_reason`` of its decision,
    the ``reason`` of its action record and notice (what the notebook's GPU view and the hub's
    pages read), and the label of its metrics. A ``StrEnum``: each is its string on the wire."""

    IDLE = "idle"  #: idle past its kind's timeout
    MAX_AGE = "max_age"  #: running longer than ``max_age``
    GPU_IDLE_LIMIT = "gpu_idle_limit"  #: GPU telemetry showed its GPU idle that long, whatever the pod claims
    UNRESPONSIVE = "unresponsive"  #: its pod stalled the cycle after cycle, and its GPU is idle
    GPU_LEASE = "gpu_lease"  #: it has held its GPU for its kind's GPU lease: the hard maximum nothing vetoes
    WAITING = "waiting"  #: idle past ``reclaim_for_waiting_after`` while spawns wait, first in line to make room
    BUDGET = "budget"  #: a budget of its user's (GPU-hours or cost) ran out while it ran (warned first)


class Refusal(StrEnum):
    """Why a spawn was refused: the ``reason`` of a :class:`~gpuspawner.hub.scheduling.SpawnRefused`,
    the key of its HTTP status (``hub.scheduling.REFUSAL_STATUS``) and the metrics' label."""

    MALFORMED = "malformed"  #: the request itself is wrong (400)
    NOT_OFFERED = "not_offered"  #: unknown or forbidden to this user, never said which (403)
    WINDOW = "window"  #: outside the offering's time window (403)
    NO_CAPACITY = "no_capacity"  #: nothing free now (409)
    QUEUE_TIMEOUT = "queue_timeout"  #: waited in the queue past its limit (409)
    UNSCHEDULABLE = "unschedulable"  #: the scheduler says the pod cannot run (409)
    IMAGE = "image"  #: no node of the offering has the driver the image needs (409)
    POD_NAME_TAKEN = "pod_name_taken"  #: the server's pod name is held by a pod of another hub, or of none (409)
    QUOTA = "quota"  #: over the user's or a group's quota (429)
    BUDGET = "budget"  #: the user's GPU-hour budget does not cover another hour (429)
    UNREACHABLE = "unreachable"  #: the Kubernetes API cannot be reached (503)
    START_TIMEOUT = "start_timeout"  #: the server did not start within the hub's start_timeout (503)
    MISCONFIGURED = "misconfigured"  #: the hub's GPU settings are wrong (503)


# --------------------------------------------------------------------------- groups

#: The hub group whose members' servers the GPU culler may read kernels of: its role's
#: ``tokens`` scope is filtered to it (docs/culler.md, Threat model). An access group, not
#: a team: GPU use is never reported under it (gpuspawner.hub.metrics).
GPU_USERS_GROUP = "gpu-users"

# --------------------------------------------------------------------- user_options

#: ``user_options`` key (and spawn-form field) holding the chosen offering's slug.
OFFERING_KEY = "offering"
#: ``user_options`` key (and spawn-form field) holding how many units (whole GPUs only).
COUNT_KEY = "count"
#: Prefix of the spawn form's per-offering count field, ``count-<slug>``.
COUNT_FIELD_PREFIX = "count-"
#: ``user_options`` key (and spawner-state key) of the record GPUSpawner writes at start;
#: never read back as the user's choice. Its keys are the ``RECORD_*`` names below.
RECORD_KEY = "gpuspawner"
#: Key of the GPU-hour ledger in a server's saved state (gpuspawner.hub.budgets): rows of
#: {"start", "end", "cost"}, kept after the server stops.
BUDGET_LEDGER_KEY = "gpu_usage"
#: The server's saved-state key for why it was last stopped by something else than its user
#: (Kueue's preemption): kept past the stop, shown on the home page, cleared by the next start.
STOP_NOTICE_KEY = "gpuspawner_stop_notice"

# Keys inside the record (docs/culler.md, "The contract"); the culler reads them.
RECORD_OFFERING = OFFERING_KEY  #: the offering's slug
RECORD_KIND = "kind"  #: a :class:`Kind` value
RECORD_COUNT = COUNT_KEY  #: units taken
RECORD_RESOURCES = "resources"  #: extended-resource limits, name -> quantity string
RECORD_POD = "pod"  #: the pod's name
RECORD_NAMESPACE = "namespace"  #: the pod's namespace
RECORD_URL = "url"  #: the server's direct address (for the culler's kernel view), or None
#: what an hour of the server costs against a GPU-hour budget (the culler stops only a server
#: that costs something when its user's budget runs out)
RECORD_COST = "gpu_hour_cost"
#: what an hour of the server costs against a cost budget (the offering's ``price_per_hour``
#: times the units; 0 where it has no price: the culler stops only a server that costs
#: something when its user's cost budget runs out)
RECORD_PRICE = "price_per_hour"
#: Dynamic Resource Allocation only: the ResourceClaimTemplate the spawner made for the pod
#: (deleted when the server stops, also after a hub restart).
RECORD_CLAIM_TEMPLATE = "claim_template"
#: Dynamic Resource Allocation, a shared offering only: the ResourceClaim the pod shares with
#: the other servers of that offering on the same device (owned by all their pods).
RECORD_SHARED_CLAIM = "shared_claim"
#: Dynamic Resource Allocation only: the devices the scheduler allocated to the pod's claim, as
#: read from the claim's status and the driver's ResourceSlice at start (the culler matches
#: them to dcgm-exporter's series). A list of dicts with the ``DEVICE_*`` keys below.
RECORD_DEVICES = "devices"
DEVICE_DRIVER = "driver"  #: the DRA driver, e.g. gpu.nvidia.com
DEVICE_POOL = "pool"  #: the pool (NVIDIA's driver: the node's name)
DEVICE_NAME = "device"  #: the device's name in its pool, e.g. gpu-0
DEVICE_UUID = "uuid"  #: the GPU's UUID (a MIG device: its parent GPU's), as dcgm-exporter's UUID label
DEVICE_MIG_PROFILE = "mig_profile"  #: a MIG device's profile (dcgm-exporter's GPU_I_PROFILE), else absent
DEVICE_REQUEST = "request"  #: the claim's request that got it (``<request>/<subrequest>`` for a firstAvailable choice)
DEVICE_CHOICE = "choice"  #: of an offering with alternatives: which one the user got, in the page's words

# ------------------------------------------------------------------------ the pod

#: Pod label: the offering's slug (the inventory and the orphan reconciler select on it).
LABEL_OFFERING = "gpuspawner.io/offering"
#: The name of the pod's device claim (``spec.resourceClaims[].name``) and of its one request.
CLAIM_NAME = "gpuspawner-gpu"
#: Pod label: the offering's :class:`Kind`.
LABEL_KIND = "gpuspawner.io/kind"
#: Pod, claim template and claim label: the hub that made it (``c.GPUSpawner.hub_id``). The
#: orphan reconciler, the shared claims and the quotas' count of bound pods select on it, so
#: one hub never counts nor deletes another's. Absent where the hub has no identity.
LABEL_HUB = "gpuspawner.io/hub"
#: Pod (and claim template) annotation: whose server it is in the hub's database, as
#: ``<user id>/<the user's creation time>`` (``podspec.user_key``). JupyterHub keeps a user's id
#: and creation time through a rename, and a new database never repeats both: the orphan
#: reconciler follows a renamed user's pods and never touches a pod its database did not make.
ANNOTATION_HUB_USER = "gpuspawner.io/hub-user"
#: Pod annotation: the start that made it (a random value per start). A creation whose answer
#: never came (a slow API server) is tried again; a pod of that name with this start's value is
#: the one the lost answer was about, and is taken as made, not deleted and made again.
ANNOTATION_SPAWN = "gpuspawner.io/spawn"
#: Pod annotation Karpenter reads (karpenter.sh/v1; pkg/apis/v1/labels.go): while a pod with the value
#: "true" runs, Karpenter's consolidation (emptiness included) never picks its node, nor does drift
#: unless the NodeClaim has a terminationGracePeriod; Karpenter's drain never evicts the pod itself.
#: Expiration and a deleted NodeClaim still take the node (docs/autoscaling.md, "Disruption").
ANNOTATION_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
#: Environment of the notebook container: what it was given (docs/kubespawner-compat.md).
ENV_OFFERING = "GPUSPAWNER_OFFERING"
ENV_KIND = "GPUSPAWNER_KIND"
ENV_COUNT = "GPUSPAWNER_GPU_COUNT"
#: Environment of the notebook container: the offering in the spawn page's words, for the
#: notebook's own GPU view (gpuspawner.notebook_ext, docs/user-gpu-view.md).
ENV_DISPLAY_NAME = "GPUSPAWNER_DISPLAY_NAME"
ENV_WORDS = "GPUSPAWNER_OFFERING_WORDS"
#: An offering with alternatives ("this, or else that"): JSON ``[[label, match], ...]`` in order,
#: ``match`` being what NVML's device name contains for that choice (the GPU view says which one the pod got).
ENV_CHOICES = "GPUSPAWNER_CHOICES"
#: What a budget limits, as ``c.GPUSpawner.user_gpu_budget`` (and a group's) names it: weighted
#: GPU-hours, or money at the offerings' ``price_per_hour``. The hub measures both
#: (capacity.budgetmath), the culler stops servers for both (culler.policy).
BUDGET_HOURS = "hours"
BUDGET_COST = "cost"
#: The user's GPU-hour budget as the hub measured it at spawn (gpuspawner.hub.budgets.env), for the
#: user's GPU view's running total: the budget, its window, the GPU-hours used then, what an hour
#: of this server costs, when it was measured (ISO 8601) and from where (prometheus | hub-record).
ENV_BUDGET_HOURS = "GPUSPAWNER_BUDGET_HOURS"
ENV_BUDGET_WINDOW = "GPUSPAWNER_BUDGET_WINDOW"
ENV_BUDGET_USED = "GPUSPAWNER_BUDGET_USED"
ENV_BUDGET_COST = "GPUSPAWNER_BUDGET_COST"
ENV_BUDGET_AS_OF = "GPUSPAWNER_BUDGET_AS_OF"
ENV_BUDGET_SOURCE = "GPUSPAWNER_BUDGET_SOURCE"
#: The same for the user's cost budget (in the site's money): the budget, its window, what was spent
#: then, this server's price per hour, when and from where it was measured.
ENV_COST_BUDGET = "GPUSPAWNER_COST_BUDGET"
ENV_COST_BUDGET_WINDOW = "GPUSPAWNER_COST_BUDGET_WINDOW"
ENV_COST_BUDGET_SPENT = "GPUSPAWNER_COST_BUDGET_SPENT"
ENV_COST_BUDGET_PRICE = "GPUSPAWNER_COST_BUDGET_PRICE"
ENV_COST_BUDGET_AS_OF = "GPUSPAWNER_COST_BUDGET_AS_OF"
ENV_COST_BUDGET_SOURCE = "GPUSPAWNER_COST_BUDGET_SOURCE"

#: KubeSpawner's names for whose pod it is, which gpuspawner reads: the user as a pod
#: label (KubeSpawner's escaped form) and the user and server name as annotations.
KUBESPAWNER_USER_LABEL = "hub.jupyter.org/username"
KUBESPAWNER_USER_ANNOTATION = "hub.jupyter.org/username"
KUBESPAWNER_SERVER_ANNOTATION = "hub.jupyter.org/servername"

# ------------------------------------------------------------------ the memory guard (docs/memory-guard.md)

#: Environment of a guarded pod: the cap as a fraction of each GPU's memory, and in MiB where
#: the GPU's memory is known. The start-up hook (gpuspawner/pod/memguard_hook.py) reads them.
ENV_MEMORY_FRACTION = "GPUSPAWNER_MEMORY_FRACTION"
ENV_MEMORY_MIB = "GPUSPAWNER_MEMORY_MIB"
#: Pod annotation holding the start-up hook's source, projected into the pod as a file.
ANNOTATION_MEMGUARD_HOOK = "gpuspawner.io/memguard-hook"

#: Kinds whose pods share one GPU's memory and engines with other pods, unisolated
#: (time-slicing, MPS, a site's fractional resource): the GPU's own numbers are not the pod's.
SHARING_KINDS: frozenset[Kind] = frozenset({Kind.SHARED, Kind.CUSTOM})

#: The per-pod GPU probe's metrics (gpuspawner.probe writes them; the culler reads them).
PROBE_POD_MEMORY = "gpuspawner_probe_pod_gpu_memory_bytes"
PROBE_POD_SM_UTIL = "gpuspawner_probe_pod_sm_utilization_ratio"
PROBE_DEVICE_TOTAL = "gpuspawner_probe_device_memory_total_bytes"

#: The hub's spawns waiting in its queue for an offering (labels ``offering``, ``kind`` and
#: ``name``, the offering's display name): the hub exports it, the culler reads it through
#: Prometheus to reclaim an idle server for them (``reclaim_for_waiting_after``).
SPAWNS_WAITING = "gpuspawner_spawns_waiting"
#: Kueue's pending workloads that wait for an offering's GPU (labels ``offering``, ``kind``,
#: ``name``, ``cluster_queue``: the ClusterQueue they wait in), read by the hub from Kueue's
#: visibility API: the culler adds them to ``SPAWNS_WAITING``, once per ClusterQueue however
#: many hubs export the same (docs/fair-turns.md).
KUEUE_WORKLOADS_WAITING = "gpuspawner_kueue_workloads_waiting"
#: The hub's GPU-hour budgets per user (gpuspawner.hub.budgets), read by the culler: hours
#: left, and GPU-hours per hour their running servers spend (labels ``user``, ``window``).
BUDGET_REMAINING = "gpuspawner_budget_remaining_hours"
BUDGET_SPEND_RATE = "gpuspawner_budget_spend_rate"
#: The hub's cost budgets per user (labels ``user``, ``window``; ``source`` on the first): what
#: their servers cost in the window, and the budget, in the site's money (``gpuspawner report``).
COST_BUDGET_USED = "gpuspawner_cost_budget_used"
COST_BUDGET = "gpuspawner_cost_budget"
#: The same as BUDGET_REMAINING and BUDGET_SPEND_RATE for the cost budgets (labels ``user``,
#: ``window``, ``name``), read by the culler: money left, and money per hour their running
#: servers spend.
COST_BUDGET_REMAINING = "gpuspawner_cost_budget_remaining"
COST_BUDGET_SPEND_RATE = "gpuspawner_cost_budget_spend_rate"
#: An offering's price per unit-hour, the admin's ``price_per_hour`` (labels ``offering``,
#: ``kind``, ``hub``), for ``gpuspawner report``'s cost figures.
OFFERING_PRICE = "gpuspawner_offering_price_per_hour"
