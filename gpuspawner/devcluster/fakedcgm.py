"""Simulated GPU telemetry for the devcluster: dcgm-exporter samples for the notebook
pods that hold GPUs, served through Prometheus' HTTP query API.

There is no NVIDIA GPU here, so the demo's GPU culler reads this instead of a real
Prometheus scraping a real dcgm-exporter. It speaks the real formats: the label sets
are taken from a real dcgm-exporter scrape shipped beside this file, the values are
dcgm's (``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` ratio, ``DCGM_FI_DEV_GPU_UTIL`` percent,
``DCGM_FI_DEV_FB_USED`` MiB), and answers have Prometheus' ``/api/v1/query`` JSON shape.
:class:`TSDB` evaluates the PromQL subset the culler asks for, with Prometheus'
semantics (``*_over_time`` drops the metric name, ``or`` keeps the left-hand series,
duplicate label sets are an error); the culler's tests use the same store.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado import web
from tornado.httpserver import HTTPServer

from ..nodeclass import GPU, MIG_PREFIX, mig_profile_of
from ..vocabulary import GPU_KINDS, LABEL_KIND, Kind

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


def as_exported(
    labels: dict[str, str],
    exporter_pod: str = "nvidia-dcgm-exporter-7xk2p",
    exporter_ns: str = "gpu-operator",
) -> dict[str, str]:
    """The labels as Prometheus stores them when it scrapes dcgm-exporter through a
    ServiceMonitor without honorLabels: the exporter's pod/namespace labels clash
    with the target's and become exported_pod/exported_namespace."""
    out = dict(labels)
    for k in ("pod", "namespace", "container"):
        if k in out:
            out["exported_" + k] = out.pop(k)
    out.update(
        pod=exporter_pod,
        namespace=exporter_ns,
        container="nvidia-dcgm-exporter",
        job="nvidia-dcgm-exporter",
        instance="10.0.3.7:9400",
    )
    return out


# --------------------------------------------------------------------------
# a time-series store with the PromQL subset the culler asks for
# --------------------------------------------------------------------------
_PART = re.compile(
    r"^label_replace\(\s*(?:(?P<fn>max|count|last)_over_time\()?\s*"
    r"(?P<metric>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<sel>[^}]*)\})?"
    r'(?:\[(?P<w>\d+)s\])?\)?\s*,\s*"(?P<dst>[A-Za-z_]+)"\s*,\s*"(?P<repl>[^"]*)"\s*,'
    r'\s*""\s*,\s*""\s*\)$'
)
_MATCHER = re.compile(
    r'\s*(?P<k>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<v>[^"]*)"\s*,?'
)
LOOKBACK_S = 300.0


class QueryError(ValueError):
    pass


