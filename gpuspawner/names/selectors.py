"""Node selection as the scheduler reads it: label requirements, node-affinity terms, taints. Pure.

An offering's pod lands only on nodes whose labels match its ``nodeSelector`` and one of
its required node-affinity terms, and whose NoSchedule/NoExecute taints it tolerates.
This module holds those rules once (the semantics of Kubernetes' label selectors,
``NodeSelectorTerm`` and ``Toleration.ToleratesTaint``), so that discovery (which writes
the selectors), capacity (which counts where they land) and the pod (which carries
them) can never disagree.

Terms are kept as a tuple of alternatives (ORed), each a tuple of :class:`Req` (ANDed).
The empty tuple ``()`` means "no constraint"; a term that is empty matches every node, so
a term list holding one is the same as ``()``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT)
#: The one field a NodeSelectorTerm's ``matchFields`` may name.
NODE_NAME_FIELD = "metadata.name"
_INT64 = re.compile(r"^[+-]?[0-9]+$")


class Req(NamedTuple):
    """One ``NodeSelectorRequirement``: ``key operator values`` (``field``: a matchFields entry)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    field: bool = False

    def matches(self, labels: Mapping[str, str], node_name: str = "") -> bool:
        """Kubernetes' ``labels.Requirement.Matches`` (NotIn and DoesNotExist hold when the label is absent)."""
        if self.field:
            present, value = self.key == NODE_NAME_FIELD, node_name
        else:
            present, value = self.key in labels, labels.get(self.key, "")
        op = self.operator
        if op == IN:
            return present and value in self.values
        if op == NOT_IN:
            return not present or value not in self.values
        if op == EXISTS:
            return present
        if op == DOES_NOT_EXIST:
            return not present
        if op in (GT, LT):
            if not present or len(self.values) != 1 or not _INT64.match(value) or not _INT64.match(self.values[0]):
                return False
            left, right = int(value), int(self.values[0])
            return left > right if op == GT else left < right
        return False

    def to_k8s(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.operator not in (EXISTS, DOES_NOT_EXIST):
            out["values"] = list(self.values)
        return out


Term = tuple[Req, ...]
Terms = tuple[Term, ...]


def equals(key: str, value: str) -> Req:
    return Req(key, IN, (value,))


def absent(key: str) -> Req:
    return Req(key, DOES_NOT_EXIST)


def pinned(key: str, labels: Mapping[str, str]) -> Req:
    """``key`` must have the value it has in ``labels``, or be absent where it is absent there."""
    return equals(key, labels[key]) if key in labels else absent(key)


def terms_match(terms: Terms, labels: Mapping[str, str], node_name: str = "") -> bool:
    """Do ``labels`` satisfy one of the ``terms``? (``()``: no constraint.)"""
    if not terms:
        return True
    return any(all(req.matches(labels, node_name) for req in term) for term in terms)


def _term(reqs: Iterable[Req]) -> Term:
    out: list[Req] = []
    for req in reqs:
        if req not in out:
            out.append(req)
    return tuple(out)


def _normal(terms: Iterable[Term]) -> Terms:
    out: list[Term] = []
    for term in terms:
        if not term:
            return ()  # an empty term matches everything: the whole OR does
        if term not in out:
            out.append(term)
    return tuple(out)


def all_of(*reqs: Req) -> Terms:
    """One term: every requirement must hold."""
    return _normal([_term(reqs)]) if reqs else ()


def any_of(*alternatives: Terms) -> Terms:
    """Nodes that match any of ``alternatives`` (each one a Terms)."""
    if any(not alt for alt in alternatives):
        return ()
    return _normal(term for alt in alternatives for term in alt)


def and_terms(*parts: Terms) -> Terms:
    """Nodes that match all of ``parts``: the cross product of their terms."""
    out: Terms = ()
    for part in parts:
        if not part:
            continue
        if not out:
            out = _normal(part)
            continue
        out = _normal(_term((*a, *b)) for a in out for b in part)
    return out


def factor(terms: Terms) -> tuple[dict[str, str], Terms]:
    """Split out the ``key In [one value]`` requirements every term shares, as a plain nodeSelector.

    The rest stays as terms. ``nodeSelector`` and terms AND together, so nothing changes.
    """
    if not terms:
        return {}, ()
    shared = [r for r in terms[0] if r.operator == IN and len(r.values) == 1 and not r.field and all(r in t for t in terms[1:])]
    selector = {r.key: r.values[0] for r in shared}
    rest = _normal(_term(r for r in t if r not in shared) for t in terms)
    return selector, rest


def terms_to_k8s(terms: Terms) -> list[dict[str, Any]]:
    """``nodeSelectorTerms`` as the API takes them."""
    out = []
    for term in terms:
        entry: dict[str, Any] = {}
        exprs = [r.to_k8s() for r in term if not r.field]
        fields = [r.to_k8s() for r in term if r.field]
        if exprs:
            entry["matchExpressions"] = exprs
        if fields:
            entry["matchFields"] = fields
        out.append(entry)
    return out


def terms_from_k8s(raw: Iterable[Mapping[str, Any]]) -> Terms:
    """Parse ``nodeSelectorTerms`` (KubeSpawner's ``node_affinity_required``).

    A term with no requirements matches no node in Kubernetes; it is kept as a requirement
    no node meets, so the count stays what the scheduler does.
    """
    out = []
    for term in raw:
        reqs = [
            Req(str(e.get("key", "")), str(e.get("operator", "")), tuple(str(v) for v in e.get("values") or ()))
            for e in term.get("matchExpressions") or ()
        ]
        reqs += [
            Req(str(e.get("key", "")), str(e.get("operator", "")), tuple(str(v) for v in e.get("values") or ()), True)
            for e in term.get("matchFields") or ()
        ]
        out.append(_term(reqs) if reqs else (Req("", "MatchesNothing"),))
    terms = tuple(out)
    return terms if terms else ()


# ----------------------------------------------------------------------------- taints

HARD_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
#: The API server's DefaultTolerationSeconds admission gives every pod these unless it
#: already tolerates the taint: a node that is only NoExecute-tainted NotReady still takes pods.
DEFAULT_NOT_READY_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
)


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``, for any of ``tolerations``.

    Lt/Gt tolerations need an alpha feature gate (off by default): they tolerate nothing here.
    """
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = tol.get("key") or ""
        if key and key != taint.get("key"):
            continue
        operator = tol.get("operator") or "Equal"
        if operator == "Exists":
            return True
        if operator == "Equal" and key and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def with_default_tolerations(tolerations: Iterable[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """The tolerations a pod has once the API server admitted it (DefaultTolerationSeconds)."""
    out = tuple(tolerations)
    extra = tuple(
        d
        for d in DEFAULT_NOT_READY_TOLERATIONS
        if not any((t.get("key") or "") in ("", d["key"]) and (t.get("effect") or "") in ("", "NoExecute") for t in out)
    )
    return out + extra


def untolerated_taint(tolerations: Iterable[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint the tolerations do not cover (the TaintToleration filter)."""
    tols = tuple(tolerations)
    for taint in taints:
        if taint.get("effect") in HARD_EFFECTS and not tolerates(tols, taint):
            return taint
    return None


def describe_taint(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'=' + value if value else ''}:{taint.get('effect')}"
