"""Offering + the user's choice -> the changes to make to the notebook pod. Pure.

The result is expressed in KubeSpawner's own terms (``extra_resource_limits``,
``node_selector``, ``tolerations``, ``environment``, ``extra_labels`` ...), so
KubeSpawner keeps building the pod; :class:`PodChanges` only says what to set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .memguard import GuardChanges
from .model import Offering
from .selectors import Terms, terms_to_k8s
from .vocabulary import ENV_COUNT, ENV_KIND, ENV_OFFERING, LABEL_KIND, LABEL_OFFERING

#: Never set by us: the device plugin decides which devices a container sees.
FORBIDDEN_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"})


@dataclass(frozen=True)
class PodChanges:
    """What a chosen offering adds to KubeSpawner's pod settings."""

    limits: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: Required node-affinity terms the pod must also meet (ORed terms of ANDed requirements):
    #: labels that must be absent, or keep a whole GPU off shared and MIG nodes.
    node_affinity: Terms = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    command_prefix: tuple[str, ...] = ()
    #: The memory guard's variables (set over the environment: see memguard.guarded_environment),
    #: without those the offering's own ``env`` sets (the admin's explicit word wins).
    guard_env: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()


def pod_changes(offering: Offering, count: int = 1, guard: GuardChanges | None = None) -> PodChanges:
    """The pod settings for ``count`` units of ``offering``, with its memory ``guard`` if any.

    Extended resources are set as limits; Kubernetes copies limits into requests
    and refuses a request that differs, so requests are never set apart.
    """
    if count not in offering.counts:
        raise ValueError(f"{offering.slug}: count {count} is not one of {list(offering.counts)}")
    env = {k: v for k, v in offering.env.items() if k not in FORBIDDEN_ENV}
    env.update({ENV_OFFERING: offering.slug, ENV_KIND: offering.kind.value})
    if offering.is_gpu and offering.resources:
        env[ENV_COUNT] = str(count)
    labels = {**offering.labels, LABEL_OFFERING: offering.slug, LABEL_KIND: offering.kind.value}
    return PodChanges(
        limits={name: str(qty) for name, qty in offering.limits_for(count).items()},
        node_selector=dict(offering.node_selector),
        node_affinity=offering.placement_terms,
        tolerations=tuple(dict(t) for t in offering.tolerations),
        env=env,
        labels=labels,
        annotations={**(guard.annotations if guard else {}), **offering.annotations},
        command_prefix=tuple(offering.command_prefix),
        guard_env={k: v for k, v in (guard.env if guard else {}).items() if k not in env},
        volumes=tuple(dict(v) for v in guard.volumes) if guard else (),
        volume_mounts=tuple(dict(m) for m in guard.volume_mounts) if guard else (),
    )


def merge_tolerations(base: list[Mapping[str, Any]], extra: tuple[Mapping[str, Any], ...]) -> list[dict[str, Any]]:
    """``base`` followed by the ``extra`` tolerations it does not already hold."""
    out = [dict(t) for t in base]
    for tol in extra:
        if dict(tol) not in out:
            out.append(dict(tol))
    return out


def merge_affinity_terms(terms: list[Mapping[str, Any]], required: Terms) -> list[dict[str, Any]]:
    """KubeSpawner's ``node_affinity_required`` terms AND the offering's ``required`` terms.

    Terms are ORed and each term's expressions ANDed, so the result is every pairing of
    one of ``terms`` with one of ``required`` (either alone when the other is empty).
    """
    ours = terms_to_k8s(required)
    if not ours:
        return [dict(t) for t in terms]
    if not terms:
        return ours
    return [
        {**t, "matchExpressions": [*(t.get("matchExpressions") or []), *(o.get("matchExpressions") or [])]} for t in terms for o in ours
    ]
