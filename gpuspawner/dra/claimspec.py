"""The claim of a DRA-backed notebook pod: the one ResourceClaim spec, its template and the pod's references. Pure.

An offering served through Dynamic Resource Allocation (``Offering.claim``) asks for no
extended resource: :func:`claim_template` is the ``ResourceClaimTemplate`` (resource.k8s.io/v1)
its pod points at, and :func:`pod_claim` / :func:`container_claim` are the two references
(the pod's ``spec.resourceClaims[]`` and the notebook container's ``resources.claims[]``).
:func:`device_claim_spec` is the one builder of a ResourceClaim's spec: the template's, a
shared offering's own claim (:mod:`gpuspawner.hub.claims`), and the template ``make dra-truth``
sends (:mod:`gpuspawner.devcluster.dratruth`) all come from it. Field names are the
Kubernetes v1 API's; docs/dra.md explains the choice of a template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuspawner.core.model import DeviceClaim
from gpuspawner.names.dranames import RESOURCE_API
from gpuspawner.names.vocabulary import CLAIM_NAME


def device_claim_spec(claim: DeviceClaim, count: int) -> dict[str, Any]:
    """A ResourceClaim's ``spec`` for ``count`` devices of ``claim``: one request, named
    :data:`~gpuspawner.names.vocabulary.CLAIM_NAME`, that the constraints and configs apply to.

    The count is the claim's (``allocationMode: ExactCount``), so "2 GPUs of one product on
    one node" is the allocator's job (``matchAttribute``), not a node selector's.
    """
    if count < 1:
        raise ValueError(f"a device claim needs a count of at least 1, not {count}")
    request: dict[str, Any] = {"name": CLAIM_NAME}
    if claim.alternatives:  # "this, or else that": the scheduler takes the first it can satisfy
        request["firstAvailable"] = [{"name": a.name, **_exact(a.device_class, a.selectors, count, claim)} for a in claim.alternatives]
    else:
        request["exactly"] = _exact(claim.device_class, claim.selectors, count, claim)
    devices: dict[str, Any] = {"requests": [request]}
    if claim.match_attributes:
        devices["constraints"] = [{"requests": [CLAIM_NAME], "matchAttribute": name} for name in claim.match_attributes]
    if claim.config:
        devices["config"] = [
            {"requests": [CLAIM_NAME], "opaque": {"driver": config["driver"], "parameters": dict(config["parameters"])}}
            for config in claim.config
        ]
    return {"devices": devices}


def _exact(device_class: str, selectors: tuple[str, ...], count: int, claim: DeviceClaim) -> dict[str, Any]:
    """One request's (or subrequest's) class, selectors and count, with the claim's capacity
    requests and device tolerations (a subrequest takes both, as a request does)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": expression}} for expression in selectors]
    if claim.capacity:  # a share of a device that allows multiple allocations: what each claim consumes
        exactly["capacity"] = {"requests": dict(claim.capacity)}
    if claim.tolerations:
        exactly["tolerations"] = [dict(t) for t in claim.tolerations]
    return exactly


def claim_template(claim: DeviceClaim, count: int, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    """The ``ResourceClaimTemplate`` named ``name`` for ``count`` devices of ``claim``.

    ``labels`` and ``annotations`` (the pod's: whose server it is, which offering) go on the
    template and, through ``spec.metadata``, on the ResourceClaim Kubernetes makes from it,
    so the orphan reconciler and a person with kubectl can tell whose GPU it is.
    """
    meta = {"labels": dict(labels), "annotations": dict(annotations)}
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, **meta},
        "spec": {"metadata": meta, "spec": device_claim_spec(claim, count)},
    }


def pod_claim(template_name: str) -> dict[str, str]:
    """The pod's ``spec.resourceClaims[]`` entry: a claim made for this pod from ``template_name``."""
    return {"name": CLAIM_NAME, "resourceClaimTemplateName": template_name}


def container_claim() -> dict[str, str]:
    """The notebook container's ``resources.claims[]`` entry: it gets the claim's devices."""
    return {"name": CLAIM_NAME}
