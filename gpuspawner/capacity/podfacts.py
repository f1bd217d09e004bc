"""What the counts keep of one pod: its node, requests and whose it is (never the whole object). Pure.

:class:`~gpuspawner.capacity.index.ClusterIndex` keeps one :class:`PodFacts` per bound, non-terminal
pod of the cluster; a cluster's pods ask for few distinct request sets, each kept once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.core.fit import holds_resources, pod_requests
from gpuspawner.names.vocabulary import ANNOTATION_HUB_USER, KUBESPAWNER_USER_LABEL, LABEL_HUB, LABEL_OFFERING

#: Pods of a cluster ask for few distinct request sets: each is kept once.
_INTERNED: dict[tuple[tuple[str, int], ...], Mapping[str, int]] = {}
_INTERN_LIMIT = 50_000


def _interned(requests: dict[str, int]) -> Mapping[str, int]:
    key = tuple(sorted(requests.items()))
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) >= _INTERN_LIMIT:
            return requests
        found = _INTERNED[key] = requests
    return found


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the counts need of one pod (never the whole object)."""

    node: str
    requests: Mapping[str, int]
    user: str | None = None
    offering: str | None = None
    hub: str | None = None  #: the hub that made it (``vocabulary.LABEL_HUB``), None if unlabelled
    #: Of an unlabelled pod only: its user key (``vocabulary.ANNOTATION_HUB_USER``), which tells a
    #: pod made before its hub had an identity (the hub's database has the key) from anyone's.
    hub_user: str | None = None

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodFacts | None:
        if not holds_resources(pod):
            return None
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        hub = labels.get(LABEL_HUB)
        return cls(
            node=pod["spec"]["nodeName"],
            requests=_interned(pod_requests(pod)),
            user=labels.get(KUBESPAWNER_USER_LABEL),
            offering=labels.get(LABEL_OFFERING),
            hub=hub,
            hub_user=None if hub else (meta.get("annotations") or {}).get(ANNOTATION_HUB_USER),
        )


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
