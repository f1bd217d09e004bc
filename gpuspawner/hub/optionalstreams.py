"""The inventory's optional streams: Dynamic Resource Allocation's, Kueue's and Karpenter's.

:class:`OptionalStreams` is the part of :class:`gpuspawner.hub.inventory.Inventory` that starts
these streams, marks them synced, and says what a cluster that does not serve them, or a hub
that may not read them, means for the counts. They run in the inventory's one watch loop
(relist, watch, backoff) and never hold up the node and pod counts. What they say goes to the
inventory's log (``gpuspawner.hub.inventory``).

Dynamic Resource Allocation adds three more streams (``resource.k8s.io/v1``:
``resourceslices``, ``deviceclasses`` and ``resourceclaims`` in all namespaces, ``list`` and
``watch``), and DeviceTaintRules where the cluster serves them. A cluster that does not serve the
API (404) or a hub that may not read it (403) has DRA offerings without free counts, said
once in the log, and the streams are asked again every ``forbidden_retry`` seconds.

Where ``c.GPUSpawner.kueue_queues`` sends servers through Kueue, :meth:`OptionalStreams.watch_kueue`
adds four more (``kueue.x-k8s.io/v1beta2``: ``localqueues`` in the hub's namespace, or in all
namespaces with user namespaces; ``clusterqueues``, ``resourceflavors`` and ``cohorts``, which
borrowing within a cohort reads; ``list`` and ``watch``), kept in :attr:`ClusterIndex.kueue` (:mod:`gpuspawner.capacity.kueuequota`) so the
spawn page reads what each queue still admits without a request. Like DRA's they are
optional: Kueue not installed (404) or not readable (403) leaves each queue's limit unknown
(the page says so, the nodes' counts stand), said once in the log and asked again every
``forbidden_retry`` seconds.

Where ``discover_offerings`` is on, :meth:`OptionalStreams.watch_pools` adds two more: Karpenter's
NodePools and NodeClaims (``karpenter.sh/v1``, ``list`` and ``watch``), kept in
:attr:`ClusterIndex.pools` (:mod:`gpuspawner.capacity.karpenterpools`): a pool with no node yet has its
offering. Optional too: not served (404) or not readable (403), discovery is as without them, said
in one log line, and asked again every ``forbidden_retry`` seconds; a stream that fails otherwise
keeps what it last read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from gpuspawner.capacity.karpenterpools import GROUP as POOL_GROUP
from gpuspawner.capacity.karpenterpools import NODECLAIMS, NODEPOOLS
from gpuspawner.capacity.karpenterpools import STREAMS as POOL_STREAMS
from gpuspawner.capacity.karpenterpools import VERSION as POOL_VERSION
from gpuspawner.capacity.kueuequota import STREAMS as KUEUE_STREAMS
from gpuspawner.hub.kubeapi import TAINT_RULES_PATH, ListCall, Refused, custom_api, resource_api, taint_rules_lister
from gpuspawner.names.kueuenames import CLUSTER_QUEUES, COHORTS, GROUP, LOCAL_QUEUES, RESOURCE_FLAVORS, VERSION

if TYPE_CHECKING:
    from gpuspawner.capacity.index import ClusterIndex

log = logging.getLogger("gpuspawner.hub.inventory")  # (the inventory's streams: its log)

#: The Dynamic Resource Allocation streams (optional: see the module's docstring).
DRA_STREAMS = ("slices", "classes", "claims", "rules")
NEEDED_DRA_PERMISSIONS = "list/watch resourceslices, deviceclasses and resourceclaims (resource.k8s.io/v1, cluster-wide)"
NEEDED_KUEUE_PERMISSIONS = f"list/watch {LOCAL_QUEUES}, {CLUSTER_QUEUES}, {RESOURCE_FLAVORS} and {COHORTS} ({GROUP}/{VERSION})"
#: Why a queue's limit is unknown where Kueue's API is not served (404) or may not be read (403).
KUEUE_NOT_SERVED = f"Kueue is not installed (the API server does not serve {GROUP}/{VERSION})"
KUEUE_FORBIDDEN = f"the hub may not read Kueue's queues ({NEEDED_KUEUE_PERMISSIONS})"
#: Why Karpenter's pools are not read: not served (404) or not readable (403).
POOLS_NOT_SERVED = f"the API server does not serve {POOL_GROUP}/{POOL_VERSION} (Karpenter is not installed)"
POOLS_FORBIDDEN = (
    f"the hub may not list/watch {NODEPOOLS} and {NODECLAIMS} ({POOL_GROUP}; the gpuspawner chart grants it with karpenter.enabled=true)"
)
#: What each optional stream reads, as a refusal names it.
OPTIONAL_WHAT = {
    "slices": "resourceslices",
    "classes": "deviceclasses",
    "claims": "resourceclaims in all namespaces",
    "rules": "devicetaintrules",
    LOCAL_QUEUES: f"{LOCAL_QUEUES}.{GROUP}",
    CLUSTER_QUEUES: f"{CLUSTER_QUEUES}.{GROUP}",
    RESOURCE_FLAVORS: f"{RESOURCE_FLAVORS}.{GROUP}",
    COHORTS: f"{COHORTS}.{GROUP}",
    NODEPOOLS: f"{NODEPOOLS}.{POOL_GROUP}",
    NODECLAIMS: f"{NODECLAIMS}.{POOL_GROUP}",
}


class OptionalStreams:
    """DRA's, Kueue's and Karpenter's streams of an :class:`~gpuspawner.hub.inventory.Inventory`."""

    if TYPE_CHECKING:  # the inventory's: the index the streams feed, their tasks, one stream's watch loop
        index: ClusterIndex
        _tasks: list[asyncio.Task[None]]

        def _run(self, kind: str, method: ListCall, kwargs: dict[str, Any]) -> Coroutine[Any, Any, None]: ...

    def __init__(self, api: Any, dra_api: Any, kueue_api: Any) -> None:
        #: Kubernetes' custom objects API for Kueue's kinds (None: a stand-in without one).
        self.kueue_api = kueue_api if kueue_api is not None else custom_api(api)
        self._kueue_started = False
        self._kueue_refusals: dict[str, str] = {}  # stream -> why it may not be read
        self._pools_started = False
        self._pools_said: set[str] = set()  # why Karpenter's pools are not read, as logged (each once)
        #: The resource.k8s.io/v1 API (None: no DRA streams; DRA offerings then have no counts).
        self.dra_api = dra_api if dra_api is not None else resource_api(api)
        self._dra_synced = dict.fromkeys(DRA_STREAMS, False)
        self._dra_unavailable = ""
        self._rules_said = False
        #: How often an optional stream was refused (403, 404): Karpenter's, by stream.
        self.refusals: Counter[str] = Counter()

    def _dra_methods(self) -> dict[str, ListCall]:
        """The DRA streams' list/watch calls, where there is a DRA API (started with the nodes and pods)."""
        if self.dra_api is None:
            return {}
        methods = {
            "slices": self.dra_api.list_resource_slice,
            "classes": self.dra_api.list_device_class,
            "claims": self.dra_api.list_resource_claim_for_all_namespaces,
        }
        rules = taint_rules_lister(self.dra_api)
        if rules is not None:
            methods["rules"] = rules
        else:
            self._optional_synced("rules", True)  # a stand-in without them: no rules
        return methods

    def watch_kueue(self, namespace: str | None) -> None:
        """Start watching Kueue's LocalQueues (in ``namespace``; None: all namespaces), ClusterQueues,
        ResourceFlavors and Cohorts, once (the spawner calls it where ``kueue_queues`` is set)."""
        if self._kueue_started or self.kueue_api is None or not self._tasks:
            return
        self._kueue_started = True
        custom = self.kueue_api
        if namespace:
            local = partial(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, LOCAL_QUEUES)
        else:
            local = partial(custom.list_cluster_custom_object, GROUP, VERSION, LOCAL_QUEUES)
        methods = {
            LOCAL_QUEUES: local,
            CLUSTER_QUEUES: partial(custom.list_cluster_custom_object, GROUP, VERSION, CLUSTER_QUEUES),
            RESOURCE_FLAVORS: partial(custom.list_cluster_custom_object, GROUP, VERSION, RESOURCE_FLAVORS),
            COHORTS: partial(custom.list_cluster_custom_object, GROUP, VERSION, COHORTS),
        }
        self._tasks += [asyncio.ensure_future(self._run(kind, method, {})) for kind, method in methods.items()]

    def watch_pools(self) -> None:
        """Start watching Karpenter's NodePools and NodeClaims, once (the catalog calls it where
        ``discover_offerings`` is on): a pool with no node yet has its offering (capacity.karpenterpools)."""
        if self._pools_started or self.kueue_api is None or not self._tasks:
            return
        self._pools_started = True
        list_all = self.kueue_api.list_cluster_custom_object
        self._tasks += [
            asyncio.ensure_future(self._run(kind, partial(list_all, POOL_GROUP, POOL_VERSION, kind), {})) for kind in POOL_STREAMS
        ]

    def _optional_synced(self, kind: str, value: bool) -> bool:
        """Mark the optional stream ``kind`` synced (or not); False where ``kind`` is not optional."""
        if kind in POOL_STREAMS:
            if value:  # (a stream that fails keeps what it last read: a pool does not vanish in a blip)
                self.index.pools.synced[kind] = True
                self.index.pools.unavailable = ""
                self.index.changed()
            return True
        if kind in KUEUE_STREAMS:
            self.index.kueue.synced[kind] = value
            return True
        if kind in DRA_STREAMS:
            self._dra_synced[kind] = value
            self.index.dra.synced = all(self._dra_synced.values())
            return True
        return False

    def _optional_allowed(self, kind: str) -> bool:
        """The optional stream ``kind``'s watch was accepted; False where ``kind`` is not optional."""
        if kind in DRA_STREAMS:
            self._dra_unavailable = ""
        elif kind in KUEUE_STREAMS:
            self._kueue_allowed(kind)
        return kind in DRA_STREAMS or kind in KUEUE_STREAMS or kind in POOL_STREAMS

    async def _optional_failed(self, kind: str, exc: Exception, backoff: float, refusal_wait: float) -> float | None:
        """The optional stream ``kind`` failed with ``exc``: said, marked and waited for (``refusal_wait``
        after a 403 or 404, else ``backoff``), then the next backoff. None: not theirs to handle (the
        nodes' and pods', and a DRA stream's failure other than a refusal, count as the API server's)."""
        refused = exc if isinstance(exc, Refused) and exc.status in (403, 404) else None
        if kind == "rules" and refused is not None:
            self._rules_refused(refused)
        elif kind in DRA_STREAMS and refused is not None:
            self._dra_refused(kind, refused)
        elif kind in POOL_STREAMS and refused is not None:
            self._pools_refused(kind, refused)
            await asyncio.sleep(refusal_wait)
            return backoff
        elif kind in KUEUE_STREAMS and refused is not None:
            self._kueue_refused(kind, refused)
        elif kind in KUEUE_STREAMS or kind in POOL_STREAMS:  # these streams never touch the nodes' health or the outage count
            self._optional_synced(kind, False)
            log.warning("inventory: %s stream failed (%s: %s); retrying in %.1fs", kind, type(exc).__name__, exc, backoff)
            await asyncio.sleep(backoff)
            return min(backoff * 2, 10.0)
        else:
            return None
        await asyncio.sleep(refusal_wait)
        return min(backoff * 2, 10.0)

    def _dra_refused(self, kind: str, refused: Refused) -> None:
        """DRA not served (404) or not readable (403): DRA offerings go uncounted; the rest is untouched."""
        self._optional_synced(kind, False)
        if not self._dra_unavailable:
            if refused.status == 404:
                self._dra_unavailable = "the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34+ does)"
                log.info("inventory: %s; no DRA offerings are counted", self._dra_unavailable)
            else:
                self._dra_unavailable = f"the hub's service account may not {NEEDED_DRA_PERMISSIONS}"
                log.warning(
                    "GPUSpawner cannot count DRA devices: %s (the API server answered %d to %s). "
                    "Grant those permissions (the gpuspawner Helm chart's ClusterRole has them); until then DRA offerings show no free count.",
                    self._dra_unavailable,
                    refused.status,
                    refused.what,
                )

    def _rules_refused(self, refused: Refused) -> None:
        """DeviceTaintRules not served (before 1.37, or DRADeviceTaintRules off) or not readable: the counts
        go on without them (a device an admin's rule taints then looks free; the scheduler still refuses)."""
        if not self._rules_said:
            self._rules_said = True
            if refused.status == 404:
                log.info("inventory: the API server does not serve %s; device taints are read from ResourceSlices only", TAINT_RULES_PATH)
            else:
                log.warning(
                    "GPUSpawner cannot read DeviceTaintRules (the API server answered %d to %s): devices an admin's rule "
                    "taints are counted free. Grant list/watch on devicetaintrules (resource.k8s.io/v1, the gpuspawner chart's ClusterRole).",
                    refused.status,
                    refused.what,
                )
        self.index.dra.replace(rules=[])
        self._optional_synced("rules", True)

    def _kueue_refused(self, kind: str, refused: Refused) -> None:
        """Kueue not served (404) or not readable (403): each queue's limit is unknown; the rest is
        untouched. Said once in the log until that stream may be read again."""
        self._optional_synced(kind, False)
        why = KUEUE_NOT_SERVED if refused.status == 404 else KUEUE_FORBIDDEN
        said = self._kueue_refusals.get(kind)
        self._kueue_refusals[kind] = why
        self.index.kueue.unavailable = next(iter(self._kueue_refusals.values()))
        if said == why or why in [w for k, w in self._kueue_refusals.items() if k != kind]:
            return
        if refused.status == 404:
            log.warning("inventory: %s; the spawn page says each queue's limit is unknown", why)
        else:
            log.warning(
                "GPUSpawner cannot read Kueue's queues: %s (the API server answered %d to %s). Grant those "
                "permissions; until then the spawn page counts the nodes only and says each queue's limit is unknown.",
                why,
                refused.status,
                refused.what,
            )

    def _kueue_allowed(self, kind: str) -> None:
        """The ``kind`` stream's watch was accepted."""
        if self._kueue_refusals.pop(kind, None) is not None:
            self.index.kueue.unavailable = next(iter(self._kueue_refusals.values()), "")

    def _pools_refused(self, kind: str, refused: Refused) -> None:
        """Karpenter's CRDs absent (404) or not readable (403): discovery is as without them (its
        NodeClaims alone: the pools' nodes are counted from the nodes). One log line per reason."""
        self.index.pools.synced[kind] = False
        self.refusals[kind] += 1
        why = POOLS_NOT_SERVED if refused.status == 404 else POOLS_FORBIDDEN
        self.index.pools.unavailable = why
        self.index.changed()
        if why not in self._pools_said:
            self._pools_said.add(why)
            log.warning("inventory: Karpenter's pools are not read: %s; offerings come from the nodes and the settings as before", why)
