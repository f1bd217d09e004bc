"""The memory guard: an offering -> the cooperative GPU memory limits its pod gets. Pure.

Time-slicing isolates no GPU memory, and TensorFlow and JAX take most of a GPU by default,
so one notebook can starve everyone on a shared GPU. Nothing in Kubernetes can stop that;
the frameworks can be asked to hold back. What each one honours (docs/memory-guard.md has
the sources and what is NOT enforced):

* JAX: ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (no 75% grab at the first operation) and
  ``XLA_CLIENT_MEM_FRACTION`` (its allocator's size, as a fraction of the GPU's memory; the
  older name ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is set too, for older jaxlib).
* TensorFlow: ``TF_FORCE_GPU_ALLOW_GROWTH=true`` stops the up-front grab but caps nothing; a
  cap is a logical device with a memory limit, set in code: by the start-up hook.
* PyTorch: no environment variable caps it; ``torch.cuda.set_per_process_memory_fraction``
  does, in code: by the start-up hook.
* MPS clients: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  (``"0=4096M"``, one ``ordinal=limit`` per visible device); a client can only tighten what
  the MPS control daemon allows.

The start-up hook (``gpuspawner/memguard_hook.py``, shipped in the wheel) reaches the pod
without any object of its own in the cluster: its source is a pod annotation, which a
downwardAPI volume projects as ``sitecustomize.py`` into :data:`GUARD_DIR`, put first on
``PYTHONPATH``. Python runs ``sitecustomize`` at the start of every process (ipykernel
kernels, but also ``python train.py`` in a terminal, where an IPython start-up file would not
run); it imports no framework, it waits for one to be imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import Offering
from .vocabulary import ANNOTATION_MEMGUARD_HOOK, ENV_MEMORY_FRACTION, ENV_MEMORY_MIB, GPU_KINDS, Kind

#: Where the start-up hook is mounted in the notebook container (first on PYTHONPATH).
GUARD_DIR = "/opt/gpuspawner/memguard"
#: The name Python runs at start-up from a directory on its path.
HOOK_FILE = "sitecustomize.py"
#: The pod volume that projects the hook from the pod's annotation.
VOLUME_NAME = "gpuspawner-memguard"
#: The kinds guarded unless the admin says otherwise: the ones whose memory nothing else isolates.
DEFAULT_KINDS: frozenset[Kind] = frozenset({Kind.SHARED, Kind.CUSTOM})

#: Every variable the guard may set (a profile may set them where the admin allows it).
GUARD_ENV = (
    ENV_MEMORY_FRACTION,
    ENV_MEMORY_MIB,
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "PYTHONPATH",
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

    ``fraction``: the cap, of each visible GPU's memory (None: no cap, only no up-front grab);
    ``cap_mib``: that cap in MiB where the GPU's memory is known (TensorFlow needs MiB);
    ``gpu_mib``: the GPU's memory (or the MIG slice's, which is the device the pod sees);
    ``mps_share``: the number of MPS clients per GPU for an MPS share, else None.
    """

    fraction: float | None
    cap_mib: int | None
    gpu_mib: int | None
    mps_share: int | None = None
    user_env: bool = False


@dataclass(frozen=True)
class GuardChanges:
    """What the guard adds to the pod: environment, the hook's annotation, volume and mount."""

    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()


def _floor(value: float, places: int = 3) -> float:
    """``value`` cut (never rounded up) to ``places`` decimals: a cap must not grow by rounding."""
    scale = 10**places
    return float(int(value * scale) / scale)


def gpu_memory_mib(offering: Offering) -> int | None:
    """The memory of one GPU the pod sees (a MIG slice's own), where the offering says it."""
    memory = offering.memory_mib
    if memory is None:
        return None
    if offering.kind is Kind.SHARED and offering.sharing == "mps":
        return memory * offering.share_count if offering.share_count else None  # memory_mib is one client's
    if offering.kind is Kind.CUSTOM:
        return None  # memory_mib says what the site's resource gives, not the GPU's size
    return memory


