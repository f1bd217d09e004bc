"""What the user is told about an offering: the spawn page's words. Pure.

Kept apart from the model so that rewording the page touches one file, and so that
the words of docs/config.md and the page stay side by side.
"""

from __future__ import annotations

from gpuspawner.names.vocabulary import Isolation, Kind

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
    # co-tenants of a GPU: NVML lists every process on it to everyone, and time-slicing
    # isolates neither memory nor faults (docs/memory-guard.md, "Confidentiality between co-tenants of a shared GPU")
    Isolation.PARTIAL: (
        "partly isolated: own memory limit, shared compute (MPS); other users of this GPU see your GPU processes"
        " -- not for confidential work"
    ),
    Isolation.NONE: (
        "no isolation: shares memory and compute with other users; they see your GPU processes, and one"
        " user's GPU fault or memory overrun stops everyone's work -- not for confidential work"
    ),
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
    """``20480`` -> "20 GB GPU memory", ``4864`` -> "4.8 GB GPU memory" (the figure as :func:`gb`
    writes it, the spawn page's too); "" when not known."""
    if memory_mib is None:
        return ""
    return f"{gb(memory_mib)} GPU memory"


def gb(mib: int) -> str:
    """``16384`` -> "16 GB", ``3840`` -> "3.8 GB", ``512`` -> "512 MiB" (GPU memory, in GiB as NVIDIA counts)."""
    gib = mib / 1024
    if gib < 1:
        return f"{mib} MiB"
    if gib >= 10 or gib == int(gib):
        return f"{gib:.0f} GB"
    return f"{gib:.1f} GB"


def memory_truth(kind: Kind, memory_mib: int | None, sharing: str = "", replicas: int | None = None, gpu: str = "") -> str:
    """What the GPU memory of an offering really is, and what enforces it ("" when not known).

    A time-sliced share: "about 4 GB of this Tesla T4's 16 GB, not enforced; other users share
    this GPU" (nothing splits the memory; the memory guard only asks the frameworks to keep
    to the share). An MPS share: its client limit, which the MPS server enforces. A MIG slice:
    "MIG: 10 GB, enforced by the hardware". A GPU-memory share (a DRA claim's
    ``capacity.requests.memory``): "8 GB of this L40S's memory, set aside by the scheduler but not
    enforced on the GPU". Other kinds: their memory as it is.
    """
    if memory_mib is None:
        return ""
    this = f"this {gpu}'s" if gpu else "this GPU's"
    if kind is Kind.SHARED and sharing == "memory":
        return f"{gb(memory_mib)} of {this} memory, set aside by the scheduler but not enforced on the GPU; other users share it"
    if kind is Kind.SHARED and sharing == "mps":
        whole = f" of {this} {gb(memory_mib * replicas)}" if replicas else ""
        return f"{gb(memory_mib)}{whole}, enforced by MPS; other users share its compute"
    if kind is Kind.SHARED:
        if replicas:
            return f"about {gb(memory_mib // replicas)} of {this} {gb(memory_mib)}, not enforced; other users share this GPU"
        return f"{gb(memory_mib)} GPU memory shared with other users, not enforced"
    if kind is Kind.MIG:
        return f"MIG: {gb(memory_mib)}, enforced by the hardware"
    if kind is Kind.VGPU:
        return f"{gb(memory_mib)} GPU memory, enforced by the vGPU"
    return memory_phrase(memory_mib)


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


def turn_words(name: str, position: int, seconds: float) -> str:
    """What a spawn waiting in the queue is told of the culler's plan to make room:
    "An idle MIG 1g.10gb will be reclaimed for you in about 2 minutes." (``seconds`` from
    now; ``position`` in the queue, the first being told it is theirs)."""
    when = "now" if seconds <= 0 else "in about a minute" if seconds < 90 else f"in about {round(seconds / 60)} minutes"
    if position == 1:
        return f"An idle {name} will be reclaimed for you {when}."
    return f"An idle {name} will be reclaimed {when}; you are number {position} in the queue."


def queue_words(queue: str, allowed: int, node_free: int, borrowed: int = 0, cohort: str = "") -> str:
    """Where a Kueue queue's quota, not the nodes, limits an offering (docs/kueue.md): "2 free on
    the nodes; your queue 'ml-course' allows 1 more" (or "allows none more"), and where some of
    that is borrowed from the queue's cohort, "allows 2 more (1 by borrowing from cohort
    'research')". The spawn page's badge and a refused spawn's reason say it in these words."""
    nodes = f"{node_free} free on the nodes" if node_free else "none free on the nodes"
    more = f"allows {allowed} more" if allowed else "allows none more"
    borrowed = min(borrowed, allowed)
    if borrowed:
        how = f"by borrowing from cohort '{cohort}'" if cohort else "by borrowing from its cohort"
        more += f" {how}" if borrowed == allowed else f" ({borrowed} {how})"
    return f"{nodes}; your queue '{queue}' {more}"


#: What the spawn page adds to the nodes' free count where the queue's quota cannot be read.
QUEUE_UNKNOWN = "your queue's limit is unknown"
