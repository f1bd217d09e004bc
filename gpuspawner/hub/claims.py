"""The ResourceClaimTemplate of a DRA-backed notebook pod: made before the pod, owned by it,
deleted with the server. The Kubernetes I/O of :mod:`gpuspawner.dra.claimspec`'s template.

Why a template rather than a ResourceClaim of our own (docs/dra.md, "Why a template"):
Kubernetes' resourceclaim controller makes one ResourceClaim per pod from the template, owned
by that pod, and deletes it when the pod goes. So the claim -- what holds the GPU -- lives
exactly as long as KubeSpawner's pod, through KubeSpawner's delete-and-recreate on a name
clash too; only the template is ours to delete. It is made under the pod's name, with the
pod's labels and annotations, and is given the pod as its owner once the pod exists, so the
garbage collector removes it even if the hub never comes back; the stop deletes it at once,
and the orphan reconciler (:mod:`gpuspawner.hub.orphans`) removes one whose pod was never made.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api
from kubernetes_asyncio.client.rest import ApiException

from gpuspawner.capacity.allocation import allocated_devices, pod_claim_name
from gpuspawner.core.model import DeviceClaim
from gpuspawner.dra.claimspec import device_claim_spec
from gpuspawner.dra.extres import extended_claim_name
from gpuspawner.names.dranames import RESOURCE_API
from gpuspawner.names.vocabulary import LABEL_OFFERING
from gpuspawner.pod.podspec import hub_selector

#: Label of a ResourceClaim shared by the servers of one shared DRA offering.
SHARED_LABEL = "gpuspawner.io/shared-claim"

#: What the template is called in Kubernetes' API (and in the orphan reconciler's logs).
KIND = "ResourceClaimTemplate"


class ClaimTemplates:
    """ResourceClaimTemplates in one namespace, through the hub's own Kubernetes client."""

    def __init__(self, api_client: Any, namespace: str, log: logging.Logger, hub_id: str = "") -> None:
        # Any: every call here is made with ``_preload_content=False`` and answers the raw
        # response (read as JSON), which kubernetes_asyncio's hints do not say.
        self.api: Any = ResourceV1Api(api_client)
        self.core: Any = CoreV1Api(api_client)
        self.namespace = namespace
        self.log = log
        #: This hub's identity (``c.GPUSpawner.hub_id``): shared claims and their pods are this hub's only.
        self.hub_id = hub_id

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create the template and return it as the API server stored it; one left over under
        the same name (a spawn the hub lost) is replaced.

        A template's spec cannot be changed, so the old one is deleted first: a pod that used
        it already has its own claim.
        """
        name = manifest["metadata"]["name"]
        try:
            response = await self.api.create_namespaced_resource_claim_template(self.namespace, dict(manifest), _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.log.info("replacing the leftover %s %s/%s", KIND, self.namespace, name)
            await self.delete(name)
            response = await self.api.create_namespaced_resource_claim_template(self.namespace, dict(manifest), _preload_content=False)
        return dict(json.loads(await response.read()))

    async def own(self, name: str, pod: Mapping[str, Any]) -> None:
        """Make ``pod`` the template's owner: Kubernetes' garbage collector deletes it with the pod."""
        meta = pod.get("metadata") or {}
        owner = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
        await self.api.patch_namespaced_resource_claim_template(
            name, self.namespace, {"metadata": {"ownerReferences": [owner]}}, _content_type="application/merge-patch+json"
        )

    async def delete(self, name: str, namespace: str | None = None) -> None:
        """Delete the template; one already gone is what was wanted."""
        try:
            await self.api.delete_namespaced_resource_claim_template(name, namespace or self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list(self, label_selector: str, all_namespaces: bool = False) -> list[dict[str, Any]]:
        """The raw templates carrying ``label_selector`` (here, or in every namespace)."""
        if all_namespaces:
            response = await self.api.list_resource_claim_template_for_all_namespaces(label_selector=label_selector, _preload_content=False)
        else:
            response = await self.api.list_namespaced_resource_claim_template(
                self.namespace, label_selector=label_selector, _preload_content=False
            )
        return json.loads(await response.read()).get("items") or []

    # ------------------------------------------------------------------ shared offerings

    async def shared_with_room(self, slug: str, claim: DeviceClaim, labels: Mapping[str, str]) -> str:
        """The name of a ResourceClaim of shared offering ``slug`` that fewer than
        ``claim.replicas`` pods use, made now if there is none.

        NVIDIA's driver shares a device between the pods of ONE claim (its ``GpuConfig``
        sharing applies to that claim's consumers), so the servers of a shared offering join
        a claim with room. Its users are counted from the pods that name it; the caller holds
        one lock over choosing, creating the pod and :meth:`delete_if_unused`, so one hub
        never overfills a claim nor deletes one a pod is about to use.
        """
        response = await self.api.list_namespaced_resource_claim(
            self.namespace,
            label_selector=hub_selector(self.hub_id, f"{LABEL_OFFERING}={slug}", f"{SHARED_LABEL}=true"),
            _preload_content=False,
        )
        users = await self._users(slug)
        spec = device_claim_spec(claim, 1)
        for item in sorted(json.loads(await response.read()).get("items") or [], key=lambda c: c["metadata"]["name"]):
            meta = item["metadata"]
            # (a claim made for another image has other selectors: c.GPUSpawner.image_requirements)
            same = claim_selectors(item.get("spec")) == claim_selectors(spec)
            if same and not meta.get("deletionTimestamp") and users.get(meta["name"], 0) < claim.replicas:
                return str(meta["name"])
        manifest = {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {"generateName": f"gpuspawner-{slug}-"[:58], "labels": {**labels, SHARED_LABEL: "true"}},
            "spec": spec,
        }
        response = await self.api.create_namespaced_resource_claim(self.namespace, manifest, _preload_content=False)
        return str(json.loads(await response.read())["metadata"]["name"])

    async def delete_if_unused(self, slug: str, claim_name: str) -> None:
        """Delete a shared claim that no pod names any more (its last server stopped, or its
        first pod was never made); one still in use stays."""
        if (await self._users(slug)).get(claim_name):
            return
        try:
            await self.api.delete_namespaced_resource_claim(claim_name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _users(self, slug: str) -> dict[str, int]:
        """Shared claim name -> how many pods of offering ``slug`` (not being deleted) name it."""
        selector = hub_selector(self.hub_id, f"{LABEL_OFFERING}={slug}")
        response = await self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        users: dict[str, int] = {}
        for pod in json.loads(await response.read()).get("items") or []:
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            name = pod_claim_name(pod)
            if name:
                users[name] = users.get(name, 0) + 1
        return users

    async def read(self, name: str) -> dict[str, Any]:
        """The ResourceClaim ``name`` of this namespace, as the API server's JSON."""
        response = await self.api.read_namespaced_resource_claim(name, self.namespace, _preload_content=False)
        claim: dict[str, Any] = json.loads(await response.read())
        return claim

    async def devices(self, pod: Mapping[str, Any]) -> builtins.list[dict[str, str]]:  # (the method list shadows the builtin here)
        """The devices allocated to ``pod``'s GPU claim, with their identity from the driver's
        ResourceSlices of the pod's node (see :func:`gpuspawner.capacity.allocation.allocated_devices`)."""
        claim_name = pod_claim_name(pod) or extended_claim_name(pod)
        if claim_name is None:
            return []
        response = await self.api.read_namespaced_resource_claim(claim_name, self.namespace, _preload_content=False)
        claim = json.loads(await response.read())
        node = (pod.get("spec") or {}).get("nodeName") or ""
        selector = f"spec.nodeName={node}" if node else None
        response = await self.api.list_resource_slice(field_selector=selector, _preload_content=False)
        return allocated_devices(claim, json.loads(await response.read()).get("items") or [])


def claim_selectors(spec: Mapping[str, Any] | None) -> list[str]:
    """The CEL expressions of a ResourceClaim spec's requests, in order: two servers share a claim
    only if theirs are the same (an image that needs a newer driver adds some)."""
    requests = ((spec or {}).get("devices") or {}).get("requests") or []
    return [
        str((selector.get("cel") or {}).get("expression"))
        for request in requests
        for selector in (request.get("exactly") or {}).get("selectors") or ()
    ]
