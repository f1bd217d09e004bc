"""Which servers go through Kueue, and with which LocalQueue and priority. Pure.

An admin maps offerings to Kueue's LocalQueues (docs/kueue.md)::

    c.GPUSpawner.kueue_queues = {
        "default": "gpu",                           # every GPU offering not named below
        "groups": {"ml-course": "ml-course"},        # a member's GPU servers (first group listed wins)
        "offerings": {"h100": "research", "cpu": ""},  # by slug; "" keeps that offering out of Kueue
    }
    c.GPUSpawner.kueue_priority_classes = {"staff": "interactive-high"}  # group -> WorkloadPriorityClass

The pod then carries ``kueue.x-k8s.io/queue-name`` (and ``kueue.x-k8s.io/priority-class``);
Kueue does the rest. The CPU offering goes through Kueue only where ``offerings`` names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.names.kueuenames import PRIORITY_LABEL, QUEUE_LABEL
from gpuspawner.names.vocabulary import AdmissionPolicy

#: A LocalQueue's or WorkloadPriorityClass's name: a Kubernetes object name (DNS subdomain).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_KEYS = ("default", "groups", "offerings")


@dataclass(frozen=True)
class KueueRouting:
    """The admin's queue mapping (see the module's docstring); empty: nothing goes through Kueue."""

    default: str = ""
    groups: Mapping[str, str] = field(default_factory=dict)
    offerings: Mapping[str, str] = field(default_factory=dict)
    priority_classes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, queues: Mapping[str, Any] | None, priority_classes: Mapping[str, Any] | None = None) -> KueueRouting:
        """From ``c.GPUSpawner.kueue_queues`` and ``kueue_priority_classes``; raises ValueError (see :func:`routing_problems`)."""
        problems = routing_problems(queues, priority_classes)
        if problems:
            raise ValueError("; ".join(problems))
        queues = queues or {}
        return cls(
            default=queues.get("default") or "",
            groups=dict(queues.get("groups") or {}),
            offerings=dict(queues.get("offerings") or {}),
            priority_classes=dict(priority_classes or {}),
        )

    @property
    def enabled(self) -> bool:
        return bool(self.default or any(self.groups.values()) or any(self.offerings.values()))

    def queue_for(self, offering: Offering, groups: Iterable[str]) -> str:
        """The LocalQueue a server of ``offering`` for a member of ``groups`` goes to ("" for none):
        the offering's own mapping, else the first of the configured groups the user is in, else
        the default; the CPU offering only by its own mapping."""
        if offering.slug in self.offerings:
            return self.offerings[offering.slug]
        if not offering.is_gpu:
            return ""
        member = set(groups)
        for group, queue in self.groups.items():
            if group in member:
                return queue
        return self.default

    def priority_for(self, groups: Iterable[str]) -> str:
        """The WorkloadPriorityClass for a member of ``groups`` ("" for Kueue's default): the first configured group."""
        member = set(groups)
        return next((name for group, name in self.priority_classes.items() if group in member), "")

    def labels(self, offering: Offering, groups: Iterable[str]) -> dict[str, str]:
        """The pod labels that send this server through Kueue (none where it does not go)."""
        groups = list(groups)
        queue = self.queue_for(offering, groups)
        if not queue:
            return {}
        priority = self.priority_for(groups)
        return {QUEUE_LABEL: queue, **({PRIORITY_LABEL: priority} if priority else {})}

    def queues(self) -> set[str]:
        """Every LocalQueue named."""
        return {q for q in (self.default, *self.groups.values(), *self.offerings.values()) if q}


def routing_problems(queues: Any, priority_classes: Any = None) -> list[str]:
    """What is wrong with ``kueue_queues`` / ``kueue_priority_classes`` (empty if nothing)."""
    where = "c.GPUSpawner.kueue_queues"
    problems: list[str] = []
    if queues is None:
        queues = {}
    if not isinstance(queues, Mapping):
        return [f"{where} must be a dict with 'default', 'groups' and/or 'offerings', got {queues!r}"]
    unknown = sorted(set(queues) - set(_KEYS))
    if unknown:
        problems.append(f"{where}: unknown key(s) {unknown}; use 'default', 'groups' (group -> queue) and 'offerings' (slug -> queue)")
    default = queues.get("default", "")
    if not isinstance(default, str) or (default and not _NAME.match(default)):
        problems.append(f"{where}['default'] must be a LocalQueue's name (lower-case letters, digits, '-', '.'), got {default!r}")
    for key in ("groups", "offerings"):
        mapping = queues.get(key, {})
        if not isinstance(mapping, Mapping):
            problems.append(f"{where}[{key!r}] must be a dict of name -> LocalQueue, got {mapping!r}")
            continue
        for name, queue in mapping.items():
            empty_allowed = key == "offerings"
            if not isinstance(queue, str) or (queue and not _NAME.match(queue)) or (not queue and not empty_allowed):
                problems.append(f"{where}[{key!r}][{name!r}] must be a LocalQueue's name, got {queue!r}")
    where = "c.GPUSpawner.kueue_priority_classes"
    if priority_classes is None:
        priority_classes = {}
    if not isinstance(priority_classes, Mapping):
        problems.append(f"{where} must be a dict of group -> WorkloadPriorityClass name, got {priority_classes!r}")
    else:
        for group, name in priority_classes.items():
            if not isinstance(name, str) or not _NAME.match(name):
                problems.append(f"{where}[{group!r}] must be a WorkloadPriorityClass's name, got {name!r}")
    return problems


def mix_problems(routing: KueueRouting, configured: Iterable[Offering], default_policy: str) -> list[str]:
    """Settings that cannot work together with Kueue: a server that waits in the hub's own queue
    (admission ``queue``) and then in Kueue's is in two queues with two orders, and the hub's
    wait counts free GPUs on the nodes while Kueue may hold the spawn for quota. Checked for the
    hub-wide ``admission`` (which discovered offerings follow) and each configured offering."""
    if not routing.enabled:
        return []
    advice = "a spawn would wait in two queues; let Kueue queue it (admission 'block' or 'warn')"
    problems = []
    if default_policy == AdmissionPolicy.QUEUE.value and (routing.default or any(routing.groups.values())):
        problems.append(f"c.GPUSpawner.admission is 'queue' and GPU offerings go through Kueue (c.GPUSpawner.kueue_queues): {advice}")
    for offering in configured:
        through = routing.queue_for(offering, ()) or any(routing.queue_for(offering, [g]) for g in routing.groups)
        if through and offering.admission == AdmissionPolicy.QUEUE.value:
            problems.append(
                f"offering {offering.slug!r} goes through Kueue (c.GPUSpawner.kueue_queues) and its admission is 'queue': {advice}"
            )
    return problems
