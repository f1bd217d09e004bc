"""What the user is told about an offering: the spawn page's words. Pure.

Kept apart from the model so that rewording the page touches one file, and so that
the words of docs/config.md and the page stay side by side.
"""

from __future__ import annotations

from .vocabulary import Isolation, Kind

#: The spawn page's group headings, by kind.
GROUP_TITLES: dict[Kind, str] = {
    Kind.CPU: "No GPU",
    Kind.SHARED: "Shared GPU",
    Kind.MIG: "MIG slice",
    Kind.FULL: "Whole GPU",
    Kind.VGPU: "vGPU class",
    Kind.CUSTOM: "Site-specific",
}

_ISOLATION_PHRASES: dict[Isolation, str] = {
    Isolation.EXCLUSIVE: "the whole GPU is yours",
    Isolation.HARDWARE: "hardware isolated (own memory and compute)",
    Isolation.PARTIAL: "partly isolated: own memory limit, shared compute (MPS)",
    Isolation.NONE: "no isolation: shares memory and compute with other users",
    Isolation.VM: "VM isolated (vGPU)",
    Isolation.SITE: "as your site's GPU layer provides",
    Isolation.NO_GPU: "no GPU",
}


def group_title(kind: Kind | str) -> str:
    """The heading of ``kind``'s group on the spawn page (an unknown kind is shown as it is)."""
    try:
        return GROUP_TITLES[Kind(kind)]
    except ValueError:
        return str(kind)


def isolation_phrase(isolation: Isolation) -> str:
    """How well the user is protected from neighbours, in the page's words."""
    return _ISOLATION_PHRASES[isolation]


def memory_phrase(memory_mib: int | None) -> str:
    """``20480`` -> "20 GB GPU memory"; "" when not known."""
    if memory_mib is None:
        return ""
    gib = memory_mib / 1024
    return f"{gib:.0f} GB GPU memory" if gib >= 1 else f"{memory_mib} MiB GPU memory"


def share_phrase(replicas: int, sharing: str) -> str:
    """A time-sliced or MPS share's part of the GPU: "1/4 of the GPU (time-sliced)"."""
    how = "MPS share" if sharing == "mps" else "time-sliced"
    return f"1/{replicas} of the GPU ({how})"


def mig_compute_phrase(slices: int) -> str:
    """A MIG slice's part of the GPU's compute: "3/7 of the GPU's compute"."""
    return f"{slices}/7 of the GPU's compute"


def offering_words(memory_mib: int | None, compute_share: str, isolation: Isolation) -> str:
    """The spawn page's line under an offering's name, as one phrase for the notebook's GPU view:
    "10 GB GPU memory · 1/7 of the GPU's compute · hardware isolated" (its parts, once each)."""
    parts = (memory_phrase(memory_mib), compute_share, isolation_phrase(isolation))
    return " · ".join(dict.fromkeys(p for p in parts if p))
