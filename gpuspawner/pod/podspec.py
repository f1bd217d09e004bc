"""Offering + the user's choice -> the changes to make to the notebook pod. Pure.

The result is expressed in KubeSpawner's own terms (``extra_resource_limits``,
``node_selector``, ``tolerations``, ``environment``, ``extra_labels`` ...), so
KubeSpawner keeps building the pod; :class:`PodChanges` only says what to add, and
:func:`layered_settings` puts it on top of the settings the site's config, hooks and
profile made, as new values (the site's own are never changed: docs/architecture.md,
"The pod settings").

An offering served through Dynamic Resource Allocation (``Offering.claim``) asks for no
extended resource: its pod's claim is :mod:`gpuspawner.dra.claimspec`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.core.model import Offering, PodFields
from gpuspawner.core.wording import offering_words
from gpuspawner.names.selectors import Terms, terms_to_k8s
from gpuspawner.names.vocabulary import (
    ANNOTATION_HUB_USER,
    ENV_CHOICES,
    ENV_COUNT,
    ENV_DISPLAY_NAME,
    ENV_KIND,
    ENV_OFFERING,
    ENV_WORDS,
    LABEL_HUB,
    LABEL_KIND,
    LABEL_OFFERING,
)
from gpuspawner.pod.memguard import GuardChanges, guarded_environment, one_jax_spelling, without_jax_clash

#: Never set by us: the device plugin decides which devices a container sees.
FORBIDDEN_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"})


@dataclass(frozen=True)
class PodChanges(PodFields):
    """What a chosen offering adds to KubeSpawner's pod settings: its :class:`PodFields` (with
    ``node_affinity`` the offering's whole placement), its limits and its memory guard's part."""

    limits: Mapping[str, str] = field(default_factory=dict)
    #: The memory guard's variables (set over the environment: see memguard.guarded_environment),
    #: without those the offering's own ``env`` sets (the admin's explicit word wins; JAX's
    #: fraction in either spelling counts as the same variable).
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
    if guard is not None:  # JAX's fraction under the one name every jaxlib reads (memguard)
        env = one_jax_spelling(env)
    env.update({ENV_OFFERING: offering.slug, ENV_KIND: offering.kind.value})
    env.update(
        {
            ENV_DISPLAY_NAME: offering.display_name,
            ENV_WORDS: offering_words(offering.memory_mib, offering.compute_share, offering.isolation),
        }
    )
    if offering.is_gpu and offering.takes_units:
        env[ENV_COUNT] = str(count)
    if offering.claim is not None and offering.claim.alternatives:
        # [label, match] pairs, not objects: KubeSpawner expands {braces} in every env value.
        env[ENV_CHOICES] = json.dumps([[a.label, a.match] for a in offering.claim.alternatives])
    labels = {**offering.labels, LABEL_OFFERING: offering.slug, LABEL_KIND: offering.kind.value}
    return PodChanges(
        limits={name: str(qty) for name, qty in offering.limits_for(count).items()},
        node_selector=dict(offering.node_selector),
        node_affinity=offering.placement_terms,
        tolerations=tuple(dict(t) for t in offering.tolerations),
        env=env,
        labels=labels,
        annotations={**(guard.annotations if guard else {}), **offering.annotations},
        # the guard's first: its shell sets PYTHONPATH, then runs the offering's prefix and the server
        command_prefix=(*(guard.command_prefix if guard else ()), *offering.command_prefix),
        guard_env=without_jax_clash(guard.env, env) if guard else {},
        volumes=tuple(dict(v) for v in guard.volumes) if guard else (),
        volume_mounts=tuple(dict(m) for m in guard.volume_mounts) if guard else (),
    )


#: KubeSpawner's settings that a chosen offering adds to (see :func:`layered_settings`).
POD_SETTINGS = (
    "extra_resource_limits",
    "extra_resource_guarantees",
    "node_selector",
    "node_affinity_required",
    "tolerations",
    "environment",
    "extra_labels",
    "extra_annotations",
    "cmd",
    "volumes",
    "volume_mounts",
)

#: The notebook command when KubeSpawner's ``cmd`` is unset (KubeSpawner's own default).
DEFAULT_CMD = ("jupyterhub-singleuser",)


def layered_settings(
    site: Mapping[str, Any], changes: PodChanges, profile_env_keys: frozenset[str] = frozenset(), user_env: bool = False
) -> dict[str, Any]:
    """The :data:`POD_SETTINGS` for one pod: ``site`` (KubeSpawner's settings as the admin's
    config, the hub's hooks and the user's profile left them; lists, not KubeSpawner's
    dict form) with ``changes`` on top. New values: nothing in ``site`` is changed.

    ``profile_env_keys`` are the variables the user's profile set, which keep their value
    over the memory guard's where the admin allows it (``user_env``).
    """
    cmd = site["cmd"]
    return {
        "extra_resource_limits": {**site["extra_resource_limits"], **changes.limits},
        # Kubernetes requires requests == limits for extended resources; set both explicitly.
        "extra_resource_guarantees": {**site["extra_resource_guarantees"], **changes.limits},
        "node_selector": {**site["node_selector"], **changes.node_selector},
        "node_affinity_required": merge_affinity_terms(site["node_affinity_required"], changes.node_affinity),
        "tolerations": merge_tolerations(site["tolerations"], changes.tolerations),
        "environment": guarded_environment({**site["environment"], **changes.env}, changes.guard_env, profile_env_keys, user_env),
        "extra_labels": {**site["extra_labels"], **changes.labels},
        "extra_annotations": {**site["extra_annotations"], **changes.annotations},
        "volumes": [*site["volumes"], *(dict(v) for v in changes.volumes)],
        "volume_mounts": [*site["volume_mounts"], *(dict(m) for m in changes.volume_mounts)],
        "cmd": [*changes.command_prefix, *(cmd or DEFAULT_CMD)] if changes.command_prefix else cmd,
    }


def user_key(user_id: object, created: object = None) -> str:
    """Who a server belongs to in one hub's database: the user's id and creation time
    (``vocabulary.ANNOTATION_HUB_USER``). Both survive a rename; a new database (a lost one,
    another hub's) gives a user of the same id another creation time."""
    when = created.isoformat() if hasattr(created, "isoformat") else ""
    return f"{user_id}/{when}" if when else str(user_id)


def identity(hub_id: str, user: str) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations that tie a GPU pod (and its claim template) to this hub
    (``hub_id``, none when it is "") and to its user there (``user``: :func:`user_key`)."""
    return ({LABEL_HUB: hub_id} if hub_id else {}), {ANNOTATION_HUB_USER: user}


def hub_selector(hub_id: str, *more: str) -> str:
    """A label selector for this hub's objects (with ``more`` terms): those labelled with its
    identity, or, for a hub without one, those that carry no hub's identity."""
    return ",".join([*more, f"{LABEL_HUB}={hub_id}" if hub_id else f"!{LABEL_HUB}"])


#: The longest label value Kubernetes takes, and what one may hold.
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


def hub_id_problem(value: str) -> str:
    """Why ``value`` cannot be a hub identity (a Kubernetes label value), "" when it can."""
    if _LABEL_VALUE.match(value):
        return ""
    return (
        f"c.GPUSpawner.hub_id must be a Kubernetes label value (at most 63 letters, digits, '-', '_' or '.', "
        f"beginning and ending with a letter or digit), not {value[:80]!r}"
    )


def default_hub_id(environ: Mapping[str, str]) -> str:
    """This hub's identity from its deployment: zero-to-jupyterhub's hub Deployment sets
    ``HELM_RELEASE_NAME`` (the Helm release) and ``POD_NAMESPACE`` (the hub's namespace), so
    ``<namespace>.<release>`` names one release on a cluster. "" outside such a deployment.
    Shortened, with a digest of the whole, to fit a label value."""
    release, namespace = environ.get("HELM_RELEASE_NAME", ""), environ.get("POD_NAMESPACE", "")
    if not release:
        return ""
    value = f"{namespace}.{release}" if namespace else release
    if len(value) > 63:
        digest = hashlib.sha256(value.encode()).hexdigest()[:10]
        value = f"{value[:52].rstrip('-_.')}-{digest}"
    return value


def derived_hub_id(namespace: str, token: str) -> str:
    """The identity of a hub that has none configured and is not zero-to-jupyterhub's:
    ``<namespace>.<token>``, ``token`` being the random value kept in the hub's own database
    (``hub.hubid``), so two hubs with two databases never get the same one, even in one
    namespace. Shortened, with a digest of the whole, to fit a label value."""
    value = f"{namespace}.{token}" if namespace else token
    if len(value) > 63:
        digest = hashlib.sha256(value.encode()).hexdigest()[:10]
        value = f"{value[:52].rstrip('-_.')}-{digest}"
    return value


#: KubeSpawner's own default ``pod_name_template``.
KUBESPAWNER_POD_NAME_TEMPLATE = "jupyter-{user_server}"


def hub_suffix(hub_id: str) -> str:
    """Six characters that tell this hub's pod names from another hub's in one namespace (a
    digest of ``hub_id``: the same across restarts, different for two hubs); "" without one."""
    return hashlib.sha256(hub_id.encode()).hexdigest()[:6] if hub_id else ""


def default_pod_name_template(hub_id: str) -> str:
    """GPUSpawner's default ``pod_name_template``: KubeSpawner's with this hub's :func:`hub_suffix`
    (``jupyter-alice--gpu-3f9a2c``), so two hubs with the same user names in one namespace never
    ask for the same pod name. Every name of one hub ends with the same six characters, so two
    hubs' names never meet. KubeSpawner's own without an identity."""
    suffix = hub_suffix(hub_id)
    return f"{KUBESPAWNER_POD_NAME_TEMPLATE}-{suffix}" if suffix else KUBESPAWNER_POD_NAME_TEMPLATE


def pod_taken_by(labels: Mapping[str, str], annotations: Mapping[str, str], hub_id: str, user: str) -> str:
    """Who holds the pod (``labels``, ``annotations``) that has the name this hub's server of
    ``user`` (its :func:`user_key`) wants, in words; "" when it is that very server's own pod
    (this hub's identity, or none on a pod made before the hub had one, and this user's key),
    which KubeSpawner may delete and make again. Any other pod is never deleted."""
    theirs, their_user = labels.get(LABEL_HUB, ""), annotations.get(ANNOTATION_HUB_USER, "")
    if their_user == user and theirs in (hub_id, ""):
        return ""
    if theirs and theirs != hub_id:
        return f"a pod of the hub '{theirs}'"
    if theirs:
        return f"a pod this hub made for another user record ({their_user or 'none'})"
    return "a pod not made by this hub"


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
