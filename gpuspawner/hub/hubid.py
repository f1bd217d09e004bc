"""This hub's identity on the cluster, and the pod names it may take.

Every hub has an identity (``c.GPUSpawner.hub_id``, the label ``gpuspawner.io/hub`` on every
pod, claim template and claim it makes). Set, it is the admin's; under zero-to-jupyterhub it is
``<namespace>.<release>``; otherwise it is derived once and kept in the hub's own database
(:func:`stored_hub_id`): ``<namespace>.<random>``, so it survives restarts and upgrades, and two
hubs with two databases never share one, even in one namespace.

KubeSpawner deletes whatever pod already has the name it wants ("Found existing pod ...,
attempting to kill"). Two hubs in one namespace with the same user names would then delete
each other's running pods. Here a pod of that name is deleted only when it is this very
server's own (:func:`gpuspawner.pod.podspec.pod_taken_by`); any other refuses the spawn (409,
:data:`Refusal.POD_NAME_TAKEN`) naming who holds it and what to set. It is checked when the
create answers 409 AlreadyExists (:func:`create_pod`: the pod there is read, never deleted
unread) and, for a server whose DRA claim template is named after its pod, before that template
is made (:func:`check_pod_name`). A create is not preceded by a read otherwise: the API server's
409 says the same, and a read per spawn was the spawn's second request. A stop deletes the
pod its server names only when that pod carries no other hub's identity (:func:`stop_blocked`,
asked of the API server at each try of the stop).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio.client.rest import ApiException
from sqlalchemy import Column, MetaData, String, Table, insert, select
from sqlalchemy.exc import SQLAlchemyError

from gpuspawner.core.noticewords import SLOW_POD_CREATION
from gpuspawner.core.wording import pod_name_taken
from gpuspawner.hub import metrics
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.hub.seam import Spawner
from gpuspawner.names.vocabulary import ANNOTATION_HUB_USER, ANNOTATION_SPAWN, LABEL_HUB, Refusal
from gpuspawner.pod.podspec import derived_hub_id, identity, pod_taken_by, user_key

#: The one table gpuspawner keeps in JupyterHub's database: name -> value, one row
#: (``hub_id``). A table of its own, not a row of JupyterHub's: JupyterHub's migrations
#: (``jupyterhub upgrade-db``) change only JupyterHub's tables, and JupyterHub deletes rows
#: of its own tables that its config no longer names (roles, services, OAuth clients).
TABLE = Table(
    "gpuspawner_hub",
    MetaData(),
    Column("name", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
)
_HUB_ID = "hub_id"

#: database engine -> the identity stored there (read once per hub process).
_stored: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def stored_hub_id(db: Any, namespace: str, log: Any = None) -> str:
    """The identity kept in the hub's database (``db``: its SQLAlchemy session), made the first
    time (``<namespace>.<random>``: :func:`gpuspawner.pod.podspec.derived_hub_id`) and read
    from then on. "" (no identity) where the database cannot keep it, with one log line."""
    engine = db.get_bind()
    found = _stored.get(engine)
    if found is not None:
        return found
    try:
        TABLE.create(db.connection(), checkfirst=True)
        value = db.execute(select(TABLE.c.value).where(TABLE.c.name == _HUB_ID)).scalar()
        how = "kept in"
        if value is None:
            value, how = derived_hub_id(namespace, secrets.token_hex(4)), "made now and kept in"
            db.execute(insert(TABLE).values(name=_HUB_ID, value=value))
        db.commit()
    except SQLAlchemyError as exc:
        db.rollback()
        if log is not None:
            log.error("GPUSpawner: cannot keep this hub's identity in its database (%s); set c.GPUSpawner.hub_id", exc)
        return ""
    value = str(value)  # (the column is a string)
    _stored[engine] = value
    if log is not None:
        log.info("GPUSpawner: this hub's identity is %r (no c.GPUSpawner.hub_id set), %s its database (table %s)", value, how, TABLE.name)
    return value


def own_user_key(spawner: Spawner) -> str:
    """This server's user in the hub's database (``vocabulary.ANNOTATION_HUB_USER``)."""
    return user_key(spawner.user.id, getattr(spawner.user, "created", None))


def taken_by(spawner: Spawner, pod: Mapping[str, Any]) -> str:
    """Who holds ``pod`` if it is not this server's own, in words; "" if it is."""
    meta = pod.get("metadata") or {}
    return pod_taken_by(meta.get("labels") or {}, meta.get("annotations") or {}, spawner.hub_id, own_user_key(spawner))


