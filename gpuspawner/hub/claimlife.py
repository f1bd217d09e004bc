"""The life of a DRA server's GPU claim: made before its pod, owned by the pod, shared where
the offering shares devices, read for the devices the scheduler allocated, deleted at stop.

The claim itself (its spec and template) is :mod:`gpuspawner.pod.podspec`'s; the calls to the
cluster are :class:`gpuspawner.hub.claims.ClaimTemplates`'. The spawner is read through the seam
(``spawner``: :class:`gpuspawner.hub.seam.Spawner`) for its pod's name, namespace, API client, log
and spawn state.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client.rest import ApiException

from gpuspawner.capacity.allocation import pod_claim_name
from gpuspawner.core.model import Offering
from gpuspawner.core.noticewords import READY_WORDS, preparing_words
from gpuspawner.core.wording import MISCONFIGURED_MESSAGE
from gpuspawner.dra import binding
from gpuspawner.dra.alternatives import chosen_label
from gpuspawner.dra.claimspec import claim_template, container_claim, pod_claim
from gpuspawner.dra.extres import extended_claim_name
from gpuspawner.dra.gates import dropped, needs
from gpuspawner.hub.claims import ClaimTemplates
from gpuspawner.hub.scheduling import SpawnRefused, brief
from gpuspawner.hub.seam import Spawner
from gpuspawner.names.vocabulary import (
    CLAIM_NAME,
    DEVICE_CHOICE,
    DEVICE_REQUEST,
    LABEL_HUB,
    LABEL_KIND,
    LABEL_OFFERING,
    RECORD_CLAIM_TEMPLATE,
    RECORD_OFFERING,
    RECORD_SHARED_CLAIM,
    Refusal,
)

#: KubeSpawner's pod creation (the spawner's ``super()._make_create_pod_request``).
CreatePod = Callable[[Any, int], Awaitable[bool]]

#: One lock per shared offering (and namespace) in this hub process: choosing a claim with room
#: and becoming its owner happen together, so two spawns never overfill one claim.
_shared_locks: dict[str, asyncio.Lock] = {}


def claimed(spawner: Spawner) -> Offering | None:
    """The current spawn's offering when it is served through Dynamic Resource Allocation."""
    choice = spawner.spawn_state.choice
    return choice.offering if choice is not None and choice.offering.claim is not None else None


def claim_templates(spawner: Spawner) -> ClaimTemplates:
    return ClaimTemplates(spawner.api.api_client, spawner.namespace, spawner.log, spawner.hub_id)


def add_claim(pod: Any, pod_name: str) -> None:
    """The GPU claim added to KubeSpawner's pod: in the pod's ``resourceClaims`` and the
    notebook container's ``resources.claims``, after whatever the admin's
    ``extra_pod_config``/``extra_container_config`` put there."""
    pod.spec.resource_claims = [*(pod.spec.resource_claims or []), pod_claim(pod_name)]
    notebook = next(c for c in pod.spec.containers if c.name == "notebook")  # KubeSpawner's name for it
    resources = notebook.resources  # a model, or a plain dict where extra_container_config set it
    if isinstance(resources, dict):
        resources["claims"] = [*(resources.get("claims") or []), container_claim()]
    elif resources is not None:
        resources.claims = [*(resources.claims or []), container_claim()]
    else:
        notebook.resources = {"claims": [container_claim()]}


async def create_pod(spawner: Spawner, offering: Offering, pod: Any, request_timeout: int, create: CreatePod) -> bool:
    """Create a DRA server's pod with ``create``: its claim template first (the pod cannot be
    scheduled without it), given the pod as its owner after; a shared offering's pod joins a
    claim with room instead."""
    assert offering.claim is not None and spawner.spawn_state.choice is not None
    if offering.claim.replicas > 1:
        return await _create_sharing(spawner, offering, pod, request_timeout, create)
    meta, templates = pod.metadata, claim_templates(spawner)
    template = claim_template(offering.claim, spawner.spawn_state.choice.count, spawner.pod_name, meta.labels or {}, meta.annotations or {})
    try:
        stored = await templates.create(template)
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
        fix = (
            "grant it with charts/gpuspawner's dra.enabled=true (docs/dra.md)"
            if exc.status == 403
            else "this cluster serves no resource.k8s.io/v1 (Kubernetes 1.34 or newer, with DRA)"
        )
        spawner.log.error(
            "%s: cannot create ResourceClaimTemplate %s/%s for offering %s (%s): %s",
            spawner.log_name,
            spawner.namespace,
            spawner.pod_name,
            offering.slug,
            brief(exc),
            fix,
        )
        raise SpawnRefused(MISCONFIGURED_MESSAGE, Refusal.MISCONFIGURED) from None
    spawner.spawn_state.claim_template = spawner.pod_name
    lost = dropped(template["spec"], stored.get("spec") or {})
    if lost:  # an older API server kept the template without a feature's fields: not this claim
        await templates.delete(spawner.pod_name)
        spawner.spawn_state.claim_template = None
        spawner.log.error(
            "%s: offering %s needs a newer Kubernetes: the API server stored its ResourceClaimTemplate without %s (%s)",
            spawner.log_name,
            offering.slug,
            ", ".join(lost),
            needs(lost),
        )
        raise SpawnRefused(MISCONFIGURED_MESSAGE, Refusal.MISCONFIGURED)
    created = await create(pod, request_timeout)
    if created:
        try:
            response = await spawner.api.read_namespaced_pod(spawner.pod_name, spawner.namespace, _preload_content=False)
            await templates.own(spawner.pod_name, json.loads(await response.read()))
        except Exception as exc:  # the stop (or the orphan reconciler) still deletes it
            spawner.log.warning(
                "%s: could not make pod %s the owner of its claim template (%s)", spawner.log_name, spawner.pod_name, brief(exc)
            )
    return created


