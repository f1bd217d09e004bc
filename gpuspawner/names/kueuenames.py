"""Kueue's names, in one place. Pure.

Spelled as Kueue v0.17.0 spells them (``pkg/controller/constants/constants.go``,
``pkg/controller/jobs/pod/constants/constants.go``, ``pkg/constants/constants.go``,
``apis/kueue/v1beta2/workload_types.go``, ``pkg/controller/jobs/pod/pod_controller.go``).
Every other module imports these; none spells them again (docs/kueue.md).
"""

from __future__ import annotations

#: Kueue's API group and the version gpuspawner reads and writes.
GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"

#: The pod label that sends a pod through Kueue: the name of a LocalQueue in its namespace.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The pod label naming a WorkloadPriorityClass (Kueue's priority, not the scheduler's).
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: The label Kueue's Workload for a pod carries: the pod's UID.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: The scheduling gate Kueue's webhook puts on a pod until its Workload is admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: The finalizer (and label) Kueue puts on the pods it manages.
MANAGED_FINALIZER = "kueue.x-k8s.io/managed"

#: The pod condition Kueue sets just before it deletes a pod it stops, its reason one of
#: ``StopReason*``, for an eviction ``WorkloadEvictedDueTo<the Workload's Evicted reason>``
#: (``WorkloadEvictedDueToPreempted``; ``jobframework/reconciler.go``), its message Kueue's words.
TERMINATION_TARGET = "TerminationTarget"
STOP_EVICTED = "WorkloadEvicted"

#: Workload condition types and the reasons gpuspawner reads.
COND_QUOTA_RESERVED = "QuotaReserved"
COND_ADMITTED = "Admitted"
COND_EVICTED = "Evicted"
COND_PREEMPTED = "Preempted"
REASON_PENDING = "Pending"
REASON_INADMISSIBLE = "Inadmissible"

#: The names of Kueue's mutating and validating pod webhooks, as the hub sees them in an
#: API server's refusal when Kueue is down ("failed calling webhook \"mpod.kb.io\"").
POD_WEBHOOKS = ("mpod.kb.io", "vpod.kb.io")

#: The kinds the hub watches for the spawn page's counts (their API plurals,
#: ``apis/kueue/v1beta2``): LocalQueues (namespaced; ``spec.clusterQueue``), ClusterQueues
#: (``spec.resourceGroups[].coveredResources`` and ``.flavors[].resources[].nominalQuota``,
#: ``status.flavorsReservation[].resources[].total``) and ResourceFlavors (``spec.nodeLabels``,
#: ``spec.nodeTaints``, ``spec.tolerations``).
LOCAL_QUEUES = "localqueues"
CLUSTER_QUEUES = "clusterqueues"
RESOURCE_FLAVORS = "resourceflavors"
#: Cohort objects (cluster-scoped; ``spec.parentName``, ``spec.resourceGroups``): a cohort's own
#: quota and its place in a tree of cohorts, which borrowing reads. A ClusterQueue's
#: ``spec.cohortName`` may name a cohort that has no object (a root without quota of its own).
COHORTS = "cohorts"
#: Kueue's visibility API (an aggregated API served by Kueue's controller): a ClusterQueue's and a
#: LocalQueue's pending workloads, in queue order (``apis/visibility/v1beta2/types.go``).
VISIBILITY_GROUP = f"visibility.{GROUP}"
PENDING_WORKLOADS = "pendingworkloads"
#: A ClusterQueue's condition that is ``False`` while it admits nothing (e.g. a flavor missing).
COND_ACTIVE = "Active"
#: ``spec.stopPolicy`` of a ClusterQueue or LocalQueue: anything but this admits nothing new.
STOP_NONE = "None"
