"""Images that fit the node: what an image needs of the GPU's driver, and the nodes and devices that have it. Pure.

A CUDA image runs only where the node's NVIDIA driver is new enough (the driver supports
CUDA up to a version) and, for code built for it, the GPU's compute capability is high
enough. The admin says what each image needs (``c.GPUSpawner.image_requirements``: glob
patterns on the image, first match wins), as a dict or as the image's own
``NVIDIA_REQUIRE_CUDA`` string::

    c.GPUSpawner.image_requirements = {
        "quay.io/jupyter/pytorch-notebook:cuda12-*": {"min_driver": "570", "min_cuda": "12.8", "min_compute": "8.0"},
        "nvcr.io/nvidia/pytorch:24.*": "cuda>=12.4 brand=tesla,driver>=470,driver<471",
    }

What a node has is what GPU Feature Discovery labels (:mod:`gpuspawner.names.nvidia`): the
driver version (``nvidia.com/cuda.driver-version.major``/``minor``/``revision``), the CUDA
version it supports (``nvidia.com/cuda.runtime-version.major``/``minor``) and the compute
capability (``nvidia.com/gpu.compute.major``/``minor``), each an integer. A device of NVIDIA's
DRA driver carries the same as the version attributes ``driverVersion``, ``cudaDriverVersion``
and ``cudaComputeCapability``.

:func:`fitted` turns an offering into the same offering for one image: its pod's node affinity
gains ``Gt``/``Lt`` requirements on those labels (so the scheduler, and the counts, see only
nodes that can run the image; a node without the labels cannot), and a DRA offering's claim
gains CEL selectors (``compareTo(semver(...)) >= 0``). Node affinity is read when a pod is
scheduled, so during a rolling driver upgrade a pod lands only on a node whose labels already
say the new driver.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

from gpuspawner.core.model import Availability, Offering
from gpuspawner.names import dranames as dn
from gpuspawner.names.nvidia import (
    COMPUTE_LABELS,
    CUDA_VERSION_FULL_LABEL,
    CUDA_VERSION_LABELS,
    DRIVER_VERSION_FULL_LABEL,
    DRIVER_VERSION_LABELS,
)
from gpuspawner.names.selectors import GT, LT, Req, Terms, all_of, and_terms, any_of

SETTING = "c.GPUSpawner.image_requirements"

Version = tuple[int, ...]


@dataclass(frozen=True)
class Need:
    """One thing an image may need: its name in the config, its words, its GFD labels, its DRA attribute."""

    key: str
    words: str
    labels: tuple[str, ...]
    full_label: str
    attribute: str


DRIVER = Need("min_driver", "driver", DRIVER_VERSION_LABELS, DRIVER_VERSION_FULL_LABEL, dn.ATTR_DRIVER_VERSION)
CUDA = Need("min_cuda", "CUDA", CUDA_VERSION_LABELS, CUDA_VERSION_FULL_LABEL, dn.ATTR_CUDA_DRIVER_VERSION)
COMPUTE = Need("min_compute", "compute capability", COMPUTE_LABELS, "", dn.ATTR_COMPUTE_CAPABILITY)
NEEDS = (DRIVER, CUDA, COMPUTE)
#: ``NVIDIA_REQUIRE_CUDA``'s constraint names -> ours.
_REQUIRE_NAMES = {"driver": DRIVER, "cuda": CUDA, "arch": COMPUTE}
_VERSION = re.compile(r"^\d{1,6}(\.\d{1,6}){0,2}$")


@dataclass(frozen=True)
class ImageNeeds:
    """What one image needs: the least version of each :data:`NEEDS` (absent: anything)."""

    minimum: tuple[tuple[Need, Version], ...] = ()
    pattern: str = ""  #: the image_requirements pattern it came from

    def __bool__(self) -> bool:
        return bool(self.minimum)

    def words(self) -> str:
        """ "driver >= 570 and CUDA >= 12.8" """
        return " and ".join(f"{need.words} >= {_text(version)}" for need, version in self.minimum)


class ImageNeedsError(ValueError):
    """A wrong image_requirements entry; the message names it."""


def _text(version: Version) -> str:
    return ".".join(str(p) for p in version)


def _version(value: Any, need: Need, where: str) -> Version:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not _VERSION.match(str(value).strip()):
        raise ImageNeedsError(
            f"{where}: {need.key} must be a version written as text, such as '570', '570.86' or '12.8', got {value!r}"
            + (" (a float loses digits: 12.10 reads as 12.1)" if isinstance(value, float) else "")
        )
    version = tuple(int(p) for p in str(value).strip().split("."))
    most = len(need.labels)
    if len(version) > most:
        raise ImageNeedsError(f"{where}: {need.key} has at most {most} parts ({'.'.join(['N'] * most)}), got {value!r}")
    return version


def parse_needs(value: Any, where: str) -> ImageNeeds:
    """One entry: a dict (``min_driver``, ``min_cuda``, ``min_compute``, each optional) or an
    ``NVIDIA_REQUIRE_CUDA`` string. Raises :class:`ImageNeedsError` naming ``where``.

    Of an ``NVIDIA_REQUIRE_CUDA`` string (constraints separated by spaces are alternatives, by
    commas all required) only the first alternative is read: ``cuda>=``, ``driver>=`` and
    ``arch>=``. The later ones (``brand=tesla,driver>=470,driver<471``: CUDA's forward
    compatibility on data-centre GPUs) are left out: an image is then offered only where the
    driver supports its CUDA version itself, the reading that is right on every GPU.
    """
    if isinstance(value, str):
        return _from_require(value, where)
    if not isinstance(value, Mapping):
        raise ImageNeedsError(
            f"{where} must be a dict such as {{'min_driver': '570', 'min_cuda': '12.8', 'min_compute': '8.0'}}"
            f" or an NVIDIA_REQUIRE_CUDA string such as 'cuda>=12.8', got {value!r}"
        )
    unknown = sorted(str(k) for k in value if k not in {n.key for n in NEEDS})
    if unknown:
        raise ImageNeedsError(f"{where}: unknown key(s) {', '.join(unknown)}; use min_driver, min_cuda, min_compute")
    return ImageNeeds(tuple((need, _version(value[need.key], need, where)) for need in NEEDS if value.get(need.key) is not None))


def _from_require(text: str, where: str) -> ImageNeeds:
    body = text.strip().removeprefix("NVIDIA_REQUIRE_CUDA=").strip().strip("\"'")
    first = body.split()[0] if body.split() else ""
    found: dict[str, Version] = {}
    for constraint in filter(None, first.split(",")):
        match = re.match(r"^(cuda|driver|arch)>=(.+)$", constraint)
        if not match:
            raise ImageNeedsError(
                f"{where}: {constraint!r} is not read; the first alternative of an NVIDIA_REQUIRE_CUDA string may hold"
                " cuda>=, driver>= and arch>= (e.g. 'cuda>=12.8'), or write a dict with min_driver, min_cuda, min_compute"
            )
        need = _REQUIRE_NAMES[match.group(1)]
        found[need.key] = _version(match.group(2), need, where)
    if not found:
        raise ImageNeedsError(f"{where}: an NVIDIA_REQUIRE_CUDA string such as 'cuda>=12.8' is empty, got {text!r}")
    return ImageNeeds(tuple((need, found[need.key]) for need in NEEDS if need.key in found))


def parse_rules(raw: Any) -> tuple[ImageNeeds, ...]:
    """``c.GPUSpawner.image_requirements`` (pattern -> entry), in its order. Raises
    :class:`ImageNeedsError` listing every wrong entry."""
    if not isinstance(raw, Mapping):
        raise ImageNeedsError(f"{SETTING} must be a dict of image pattern -> requirement, got {raw!r}")
    rules, problems = [], []
    for pattern, value in raw.items():
        where = f"{SETTING}[{pattern!r}]"
        if not isinstance(pattern, str) or not pattern.strip():
            problems.append(f"{where}: the key must be an image or a glob pattern such as 'quay.io/jupyter/pytorch-notebook:cuda12-*'")
            continue
        try:
            rules.append(replace(parse_needs(value, where), pattern=pattern))
        except ImageNeedsError as exc:
            problems.append(str(exc))
    if problems:
        raise ImageNeedsError("; ".join(problems))
    return tuple(rules)


def needs_for(image: str, rules: Iterable[ImageNeeds]) -> ImageNeeds:
    """What ``image`` needs: the first rule whose pattern matches it (glob, ``*`` crosses ``/``);
    nothing where none does (an empty entry says so for a pattern before a broader one)."""
    for rule in rules:
        if fnmatchcase(image, rule.pattern):
            return rule
    return ImageNeeds()


# ----------------------------------------------------------------------------- nodes


def _equal(label: str, value: int) -> tuple[Req, ...]:
    """``label == value`` as integers (``Gt value-1`` and ``Lt value+1``: "06" equals 6)."""
    return (Req(label, GT, (str(value - 1),)), Req(label, LT, (str(value + 1),)))


def _at_least(labels: Sequence[str], version: Version) -> Terms:
    """Nodes whose integer labels, read as one version, are at least ``version`` (only its parts count;
    trailing zeros ask for nothing: ``8.0`` is ``major > 7``)."""
    while len(version) > 1 and version[-1] == 0:
        version = version[:-1]
    head, rest = version[0], version[1:]
    if not rest:
        return all_of(Req(labels[0], GT, (str(head - 1),)))
    return any_of(all_of(Req(labels[0], GT, (str(head),))), and_terms(all_of(*_equal(labels[0], head)), _at_least(labels[1:], rest)))


def need_terms(need: Need, version: Version) -> Terms:
    return _at_least(need.labels, version)


def node_terms(needs: ImageNeeds) -> Terms:
    """Required node-affinity terms that hold on exactly the nodes whose GFD labels meet ``needs``."""
    return and_terms(*(need_terms(need, version) for need, version in needs.minimum))


def node_has(need: Need, labels: Mapping[str, str]) -> str | None:
    """What a node's labels say of ``need`` ("570.124.06"), or None where they do not say."""
    if need.full_label and labels.get(need.full_label):
        return labels[need.full_label]
    parts = [labels.get(label) for label in need.labels[:2]]
    return ".".join(p for p in parts if p) if parts[0] else None