def guard_for(offering: Offering, defaults: GuardDefaults) -> Guard | None:
    """The guard ``offering``'s pod gets, or None (not a GPU, or turned off).

    The fraction is the admin's (``memory_guard.fraction``), else the share: 1/replicas for a
    time-sliced or MPS share. A MIG slice or whole GPU has no share to keep to; guarded, it
    gets no up-front grab and no cap unless the admin sets a fraction. A custom offering's
    share is the site's business: its cap is the admin's fraction, or ``memory_mib`` of the GPU
    where the admin gives both.
    """
    setting = offering.memory_guard
    if offering.kind not in GPU_KINDS:
        return None
    enabled = setting.enabled if setting.enabled is not None else offering.kind in defaults.kinds
    if not enabled:
        return None
    fraction = setting.fraction
    if fraction is None and offering.kind is Kind.SHARED and offering.share_count:
        fraction = 1 / offering.share_count
    fraction = _floor(fraction) if fraction is not None else None
    gpu_mib = gpu_memory_mib(offering)
    cap_mib = int(gpu_mib * fraction) if gpu_mib and fraction else None
    if offering.kind is Kind.CUSTOM and fraction and offering.memory_mib:
        cap_mib = offering.memory_mib
    mps = offering.share_count if offering.kind is Kind.SHARED and offering.sharing == "mps" else None
    user_env = setting.user_env if setting.user_env is not None else defaults.user_env
    return Guard(fraction=fraction, cap_mib=cap_mib, gpu_mib=gpu_mib, mps_share=mps, user_env=user_env)


def guard_env(guard: Guard, count: int = 1) -> dict[str, str]:
    """The environment variables of ``guard`` for a pod with ``count`` GPUs (without PYTHONPATH)."""
    env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if guard.fraction is not None:
        text = f"{guard.fraction:g}"
        env.update({ENV_MEMORY_FRACTION: text, "XLA_CLIENT_MEM_FRACTION": text, "XLA_PYTHON_CLIENT_MEM_FRACTION": text})
    if guard.cap_mib:
        env[ENV_MEMORY_MIB] = str(guard.cap_mib)
    if guard.mps_share:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, 100 // guard.mps_share))
        if guard.cap_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={guard.cap_mib}M" for i in range(count))
    return env


def guard_changes(guard: Guard, count: int, hook_source: str, python_path: str | None = None) -> GuardChanges:
    """Everything ``guard`` adds to a pod with ``count`` GPUs.

    The start-up hook is mounted only where there is a cap for it to apply (PyTorch and
    TensorFlow need code); ``python_path`` is the PYTHONPATH the pod would have otherwise
    (kept after :data:`GUARD_DIR`).
    """
    env = guard_env(guard, count)
    if guard.fraction is None:
        return GuardChanges(env=env)
    env["PYTHONPATH"] = GUARD_DIR + (f":{python_path}" if python_path else "")
    volume = {
        "name": VOLUME_NAME,
        "downwardAPI": {
            "items": [{"path": HOOK_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_MEMGUARD_HOOK}']"}}],
        },
    }
    mount = {"name": VOLUME_NAME, "mountPath": GUARD_DIR, "readOnly": True}
    return GuardChanges(env=env, annotations={ANNOTATION_MEMGUARD_HOOK: hook_source}, volumes=(volume,), volume_mounts=(mount,))


def guarded_environment(
    environment: Mapping[str, Any], guard: Mapping[str, str], user_keys: Iterable[str], user_env: bool
) -> dict[str, Any]:
    """``environment`` with the guard's variables set over it.

    Where the admin allows it (``user_env``), a variable the user's chosen profile set
    (``user_keys``) keeps the user's value; otherwise the guard's wins. ``PYTHONPATH`` is
    always the guard's: it already ends with the profile's (see :func:`guard_changes`).
    """
    kept = set(user_keys) - {"PYTHONPATH"} if user_env else set()
    return {**environment, **{k: v for k, v in guard.items() if k not in kept}}
