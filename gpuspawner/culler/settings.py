"""The culler's settings: every ``c.GpuCuller.<name>`` option, with its default and help.

:class:`CullerSettings` holds the traits; :class:`gpuspawner.culler.app.GpuCuller` (the
traitlets application, which inherits them) turns them into a running culler. The scopes
the culler's role needs are here too: they are what the admin configures in the hub.
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, validate

from gpuspawner.culler.connections import ConnectionSettings, help_text, positive
from gpuspawner.culler.policy import (
    DEFAULT_GPU_IDLE_LIMIT,
    DEFAULT_GPU_LEASES,
    DEFAULT_KERNEL_SHUTDOWNS_PER_CYCLE,
    DEFAULT_KIND_TIMEOUTS,
    DEFAULT_RECLAIM_KINDS,
    DEFAULT_STALLS_BEFORE_TELEMETRY,
    LEASE_ENDS_RECLAIM,
    LEASE_ENDS_STOP,
)
from gpuspawner.names.vocabulary import GPU_USERS_GROUP, Kind

#: the scopes the culler's role needs, and no more (see docs/culler.md). No
#: ``access:servers``: the culler reaches each server with a token of that
#: server's own user (``tokens``), never with its own.
#: The group of users the culler may mint per-server tokens for (vocabulary.GPU_USERS_GROUP):
#: every user who may run a GPU server, and NEVER an admin or a user with an elevated role
#: (the hub lets the culler mint, for a member, any scope that member holds; docs/culler.md,
#: Threat model).
#: ``tokens`` filtered to that group: the hub refuses the culler a token for anyone else
TOKENS_SCOPE = f"tokens!group={GPU_USERS_GROUP}"
REQUIRED_SCOPES: tuple[str, ...] = (
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    TOKENS_SCOPE,
)
#: scopes that would let the culler's own token into users' servers: not needed
NEEDLESS_SCOPES: tuple[str, ...] = ("access:servers", "admin:servers", "servers")
#: only with --cull-users
USER_CULLING_SCOPES: tuple[str, ...] = ("admin:users",)


def scope_problems(scopes: list[str], cull_users: bool = False) -> list[str]:
    """What is wrong with the scopes the culler's token holds (as ``GET
    /hub/api/user`` lists them): too much, or too little."""
    bases = {s.split("!", 1)[0] for s in scopes}
    out = [
        f"the culler's role grants {s!r}, which it does not need (it reaches each server"
        " with a token of that server's own user): remove it, so that the culler's token"
        " cannot open users' servers (docs/culler.md, Scopes)"
        for s in sorted(set(scopes) & set(NEEDLESS_SCOPES))
    ]
    if "tokens" in scopes:
        out.append(
            "the culler's role grants unfiltered 'tokens': it can mint a token for any user,"
            " admins included, so whoever holds its token can become admin; filter it to a"
            f" group of GPU users that holds no admin: {TOKENS_SCOPE!r} (docs/culler.md, Scopes)"
        )
    if "tokens" not in bases:
        out.append(
            "the culler's role lacks 'tokens': it cannot mint per-server tokens, so it"
            " cannot read kernels, and servers with a direct address are held back"
            " (docs/culler.md, Scopes)"
        )
    for need in REQUIRED_SCOPES:
        if need != TOKENS_SCOPE and need not in bases:
            out.append(f"the culler's role lacks {need!r} (docs/culler.md, Scopes)")
    if cull_users and "admin:users" not in bases:
        out.append("--cull-users needs 'admin:users' in the culler's role")
    return out


#: kind_timeouts' default: the GPU kinds' timeouts (plain servers have ``timeout``).
DEFAULT_GPU_KIND_TIMEOUTS = {k: v for k, v in DEFAULT_KIND_TIMEOUTS.items() if k != Kind.CPU}


class CullerSettings(ConnectionSettings):
    """The configurable settings of :class:`~gpuspawner.culler.app.GpuCuller`.

    A plain ``HasTraits`` mix-in: its traits become the application's own, so they are
    set as ``c.GpuCuller.<name>`` and ``--GpuCuller.<name>``, and jupyterhub-idle-culler's
    options that change meaning or default here are redefined first.
    """

    # ---- upstream options whose meaning or default changes ---------------
    timeout = Int(
        DEFAULT_KIND_TIMEOUTS[Kind.CPU],
        help=help_text(
            """
            Idle timeout (seconds) of plain servers (kind ``cpu``: no gpuspawner
            contract) and of any kind not in ``kind_timeouts``; also the user
            timeout for ``--cull-users``. Default 8 hours.
            """
        ),
    ).tag(config=True)

    cull_every = Int(
        120,
        help="Seconds between the starts of two culling cycles.",
    ).tag(config=True)

    max_age = Int(
        0,
        help=help_text(
            """
            Stop servers older than this (seconds) even if recently used -- but,
            unlike jupyterhub-idle-culler, never one with a busy kernel or GPU
            activity in the window, and a GPU server only with a known GPU view.
            0: off.
            """
        ),
    ).tag(config=True)

    config_file = Unicode("gpuspawner_culler_config.py", help="Config file to load (if it exists).").tag(config=True)

    # ---- timeouts ---------------------------------------------------------
    kind_timeouts = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=help_text(
            f"""
            Idle timeout (seconds) per offering kind, merged over the defaults
            {DEFAULT_GPU_KIND_TIMEOUTS}. Kinds not listed here (``cpu``: plain servers)
            use ``--timeout`` (default 8 hours). 0 or less: never stop that kind
            for idleness. Example::

                c.GpuCuller.kind_timeouts = {{"full": 900, "shared": 4 * 3600}}

            or ``--kind-timeout full=900 --kind-timeout shared=14400``.
            """
        ),
    ).tag(config=True)

    offering_timeouts = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=help_text(
            """
            Idle timeout (seconds) per offering slug; wins over the kind's.
            Example: ``{"a100-80gb-full": 600, "t4-shared-teaching": 0}``.
            """
        ),
    ).tag(config=True)

    kernel_timeout = Int(
        1800,
        help=help_text(
            """
            Seconds a kernel must be idle (execution_state idle, no message) before
            it is shut down to reclaim GPU memory, on kinds in ``reclaim_kinds``
            and only while the pod holds GPU memory. 0 disables kernel shutdowns.
            """
        ),
    ).tag(config=True)

    offering_kernel_timeouts = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help="Kernel timeout (seconds) per offering slug; wins over kernel_timeout.",
    ).tag(config=True)

    reclaim_kinds = List(
        Unicode(),
        list(DEFAULT_RECLAIM_KINDS),
        help=help_text(
            """
            Kinds whose idle kernels are shut down to reclaim GPU memory while the
            server keeps running: kinds whose GPU memory other users share
            (time-slicing/MPS ``shared``, fractional ``custom``). On ``full``,
            ``mig`` and ``vgpu`` the memory belongs to the pod anyway: stopping
            the server after its timeout is what frees the device.
            """
        ),
    ).tag(config=True)

    stop_kinds = List(
        Unicode(),
        [k.value for k in Kind],
        help="Kinds whose idle servers may be stopped (default: all).",
    ).tag(config=True)

    memory_held_mib = Float(
        64.0,
        help="A pod holds GPU memory when DCGM_FI_DEV_FB_USED is at least this (MiB).",
    ).tag(config=True)

    require_kernel_view = Bool(
        True,
        help=help_text(
            """
            Stop a server that has a direct address only if its kernel API
            answered this cycle. If False, a server whose API cannot be reached
            is judged on hub and GPU signals alone.
            """
        ),
    ).tag(config=True)

    reclaim_connected_kernels = Bool(
        True,
        help=help_text(
            """
            Shut down idle kernels even while a browser tab is connected to them
            (an open tab is the usual way GPU memory is left held). False: only
            kernels with no connection, like jupyter_server's own ``cull_connected``.
            """
        ),
    ).tag(config=True)

    gpu_activity_blocks_kernel_reclaim = Bool(
        True,
        help=help_text(
            """
            Do not shut down idle kernels while the pod's GPU shows activity (a
            kernel can run GPU work in a thread while it reads 'idle'). Note that
            with older dcgm-exporter releases a shared GPU's activity is copied
            onto every pod that shares it.
            """
        ),
    ).tag(config=True)

    # (The ignore: traitlets' second positional argument is allow_none, and DEFAULT_GPU_LEASES
    # (a mapping, truthy) lands there, so None is accepted; found by mypy, left as it is (no
    # behaviour change here), reported in issue #40's work.)
    gpu_idle_limit = Int(  # type: ignore[call-overload]
        DEFAULT_GPU_IDLE_LIMIT,
        DEFAULT_GPU_LEASES,
        help=help_text(
            """
            Seconds after which a GPU that GPU telemetry has shown idle, in every
            cycle since, wins over everything its pod claims: the server is
            stopped even though it says a kernel is busy, reports fresh activity
            (kernels, ``/api/status``, the hub's ``last_activity``, which the
            pod's own jupyterhub-singleuser reports) or does not answer -- with a
            WARNING in the log naming what it claimed. Only with a known GPU view
            that is idle now; real GPU activity always keeps the server and
            starts the count again. Never shorter than the offering's idle
            timeout; no effect where that timeout is 0. Counted from the first
            cycle that saw the GPU idle (after a culler restart: from scratch).
            0: off (the pod's word can keep a GPU forever). Default 4 hours.
            """
        ),
    ).tag(config=True)

    offering_gpu_idle_limits = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=help_text(
            """
            ``gpu_idle_limit`` per offering slug (seconds; 0: off for that
            offering). Example: ``{"a100-80gb-full": 3600, "t4-shared": 0}``.
            """
        ),
    ).tag(config=True)

    gpu_leases = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=help_text(
            """
            The GPU lease per GPU kind: seconds a GPU server may run from its start,
            whatever it does -- GPU activity, busy kernels and every other sign of
            life included. Nothing vetoes it: it is the hard maximum a kind's GPU is
            held, warned ``warn_before_seconds`` ahead (with no "Keep": nothing keeps
            it) and stopped with reason ``gpu_lease``. Merged over the defaults
            (24 hours for every GPU kind); 0 for a kind: no lease. Plain servers
            have none (see ``max_age``). Example: ``{"full": 28800, "shared": 0}``.
            """
        ),
    ).tag(config=True)

    offering_gpu_leases = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=help_text(
            """
            The GPU lease per offering slug (seconds; 0: no lease for that offering),
            winning over its kind's in ``gpu_leases``: "4 hours on an H100, 24 on a
            T4 share". Example: ``{"gpu-nvidia-h100-80gb-hbm3": 14400}``.
            """
        ),
    ).tag(config=True)

    gpu_lease_extensions = Int(
        0,
        help=help_text(
            """
            How many times a user may extend a GPU lease (from the hub's home page, or the
            "Extend" the notebook's warning links to), each by ``gpu_lease_extension``
            seconds -- only while nobody waits for the server's offering. 0 (the default):
            never. Per offering: ``offering_gpu_lease_extensions``.
            """
        ),
    ).tag(config=True)

    offering_gpu_lease_extensions = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=help_text(
            """
            Extensions per offering slug, winning over ``gpu_lease_extensions``:
            ``{"gpu-nvidia-h100-80gb-hbm3": 2}``.
            """
        ),
    ).tag(config=True)

    gpu_lease_extension = Int(
        60 * 60,
        help=help_text(
            """
            Seconds one extension adds to a GPU lease. Default: 1 hour.
            """
        ),
    ).tag(config=True)

    offering_gpu_lease_ends = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help=help_text(
            """
            What a GPU lease ends with, per offering slug: ``"stop"`` (the default: the
            server is stopped) or ``"reclaim"``: every kernel is shut down, busy or not
            (its user was warned), the server stays, and a new lease begins -- for shared
            GPUs, where the memory a kernel holds is what others wait for.
            Example: ``{"t4-share": "reclaim"}``.
            """
        ),
    ).tag(config=True)

    @validate("offering_gpu_lease_ends")
    def _valid_lease_ends(self, proposal: dict[str, Any]) -> dict[str, Any]:
        value = dict(proposal["value"])
        wrong = sorted(k for k, v in value.items() if v not in (LEASE_ENDS_STOP, LEASE_ENDS_RECLAIM))
        if wrong:
            raise TraitError(f"offering_gpu_lease_ends: {wrong}: give {LEASE_ENDS_STOP!r} or {LEASE_ENDS_RECLAIM!r}")
        return value

    @validate("gpu_lease_extensions", "gpu_lease_extension")
    def _valid_extension(self, proposal: dict[str, Any]) -> int:
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name}: {proposal['value']} must be 0 or more")
        return int(proposal["value"])

    @validate("offering_gpu_leases", "offering_gpu_lease_extensions")
    def _valid_per_offering_counts(self, proposal: dict[str, Any]) -> dict[str, Any]:
        value = dict(proposal["value"])
        negative = sorted(k for k, v in value.items() if v < 0)
        if negative:
            name = proposal["trait"].name
            zero = "0 (no lease) or more seconds" if name == "offering_gpu_leases" else "0 (none) or more"
            raise TraitError(f"{name}: {negative} must be {zero}")
        return value

    @validate("gpu_leases")
    def _valid_leases(self, proposal: dict[str, Any]) -> dict[str, Any]:
        value = dict(proposal["value"])
        gpu_kinds = {k.value for k in Kind} - {Kind.CPU.value}
        wrong = sorted(set(value) - gpu_kinds)
        if wrong:
            raise TraitError(f"gpu_leases: {wrong} are not GPU kinds; the GPU kinds are {sorted(gpu_kinds)}")
        negative = sorted(k for k, v in value.items() if v < 0)
        if negative:
            raise TraitError(f"gpu_leases: {negative} must be 0 (no lease) or more seconds")
        return value

    # ---- fair turns: reclaim when someone waits ---------------------------------
    reclaim_for_waiting_after = Int(
        0,
        help=help_text(
            """
            Seconds of idleness after which a GPU server is reclaimed while spawns
            wait for its offering in the hub's queue (the ``queue`` admission
            policy): far shorter than the idle timeout, say 900. Only the longest
            idle servers of that offering are reclaimed, one per waiting spawn;
            the same signs of life count as for the idle timeout (a busy kernel,
            GPU activity, a cell run or "Keep" withdraw it), the user is warned
            ``warn_before_seconds`` ahead, and the reason says who waits ("2
            people were waiting for MIG 1g.10gb and the MIG slice was idle for 22
            minutes (limit 15)"). Nothing is reclaimed when nobody waits, nor
            while the GPU view (Prometheus, which also carries the hub's
            ``gpuspawner_spawns_waiting``) is unavailable. The server is stopped:
            a waiting spawn waits for the offering's unit, which only a stopped
            pod frees. No effect where it is not shorter than the idle timeout,
            or where that timeout is 0. 0: off (the default).
            """
        ),
    ).tag(config=True)

    offering_reclaim_for_waiting_after = Dict(
        key_trait=Unicode(),
        value_trait=Int(),
        help=help_text(
            """
            ``reclaim_for_waiting_after`` per offering slug (seconds; 0: off for that
            offering). Example: ``{"mig-nvidia-a100-sxm4-40gb-1g-5gb": 900}``.
            """
        ),
    ).tag(config=True)

    # ---- pods that stall the culler ---------------------------------------------
    server_deadline_seconds = Float(
        60.0,
        help=help_text(
            """
            Seconds a cycle waits for one server's pod (its kernel view, the notice,
            its kernel shutdowns). A pod that takes longer is carried over: its work
            goes on in the background, no one else's decision waits for it, the next
            cycle does not start it again while it runs, and each such cycle counts
            in ``gpuspawner_culler_errors_total{source="stall"}`` with a WARNING.
            """
        ),
    ).tag(config=True)

    @validate("server_deadline_seconds")
    def _valid_deadline(self, proposal: dict[str, Any]) -> float:
        return positive("server_deadline_seconds", proposal["value"], "seconds a cycle waits for one pod")

    stalls_before_telemetry = Int(
        DEFAULT_STALLS_BEFORE_TELEMETRY,
        help=help_text(
            """
            Cycles in a row a server's pod may miss ``server_deadline_seconds``
            before the server is judged by GPU telemetry alone: a GPU server whose
            GPU is known idle now, and has been for at least its idle timeout, is
            then stopped (reason ``unresponsive``), whatever its pod would answer.
            """
        ),
    ).tag(config=True)

    kernel_shutdowns_per_cycle = Int(
        DEFAULT_KERNEL_SHUTDOWNS_PER_CYCLE,
        help="Idle kernels of one server shut down per cycle, at most (the rest in later cycles); 0: no cap.",
    ).tag(config=True)

    kernel_shutdown_concurrency = Int(
        4,
        help="Kernel shutdowns in flight at once to one server (within server_concurrency for all servers).",
    ).tag(config=True)

    # ---- telling users: warnings, notices, the action log ---------------------
    warn_before_seconds = Int(
        600,
        help=help_text(
            """
            Seconds before it stops a server or shuts down idle kernels that the
            culler warns the server's user, through gpuspawner's notebook extension
            (``PUT {server}/api/gpuspawner/culler`` with the server's own token):
            the notebook shows what will be reclaimed and when, and any activity
            resets the clock as usual. A warning never changes what is reclaimed
            or when; it only tells first. Make it longer than ``cull_every`` so
            that a warning comes at least one cycle ahead. Servers without the
            extension (404) are left alone until they restart. 0: no warnings
            (the notices that kernels were reclaimed are still sent).
            """
        ),
    ).tag(config=True)

    @validate("warn_before_seconds")
    def _valid_warn_before(self, proposal: dict[str, Any]) -> int:
        value = int(proposal["value"])
        if value < 0:
            raise TraitError(f"warn_before_seconds={value}: must be 0 (no warnings) or a number of seconds")
        return value

    notify_servers = Bool(
        True,
        help=help_text(
            """
            Put the culler's view (warnings, reclaimed kernels) to each server's
            gpuspawner notebook extension. False: never call it (the culler
            behaves as without the extension).
            """
        ),
    ).tag(config=True)

    action_log_path = Unicode(
        "gpuspawner-culler-actions.jsonl",
        help=help_text(
            """
            JSON-lines file that keeps every action the culler takes (user,
            server, what was reclaimed, why, the GPU figures seen, when), read
            back at start-up. Relative to the culler's working directory. Users
            read their own through ``api/actions`` and the hub's pages. Empty:
            kept in memory only (lost at restart).
            """
        ),
    ).tag(config=True)

    action_log_max_entries = Int(
        10_000,
        help="Most recent actions kept (in memory and in the file, which is rewritten at twice this).",
    ).tag(config=True)

    @validate("action_log_max_entries")
    def _valid_action_log_max(self, proposal: dict[str, Any]) -> int:
        value = int(proposal["value"])
        if value < 1:
            raise TraitError(f"action_log_max_entries={value}: must be at least 1")
        return value

    action_log_retention_days = Float(
        90.0,
        help="Days an action is kept (older ones are dropped from the log and the API).",
    ).tag(config=True)

    @validate("action_log_retention_days")
    def _valid_retention(self, proposal: dict[str, Any]) -> float:
        return positive("action_log_retention_days", proposal["value"], "days an action is kept")

    actions_read_all_scopes = List(
        Unicode(),
        ["custom:gpu-culler:read-actions", "admin:users"],
        help=help_text(
            """
            Hub scopes whose holders read every user's actions in ``api/actions``
            (others read only their own). Define the custom scope in the hub:
            ``c.JupyterHub.custom_scopes = {"custom:gpu-culler:read-actions":
            {"description": "..."}}`` and grant it in a role.
            """
        ),
    ).tag(config=True)
