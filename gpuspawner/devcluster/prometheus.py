"""The real Prometheus server for the tests and the demo, run from the devcluster's cache.

The culler's decisions, the dashboard's panels, the alerting rules and
``gpuspawner report`` all rest on PromQL. Only a real Prometheus evaluates it the way
an admin's will (staleness, range windows, label matching, ``absent``), so the tests
and the demo run one: built by ``gpuspawner devcluster build`` (see build.py),
scraping static targets every second, keeping its data in a scratch folder.
"""

from __future__ import annotations

import functools
import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuspawner.devcluster import build
from gpuspawner.devcluster.ports import free_port

#: The chart's recording/alerting rules and Grafana dashboard (loaded by the demo's Prometheus).
MONITORING = Path(__file__).resolve().parents[2] / "charts" / "gpuspawner" / "monitoring"
RULES_FILE = MONITORING / "rules.yaml"
DASHBOARD_FILE = MONITORING / "dashboard.json"


class PrometheusError(RuntimeError):
    """Prometheus could not be started, or refused a query; the message says why."""


@dataclass
class ScrapeJob:
    """One scrape_config with static targets.

    ``honor_labels=False`` with ``labels`` naming pod/namespace/container is how a
    ServiceMonitor scrapes dcgm-exporter through its Service: Prometheus renames the
    exporter's own pod/namespace/container labels to exported_pod/... ."""

    name: str
    targets: list[str]
    metrics_path: str = "/metrics"
    honor_labels: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    #: a bearer token file (e.g. a JupyterHub token with read:metrics)
    token_file: Path | None = None

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "job_name": self.name,
            "metrics_path": self.metrics_path,
            "honor_labels": self.honor_labels,
            "static_configs": [{"targets": list(self.targets), "labels": dict(self.labels)}],
        }
        if self.token_file is not None:
            cfg["authorization"] = {"type": "Bearer", "credentials_file": str(self.token_file)}
        return cfg


class Prometheus:
    """One Prometheus process: config and data in ``directory``, log in ``prometheus.log``."""

    def __init__(
        self,
        directory: Path,
        jobs: Iterable[ScrapeJob],
        rule_files: Iterable[Path] = (),
        scrape_interval: str = "1s",
        port: int | None = None,
        binary: Path | None = None,
        extra_args: Iterable[str] = (),
    ) -> None:
        self.directory = Path(directory)
        self.jobs = list(jobs)
        self.rule_files = [Path(p) for p in rule_files]
        self.scrape_interval = scrape_interval
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.binary = binary
        self.extra_args = list(extra_args)
        self.config_file = self.directory / "prometheus.yml"
        self.log_file = self.directory / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ lifecycle
    def backfill(self, openmetrics: str) -> None:
        """Write ``openmetrics`` (text with timestamps, ending in ``# EOF``) into the data
        folder as blocks with promtool, before :meth:`start`: a known history."""
        if self.proc is not None:
            raise PrometheusError("backfill before start(): Prometheus loads blocks when it starts")
        self.directory.mkdir(parents=True, exist_ok=True)
        source = self.directory / "backfill.om"
        source.write_text(openmetrics)
        proc = subprocess.run(
            [str(build.tool("promtool")), "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.directory / "data")],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise PrometheusError(f"promtool could not backfill {source}: {proc.stderr.strip() or proc.stdout.strip()}")

    def write_config(self) -> None:
        cfg = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [j.config() for j in self.jobs],
        }
        self.config_file.write_text(json.dumps(cfg, indent=1))  # JSON is YAML

    def start(self, timeout: float = 60.0) -> Prometheus:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_config()
        binary = self.binary or build.tool("prometheus")
        cmd = [
            str(binary),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",  # POST /-/reload after add_job()
            "--storage.tsdb.retention.time=15d",
            "--log.level=warn",
            *self.extra_args,
        ]
        with self.log_file.open("ab") as log:
            # In its parent's process group (no session of its own): whatever ends the demo's or
            # the tests' group (Ctrl-C, a test killing the demo) ends Prometheus too, never an orphan.
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}; see {self.log_file}:\n{self.log_tail()}")
            if self._ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise PrometheusError(f"prometheus did not become ready at {self.url} within {timeout:.0f}s; see {self.log_file}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_job(self, job: ScrapeJob) -> None:
        """Scrape one more target from now on (the config is rewritten and reloaded)."""
        self.jobs = [j for j in self.jobs if j.name != job.name] + [job]
        self.write_config()
        self._post("/-/reload")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self) -> str:
        try:
            return self.log_file.read_text()[-3000:]
        except OSError:
            return ""

    def _post(self, path: str) -> None:
        req = urllib.request.Request(f"{self.url}{path}", method="POST", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"POST {path}: {exc.code} {exc.read().decode(errors='replace')}") from exc

    # ------------------------------------------------------------------ queries
    def api(self, path: str, params: Mapping[str, Any]) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer, else PrometheusError."""
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            raise PrometheusError(f"{path} {dict(params)}: {body.get('errorType')}: {body.get('error')}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise PrometheusError(f"cannot reach prometheus at {self.url}: {exc}") from exc
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result list (vector or scalar as a one-item list)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self.api("query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query_range", {"query": expr, "start": start, "end": end, "step": step})["result"]
        return result

    def raw_query(self, expr: str) -> dict[str, Any]:
        """Prometheus' whole /api/v1/query JSON answer, errors included (what the culler reads)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                answer: dict[str, Any] = json.load(resp)
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read() or b"{}")
        return answer

    def wait_for(self, check: Callable[[], Any], what: str, timeout: float = 90.0, every: float = 0.25) -> Any:
        """Poll ``check()`` until it returns something truthy (and return it). A wait for a
        condition, not a timing assertion: ``timeout`` only bounds a broken setup."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except PrometheusError as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(every)
        raise PrometheusError(f"waited {timeout:.0f}s for {what}; last answer: {last!r}; log: {self.log_tail()[-800:]}")

    def scraped_after(self, job: str, after: float) -> bool:
        """True once every target of ``job`` has been scraped (successfully) since ``after``."""
        targets = self.api("targets", {"state": "active"})["activeTargets"]
        mine = [t for t in targets if t["labels"].get("job") == job]
        if not mine:
            return False
        for t in mine:
            last = t.get("lastScrape", "")
            if t.get("health") != "up" or not last or _parse_rfc3339(last) <= after:
                return False
        return True

    def wait_scrapes(self, job: str, n: int = 2, timeout: float = 60.0) -> None:
        """Wait until every target of ``job`` has been scraped ``n`` times from now: what a
        stand-in reports now is then in Prometheus, and the previous state is superseded."""
        for _ in range(n):
            since = time.time()
            self.wait_for(functools.partial(self.scraped_after, job, since), f"a scrape of job {job!r}", timeout)


def _parse_rfc3339(text: str) -> float:
    """Prometheus' RFC 3339 times (nanoseconds, "Z") as Unix seconds."""
    from datetime import datetime

    text = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))
    return datetime.fromisoformat(text).timestamp()
