"""A dcgm-exporter stand-in: the exporter's ``/metrics`` for GPUs that are not here.

There is no NVIDIA GPU on the machines that run the tests and the demo, so nothing can
run the real dcgm-exporter. This serves what it would: Prometheus' text exposition
with dcgm-exporter's metric names, HELP/TYPE lines and value formats
(``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` ratio printed ``%f``, ``DCGM_FI_DEV_GPU_UTIL``
percent and ``DCGM_FI_DEV_FB_USED``/``FB_FREE`` MiB printed as integers), one row per
device with the labels the caller gives, in the caller's order (take them from a real
scrape: tests/culler/data/ and ``dcgm-exporter-h100-mig.txt`` hold some). A real
Prometheus scrapes it; everything downstream (staleness, windows, ``exported_pod``
when scraped as a target with pod labels of its own) is Prometheus' doing.

What a device reports is set by the caller at any time (:meth:`DcgmStandIn.set`):
busy or idle engine, utilisation, GPU memory held. A metric set to ``None`` has no
row, as dcgm-exporter omits ``DCGM_FI_DEV_FB_*`` for H100 MIG instances
(dcgm-exporter issue 512) and PROF metrics on GPUs without profiling support.
Removing a device (a pod that stopped) removes its rows; Prometheus then marks its
series stale at the next scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"

#: (name, HELP text as dcgm-exporter's default-counters.csv words it, printed as float)
FAMILIES = (
    (UTIL, "GPU utilization (in %).", False),
    (FB_FREE, "Framebuffer memory free (in MiB).", False),
    (FB_USED, "Framebuffer memory used (in MiB).", False),
    (ENGINE, "Ratio of time the graphics engine is active.", True),
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Device:
    """One GPU or MIG instance as dcgm-exporter reports it: its labels, and the
    value of each metric (None: no row for that metric)."""

    labels: dict[str, str]
    values: dict[str, float | None] = field(default_factory=dict)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(devices: list[Device]) -> str:
    """The text exposition of ``devices``, family by family as dcgm-exporter writes it."""
    out: list[str] = []
    for name, help_text, is_float in FAMILIES:
        rows = [d for d in devices if d.values.get(name) is not None]
        if not rows:
            continue
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        for d in rows:
            labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in d.labels.items())
            value = float(d.values[name])  # type: ignore[arg-type]
            out.append(f"{name}{{{labels}}} {value:f}" if is_float else f"{name}{{{labels}}} {int(round(value))}")
    return "\n".join(out) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404, "dcgm-exporter serves /metrics only")
            return
        body = render(self.server.standin.snapshot()).encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the scraper gave up (its scrape_timeout): not ours to report
            return
        self.server.standin.scrapes += 1

    def log_message(self, format: str, *args: object) -> None:  # access log: a file, or nowhere
        log = self.server.standin.access_log
        if log is not None:
            with log.open("a") as f:
                f.write(f"{self.log_date_time_string()} {self.address_string()} {format % args}\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    standin: DcgmStandIn


class DcgmStandIn:
    """dcgm-exporter's ``/metrics`` on 127.0.0.1, in a thread of its own.

    Devices are keyed by any string the caller chooses (a pod and GPU index, say)."""

    def __init__(self, access_log: Path | None = None, port: int = 0) -> None:
        self.access_log = access_log
        self.scrapes = 0
        self._devices: dict[str, Device] = {}
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.standin = self
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread: threading.Thread | None = None

    @property
    def target(self) -> str:
        """host:port, as a Prometheus static target."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> DcgmStandIn:
        if self.access_log is not None:
            self.access_log.touch()  # there from the start, for whoever looks for it
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"dcgm-standin-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()

    def set(
        self,
        key: str,
        labels: Mapping[str, str],
        *,
        engine: float | None = None,
        util: float | None = None,
        fb_used: float | None = None,
        fb_free: float | None = None,
    ) -> None:
        """Report ``key``'s device with these labels and values from the next scrape on."""
        values = {ENGINE: engine, UTIL: util, FB_USED: fb_used, FB_FREE: fb_free}
        with self._lock:
            self._devices[key] = Device(dict(labels), values)

    def remove(self, key: str) -> None:
        with self._lock:
            self._devices.pop(key, None)

    def remove_where(self, **match: str) -> int:
        """Remove every device whose labels include ``match`` (e.g. ``pod="jupyter-ann"``)."""
        with self._lock:
            gone = [k for k, d in self._devices.items() if all(d.labels.get(a) == b for a, b in match.items())]
            for k in gone:
                del self._devices[k]
        return len(gone)

    def clear(self) -> None:
        with self._lock:
            self._devices.clear()

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._devices)

    def snapshot(self) -> list[Device]:
        with self._lock:
            return [Device(dict(d.labels), dict(d.values)) for d in self._devices.values()]
