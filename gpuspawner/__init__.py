"""gpuspawner: a KubeSpawner for GPUs — whole GPUs, MIG slices, shared GPUs, vGPU classes."""

from typing import Any

__version__ = "0.1.0"

__all__ = ["GPUSpawner", "check_config", "__version__"]


def __getattr__(name: str) -> Any:
    # Import lazily: the pure core (offerings, discovery, ...) must not need KubeSpawner.
    if name == "check_config":
        from gpuspawner.capacity.checks import check_config

        return check_config
    if name == "GPUSpawner":
        from gpuspawner.spawner import GPUSpawner

        return GPUSpawner
    raise AttributeError(name)
