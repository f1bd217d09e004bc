"""``gpuspawner probe``: a node agent that tells apart the pods sharing one GPU.

dcgm-exporter reports a time-sliced or MPS GPU's numbers on every pod that shares it;
NVML knows which processes hold the memory. The probe reads NVML (the ``nvidia-ml-py``
binding), maps each process to its pod through ``/proc/<pid>/cgroup`` and exports the
GPU memory (and, where NVML samples it, the SM utilisation) per pod, container and
device. See docs/probe.md for what it needs on a node and why.
"""

from gpuspawner.probe.cgroup import PodRef, pod_of
from gpuspawner.probe.collect import ProbeCollector, ProcReader
from gpuspawner.probe.nvml import NvmlReader

__all__ = ["NvmlReader", "PodRef", "ProbeCollector", "ProcReader", "pod_of"]
