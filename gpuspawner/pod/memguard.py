"""The memory guard: an offering -> the cooperative GPU memory limits its pod gets. Pure.

Time-slicing isolates no GPU memory, and TensorFlow and JAX take most of a GPU by default,
so one notebook can starve everyone on a shared GPU. Nothing in Kubernetes can stop that;
the frameworks can be asked to hold back. What each one honours (docs/memory-guard.md has
the versions, read from each framework's own source, and what is NOT enforced):

* JAX: ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (no 75% grab at the first operation) and ONE
  fraction variable. Every jaxlib reads ``XLA_PYTHON_CLIENT_MEM_FRACTION``; from 0.4.38 on
  jaxlib also reads ``XLA_CLIENT_MEM_FRACTION`` and refuses the two together (the CUDA plugin
  then fails and JAX runs on the CPU), and before it the new name is ignored. So a guarded
  pod has the old name only, whichever spelling the admin, a profile or an offering used
  (:func:`guarded_environment`).
* TensorFlow: ``TF_FORCE_GPU_ALLOW_GROWTH=true`` stops the up-front grab but caps nothing; a
  cap is a logical device with a memory limit, set in code: by the start-up hook.
* PyTorch: ``torch.cuda.set_per_process_memory_fraction``, in code, by the start-up hook.
  Not ``PYTORCH_CUDA_ALLOC_CONF``: releases before its ``per_process_memory_fraction`` key
  refuse unknown keys at the first CUDA allocation, and the variable is the user's own knob.
* MPS clients: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  (``"0=2048M"``, one ``ordinal=limit`` per visible device), never above what NVIDIA's device
  plugin has the MPS control daemon set for every client (the same share: 1/replicas).

The cap is per process, and each process also holds a CUDA context outside it: a share is
cut for :data:`PROCESSES` GPU processes, each with :data:`CONTEXT_MIB` left for its context,
so two notebooks of one server stay within the share the spawn page names.

The start-up hook (``gpuspawner/pod/memguard_hook.py``, shipped in the wheel) reaches the pod
without any object of its own in the cluster: its source is a pod annotation, which a
downwardAPI volume projects as ``sitecustomize.py`` into :data:`GUARD_DIR`. The pod's
command starts with :func:`path_prefix`, a shell that puts that directory first on
``PYTHONPATH`` *in front of the image's own* (the pod's environment cannot: Kubernetes
replaces the image's variable and its ``$(VAR)`` cannot see the image's ENV). Python runs
``sitecustomize`` at the start of every process (ipykernel kernels, but also ``python
train.py`` in a terminal); it imports no framework, it waits for one to be imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.names.vocabulary import ANNOTATION_MEMGUARD_HOOK, ENV_MEMORY_FRACTION, ENV_MEMORY_MIB, GPU_KINDS, Kind

#: Where the start-up hook is mounted in the notebook container (first on PYTHONPATH).
GUARD_DIR = "/opt/gpuspawner/memguard"
#: The name Python runs at start-up from a directory on its path.
HOOK_FILE = "sitecustomize.py"
#: The pod volume that projects the hook from the pod's annotation.
VOLUME_NAME = "gpuspawner-memguard"
#: The kinds guarded unless the admin says otherwise: the ones whose memory nothing else isolates.
DEFAULT_KINDS: frozenset[Kind] = frozenset({Kind.SHARED, Kind.CUSTOM})
#: A share is cut for this many GPU processes of one server (two notebooks, or a notebook and
#: the script it starts): each gets half, so two of them stay within the share.
PROCESSES = 2
#: What each process's CUDA context holds outside the framework's cap, MiB (an estimate:
#: a few hundred MiB per process with lazy module loading; docs/memory-guard.md).
CONTEXT_MIB = 512

#: JAX's fraction, in the spelling every jaxlib reads, and the newer one that jaxlib from
#: 0.4.38 on also reads and refuses together with the first (docs/memory-guard.md).
JAX_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
JAX_FRACTION_NEW = "XLA_CLIENT_MEM_FRACTION"
JAX_FRACTIONS = frozenset({JAX_FRACTION, JAX_FRACTION_NEW})

#: Every variable the guard may set (a profile may set them where the admin allows it).
GUARD_ENV = (
    ENV_MEMORY_FRACTION,
    ENV_MEMORY_MIB,
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    JAX_FRACTION,
    JAX_FRACTION_NEW,
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)


class GuardConfigError(ValueError):
    """The spawner-wide memory guard settings are wrong; the message names the setting."""


@dataclass(frozen=True)
class GuardDefaults:
    """The spawner-wide settings: which kinds are guarded, and whether the user's profile
    environment wins over the guard's values (``c.GPUSpawner.memory_guard_*``)."""

    kinds: frozenset[Kind] = DEFAULT_KINDS
    user_env: bool = False

    @classmethod
    def from_settings(cls, kinds: Iterable[Any], user_env: Any) -> GuardDefaults:
        """From the traits' values; raises :class:`GuardConfigError` naming the setting."""
        allowed = sorted(k.value for k in GPU_KINDS)
        chosen = []
        for kind in kinds:
            if kind not in allowed:
                raise GuardConfigError(
                    f"c.GPUSpawner.memory_guard_kinds: {kind!r} is not a GPU offering kind; use some of {allowed} "
                    "(an empty list turns the guard off except where an offering's memory_guard turns it on)"
                )
            chosen.append(Kind(kind))
        if not isinstance(user_env, bool):
            raise GuardConfigError(f"c.GPUSpawner.memory_guard_user_env must be True or False, got {user_env!r}")
        return cls(kinds=frozenset(chosen), user_env=user_env)