@dataclass
class TSDB:
    series: dict[frozenset, list[tuple[float, float]]] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)

    def add(self, name: str, labels: dict[str, str], t: float, value: float) -> None:
        key = frozenset({**labels, "__name__": name}.items())
        self.series.setdefault(key, []).append((t, value))

    def add_scrapes(
        self,
        name: str,
        labels: dict[str, str],
        values: list[float],
        end: float | None = None,
        step: float = 15.0,
    ) -> None:
        """`values` scraped every `step` seconds, the last one at `end`."""
        end = time.time() if end is None else end
        n = len(values)
        for i, v in enumerate(values):
            self.add(name, labels, end - (n - 1 - i) * step, v)

    def drop(self, **match: str) -> None:
        """Forget every series whose labels include `match` (a pod gone)."""
        for key in list(self.series):
            labels = dict(key)
            if all(labels.get(k) == v for k, v in match.items()):
                del self.series[key]

    def clear(self) -> None:
        self.series.clear()

    @staticmethod
    def _matches(labels: dict[str, str], sel: str) -> bool:
        pos = 0
        sel = sel.strip()
        while pos < len(sel):
            m = _MATCHER.match(sel, pos)
            if not m:
                raise QueryError(f"bad matcher at {sel[pos:]!r}")
            pos = m.end()
            have = labels.get(m["k"], "")
            op, want = m["op"], m["v"]
            ok = {
                "=": have == want,
                "!=": have != want,
                "=~": re.fullmatch(want, have) is not None,
                "!~": re.fullmatch(want, have) is None,
            }[op]
            if not ok:
                return False
        return True

    def _part(self, part: str, now: float) -> list[dict]:
        m = _PART.match(part.strip())
        if not m:
            raise QueryError(f"unsupported expression: {part!r}")
        fn, w = m["fn"], m["w"]
        if fn and not w:
            raise QueryError("range function without a range")
        if w and not fn:
            raise QueryError("range vector where an instant vector is expected")
        out = []
        for key, samples in self.series.items():
            labels = dict(key)
            if labels["__name__"] != m["metric"] or not self._matches(labels, m["sel"] or ""):
                continue
            if fn:
                lo = now - float(w)
                vals = [v for t, v in samples if lo < t <= now]
                if not vals:
                    continue
                value = {"max": max(vals), "count": float(len(vals)), "last": vals[-1]}[fn]
                del labels["__name__"]  # *_over_time drops the metric name
            else:
                vals = [v for t, v in samples if now - LOOKBACK_S < t <= now]
                if not vals:
                    continue
                value = vals[-1]
            labels[m["dst"]] = m["repl"]
            out.append({"metric": labels, "value": [now, _fmt(value)]})
        # Prometheus refuses a vector with duplicate label sets
        seen = set()
        for item in out:
            k = frozenset(item["metric"].items())
            if k in seen:
                raise QueryError("vector cannot contain metrics with the same labelset")
            seen.add(k)
        return out

    def evaluate(self, query: str, now: float | None = None) -> dict:
        """Prometheus' /api/v1/query JSON for `query` (the subset: parts joined by `or`)."""
        now = time.time() if now is None else now
        self.queries.append(query)
        try:
            result: list[dict] = []
            seen: set[frozenset] = set()
            for part in query.split(" or "):
                for item in self._part(part, now):
                    k = frozenset(item["metric"].items())
                    if k in seen:  # `or` keeps the left-hand series
                        continue
                    seen.add(k)
                    result.append(item)
        except QueryError as e:
            return {"status": "error", "errorType": "bad_data", "error": str(e)}
        return {"status": "success", "data": {"resultType": "vector", "result": result}}


def _fmt(v: float) -> str:
    if v != v:
        return "NaN"
    return repr(float(v)) if v != int(v) else str(int(v))


# --------------------------------------------------------------------------
# a fake Prometheus
# --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _PromQuery(web.RequestHandler):
    def initialize(self, fake: FakePrometheus) -> None:
        self.fake = fake

    async def _answer(self) -> None:
        fake = self.fake
        fake.requests += 1
        if fake.mode == "down":
            raise web.HTTPError(503)
        if fake.mode == "slow":
            await asyncio.sleep(fake.slow_s)
        query = self.get_argument("query")
        body = fake.tsdb.evaluate(query)
        if body["status"] != "success":
            self.set_status(400)
        self.finish(body)

    async def get(self) -> None:
        await self._answer()

    async def post(self) -> None:
        await self._answer()


class FakePrometheus:
    """Answers /api/v1/query from a TSDB, in Prometheus' JSON shape.
    mode: "ok", "down" (503), "slow" (sleeps slow_s first), "refuse" (not listening)."""

    def __init__(self) -> None:
        self.tsdb = TSDB()
        self.mode = "ok"
        self.slow_s = 30.0
        self.requests = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: HTTPServer | None = None

    def start(self) -> None:
        app = web.Application([(r"/api/v1/query", _PromQuery, {"fake": self})])
        self._server = HTTPServer(app)
        self._server.listen(self.port, "127.0.0.1")

    def stop(self) -> None:
        if self._server:
            self._server.stop()
            self._server = None