# ----------------------------------------------------------------------------- DRA devices


def device_selectors(needs: ImageNeeds) -> tuple[str, ...]:
    """CEL selectors that hold on exactly the NVIDIA DRA devices that meet ``needs`` (version attributes
    are semantic versions: ``12.8`` is ``12.8.0``)."""
    out = []
    for need, version in needs.minimum:
        semver = ".".join(str(p) for p in (*version, 0, 0)[:3])
        out.append(f"device.attributes['{dn.DRIVER}'].{need.attribute}.compareTo(semver('{semver}')) >= 0")
    return tuple(out)


# ----------------------------------------------------------------------------- offerings


def fitted(offering: Offering, needs: ImageNeeds) -> Offering:
    """``offering`` for an image that needs ``needs``: the same choice, on fitting nodes or devices only."""
    if not needs or not offering.takes_units:
        return offering
    if offering.claim is not None:
        extra = device_selectors(needs)
        alternatives = tuple(replace(a, selectors=a.selectors + extra) for a in offering.claim.alternatives)  # each choice must fit
        claim = replace(offering.claim, selectors=offering.claim.selectors + extra, alternatives=alternatives)
        return replace(offering, claim=claim)
    return replace(offering, node_affinity=and_terms(offering.node_affinity, node_terms(needs)))


