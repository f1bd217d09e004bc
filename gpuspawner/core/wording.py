"""What the user is told about an offering: the spawn page's words. Pure.

Kept apart from the model so that rewording the page touches one file, and so that
the words of docs/config.md and the page stay side by side: an offering's heading, memory,
isolation and share; its badge and why it cannot be chosen; the notice above the choices while
the free counts are not live; and the refusals a spawn gets (admission, quotas, time windows,
the queue, the cluster unreachable or slow, a pod name taken, an image the nodes cannot run, a
choice not understood). The modules that decide call these with plain values, so this module
imports nothing of gpuspawner but ``names``. A server's own story (a start's progress, Kueue's
holds and stops, the home page's notices) is :mod:`gpuspawner.core.noticewords`'.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

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


# -- An offering's badge and why it cannot be chosen (page.cards) ------------------------------

#: The badge of an offering whose free units cannot be counted (the hub may not read the cluster).
FREE_COUNT_UNAVAILABLE = "free count unavailable"
#: The badge of an offering with nothing free, and why it cannot be chosen.
NONE_FREE = "none free"
NONE_FREE_NOW = "none free right now"
#: The badges of an offering with nothing free that the start would wait for (warn, queue).
NONE_FREE_WAIT = "none free: your server would wait"
NONE_FREE_FIRST = "none free: you would be first in the queue"
#: Why an offering the user's groups may not use cannot be chosen.
NOT_ALLOWED = "not allowed for your groups"
#: The badge of an offering none of whose nodes can run the form's image.
NOT_FOR_IMAGE = "not for this image"
#: Why an offering cannot be chosen: over the user's (or a group's) quota, over the GPU-hour budget.
OVER_QUOTA = "over your quota"
OVER_BUDGET = "over your GPU-hour budget"
OVER_COST_BUDGET = "over your cost budget"


def free_words(free: int, capacity: int | None, queue_unknown: bool = False) -> str:
    """ "3 of 8 free" (and "3 of 8 free on the nodes; your queue's limit is unknown")."""
    return f"{free} of {capacity} free" + (f" on the nodes; {QUEUE_UNKNOWN}" if queue_unknown else "")


def queue_wait_words(queue_text: str) -> str:
    """The badge where Kueue would hold the server until its queue's quota allows it."""
    return f"{queue_text}: your server would wait"


def queue_full_words(queue: str) -> str:
    """Why an offering cannot be chosen while its Kueue queue allows no more."""
    return f"your queue '{queue}' allows none more right now"


def scale_up_words(minutes: int) -> str:
    """The badge of an offering with nothing free now whose pool can grow: "a new node starts for you, about 5 min"."""
    return f"a new node starts for you, about {minutes} min"


#: Why an offering of an autoscaled pool that may add no node (``limits.nodes`` reached) cannot be chosen now.
POOL_AT_LIMIT = "the pool is at its limit"
#: Its badge.
POOL_AT_LIMIT_BADGE = f"none free, {POOL_AT_LIMIT}"


def pool_size_words(limit: int | None, name: str) -> str:
    """What a card says of the autoscaled pools behind an offering: "Up to 4 H100 80GB nodes." ("" with no limit)."""
    return "" if limit is None else f"Up to {limit} {name} node{'' if limit == 1 else 's'}."


def price_words(price: float) -> str:
    """An offering's price on its card: "5.00 per hour"."""
    return f"{money_words(price)} per hour"


def money_words(amount: float) -> str:
    """An amount of the site's money (a price, a cost budget, what was spent): "5.00", "1,250.00"."""
    return f"{amount:,.2f}"


def pool_at_limit_refusal(what: str, limit: int | None) -> str:
    """The refusal of a spawn whose pool may add no node while none is free."""
    return f"No {what} is free right now and {POOL_AT_LIMIT} ({limit} node{'' if limit == 1 else 's'}): no new node can start for it."


def queued_words(waiting: int) -> str:
    """The badge of an offering with a wait queue: "queue: 2 waiting"."""
    return f"queue: {waiting} waiting" if waiting else NONE_FREE_FIRST


# -- The spawn page's notice above the choices, and the refusals while the cluster is away -----


class CountsHealth(Protocol):
    """What the words read of the free counts' health (capacity.index.Health)."""

    @property
    def ready(self) -> bool: ...
    @property
    def forbidden(self) -> str: ...
    @property
    def answered(self) -> bool: ...
    @property
    def as_of(self) -> float | None: ...


