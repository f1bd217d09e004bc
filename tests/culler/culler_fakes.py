"""Test doubles for the culler's tests: a fault-injecting proxy (in front of the hub
API, or of the real Prometheus), and the dcgm-exporter scrapes in tests/culler/data/
(the source of truth for label names and formats). GPU telemetry itself comes from the
real Prometheus (culler_prom.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.httpserver import HTTPServer

from gpuspawner.devcluster.fakedcgm import parse_exposition
from gpuspawner.devcluster.ports import free_port

DATA = Path(__file__).parent / "data"


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


class _Forward(web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "POST", "DELETE", "PATCH", "PUT")

    def initialize(self, proxy: FaultyProxy) -> None:
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
    """A reverse proxy in front of the hub API or Prometheus that can fail, flake or be slow.
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
