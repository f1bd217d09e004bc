"""NVIDIA's GPU products as the spawn page names them, and their memory: one figure per GPU
and per MIG profile, from one source. Pure.

Every offering's ``memory_mib`` comes from :func:`gpu_memory_mib`, whichever way the GPU was
found (GPU Feature Discovery's node labels, a DRA ResourceSlice, the admin's config), so two
cards for the same GPU or MIG profile never show two figures. Its order of sources:

1. What the node measured: GPU Feature Discovery's memory label (``nvidia.com/gpu.memory`` for a
   whole GPU, or for a MIG device under the ``single`` strategy; ``nvidia.com/mig-<profile>.memory``
   under ``mixed``; MiB, NVML's ``MemorySizeMB`` for MIG devices: GFD's ``internal/lm/resource.go``
   and ``internal/resource/nvml-mig-device.go`` in github.com/NVIDIA/k8s-device-plugin), or a DRA
   device's ``memory`` capacity (the same NVML figure; NVIDIA's DRA driver publishes
   ``memory: 4864Mi`` for an A100-40GB's 1g.5gb, its ``resourceslice-attributes.md``).
2. For a MIG profile, NVIDIA's table of the profile's memory on that GPU (:data:`MIG_PROFILE_MIB`).
3. For a whole GPU, the memory its product name says ("NVIDIA-A100-SXM4-40GB", "H100 80GB HBM3").

Never the rounded number in a MIG profile's name: a 1g.5gb slice has 4864 MiB (4.75 GiB), not 5 GiB.
"""

from __future__ import annotations

import re

#: GKE's accelerator labels, which name no memory where the GPU has one size only.
_CLOUD_ACCELERATORS = {
    "nvidia-tesla-a100": "A100 40GB",
    "nvidia-a100-80gb": "A100 80GB",
    "nvidia-h100-80gb": "H100 80GB",
    "nvidia-h100-mega-80gb": "H100 Mega 80GB",
    "nvidia-tesla-t4": "Tesla T4",
    "nvidia-l4": "L4",
}
_FORM_FACTORS = {"SXM", "SXM2", "SXM4", "SXM5", "PCIE", "HBM2", "HBM2E", "HBM3", "HBM3E", "NVL", "GRID"}

#: MIG profile -> its memory in MiB, by GPU (as :func:`product_name` names it), from NVIDIA's
#: Multi-Instance GPU User Guide ("List GPU Instance Profiles": ``nvidia-smi mig -lgip``, in GiB
#: with two decimals; a GPU instance's memory is a whole number of 128 MiB pages, which fixes
#: the MiB each decimal stands for):
#:
#: * A100 40GB (SXM4 and PCIe): 1g.5gb 4.75 GiB, 1g.10gb and 2g.10gb 9.62, 3g.20gb and 4g.20gb
#:   19.50, 7g.40gb 39.25. The same MiB are NVML's ``MemorySizeMB`` in NVIDIA's go-nvml A100
#:   model (``pkg/nvml/mock/shared/gpus/a100.go``: 4864, 9856, 19968, 40192), and 4864Mi is what
#:   NVIDIA's DRA driver documents for a 1g.5gb device.
#: * H100 80GB: 1g.10gb 9.75 GiB, 1g.20gb and 2g.20gb 19.62, 3g.40gb and 4g.40gb 39.50, 7g.80gb
#:   79.25 (``nvidia-smi mig -lgip`` on an H100 80GB HBM3).
#:
#: A profile's ``+me`` (media extensions) or ``-me`` variant has its base profile's memory; a
#: compute-instance profile (``1c.3g.20gb``) its GPU instance's. Profiles of GPUs not listed have
#: no figure here (the node's label gives it where GFD runs).
MIG_PROFILE_MIB: dict[str, dict[str, int]] = {
    "A100 40GB": {"1g.5gb": 4864, "1g.10gb": 9856, "2g.10gb": 9856, "3g.20gb": 19968, "4g.20gb": 19968, "7g.40gb": 40192},
    "H100 80GB": {"1g.10gb": 9984, "1g.20gb": 20096, "2g.20gb": 20096, "3g.40gb": 40448, "4g.40gb": 40448, "7g.80gb": 81152},
}

