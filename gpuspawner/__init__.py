"""gpuspawner: a KubeSpawner for GPUs — whole GPUs, MIG slices, shared GPUs, vGPU classes."""

__version__ = "0.1.0"

__all__ = ["GPUSpawner", "__version__"]


def __getattr__(name: str):
    # Import lazily: the pure core (offerings, discovery, ...) must not need KubeSpawner.
    if name == "GPUSpawner":
        from .spawner import GPUSpawner

        return GPUSpawner
    raise AttributeError(name)