def age_words(seconds: float) -> str:
    """ "45 s", "12 min", "3 h"."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def counts_notice(health: CountsHealth, now: datetime) -> str:
    """What the spawn page says above the choices when the free counts are not live ("" when they are).

    ``now`` is timezone-aware (the site's zone): the time the counts are from is shown in it,
    with the zone's abbreviation (``c.GPUSpawner.site_timezone``), so no reader takes it for theirs.
    """
    if health.ready or health.forbidden:  # forbidden: each offering says "free count unavailable"
        return ""
    if not health.answered:
        return "Counting free GPUs: the hub is still connecting to the cluster. Reload the page in a moment."
    if health.as_of is None:
        return (
            "The GPU cluster cannot be reached, so the free counts are unknown and no server can start "
            "right now. Please try again in a few minutes."
        )
    as_of = datetime.fromtimestamp(health.as_of, now.tzinfo)
    return (
        f"The GPU cluster cannot be reached: the free counts are as of {as_of:%H:%M:%S %Z} "
        f"({age_words(now.timestamp() - health.as_of)} ago) and may be out of date. No server can start "
        "until the cluster is back; please try again in a few minutes."
    )


def unreachable_message(health: CountsHealth, now: datetime) -> str:
    """Why a spawn is refused while the counts are not live (the 503's message)."""
    if not health.answered:
        return "The hub is still connecting to the GPU cluster, so no server can start yet. Please try again in a few seconds."
    since = ""
    if health.as_of is not None:
        since = f" (since {datetime.fromtimestamp(health.as_of, now.tzinfo):%H:%M:%S %Z}, {age_words(now.timestamp() - health.as_of)} ago)"
    return f"The GPU cluster cannot be reached{since}, so no server can start now. Please try again in a few minutes."


def slow_cluster_message() -> str:
    """Why a spawn is refused when the API server answers, but not the hub's request in time (the 503's message)."""
    return (
        "The cluster is answering too slowly right now: it did not confirm your server's pod in time, "
        "so your server was not started. Please try again in a minute."
    )


def start_timeout_message(start_timeout: float, waiting_for: str) -> str:
    """Why a start ran out of time (``waiting_for``: what it was still waiting for)."""
    return (
        f"Your server did not start within the hub's time limit ({start_timeout:.0f} seconds): {waiting_for}. "
        "Nothing is left running. Please try again; if it happens again, tell the hub's administrators."
    )


#: The message of every refusal for a hub whose GPU settings are wrong (the log says what).
MISCONFIGURED_MESSAGE = "This hub's GPU options are misconfigured; please tell your administrator."


# -- A spawn admitted, queued or refused (capacity.admission, hub.admitting, hub.scheduling) ---


def none_free_queue_words(what: str, queue_text: str) -> str:
    """Where Kueue's quota alone refuses: "No H100 is free now: <queue_words>."."""
    return f"No {what} is free now: {queue_text}."


def none_free_words(what: str, free: int | None, capacity: int | None) -> str:
    """ "No H100 is free (0 of 8 free)."."""
    return f"No {what} is free ({free} of {capacity} free)."


def free_instead_words(instead: str) -> str:
    """What the user may take instead, after a refusal: " Free now: MIG 1g.5gb (2)." ("" for none)."""
    return f" Free now: {instead}." if instead else ""


def scale_up_warning(what: str, minutes: int) -> str:
    """The warning of a spawn that waits for its pool to grow."""
    return f"No {what} is free right now; a new node starts for you, so your server should start in about {minutes} minutes."


def wait_warning(what: str, refusal: str) -> str:
    """The warning of a spawn that starts when a unit is free (``warn``), with what a refusal would say."""
    return f"No {what} is free right now; your server will start when one is. {refusal}"


def queued_message(what: str) -> str:
    """The message of a spawn put in the wait queue (``queue``)."""
    return f"No {what} is free right now: you are in the queue for the next one."


def quota_words(key: str) -> str:
    """What a quota key counts: "GPUs of any kind" (``total``), "MIG slice units"."""
    return "GPUs of any kind" if key == "total" else f"{group_title(key)} units"


def over_user_quota(limit: int, key: str, now: int) -> str:
    """The refusal of a spawn over the user's own quota."""
    return f"Over your quota: you may hold {limit} {quota_words(key)} at once and already hold {now}. Stop one of your other servers first."


def over_group_quota(group: str, limit: int, key: str, now: int) -> str:
    """The refusal of a spawn over the quota of one of the user's groups."""
    return (
        f"Over the quota of your group '{group}': its members may hold {limit} {quota_words(key)} "
        f"together and already hold {now}. Try again later or pick a smaller option."
    )


def window_closed(display_name: str, closed: str) -> str:
    """The refusal of an offering outside its time window (``closed``: core.windows' words)."""
    return f"{display_name} is {closed}."


#: What a refused window or capacity decision adds: what the user can do about it.
PICK_ANOTHER = " Please pick another option."
TAKEN_PICK_AGAIN = " Your choice was taken just now; please pick again."
QUEUE_FULL_ADVICE = " Please pick another option, or try again when a server of your queue has stopped."


def just_taken(display_name: str) -> str:
    """The refusal when the last free unit went to another spawn between count and reservation."""
    return f"The last {display_name} was just taken by another spawn. Please pick again."


def queue_timeout(display_name: str, minutes: int) -> str:
    """The refusal of a spawn that waited in the queue for its whole time."""
    return f"No {display_name} became free within {minutes} minute(s). Please try again later."


def pod_name_taken(where: str, holder: str, hub_id: str) -> str:
    """The refusal when another hub's (or anyone's) pod already has this server's pod name."""
    mine = f"this hub's identity is '{hub_id}'" if hub_id else "this hub has no identity"
    return (
        f"The pod name {where} is taken by {holder} ({mine}), so this server cannot start; that pod is "
        "left alone. Two hubs share this namespace with the same pod names: give each hub its own "
        "c.GPUSpawner.hub_id and GPUSpawner's default pod_name_template (or its own c.KubeSpawner.pod_name_template "
        "or namespace). Please tell the hub's admin."
    )


def image_refusal(display_name: str, image: str, reason: str) -> str:
    """A spawn's refusal: "H100 cannot run quay.io/...: it needs driver >= 570; these nodes have 550.54.15. ..." """
    return f"{display_name} cannot run the image {image}: it {reason}. Choose another GPU or another image, or ask your hub admin."


# -- A choice the hub cannot take (offerings.choice, page.useroptions: 400s) -------------------
# (``shown``: what the user sent, as offerings.choice.shown cuts it for the page)

#: The options of a spawn were not a mapping, or had no count that is a whole number.
OPTIONS_NOT_UNDERSTOOD = "The server options were not understood. Pick one of the options on the spawn page."
COUNT_NOT_WHOLE = "The number of GPUs must be a whole number such as 1 or 2."
NO_CHOICE_NO_DEFAULT = "No GPU option was chosen and this hub has no default. Pick one on the spawn page."


def too_long(keys: str, max_chars: int) -> str:
    """The 400's words for options whose values under ``keys`` (as page.useroptions names them) are over the bound."""
    return f"The value of {keys} is too long (at most {max_chars} characters as JSON). Pick one of the options on the spawn page."


def not_one(name: str, got: int) -> str:
    return f"Please choose exactly one {name} (got {got})."


def count_not_whole(shown: str) -> str:
    return f"The number of GPUs must be a whole number such as 1 or 2, not '{shown}'."


def not_a_choice(shown: str) -> str:
    return f"'{shown}' is not a valid GPU option. Pick one of the options on the spawn page."


def not_offered(shown: str, names: str) -> str:
    """An unknown offering and a forbidden one get these same words (neither is revealed)."""
    return (
        f"The GPU option '{shown}' is not offered to you on this hub (it may have been removed or "
        f"renamed since you last used it). Available: {names or 'none'}."
    )


def count_not_offered(display_name: str, allowed: str, count: int) -> str:
    return f"{display_name} can be taken {allowed} at a time, not {count}."


def profile_not_a_name(slugs: str) -> str:
    return f"The profile must be the name of one profile: {slugs}."


def profile_unknown(shown: str, slugs: str) -> str:
    return f"The profile '{shown}' does not exist on this hub. Profiles: {slugs}."


def unlisted_not_text(title: str, shown: str) -> str:
    return f"The value for {title} must be a short text, not '{shown}'."


def not_a_profile_choice(shown: str, title: str, profile: str, choices: str) -> str:
    return f"'{shown}' is not a choice for {title} in the profile {profile}. Choices: {choices or 'none'}."