def refusal(spawner: Spawner, name: str, holder: str) -> SpawnRefused:
    """The 409 for a pod name ``holder`` holds; nothing of this spawn was made, so the hub's
    cleanup asks the cluster nothing (see GPUSpawner.poll)."""
    spawner.spawn_state.refused = True
    choice = spawner.spawn_state.choice
    metrics.refused(choice.offering if choice is not None else None, Refusal.POD_NAME_TAKEN)
    where = f"{spawner.namespace}/{name}"
    spawner.log.warning("%s: pod %s is %s; refusing the spawn and leaving that pod alone", spawner.log_name, where, holder)
    return SpawnRefused(pod_name_taken(where, holder, spawner.hub_id), Refusal.POD_NAME_TAKEN)


async def read_pod(spawner: Spawner, name: str) -> dict[str, Any] | None:
    """The pod ``name`` in the server's namespace as the API server has it now; None if there is none."""
    response = await spawner.api.read_namespaced_pod(name, spawner.namespace, _preload_content=False)
    body = await response.read()  # (unparsed, the client raises for no status: see below)
    if response.status == 404:
        return None
    if not 200 <= response.status <= 299:
        refused = ApiException(status=response.status, reason=response.reason)
        refused.body = body
        raise refused
    return dict(json.loads(body))


async def check_pod_name(spawner: Spawner, name: str) -> None:
    """Before anything of this spawn is made (its pod, a DRA claim template named after it):
    refuse (:func:`refusal`) if a pod that is not this server's own has the name."""
    pod = await read_pod(spawner, name)
    holder = taken_by(spawner, pod) if pod is not None and not (pod.get("metadata") or {}).get("deletionTimestamp") else ""
    if holder:
        raise refusal(spawner, name, holder)


#: KubeSpawner's pod creation (the spawner's ``super()._make_create_pod_request``).
CreatePod = Callable[[Any, int], Awaitable[bool]]


