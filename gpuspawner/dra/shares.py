"""GPU-memory shares: NVIDIA GPUs that several claims share by amount of memory -> offerings. Pure.

NVIDIA's DRA driver with ``--consumable-shares`` (its ConsumableShares feature, alpha in
driver 0.5) publishes a GPU with ``allowMultipleAllocations: true`` and a ``memory`` capacity
whose request policy takes 1Mi steps; a claim asks ``capacity.requests.memory: 8Gi`` and
the scheduler allots the GPU to claims until their amounts fill its memory
(:mod:`gpuspawner.dra.capacity`). Each product becomes a few offerings by amount ("8 GB of
an L40S"). Nothing on the GPU holds a user to the amount (no MIG, no MPS limit: the driver
refuses MPS with consumable shares): the page says so, as for time-slicing, and the memory
guard asks the frameworks to keep to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from gpuspawner.core.model import DEFAULT_GPU_TOLERATION, DeviceClaim, Offering
from gpuspawner.core.quantity import parse_quantity
from gpuspawner.dra.capacity import consumption
from gpuspawner.dra.slices import Device
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import Isolation, Kind
from gpuspawner.offerings.discovery import product_name

#: The amounts offered of each shared GPU (GiB), those at most half its memory.
AMOUNTS_GIB = (4, 8, 16)
MIB = 1024 * 1024
#: ``Offering.sharing`` of a memory share.
MEMORY_SHARE = "memory"


def _slug(*parts: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")[:63].rstrip("-")


def _article(name: str) -> str:
    return "an" if name[:1].upper() in "AEFHILMNORSX8" else "a"


def is_share_gpu(device: Device) -> bool:
    """A whole NVIDIA GPU that claims share by memory (``allowMultipleAllocations`` and a memory capacity)."""
    return device.multiple and device.attribute(dn.ATTR_TYPE) == dn.TYPE_GPU and device.quantity(dn.CAP_MEMORY) is not None


def share_offering(product: str, gib: int, device_mib: int | None) -> Offering:
    """The offering of ``gib`` GiB of a shared ``product`` GPU."""
    name = product_name(product.replace(" ", "-"))
    return Offering(
        slug=_slug("dra", "share", name, f"{gib}gb"),
        kind=Kind.SHARED,
        display_name=f"{gib} GB of {_article(name)} {name}",
        description=(
            f"{gib} GB of an {name}'s memory, set aside for you by the scheduler; its compute is shared with the "
            "other users on the GPU. Nothing on the GPU enforces the amount: keep to it."
        ),
        tolerations=(dict(DEFAULT_GPU_TOLERATION),),
        claim=DeviceClaim(
            dn.CLASS_GPU,
            (f"device.attributes['{dn.DRIVER}'].{dn.ATTR_PRODUCT} == '{product}'",),
            capacity={dn.CAP_MEMORY: f"{gib}Gi"},
        ),
        product=product,
        memory_mib=gib * 1024,
        device_memory_mib=device_mib,
        compute_share="shared with the other users of the GPU",
        isolation=Isolation.NONE,
        sharing=MEMORY_SHARE,
        source="dra",
    )


def share_offerings(devices: Iterable[Device]) -> list[Offering]:
    """Offerings by amount for each product among ``devices`` that claims share by memory:
    the amounts of :data:`AMOUNTS_GIB` at most half a GPU's memory that its request policy takes."""
    best: dict[str, Device] = {}
    for device in devices:
        product = device.attribute(dn.ATTR_PRODUCT)
        if device.driver == dn.DRIVER and isinstance(product, str) and is_share_gpu(device):
            best.setdefault(product, device)
    out = []
    for product, device in sorted(best.items()):
        mib = int(parse_quantity(device.quantity(dn.CAP_MEMORY)) // MIB)
        for gib in AMOUNTS_GIB:
            if mib and gib * 1024 * 2 <= mib and consumption({dn.CAP_MEMORY: f"{gib}Gi"}, device.capacity) is not None:
                out.append(share_offering(product, gib, mib))
    return out


def sized(offering: Offering, devices: Iterable[Device]) -> Offering:
    """An admin's memory share (``dra.memory``) with the memory of the GPUs its claim selects
    (``devices``, the smallest where they differ), so that the memory guard is sized from the
    share of it; any other offering as it is."""
    if offering.sharing != MEMORY_SHARE or offering.device_memory_mib is not None:
        return offering
    sizes = [int(parse_quantity(q) // MIB) for q in (d.quantity(dn.CAP_MEMORY) for d in devices) if q is not None]
    return replace(offering, device_memory_mib=min(sizes)) if sizes else offering
