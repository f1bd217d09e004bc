"""gpuspawner's memory guard, run at the start of every Python process in a guarded notebook pod.

GPUSpawner puts this file into the pod as ``sitecustomize.py`` in a directory that the pod's
command prefix puts first on ``PYTHONPATH``, in front of the image's own (see
gpuspawner/pod/memguard.py and docs/memory-guard.md), so Python runs it at start-up: in
ipykernel kernels, and also in ``python train.py`` run from a terminal. Not where Python
ignores PYTHONPATH or site (``python -I``, ``-E``, ``-S``).

It imports no framework: importing torch or tensorflow takes seconds and, for TensorFlow,
loads CUDA. It puts a finder first on ``sys.meta_path`` that notices when ``torch`` or
``tensorflow`` is imported, lets the import run, and then asks the framework to stay within
``GPUSPAWNER_MEMORY_FRACTION`` of each GPU's memory:

* PyTorch: ``torch.cuda.set_per_process_memory_fraction`` for every visible GPU, deferred
  (``torch.cuda._lazy_call``) until CUDA is initialised, so a notebook that imports torch
  but never uses the GPU creates no CUDA context;
* TensorFlow: one logical device per GPU with ``memory_limit`` = ``GPUSPAWNER_MEMORY_MIB``
  (TensorFlow's cap is in MiB). TensorFlow then refuses ``set_memory_growth`` on that GPU
  with a ValueError; growth is already on through ``TF_FORCE_GPU_ALLOW_GROWTH``, so the hook
  answers ``tf.config.experimental.set_memory_growth(gpu, True)`` itself for those GPUs.

JAX needs no code: its variables are set on the pod. Nothing here is enforced: it is a
cooperative limit that the user's own code can change.

Then it runs the image's own ``sitecustomize``, if there is one (this file shadows it).
Written for any Python 3.6+ an image may have; it must never stop a process from starting.
"""

import os
import sys

FRACTION_ENV = "GPUSPAWNER_MEMORY_FRACTION"
MIB_ENV = "GPUSPAWNER_MEMORY_MIB"


def _say(message):
    try:
        sys.stderr.write("gpuspawner memory guard: " + message + "\n")
    except Exception:
        pass


def _number(name, kind):
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        _say(f"ignoring {name}={text!r} (not a number)")
        return None
    return value if value > 0 else None


def cap_torch(torch):
    """Cap PyTorch's caching allocator on every visible GPU, once CUDA is initialised."""
    fraction = _number(FRACTION_ENV, float)
    cuda = getattr(torch, "cuda", None)
    if fraction is None or cuda is None or not hasattr(cuda, "set_per_process_memory_fraction"):
        return
    fraction = min(fraction, 1.0)

    def apply():
        try:
            for index in range(cuda.device_count()):
                cuda.set_per_process_memory_fraction(fraction, index)
        except Exception as exc:  # never break the user's CUDA start
            _say(f"could not cap PyTorch: {exc}")
            return
        _say(f"PyTorch may use {fraction:g} of each GPU's memory (this server's share)")

    lazy = getattr(cuda, "_lazy_call", None)
    if lazy is not None:
        lazy(apply)  # runs now if CUDA is initialised, else when it is
    else:
        apply()


def cap_tensorflow(tf):
    """One logical device per GPU with a memory limit (MiB), before TensorFlow initialises them."""
    mib = _number(MIB_ENV, int)
    config = getattr(tf, "config", None)
    if mib is None or config is None:
        return
    try:
        gpus = config.list_physical_devices("GPU")
        for gpu in gpus:
            config.set_logical_device_configuration(gpu, [config.LogicalDeviceConfiguration(memory_limit=mib)])
    except Exception as exc:  # e.g. RuntimeError: the GPUs were initialised already
        _say(f"could not cap TensorFlow: {exc}")
        return
    if gpus:
        _say(f"TensorFlow may use {mib} MiB of each GPU (this server's share)")
        growth_already_on(getattr(config, "experimental", None), gpus)


def growth_already_on(experimental, configured):
    """Make ``tf.config.experimental.set_memory_growth(gpu, True)`` harmless on the GPUs the
    guard gave a logical device.

    TensorFlow refuses memory growth on a GPU with logical devices (``ValueError: Cannot set
    memory growth on device when virtual devices configured``), which breaks the most common
    TensorFlow snippet. Growth is on there already (``TF_FORCE_GPU_ALLOW_GROWTH=true``, set
    on the pod), so asking for it again is answered here; anything else (another device,
    ``False``) goes to TensorFlow as before."""
    real = getattr(experimental, "set_memory_growth", None)
    if real is None or getattr(real, "gpuspawner_guard", False):
        return
    configured = list(configured)

    def set_memory_growth(device, enable):
        if enable and device in configured:
            return None
        return real(device, enable)

    set_memory_growth.gpuspawner_guard = True
    set_memory_growth.__doc__ = getattr(real, "__doc__", None)
    set_memory_growth.__wrapped__ = real
    experimental.set_memory_growth = set_memory_growth


class _Loader:
    """The framework's own loader, with ``after`` called once its module has run."""

    def __init__(self, real, after):
        self._real = real
        self._after = after

    def create_module(self, spec):
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        module.__loader__ = self._real
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._real
        self._real.exec_module(module)
        try:
            self._after(module)
        except Exception as exc:
            _say(f"{module.__name__}: {exc}")

    def __getattr__(self, name):
        return getattr(self._real, name)


class AfterImport:
    """A ``sys.meta_path`` finder that runs a callback after a watched top-level module is imported."""

    def __init__(self, callbacks):
        self._callbacks = dict(callbacks)
        self._finding = set()

    def find_spec(self, fullname, path=None, target=None):
        after = self._callbacks.get(fullname)
        if after is None or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)  # the other finders' answer
        finally:
            self._finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self._callbacks[fullname]  # once
        spec.loader = _Loader(spec.loader, after)
        return spec


def install():
    """Watch for the frameworks (only where the pod has a fraction to keep to)."""
    if _number(FRACTION_ENV, float) is None:
        return
    if any(isinstance(finder, AfterImport) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, AfterImport({"torch": cap_torch, "tensorflow": cap_tensorflow}))


def run_shadowed_sitecustomize():
    """Run the ``sitecustomize`` this file hides (the image's own), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.get("sitecustomize")
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if getattr(exc, "name", None) != "sitecustomize":
            _say(f"the image's sitecustomize failed: {exc}")
    except Exception as exc:
        _say(f"the image's sitecustomize failed: {exc}")
    finally:
        if me is not None:
            sys.modules["sitecustomize"] = me


if __name__ == "sitecustomize":
    try:
        install()
    except Exception as exc:
        _say(f"not installed: {exc}")
    run_shadowed_sitecustomize()
