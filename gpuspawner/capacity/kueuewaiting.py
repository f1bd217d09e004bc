"""Who waits in Kueue for the GPU an offering's servers hold. Pure.

Fair turns (docs/fair-turns.md: reclaim an idle GPU when someone waits, no lease extension
while someone waits) count the spawns that wait for an offering. Where the offering's servers
go through Kueue (docs/kueue.md), others wait for the same GPUs in Kueue's queues: another
hub's spawns, batch Jobs, this hub's own spawns Kueue holds. The hub reads them from Kueue's
visibility API (the pending workloads of a ClusterQueue, :mod:`gpuspawner.hub.kueuevisibility`)
and their Workloads' pod sets; this module says which of them wait for an offering:

* a workload pending in the ClusterQueue behind one of the offering's LocalQueues, or in a
  ClusterQueue of the same cohort tree (a GPU given back there is quota the cohort lends:
  :class:`~gpuspawner.capacity.kueuequota.QuotaTree`);
* one of whose pod sets asks for the offering's extended resource (``nvidia.com/gpu``,
  ``nvidia.com/mig-1g.5gb``, ...) in a flavor that would also take the offering's pod: a
  flavor of its ClusterQueue's resource group for that resource whose node labels and taints
  let its pod in (as Kueue assigns flavors), and which the offering's servers use.

Each such workload counts once per offering, as one spawn waiting, whatever it asks for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.capacity.kueuequota import ClusterQueue, KueueState, flavor_takes, takers
from gpuspawner.core.fit import PodSpec, pod_requests
from gpuspawner.core.model import Offering
from gpuspawner.names.selectors import terms_from_k8s
from gpuspawner.pod.notebook import Notebook


def template_pod(template: Mapping[str, Any]) -> PodSpec:
    """A Workload pod set's ``template`` as the scheduler's filters (and Kueue's flavor
    assignment) read it: requests, node selector, required node affinity, tolerations."""
    spec = template.get("spec") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    return PodSpec(
        requests=pod_requests({"spec": spec}),
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        terms=terms_from_k8s(required.get("nodeSelectorTerms") or ()),
        tolerations=tuple(dict(t) for t in spec.get("tolerations") or ()),
    )


@dataclass(frozen=True)
class PendingWorkload:
    """A Workload Kueue lists as pending in ``cluster_queue``: its pods, one per pod set."""

    namespace: str
    name: str
    cluster_queue: str
    pods: tuple[PodSpec, ...]

    @classmethod
    def from_object(cls, workload: Mapping[str, Any], cluster_queue: str) -> PendingWorkload:
        meta, spec = workload.get("metadata") or {}, workload.get("spec") or {}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            cluster_queue=cluster_queue,
            pods=tuple(template_pod(ps.get("template") or {}) for ps in spec.get("podSets") or () if int(ps.get("count", 1) or 0) > 0),
        )


def cohort_root(state: KueueState, queue: ClusterQueue) -> str:
    """The root of ``queue``'s cohort tree ("" for a queue in no cohort)."""
    name, seen = queue.cohort, set()
    while name and name not in seen:
        seen.add(name)
        parent = state.cohorts.get(name)
        if parent is None or not parent.parent:
            return name
        name = parent.parent
    return name


def related_queues(state: KueueState, cluster_queue: str) -> set[str]:
    """``cluster_queue`` and the ClusterQueues of its cohort tree: where a GPU it gives back may go."""
    queue = state.cluster.get(cluster_queue)
    if queue is None:
        return set()
    root = cohort_root(state, queue)
    if not root:
        return {cluster_queue}
    return {name for name, other in state.cluster.items() if other.cohort and cohort_root(state, other) == root} | {cluster_queue}


def offering_flavors(offering: Offering, notebook: Notebook, state: KueueState, cluster_queue: str) -> set[str]:
    """The flavors of ``cluster_queue`` that would take a server of ``offering`` for its GPU resource."""
    queue = state.cluster.get(cluster_queue)
    groups = takers(offering, notebook, queue, state.flavors) if queue is not None else None
    return {name for group, names in groups or () if group.covered & set(offering.resources) for name in names}


def waits_for(workload: PendingWorkload, offering: Offering, flavors: set[str], state: KueueState) -> bool:
    """Whether ``workload`` asks for ``offering``'s resource in one of ``flavors`` (those its servers use)."""
    queue = state.cluster.get(workload.cluster_queue)
    if queue is None or not flavors:
        return False
    for pod in workload.pods:
        asked = {r for r in offering.resources if pod.requests.get(r, 0) > 0}
        for group in queue.groups:
            if not group.covered & asked:
                continue
            keys = frozenset(k for name, _ in group.flavors if name in state.flavors for k in state.flavors[name].node_labels)
            if any(name in flavors and name in state.flavors and flavor_takes(state.flavors[name], pod, keys) for name, _ in group.flavors):
                return True
    return False


def waiting(
    offerings: Iterable[Offering],
    local_queues: Mapping[str, Iterable[str]],
    namespace: str | None,
    state: KueueState,
    notebook: Notebook,
    pending: Iterable[PendingWorkload],
) -> dict[tuple[str, str], int]:
    """(offering slug, ClusterQueue the workloads wait in) -> how many pending workloads wait for
    that offering's GPU, for the offerings whose servers go to ``local_queues[slug]``
    (LocalQueues in ``namespace``; None: of those names in any namespace, for a hub whose users
    have namespaces of their own); each workload once per offering. Offerings without a known
    queue count none."""
    pending = list(pending)
    out: dict[tuple[str, str], int] = {}
    for offering in offerings:
        if not offering.resources or offering.claim is not None:
            continue
        names = set(local_queues.get(offering.slug, ()))
        behind = {lq.cluster_queue for (ns, name), lq in state.local.items() if name in names and namespace in (None, ns)}
        reach = [(related_queues(state, cq), offering_flavors(offering, notebook, state, cq)) for cq in sorted(behind)]
        for workload in pending:
            if any(workload.cluster_queue in related and waits_for(workload, offering, flavors, state) for related, flavors in reach):
                key = (offering.slug, workload.cluster_queue)
                out[key] = out.get(key, 0) + 1
    return out