async def create_pod(spawner: Spawner, kubespawner_create: CreatePod, pod: Any, request_timeout: int) -> bool:
    """Create ``pod``; KubeSpawner's way (``kubespawner_create``: delete the old pod and try
    again) only where a pod of that name is this server's own. A 409 AlreadyExists (a pod made
    since :func:`check_pod_name`) is read, and refused unless it is this server's own. A try after
    one that timed out first looks for the pod in the pod watch (:func:`made_by_this_start`): on a
    slow hub the create often succeeded and only its answer was late, so it is found, not made
    again. Returns as KubeSpawner's does: True made, False try again."""
    name = pod.metadata.name
    state = spawner.spawn_state
    if state.slow_creations and made_by_this_start(spawner, name):
        spawner.log.info("%s: pod %s, created by the try whose answer was late, is in the pod watch; taken as made", spawner.log_name, name)
        return True  # (found, not made again: no request at all where the watch has it)
    try:
        await asyncio.wait_for(spawner.api.create_namespaced_pod(spawner.namespace, pod), request_timeout)
        return True
    except TimeoutError:
        state.slow_creations += 1
        if state.slow_creations == 1:
            state.messages.append(SLOW_POD_CREATION)
        spawner.log.info("%s: creating pod %s timed out after %ss; trying again", spawner.log_name, name, request_timeout)
        return False  # (KubeSpawner's answer: try again; a pod the lost answer made is found by its stamp)
    except ApiException as exc:
        if exc.status != 409:
            raise
    there = await read_pod(spawner, name)
    if there is None:
        return False  # gone again in between: try again
    holder = taken_by(spawner, there)
    if holder:
        raise refusal(spawner, name, holder)
    if ((there.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPAWN) == state.spawn_id:
        spawner.log.info("%s: pod %s was made by this start's earlier try (its answer was lost); taken as made", spawner.log_name, name)
        return True  # made by this start's own earlier request, whose answer never came
    return await kubespawner_create(pod, request_timeout)  # this server's own leftover: KubeSpawner replaces it


def made_by_this_start(spawner: Spawner, name: str) -> bool:
    """Whether the pod watch (KubeSpawner's reflector, no request) has the pod ``name`` with this
    start's stamp: made by an earlier try of this start whose answer did not come in time. False
    where the watch has not seen it (yet): the create then asks, and its 409 is read."""
    reflector = spawner.pod_reflector
    pods = getattr(reflector, "pods", None) or {}
    found = pods.get(f"{spawner.namespace}/{name}")
    if not found:
        return False
    meta = found.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (meta.get("annotations") or {}).get(ANNOTATION_SPAWN) == spawner.spawn_state.spawn_id


async def stop_blocked(spawner: Spawner) -> str:
    """Who holds the pod this server names, where it carries another hub's identity or another
    user's key (as the API server has it now); "" where the stop may delete it, or there is none.
    A pod with no identity at all is one made before the hub stamped it: the server's saved state
    names it, so it is this server's, as KubeSpawner has it."""
    pod = await read_pod(spawner, spawner.pod_name)
    if pod is None:
        return ""
    meta = pod.get("metadata") or {}
    if LABEL_HUB not in (meta.get("labels") or {}) and ANNOTATION_HUB_USER not in (meta.get("annotations") or {}):
        return ""
    return taken_by(spawner, pod)


def made_before(db: Any, unlabelled: Mapping[str, Any]) -> dict[str, Any]:
    """Of ``unlabelled`` (pod key -> ``capacity.index.PodFacts`` of the pods without a hub's
    identity), those this hub made before it had one: their user key is a user of its database
    (``db``: the hub's session; none without one). Such a pod is still counted, and judged by the
    orphan reconciler, as this hub's after an upgrade."""
    items = list(unlabelled.items())  # (one step: safe beside the watch's events)
    keys = {pod.hub_user for _, pod in items if pod.hub_user}
    if db is None or not keys:
        return {}
    from jupyterhub import orm

    ids = {int(k.split("/", 1)[0]) for k in keys if k.split("/", 1)[0].isdigit()}
    mine = {user_key(uid, created) for uid, created in db.query(orm.User.id, orm.User.created).filter(orm.User.id.in_(ids))}
    return {key: pod for key, pod in items if pod.hub_user in mine}


async def stop_unless_taken(spawner: Spawner, kubespawner_stop: Callable[..., Awaitable[Any]], now: bool) -> None:
    """KubeSpawner's stop (``kubespawner_stop``), never of a pod of another hub that has this
    server's pod name (:func:`stop_blocked`; asked on each try: the stop is retried while the
    cluster cannot answer)."""
    holder = await stop_blocked(spawner)
    if holder:
        spawner.log.warning("%s: not deleting pod %s/%s: it is %s", spawner.log_name, spawner.namespace, spawner.pod_name, holder)
        return
    await kubespawner_stop(now=now)


def stamp_identity(spawner: Spawner, pod: Any) -> None:
    """Label ``pod`` with this hub's identity and annotate whose server it is in the hub's
    database (see podspec.identity), for the orphan reconciler and the quotas; the claim
    template copies both from the pod."""
    labels, annotations = identity(spawner.hub_id, own_user_key(spawner))
    pod.metadata.labels = {**(pod.metadata.labels or {}), **labels}
    pod.metadata.annotations = {**(pod.metadata.annotations or {}), **annotations, ANNOTATION_SPAWN: spawner.spawn_state.spawn_id}
