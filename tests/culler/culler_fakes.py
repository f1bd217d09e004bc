"""Test doubles for the culler's tests: a tiny time-series store that evaluates
the PromQL subset the culler's query uses with Prometheus' semantics, a fake
Prometheus HTTP server answering in Prometheus' exact JSON shape, a fault-
injecting proxy for the hub API, and a parser of the dcgm-exporter scrapes in
tests/culler/data/ (the source of truth for label names and formats)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.httpserver import HTTPServer

DATA = Path(__file__).parent / "data"

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


def reference(name: str) -> list[tuple[str, dict[str, str], float]]:
    return parse_exposition((DATA / name).read_text())


H100_MIG = "dcgm-exporter-issue512-h100-mig-k8s.txt"
SHARED_A100 = "dcgm-exporter-pr432-shared-gpu-identical-values.txt"
MIXED_LOWER = "dcgm-exporter-pr736-mixed-node-mig-lowercase-hostname.txt"
A100_DOCS = "dcgm-nvidia-docs-a100-mig.txt"


def template(file: str, metric: str, index: int = 0) -> dict[str, str]:
    """The labels of the index-th `metric` row of a reference scrape."""
    rows = [labels for name, labels, _ in reference(file) if name == metric]
    return dict(rows[index])


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
# a fake Prometheus and a faulty hub
# --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _PromQuery(web.RequestHandler):
    def initialize(self, fake: "FakePrometheus") -> None:
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


class _Forward(web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "POST", "DELETE", "PATCH", "PUT")

    def initialize(self, proxy: "FaultyProxy") -> None:
        self.proxy = proxy

    async def _forward(self) -> None:
        p = self.proxy
        p.requests.append((self.request.method, self.request.uri))
        mode = p.mode
        if mode == "fail":
            self.set_status(503)
            self.finish({"status": 503, "message": "injected failure"})
            return
        if mode == "slow":
            await asyncio.sleep(p.slow_s)
        if mode == "flaky" and p.flaky_left > 0:
            p.flaky_left -= 1
            self.set_status(502)
            self.finish({"status": 502, "message": "injected flake"})
            return
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() != "host"}
        req = HTTPRequest(
            p.target + self.request.uri,
            method=self.request.method,
            headers=headers,
            body=self.request.body or None,
            allow_nonstandard_methods=True,
            request_timeout=120,
            follow_redirects=False,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            resp = e.response
            if resp is None:
                raise web.HTTPError(502) from e
        self.set_status(resp.code)
        for k in ("Content-Type",):
            if k in resp.headers:
                self.set_header(k, resp.headers[k])
        self.finish(resp.body)

    async def get(self, *a) -> None:
        await self._forward()

    post = delete = patch = put = get


class FaultyProxy:
    """A reverse proxy in front of the hub API that can fail, flake or be slow.
    mode: "ok", "fail" (503 always), "flaky" (502 for `flaky_left` requests),
    "slow" (sleeps slow_s first)."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.mode = "ok"
        self.slow_s = 30.0
        self.flaky_left = 0
        self.requests: list[tuple[str, str]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: HTTPServer | None = None

    def start(self) -> None:
        self._server = HTTPServer(web.Application([(r"(.*)", _Forward, {"proxy": self})]))
        self._server.listen(self.port, "127.0.0.1")

    def stop(self) -> None:
        if self._server:
            self._server.stop()
