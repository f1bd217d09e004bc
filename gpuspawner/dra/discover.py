"""NVIDIA's DRA devices -> offerings, grouped the way users choose. Pure.

NVIDIA's devices (driver ``gpu.nvidia.com``, :mod:`gpuspawner.names.dranames`) become
offerings: whole GPUs by product and memory (with counts up to the most one node has), MIG
devices by product and profile. Each asks for its devices with CEL selectors on the driver's
own attributes (:func:`attribute_equals`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from gpuspawner.core.model import DEFAULT_GPU_TOLERATION, DeviceClaim, Offering
from gpuspawner.core.nodeclass import mig_profile_parts
from gpuspawner.core.products import gpu_memory_mib, product_name
from gpuspawner.core.quantity import QuantityError, parse_quantity
from gpuspawner.core.wording import mig_compute_phrase
from gpuspawner.dra.shares import is_share_gpu, share_offerings
from gpuspawner.dra.slices import Device
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import Isolation, Kind

MIB = 1024 * 1024


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def attribute_equals(attribute: str, value: str) -> str:
    """A CEL selector: the driver's ``attribute`` equals ``value``."""
    return f"device.attributes[{_cel_string(dn.DRIVER)}].{attribute} == {_cel_string(value)}"


def _slug(*parts: str) -> str:
    text = re.sub(r"[^a-z0-9]+", "-", "-".join(p for p in parts if p).lower()).strip("-")
    return text[:63].rstrip("-")


def _display(product: str) -> str:
    return product_name(product)


def _gpu_offering(product: str, memory: str | None, most: int) -> Offering:
    selectors = [attribute_equals(dn.ATTR_PRODUCT, product)]
    if memory is not None:
        selectors.append(f"device.capacity[{_cel_string(dn.DRIVER)}].{dn.CAP_MEMORY}.compareTo(quantity({_cel_string(memory)})) == 0")
    name = _display(product)
    return Offering(
        slug=_slug("dra", "gpu", name),
        kind=Kind.FULL,
        display_name=name,
        description=f"Whole {name} GPUs, not shared with anyone (allocated through Dynamic Resource Allocation).",
        counts=tuple(c for c in (1, 2, 4, 8, 16) if c <= most) or (1,),
        tolerations=(dict(DEFAULT_GPU_TOLERATION),),
        claim=DeviceClaim(dn.CLASS_GPU, tuple(selectors), match_attributes=(dn.qualified(dn.ATTR_PRODUCT),)),
        product=product,
        memory_mib=gpu_memory_mib(product, measured_mib=_mib(memory)),
        compute_share="all of its compute",
        isolation=Isolation.EXCLUSIVE,
        source="dra",
    )


#: Said of a MIG profile some of whose devices the driver makes on demand (partitionable devices).
DYNAMIC_MIG_WORDS = " Made when your server starts, from what the GPU has left: each slice taken leaves less room for the others."


def _mig_offering(product: str, profile: str, memory: str | None, dynamic: bool = False) -> Offering:
    name = _display(product)
    parts = mig_profile_parts(profile)
    return Offering(
        slug=_slug("dra", "mig", name, profile),
        kind=Kind.MIG,
        display_name=f"{name} · MIG {profile}",
        description=f"A MIG slice {profile} of an {name}: its own memory and compute, isolated in hardware."
        + (DYNAMIC_MIG_WORDS if dynamic else ""),
        tolerations=(dict(DEFAULT_GPU_TOLERATION),),
        claim=DeviceClaim(dn.CLASS_MIG, (attribute_equals(dn.ATTR_PRODUCT, product), attribute_equals(dn.ATTR_PROFILE, profile))),
        product=product,
        memory_mib=gpu_memory_mib(product, profile, _mib(memory)),
        compute_share=mig_compute_phrase(parts[0]) if parts else "a MIG slice",
        isolation=Isolation.HARDWARE,
        source="dra",
    )


def _mib(quantity: str | None) -> int | None:
    try:
        return int(parse_quantity(quantity) // MIB) if quantity is not None else None
    except QuantityError:
        return None


def discover(devices: Iterable[Device]) -> list[Offering]:
    """NVIDIA's whole GPUs and MIG devices among ``devices`` as offerings: whole GPUs by product and
    memory (counts up to the most one node has), MIG devices by product and profile."""
    devices = list(devices)
    gpus: dict[tuple[str, str | None], Counter[str | None]] = {}
    migs: dict[tuple[str, str], str | None] = {}
    dynamic: set[tuple[str, str]] = set()  # profiles with partitionable devices (dynamic MIG)
    for device in devices:
        if device.driver != dn.DRIVER or is_share_gpu(device):
            continue  # a GPU shared by memory is offered by amount (shares.share_offerings)
        kind, product = device.attribute(dn.ATTR_TYPE), device.attribute(dn.ATTR_PRODUCT)
        if not isinstance(product, str):
            continue
        if kind == dn.TYPE_GPU:
            gpus.setdefault((product, device.quantity(dn.CAP_MEMORY)), Counter())[device.node] += 1
        elif kind == dn.TYPE_MIG and isinstance(profile := device.attribute(dn.ATTR_PROFILE), str):
            migs.setdefault((product, profile), device.quantity(dn.CAP_MEMORY))
            if device.shared_counters:
                dynamic.add((product, profile))
    out = [_gpu_offering(product, memory, max(per_node.values())) for (product, memory), per_node in gpus.items()]
    out += [_mig_offering(product, profile, memory, (product, profile) in dynamic) for (product, profile), memory in migs.items()]
    out += share_offerings(devices)
    seen: set[str] = set()
    unique = []
    for offering in sorted(out, key=lambda o: (o.kind is not Kind.MIG, o.memory_mib or 0, o.slug)):
        if offering.slug in seen:  # same product name, other memory: keep both apart
            offering = replace(offering, slug=_slug(offering.slug, str(offering.memory_mib)))
        seen.add(offering.slug)
        unique.append(offering)
    return unique
