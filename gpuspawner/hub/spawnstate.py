"""One server's spawn state and its record: what the current spawn decided and said, and
what the spawner writes for the culler and the inventory to read (and a restarted hub to
count).

The record is written under ``user_options["gpuspawner"]`` and into the server's saved
state; its keys are ``vocabulary.RECORD_*``, and the culler reads it with
:mod:`gpuspawner.culler.contract`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from kubespawner.slugs import is_valid_label, safe_slug

from gpuspawner.capacity.admission import QUOTA_KEYS, Held
from gpuspawner.names.record import GpuRecord
from gpuspawner.offerings.choice import Choice
from gpuspawner.pod.podspec import PodChanges

#: The kinds a saved record may hold quota units of (quota keys but "total").
QUOTA_KINDS = frozenset(QUOTA_KEYS) - {"total"}


@lru_cache(maxsize=4096)
def user_label(name: str) -> str:
    """A user name as KubeSpawner writes it in its pod label (``vocabulary.KUBESPAWNER_USER_LABEL``)."""
    return str(safe_slug(name, is_valid=is_valid_label))  # (KubeSpawner is untyped)


@dataclass
class SpawnState:
    """What the current (or last) spawn of one server decided and said: made with the
    spawner, replaced at the start of each spawn (load_user_options), and cleared with
    JupyterHub's ``clear_state``, so no spawn reads what an earlier one left."""

    choice: Choice | None = None  # the admitted offering and count; None without a GPU offering in play
    pod_changes: PodChanges | None = None  # what the choice adds to the pod (get_pod_manifest layers it on)
    profile_env_keys: frozenset[str] = frozenset()  # variables the user's profile set (the memory guard may defer to them)
    user_env: bool = False  # whether those keep their value over the memory guard's (memory_guard_user_env)
    refused: bool = False  # refused before any pod was made: poll() says so without asking the cluster
    messages: list[str] = field(default_factory=list)  # our progress steps (admission, reservation, queue)
    expect_wait: bool = False  # admitted with a warning that the pod may wait: no fail-fast watch
    queue_position: int | None = None  # place in the offering's wait queue, while waiting
    held_in: str | None = None  # the Kueue LocalQueue the progress said holds the spawn (until admitted)
    started_at: float | None = None  # monotonic time _start began, for the time-to-schedule metric
    record_url: str | None = None  # the server's URL as the record names it (None without a Server)
    started: bool = False  # this spawn's start finished: its server runs (until the hub finds its pod gone)
    saved_record: dict[str, Any] | None = None  # the record from the hub's saved state (after a restart)
    claim_template: str | None = None  # the ResourceClaimTemplate this spawn made (DRA offerings), until deleted
    shared_claim: str | None = None  # the ResourceClaim this spawn's pod shares (shared DRA offerings)
    devices: list[dict[str, str]] | None = None  # the devices allocated to the pod's claim (DRA offerings)
    decided: asyncio.Event = field(default_factory=asyncio.Event)  # set once load_user_options admitted or refused
    spawn_id: str = field(default_factory=lambda: secrets.token_hex(8))  # this start's stamp on its pod (vocabulary.ANNOTATION_SPAWN)
    answered: bool = False  # the hub found its server answering (JupyterHub began polling it: a start, or a restart's check)
    slow_creations: int = 0  # pod creations of this start whose answer did not come in time (said once on the progress)

    def restart(self) -> None:
        """Forget an earlier load's decisions, in place (the start that is timing it may hold this object)."""
        self.choice, self.refused, self.messages, self.expect_wait = None, False, [], False
        self.pod_changes, self.profile_env_keys, self.user_env = None, frozenset(), False
        self.queue_position, self.record_url, self.saved_record, self.held_in = None, None, None, None
        self.devices = None
        self.decided.clear()


def server_record(state: SpawnState, pod: str, namespace: str, url: str | None = None) -> dict[str, Any]:
    """The record of the server whose spawn is ``state`` (it must hold a choice), as written:
    what other services (the culler, the inventory, a restarted hub) may read about its GPU
    (:class:`gpuspawner.names.record.GpuRecord`)."""
    assert state.choice is not None
    offering, count = state.choice.offering, state.choice.count
    return GpuRecord(
        offering=offering.slug,
        kind=offering.kind.value,
        count=count,
        resources={k: str(v) for k, v in offering.limits_for(count).items()},
        pod=pod,
        namespace=namespace,
        url=url or state.record_url,
        claim_template=pod if offering.claim is not None and offering.claim.replicas == 1 else None,
        shared_claim=state.shared_claim,
        devices=tuple(state.devices) if state.devices is not None else None,
        cost=offering.hourly_cost(count),
        price=(offering.price_per_hour or 0.0) * count,
    ).to_json()


def saved_holdings(records: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Held]:
    """What running servers hold, by pod key, from their saved records ((user name, record)
    pairs): the quota units a restarted hub counts for them. Records that hold no units (no
    resources, claim or shared claim; a CPU server; a malformed count) are left out."""
    saved = {}
    for name, raw in records:
        record, _ = GpuRecord.from_json(raw)
        if record.kind in QUOTA_KINDS and record.takes_units and record.count is not None:
            saved[f"{record.namespace}/{record.pod}"] = Held(record.kind, record.count, user_label(name))
    return saved