def misfit(needs: ImageNeeds, offering: Offering, base: Availability, fit: Availability, has: Sequence[Mapping[str, str | None]]) -> str:
    """Why no node (or device) of ``offering`` can run the image ("" where one can, or where it is not known).

    ``base`` and ``fit``: the offering's counts without and with the image's needs; ``has``: what
    each of its nodes (devices) has, per need key (:func:`node_has`). Only an offering that has
    nodes, none of which fits, is refused: one without nodes is "none free" as before.
    """
    if not needs or not base.counted or not fit.counted or not base.capacity or fit.capacity:
        return ""
    where = "these GPUs have" if offering.claim is not None else "these nodes have"
    short: list[tuple[Need, Version, str]] = []
    for need, version in needs.minimum:
        values = sorted({h.get(need.key) or "" for h in has}, key=_sort_key)
        if values and all(v and _meets(v, version) for v in values):
            continue  # every node meets this one: another need is what fails
        shown = [v or f"no {need.words} label" for v in values] or ["nothing known"]
        short.append((need, version, " and ".join(shown)))
    if not short:  # e.g. the needs are met one by one but never on one node
        return f"needs {needs.words()}; no node has all of them"
    if len(short) == 1:
        need, version, text = short[0]
        return f"needs {need.words} >= {_text(version)}; {where} {text}"
    wanted = " and ".join(f"{n.words} >= {_text(v)}" for n, v, _ in short)
    found = ", ".join(f"{n.words} {values}" for n, _, values in short)
    return f"needs {wanted}; {where} {found}"


def _numbers(text: str) -> Version:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def _meets(value: str, version: Version) -> bool:
    numbers = _numbers(value)
    return bool(numbers) and numbers[: len(version)] >= version


def _sort_key(value: str) -> tuple[int, Version]:
    return (0, _numbers(value)) if value else (1, ())
