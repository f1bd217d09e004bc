"""The Kubernetes API as the inventory's streams call it: the API clients on the hub's own
connection, the raw answers checked, and what a hub without the inventory's RBAC is told.

The streams list and watch with ``_preload_content=False`` (the raw response, read as it comes),
which kubernetes_asyncio does not check: :func:`raise_for_status` does, as a :class:`Refused`
naming the status and what was asked. Used by :mod:`gpuspawner.hub.inventory`,
:mod:`gpuspawner.hub.optionalstreams` and :mod:`gpuspawner.hub.autoscaler`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

#: A list (or, with ``watch=True``, watch) call of kubernetes_asyncio's API clients, made with
#: ``_preload_content=False``: it answers the raw response, which the client's hints do not say.
ListCall = Callable[..., Awaitable[Any]]

#: What the hub's ServiceAccount must be allowed for the counts (said in the log when it is not).
NEEDED_PERMISSIONS = "list/watch nodes, list/watch pods (cluster-wide)"
#: DeviceTaintRules (resource.k8s.io/v1 from Kubernetes 1.37): a cluster that does not serve them (404) or a
#: hub that may not read them (403) has none as far as the counts go; the other DRA streams count as before.
TAINT_RULES_PATH = "/apis/resource.k8s.io/v1/devicetaintrules"


def custom_api(api: Any) -> Any:
    """Kubernetes' custom objects API on the same connection as ``api`` (None for a stand-in without one)."""
    client = getattr(api, "api_client", None)
    if client is None:
        return None
    from kubernetes_asyncio.client import CustomObjectsApi

    return CustomObjectsApi(client)


def resource_api(api: Any) -> Any:
    """``resource.k8s.io/v1`` on the same connection as ``api`` (None for a stand-in without one)."""
    client = getattr(api, "api_client", None)
    if client is None:
        return None
    from kubernetes_asyncio.client import ResourceV1Api

    return ResourceV1Api(client)


def taint_rules_lister(dra_api: Any) -> Any:
    """A list/watch method for ``resource.k8s.io/v1`` DeviceTaintRules, in the generated methods' shape
    (kubernetes_asyncio's ResourceV1Api predates them); None for a stand-in that has neither."""
    own = getattr(dra_api, "list_device_taint_rule", None)
    client = getattr(dra_api, "api_client", None)
    if own is not None or client is None:
        return own
    names = {
        "limit": "limit",
        "_continue": "continue",
        "watch": "watch",
        "resource_version": "resourceVersion",
        "allow_watch_bookmarks": "allowWatchBookmarks",
        "timeout_seconds": "timeoutSeconds",
    }

    async def list_device_taint_rule(**kwargs: Any) -> Any:
        query = [(wire, kwargs[name]) for name, wire in names.items() if kwargs.get(name) is not None]
        return await client.call_api(
            TAINT_RULES_PATH,
            "GET",
            {},
            query,
            {"Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_types_map={},
            _preload_content=False,
            _request_timeout=kwargs.get("_request_timeout"),
        )

    return list_device_taint_rule


class Refused(Exception):
    """The API server answered a list or watch with an HTTP error (not a stream)."""

    def __init__(self, status: int, what: str, message: str):
        super().__init__(f"{status} {what}: {message}")
        self.status = status
        self.what = what


async def raise_for_status(resp: Any, what: str) -> None:
    """Raw (``_preload_content=False``) answers are not checked by kubernetes_asyncio: do it here."""
    status = getattr(resp, "status", 200)
    if status < 400:
        return
    try:
        message = json.loads(await resp.read()).get("message") or ""
    except (ValueError, AttributeError):
        message = ""
    finally:
        release = getattr(resp, "release", None)
        if release is not None:
            release()
    raise Refused(status, what, message[:300])


def forbidden_message(refused: Refused) -> str:
    """The one error a hub without the inventory's RBAC logs: what is missing, and the fix."""
    return (
        f"GPUSpawner cannot count free GPUs: the hub's service account may not {NEEDED_PERMISSIONS} "
        f"(the API server answered {refused.status} to {refused.what}). Install charts/gpuspawner beside "
        "zero-to-jupyterhub (see its README), or bind a ClusterRole with those permissions to the hub's "
        "service account. Until then the spawn page shows 'free count unavailable', GPU offerings are not "
        "discovered, and spawns go ahead without a capacity check."
    )