@dataclass(frozen=True)
class Guard:
    """The limits one offering's pod gets.

    ``fraction``: each process's cap, of each visible GPU's memory (None: no cap, only no
    up-front grab); ``cap_mib``: that cap in MiB where the GPU's memory is known (TensorFlow
    needs MiB); ``gpu_mib``: the GPU's memory (or the MIG slice's, which is the device the pod
    sees); ``mps_share``: the number of MPS clients per GPU for an MPS share, else None;
    ``process_mib``: what one process may hold in all, its CUDA context included (the MPS
    client limit).
    """

    fraction: float | None
    cap_mib: int | None
    gpu_mib: int | None
    mps_share: int | None = None
    user_env: bool = False
    process_mib: int | None = None


@dataclass(frozen=True)
class GuardChanges:
    """What the guard adds to the pod: environment, the hook's annotation, volume and mount,
    and the command prefix that puts the hook's directory on ``PYTHONPATH``."""

    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    command_prefix: tuple[str, ...] = ()


def _floor(value: float, places: int = 3) -> float:
    """``value`` cut (never rounded up) to ``places`` decimals: a cap must not grow by rounding."""
    scale = 10**places
    return float(int(value * scale) / scale)


def gpu_memory_mib(offering: Offering) -> int | None:
    """The memory of one GPU the pod sees (a MIG slice's own), where the offering says it."""
    memory = offering.memory_mib
    if memory is None:
        return None
    if offering.kind is Kind.SHARED and offering.sharing == "memory":
        return offering.device_memory_mib  # memory_mib is the share of it the claim asked for
    if offering.kind is Kind.SHARED and offering.sharing == "mps":
        return memory * offering.replicas if offering.replicas else None  # memory_mib is one client's
    if offering.kind is Kind.CUSTOM:
        return None  # memory_mib says what the site's resource gives, not the GPU's size
    return memory


