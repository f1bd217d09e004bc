"""The notebook pod the hub makes, before any GPU offering: what it asks of a node. Pure.

A GPU is only free for a user if the notebook fits beside it: the scheduler weighs the
whole pod, not only its GPU. So the free counts take the hub's own pod settings into
account, read from the KubeSpawner traits that shape the pod:

* ``cpu_guarantee``/``mem_guarantee`` become the notebook container's requests (without a
  guarantee, Kubernetes takes the limit as the request: ``cpu_limit``/``mem_limit``);
  zero-to-jupyterhub sets ``mem_guarantee`` to 1G by default;
* ``extra_resource_guarantees``/``extra_resource_limits``, ``init_containers`` and
  ``extra_containers`` add what they request, as the scheduler adds them;
* ``node_selector``, ``node_affinity_required`` and ``tolerations`` narrow or widen where it
  may land (z2jh's user-pod tolerations let it onto ``hub.jupyter.org/dedicated`` nodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from traitlets import TraitError

from gpuspawner.core.fit import PODS, pod_requests
from gpuspawner.names.selectors import Terms, terms_from_k8s

#: KubeSpawner traits that shape the notebook pod's requests and placement.
NOTEBOOK_TRAITS = (
    "cpu_guarantee",
    "mem_guarantee",
    "cpu_limit",
    "mem_limit",
    "extra_resource_guarantees",
    "extra_resource_limits",
    "init_containers",
    "extra_containers",
    "node_selector",
    "node_affinity_required",
    "tolerations",
)


@dataclass(frozen=True)
class Notebook:
    """What the hub's notebook pod asks of a node besides its GPU offering."""

    requests: Mapping[str, int] = field(default_factory=lambda: {PODS: 1})
    node_selector: Mapping[str, str] = field(default_factory=dict)
    terms: Terms = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], where: Mapping[str, str] | None = None) -> Notebook:
        """From KubeSpawner's trait values by name (a spawner's, or a loaded config's section).

        Raises ValueError naming the setting that is wrong (``where``: name -> how to call it,
        default ``c.KubeSpawner.<name>``).
        """
        names = {n: (where or {}).get(n, f"c.KubeSpawner.{n}") for n in NOTEBOOK_TRAITS}
        cpu_request = _cores(settings, "cpu_guarantee", names) or _cores(settings, "cpu_limit", names)
        mem_request = _bytes(settings, "mem_guarantee", names) or _bytes(settings, "mem_limit", names)
        container_requests: dict[str, Any] = {}
        if cpu_request:
            container_requests["cpu"] = cpu_request
        if mem_request:
            container_requests["memory"] = mem_request
        extra_limits = _mapping(settings, "extra_resource_limits", names)
        extra_requests = _mapping(settings, "extra_resource_guarantees", names)
        notebook = {"name": "notebook", "resources": {"requests": {**container_requests, **extra_requests}, "limits": dict(extra_limits)}}
        spec = {
            "containers": [notebook, *_list(settings, "extra_containers", names)],
            "initContainers": _list(settings, "init_containers", names),
        }
        tolerations = _list(settings, "tolerations", names)
        return cls(
            requests=pod_requests({"spec": spec}),
            node_selector={str(k): str(v) for k, v in _mapping(settings, "node_selector", names).items()},
            terms=terms_from_k8s(_list(settings, "node_affinity_required", names)),
            tolerations=tuple(dict(t) for t in tolerations if isinstance(t, Mapping)),
        )

    def describe(self) -> str:
        """ "cpu 500m, memory 1.0 GiB" (what each notebook pod requests besides its GPU)."""
        parts = []
        if self.requests.get("cpu"):
            parts.append(f"cpu {self.requests['cpu']}m")
        if self.requests.get("memory"):
            parts.append(f"memory {self.requests['memory'] / 2**30:.2f} GiB")
        parts += [f"{k} {v}" for k, v in sorted(self.requests.items()) if k not in ("cpu", "memory", PODS)]
        return ", ".join(parts) or "no cpu or memory"


def _cores(settings: Mapping[str, Any], name: str, names: Mapping[str, str]) -> float | None:
    value = settings.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{names[name]} must be a number of CPU cores such as 0.5, got {value!r}")
    return float(value)


def _bytes(settings: Mapping[str, Any], name: str, names: Mapping[str, str]) -> int | None:
    """KubeSpawner's ByteSpecification: an int, or "1G"/"512M" (powers of 1024, as KubeSpawner reads them)."""
    from jupyterhub.traitlets import ByteSpecification

    value = settings.get(name)
    if value is None:
        return None
    try:
        return int(ByteSpecification().validate(None, value))
    except (TraitError, TypeError, ValueError, IndexError):
        raise ValueError(f"{names[name]} must be bytes or a size such as '1G' or '512M', got {value!r}") from None


def _mapping(settings: Mapping[str, Any], name: str, names: Mapping[str, str]) -> Mapping[str, Any]:
    value = settings.get(name) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{names[name]} must be a dict, got {value!r}")
    return value


def _list(settings: Mapping[str, Any], name: str, names: Mapping[str, str]) -> list[Any]:
    """KubeSpawner takes several list settings also as a dict (its values, sorted by key)."""
    value = settings.get(name) or []
    if isinstance(value, Mapping):
        return [value[k] for k in sorted(value)]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{names[name]} must be a list, got {value!r}")
    return list(value)
