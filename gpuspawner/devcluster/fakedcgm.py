"""Simulated GPU telemetry for the devcluster: what dcgm-exporter would report for the
notebook pods that hold GPUs, served by the dcgm-exporter stand-in (dcgmstandin.py)
that the demo's real Prometheus scrapes.

There is no NVIDIA GPU here. The label sets are taken from a real dcgm-exporter
scrape shipped beside this file; which pods exist comes from the API server.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from gpuspawner.core.nodeclass import mig_profile_of
from gpuspawner.devcluster.dcgmstandin import DcgmStandIn
from gpuspawner.names.nvidia import GPU, MIG_PREFIX
from gpuspawner.names.vocabulary import GPU_KINDS, LABEL_KIND, Kind

SCRAPE = Path(__file__).with_name("dcgm-exporter-h100-mig.txt")

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<k>[A-Za-z_][A-Za-z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> [(metric name, labels, value)]."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"not an exposition line: {line!r}")
        labels = {lm["k"]: lm["v"] for lm in _LABEL.finditer(m["labels"] or "")}
        out.append((m["name"], labels, float(m["value"])))
    return out


# --------------------------------------------------------------------------
# the demo's telemetry: samples for the notebook pods that hold GPUs
# --------------------------------------------------------------------------
def reference_labels(metric: str) -> dict[str, str]:
    """Labels of a real dcgm-exporter `metric` row that names a pod (an H100 MIG instance)."""
    for name, labels, _ in parse_exposition(SCRAPE.read_text()):
        if name == metric and "pod" in labels:
            return dict(labels)
    raise ValueError(f"{SCRAPE} has no {metric} row with pod labels")


def dcgm_labels(pod: dict[str, Any], template: dict[str, str], index: int) -> dict[str, str]:
    """dcgm-exporter's labels for one device of ``pod`` (the MIG labels only for MIG pods)."""
    meta, spec = pod["metadata"], pod["spec"]
    labels = {k: v for k, v in template.items() if k not in ("GPU_I_PROFILE", "GPU_I_ID")}
    labels.update(
        gpu=str(index),
        UUID=f"GPU-{meta['uid'][:8]}-{index:04d}",
        Hostname=spec.get("nodeName", ""),
        pod=meta["name"],
        namespace=meta["namespace"],
        container=spec["containers"][0]["name"],
    )
    limits = (spec["containers"][0].get("resources") or {}).get("limits") or {}
    profiles = [p for k in limits if k.startswith(MIG_PREFIX) and (p := mig_profile_of(k))]
    if meta.get("labels", {}).get(LABEL_KIND) == Kind.MIG:
        labels.update(GPU_I_PROFILE=profiles[0] if profiles else template.get("GPU_I_PROFILE", "1g.10gb"), GPU_I_ID=str(7 + index))
    return labels


def devices(pod: dict[str, Any], kind: str) -> int:
    """How many devices dcgm-exporter attaches to the pod: N whole GPUs, else one."""
    limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
    if kind == Kind.FULL:
        try:
            return max(int(str(limits.get(GPU, "1"))), 1)
        except ValueError:
            return 1
    return 1


class SimulatedDCGM:
    """Every ``step`` seconds, reports each Running pod that holds a GPU offering on the
    dcgm-exporter stand-in, and removes pods that are gone (their series go stale).

    The notebooks here never touch a GPU, so engine activity and utilisation are 0 and
    each holds ``memory_mib`` of GPU memory while it runs: an idle notebook holding
    memory, exactly what the GPU culler is for. ``active`` lists pod names to report
    as busy instead (engine active 0.7, utilisation 70 %).
    """

    def __init__(self, kube: Any, standin: DcgmStandIn, step: float = 1.0, memory_mib: int = 1536):
        self.kube = kube
        self.standin = standin
        self.step = step
        self.memory_mib = memory_mib
        self.active: set[str] = set()
        self.template = reference_labels("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        self._thread = threading.Thread(target=self._run, name="simulated-dcgm", daemon=True)
        self._stop = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scrape()
            except Exception:  # the API server may be restarting: try again next step
                pass
            self._stop.wait(self.step)

    def scrape(self) -> int:
        """Report one row per device of each GPU notebook pod; forget pods that are gone."""
        pods = self.kube.request("GET", f"/api/v1/pods?labelSelector={LABEL_KIND}")["items"]
        live: set[str] = set()
        for pod in pods:
            kind = pod["metadata"].get("labels", {}).get(LABEL_KIND)
            if kind not in GPU_KINDS or pod.get("status", {}).get("phase") != "Running":
                continue
            name = pod["metadata"]["name"]
            busy = name in self.active
            for index in range(devices(pod, kind)):
                key = f"{pod['metadata']['namespace']}/{name}/{index}"
                live.add(key)
                # GPU_UTIL reads 0 on MIG instances, busy or not, as dcgm-exporter reports it.
                self.standin.set(
                    key,
                    dcgm_labels(pod, self.template, index),
                    engine=0.7 if busy else 0.0,
                    util=70.0 if busy and kind != Kind.MIG else 0.0,
                    fb_used=float(self.memory_mib),
                )
        for key in self.standin.keys():
            if key not in live:
                self.standin.remove(key)
        return len(live)