_PROFILE = re.compile(r"^(?:\d+c\.)?(?P<gi>\d+g\.\d+gb)(?:[+-]me(?:\.all)?|\+gfx)?$")
_MEMORY_IN_NAME = re.compile(r"(?<![\w.])(?P<gb>\d{1,4})\s?GB\b", re.IGNORECASE)


def product_name(product: str) -> str:
    """``NVIDIA-A100-SXM4-40GB`` -> ``A100 40GB``; ``Tesla-T4-SHARED`` -> ``Tesla T4``; ``nvidia-a10g`` -> ``A10G``.

    Also NVML's own spelling, as DRA devices carry it: ``NVIDIA H100 80GB HBM3`` -> ``H100 80GB``."""
    if product in _CLOUD_ACCELERATORS:
        return _CLOUD_ACCELERATORS[product]
    words = product.replace("_", "-").replace(" ", "-").split("-")
    if words and words[0].upper() == "NVIDIA":
        words = words[1:]
    if "MIG" in words:
        words = words[: words.index("MIG")]
    kept = [w for w in words if w and w.upper() not in _FORM_FACTORS and w.upper() != "SHARED"]
    if product == product.lower():  # a cloud's accelerator label: nvidia-tesla-v100 -> Tesla V100
        kept = [w.upper() if any(c.isdigit() for c in w) else w.capitalize() for w in kept]
    return " ".join(kept) or product


def product_memory_mib(product: str | None) -> int | None:
    """The memory a whole GPU's product name says, in MiB (GiB as NVIDIA counts): ``NVIDIA-A100-SXM4-40GB``,
    ``A100 40GB PCIe`` and GKE's ``nvidia-tesla-a100`` -> 40960; None where the name says none
    (``Tesla-T4``). A MIG product (``A100-SXM4-40GB-MIG-1g.5gb``) says its GPU's, not the slice's."""
    if not product:
        return None
    match = _MEMORY_IN_NAME.search(product_name(product))
    return int(match.group("gb")) * 1024 if match else None


def mig_profile_mib(product: str | None, profile: str) -> int | None:
    """A MIG profile's memory on ``product`` from :data:`MIG_PROFILE_MIB`, in MiB; without a known
    product, the figure where every GPU listed with that profile agrees on it (1g.5gb: only the
    A100 40GB has it), else None (1g.10gb is 9856 MiB on an A100 40GB, 9984 on an H100)."""
    match = _PROFILE.match(profile)
    if match is None:
        return None
    gi = match.group("gi")
    if product:
        known = MIG_PROFILE_MIB.get(product_name(product))
        if known is not None:
            return known.get(gi)
    figures = {table[gi] for table in MIG_PROFILE_MIB.values() if gi in table}
    return figures.pop() if len(figures) == 1 else None


def gpu_memory_mib(product: str | None = None, profile: str | None = None, measured_mib: int | None = None) -> int | None:
    """THE memory figure of one GPU or one MIG device, in MiB (None where nothing says it).

    ``measured_mib``: what the node says of this very device (GFD's memory label, a DRA device's
    ``memory`` capacity), used as it is; else, with a MIG ``profile``, NVIDIA's table for it on
    ``product`` (:func:`mig_profile_mib`); else the memory ``product``'s name says
    (:func:`product_memory_mib`). Every offering kind takes its ``memory_mib`` from here: a
    share of a GPU (time-slicing, MPS, an amount of a consumable-capacity device) divides or
    takes from this figure, never from a number of its own."""
    if measured_mib is not None and measured_mib > 0:
        return measured_mib
    if profile:
        return mig_profile_mib(product, profile)
    return product_memory_mib(product)