def guard_for(offering: Offering, defaults: GuardDefaults) -> Guard | None:
    """The guard ``offering``'s pod gets, or None (not a GPU, or turned off).

    The cap is the admin's fraction (``memory_guard.fraction``, per process, as given), else
    the share's: a time-sliced or MPS share of 1/replicas is cut for :data:`PROCESSES`
    processes, each leaving :data:`CONTEXT_MIB` for its CUDA context where the GPU's memory
    is known (a quarter of a 16 GB T4: 4096 MiB, 2048 per process, a cap of 1536); a GPU-memory
    share (a DRA claim's ``capacity.requests.memory``) is cut the same way from its amount. A MIG
    slice or whole GPU has no share to keep to; guarded, it gets no up-front grab and no cap
    unless the admin sets a fraction. A custom offering's share is the site's business: its
    cap is the admin's fraction, or ``memory_mib`` of the GPU where the admin gives both.
    """
    setting = offering.memory_guard
    if offering.kind not in GPU_KINDS:
        return None
    enabled = setting.enabled if setting.enabled is not None else offering.kind in defaults.kinds
    if not enabled:
        return None
    gpu_mib = gpu_memory_mib(offering)
    fraction = _floor(setting.fraction) if setting.fraction is not None else None
    cap_mib = int(gpu_mib * fraction) if gpu_mib and fraction else None
    process_mib = None
    # A memory share's amount is what its claim asked for (nothing on the GPU enforces it); a time-sliced or MPS share's is 1/replicas.
    memory_share = offering.kind is Kind.SHARED and offering.sharing == "memory"
    share_mib = offering.memory_mib if memory_share else gpu_mib // offering.replicas if gpu_mib and offering.replicas else None
    if fraction is None and offering.kind is Kind.SHARED and (offering.replicas or memory_share):
        if gpu_mib and share_mib:
            process_mib = share_mib // PROCESSES
            cap_mib = max(process_mib - CONTEXT_MIB, process_mib // 2)
            fraction = _floor(cap_mib / gpu_mib)
        elif offering.replicas:  # the GPU's size unknown: no room can be kept for the contexts
            fraction = _floor(1 / (offering.replicas * PROCESSES))
    if offering.kind is Kind.CUSTOM and fraction and offering.memory_mib:
        cap_mib = offering.memory_mib
    mps = offering.replicas if offering.kind is Kind.SHARED and offering.sharing == "mps" else None
    user_env = setting.user_env if setting.user_env is not None else defaults.user_env
    return Guard(fraction=fraction, cap_mib=cap_mib, gpu_mib=gpu_mib, mps_share=mps, user_env=user_env, process_mib=process_mib)


def guard_env(guard: Guard, count: int = 1) -> dict[str, str]:
    """The environment variables of ``guard`` for a pod with ``count`` GPUs.

    JAX's fraction is under :data:`JAX_FRACTION` alone (see :func:`guarded_environment`)."""
    env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if guard.fraction is not None:
        text = f"{guard.fraction:g}"
        env.update({ENV_MEMORY_FRACTION: text, JAX_FRACTION: text})
    if guard.cap_mib:
        env[ENV_MEMORY_MIB] = str(guard.cap_mib)
    if guard.mps_share:
        # NVIDIA's device plugin has the MPS control daemon give every client 100/replicas
        # percent and (GPU memory)/replicas; these are never above that, only the same or tighter
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, 100 // guard.mps_share))
        limit = guard.process_mib or guard.cap_mib
        if limit:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={limit}M" for i in range(count))
    return env


def path_prefix(directory: str = GUARD_DIR) -> tuple[str, ...]:
    """The command prefix that puts ``directory`` first on ``PYTHONPATH``, keeping what the
    image (or the pod's environment) has there, then runs the rest of the command.

    KubeSpawner puts its command into the container's ``args``, so the image's ENTRYPOINT
    (tini, an NGC entrypoint script) still runs first and starts this shell. ``$0`` names
    the prefix in the shell's own error messages."""
    script = f'export PYTHONPATH="{directory}${{PYTHONPATH:+:$PYTHONPATH}}"; exec "$@"'
    return ("sh", "-c", script, "gpuspawner-memguard")


def guard_changes(guard: Guard, count: int, hook_source: str) -> GuardChanges:
    """Everything ``guard`` adds to a pod with ``count`` GPUs.

    The start-up hook is mounted only where there is a cap for it to apply (PyTorch and
    TensorFlow need code), and put on ``PYTHONPATH`` by the command prefix (:func:`path_prefix`).
    """
    env = guard_env(guard, count)
    if guard.fraction is None:
        return GuardChanges(env=env)
    volume = {
        "name": VOLUME_NAME,
        "downwardAPI": {
            "items": [{"path": HOOK_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_MEMGUARD_HOOK}']"}}],
        },
    }
    mount = {"name": VOLUME_NAME, "mountPath": GUARD_DIR, "readOnly": True}
    return GuardChanges(
        env=env,
        annotations={ANNOTATION_MEMGUARD_HOOK: hook_source},
        volumes=(volume,),
        volume_mounts=(mount,),
        command_prefix=path_prefix(),
    )


def without_jax_clash(guard: Mapping[str, str], present: Mapping[str, Any]) -> dict[str, str]:
    """``guard`` less every variable ``present`` already sets, JAX's fraction in either spelling
    included (an offering's own ``env`` is the admin's word: the guard adds nothing beside it)."""
    jax = bool(JAX_FRACTIONS & present.keys())
    return {k: v for k, v in guard.items() if k not in present and not (jax and k in JAX_FRACTIONS)}


def one_jax_spelling(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with JAX's fraction under :data:`JAX_FRACTION` only (an offering's ``env`` that
    spells it the new way: jaxlib before 0.4.38 would not read it). Where both are given, the
    new name's value, which a jaxlib that reads both would have preferred."""
    if JAX_FRACTION_NEW not in env:
        return dict(env)
    out = {k: v for k, v in env.items() if k not in JAX_FRACTIONS}
    out[JAX_FRACTION] = env[JAX_FRACTION_NEW]
    return out


def guarded_environment(
    environment: Mapping[str, Any], guard: Mapping[str, str], user_keys: Iterable[str], user_env: bool
) -> dict[str, Any]:
    """``environment`` with the guard's variables set over it.

    Where the admin allows it (``user_env``), a variable the user's chosen profile set
    (``user_keys``) keeps the user's value; otherwise the guard's wins.

    A guarded pod gets exactly one JAX fraction, under :data:`JAX_FRACTION`, the name every
    jaxlib reads: jaxlib from 0.4.38 on refuses both names together (and JAX then runs on
    the CPU), and jaxlib before it reads only that one. Its value is the guard's, or the
    user's where allowed, in whichever spelling the profile used; where the guard has none
    (an offering's own ``env`` set it, already under that name: :func:`one_jax_spelling`),
    the value the environment has under that name wins, else the other spelling's.
    """
    user_keys = set(user_keys)
    kept = user_keys if user_env else set()
    result = {**environment, **{k: v for k, v in guard.items() if k not in kept}}
    if not guard or not JAX_FRACTIONS & result.keys():
        return result
    if JAX_FRACTION in guard:
        mine = [k for k in (JAX_FRACTION_NEW, JAX_FRACTION) if k in kept and k in environment]
        value = environment[mine[0]] if mine else guard[JAX_FRACTION]
    else:
        value = result.get(JAX_FRACTION, result.get(JAX_FRACTION_NEW))
    result = {k: v for k, v in result.items() if k not in JAX_FRACTIONS}
    result[JAX_FRACTION] = value
    return result


def guarded(offering: Offering, count: int, kinds: Any, user_env: bool, hook_source: Callable[[], str]) -> tuple[GuardChanges | None, bool]:
    """The memory guard of ``count`` units of ``offering`` under the admin's
    ``memory_guard_kinds`` and ``memory_guard_user_env`` (None: no guard), and whether the
    user's profile environment wins over it; ``hook_source`` gives the start-up hook as
    shipped. Raises GuardConfigError for settings ``config_problems`` refuses."""
    guard = guard_for(offering, GuardDefaults.from_settings(kinds, user_env))
    if guard is None:
        return None, False
    return guard_changes(guard, count, hook_source()), guard.user_env