async def _create_sharing(spawner: Spawner, offering: Offering, pod: Any, request_timeout: int, create: CreatePod) -> bool:
    """A shared DRA offering's pod joins a claim of that offering with room (or a new one;
    see :meth:`gpuspawner.hub.claims.ClaimTemplates.shared_with_room`)."""
    assert offering.claim is not None
    async with _shared_locks.setdefault(f"{spawner.namespace}/{offering.slug}", asyncio.Lock()):
        labels = {k: v for k, v in (pod.metadata.labels or {}).items() if k in (LABEL_OFFERING, LABEL_KIND, LABEL_HUB)}
        name = await claim_templates(spawner).shared_with_room(offering.slug, offering.claim, labels)
        spawner.spawn_state.shared_claim = name
        pod.spec.resource_claims = [
            {"name": CLAIM_NAME, "resourceClaimName": name} if _claim_name_of(ref) == CLAIM_NAME else ref
            for ref in pod.spec.resource_claims or ()
        ]
        return await create(pod, request_timeout)


async def delete_claims(spawner: Spawner, record: dict[str, Any]) -> None:
    """Delete this server's claim template (this spawn's, or the saved ``record``'s after a hub
    restart); a shared claim once no pod uses it."""
    state = spawner.spawn_state
    templates = claim_templates(spawner)
    name = state.claim_template or (state.saved_record or {}).get(RECORD_CLAIM_TEMPLATE)
    if name:
        await templates.delete(name)
        state.claim_template = None
    shared, slug = state.shared_claim or record.get(RECORD_SHARED_CLAIM), record.get(RECORD_OFFERING)
    if shared and slug:
        async with _shared_locks.setdefault(f"{spawner.namespace}/{slug}", asyncio.Lock()):
            await templates.delete_if_unused(slug, shared)
        state.shared_claim = None


async def record_devices(spawner: Spawner) -> None:
    """Note which devices the scheduler allocated to the pod's claim (for the record the
    culler reads): a DRA offering's, or the claim the scheduler made for a plain
    ``nvidia.com/gpu`` pod on a DRA node (the extended-resource mapping, :mod:`gpuspawner.dra.extres`;
    on a device-plugin node there is no claim, and the culler finds the GPU by pod name).
    Best effort: without them the culler never calls the GPU idle."""
    if spawner.pod_reflector is None:
        return
    pod = spawner.pod_reflector.pods.get(f"{spawner.namespace}/{spawner.pod_name}")
    if claimed(spawner) is None and not (pod and extended_claim_name(pod)):
        return
    try:
        devices: list[dict[str, str]] | None = await claim_templates(spawner).devices(pod) if pod else None
        offering = claimed(spawner)
        for device in devices or []:  # "this, or else that": which one the user got
            label = chosen_label(offering.claim if offering else None, device.get(DEVICE_REQUEST, ""))
            if label:
                device[DEVICE_CHOICE] = label
        spawner.spawn_state.devices = devices
    except Exception as exc:
        spawner.log.warning("%s: could not read the devices allocated to pod %s (%s)", spawner.log_name, spawner.pod_name, brief(exc))


def _claim_name_of(ref: Any) -> str | None:
    """The ``name`` of a pod's ``resourceClaims`` entry, a dict or a Kubernetes model."""
    return ref.get("name") if isinstance(ref, dict) else getattr(ref, "name", None)


async def watch_binding(spawner: Spawner, interval: float = 1.0) -> None:
    """Until the pod has a node: if its GPU claim's devices wait for binding conditions
    (:mod:`gpuspawner.dra.binding`), add "Preparing the device (<condition>)…" to the spawn's
    progress, and say when they are met. Ends when the pod is bound (or the start ends)."""
    state, said = spawner.spawn_state, ""
    while True:
        await asyncio.sleep(interval)
        pod = spawner.pod_reflector.pods.get(f"{spawner.namespace}/{spawner.pod_name}") if spawner.pod_reflector else None
        if pod is None:
            continue
        if (pod.get("spec") or {}).get("nodeName"):
            if said:
                state.messages.append(READY_WORDS)
            return
        name = pod_claim_name(pod) or extended_claim_name(pod)
        if not name:
            continue
        try:
            claim = await claim_templates(spawner).read(name)
        except Exception as exc:  # best effort: the step is words, the scheduler decides
            spawner.log.debug("%s: could not read claim %s (%s)", spawner.log_name, name, brief(exc))
            continue
        waiting = binding.pending(claim)
        if waiting and preparing_words(waiting) != said:
            said = preparing_words(waiting)
            state.messages.append(said)