# --------------------------------------------------------------------------
# the demo's telemetry: samples for the notebook pods that hold GPUs
# --------------------------------------------------------------------------


def _template(metric: str) -> dict[str, str]:
    """Labels of a real dcgm-exporter row (an H100 MIG instance attached to a pod)."""
    for name, labels, _ in parse_exposition(SCRAPE.read_text()):
        if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" and "pod" in labels:
            return dict(labels)
    raise ValueError(f"{SCRAPE} has no {metric} row with pod labels")


def dcgm_labels(pod: dict[str, Any], template: dict[str, str], index: int) -> dict[str, str]:
    """dcgm-exporter's labels for one device of ``pod`` (the MIG labels only for MIG pods)."""
    meta, spec = pod["metadata"], pod["spec"]
    labels = {k: v for k, v in template.items() if k not in ("GPU_I_PROFILE", "GPU_I_ID")}
    labels.update(
        gpu=str(index), UUID=f"GPU-{meta['uid'][:8]}-{index:04d}", Hostname=spec.get("nodeName", ""),
        pod=meta["name"], namespace=meta["namespace"], container=spec["containers"][0]["name"],
    )
    limits = (spec["containers"][0].get("resources") or {}).get("limits") or {}
    profiles = [mig_profile_of(k) for k in limits if k.startswith(MIG_PREFIX)]
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
    """Every ``step`` seconds, one scrape for each Running pod that holds a GPU offering.

    The notebooks here never touch a GPU, so engine activity and utilisation are 0 and
    each holds ``memory_mib`` of GPU memory while it runs: an idle notebook holding
    memory, exactly what the GPU culler is for. ``active`` lists pod names to report
    as busy instead (engine active 0.7, utilisation 70 %).
    """

    def __init__(self, kube: Any, step: float = 15.0, memory_mib: int = 1536):
        self.kube = kube
        self.step = step
        self.memory_mib = memory_mib
        self.active: set[str] = set()
        self.prometheus = FakePrometheus()
        self.template = _template("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="simulated-dcgm", daemon=True)
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        return self.prometheus.url

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.prometheus.start()
        self._loop.call_soon(self._tick)
        self._loop.run_forever()
        self.prometheus.stop()
        self._loop.close()

    def _tick(self) -> None:
        if self._stop.is_set():
            return
        try:
            self.scrape()
        except Exception:  # the API server may be restarting: skip this scrape
            pass
        self._loop.call_later(self.step, self._tick)

    def scrape(self, now: float | None = None) -> int:
        """Add one sample per device of each GPU notebook pod; forget pods that are gone."""
        now = time.time() if now is None else now
        pods = self.kube.request("GET", f"/api/v1/pods?labelSelector={LABEL_KIND}")["items"]
        live = set()
        for pod in pods:
            kind = pod["metadata"].get("labels", {}).get(LABEL_KIND)
            if kind not in GPU_KINDS or pod.get("status", {}).get("phase") != "Running":
                continue
            live.add(pod["metadata"]["name"])
            busy = pod["metadata"]["name"] in self.active
            for index in range(devices(pod, kind)):
                labels = dcgm_labels(pod, self.template, index)
                self.prometheus.tsdb.add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, now, 0.7 if busy else 0.0)
                self.prometheus.tsdb.add("DCGM_FI_DEV_FB_USED", labels, now, float(self.memory_mib))
                # GPU_UTIL reads 0 on MIG instances, busy or not, as dcgm-exporter reports it.
                self.prometheus.tsdb.add("DCGM_FI_DEV_GPU_UTIL", labels, now, 70.0 if busy and kind != "mig" else 0.0)
        for key in list(self.prometheus.tsdb.series):
            if dict(key).get("pod") not in live:
                del self.prometheus.tsdb.series[key]
        return len(live)
