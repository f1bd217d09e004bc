"""Prometheus metrics of the culler itself, and a tiny tornado app that serves them."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from tornado import web

from gpuspawner.culler.records import GPU_IDLE_LIMIT, GPU_LEASE, IDLE, MAX_AGE, UNRESPONSIVE
from gpuspawner.names.vocabulary import Kind

PREFIX = "gpuspawner_culler"


class CullerMetrics:
    """All of the culler's metrics, in a registry of its own (one per culler)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.server_stops = Counter(
            f"{PREFIX}_server_stops",
            "Servers stopped by the culler, by reason (idle, max_age) and offering kind",
            ["reason", "kind"],
            registry=r,
        )
        self.kernel_shutdowns = Counter(
            f"{PREFIX}_kernel_shutdowns",
            "Kernels shut down by the culler, by reason and offering kind",
            ["reason", "kind"],
            registry=r,
        )
        self.memory_reclaimed = Counter(
            f"{PREFIX}_gpu_memory_reclaimed_mib",
            "GPU memory reclaimed (MiB): held by a stopped server's pod, or the drop seen by dcgm-exporter after kernels were shut down",
            ["action", "kind"],
            registry=r,
        )
        self.decisions = Counter(
            f"{PREFIX}_decisions",
            "Per-server decisions made (stop, reclaim, keep, held_back), dry runs included",
            ["decision", "kind", "dry_run"],
            registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_errors",
            "Errors after retries, by source (hub, server, prometheus, culler; stall: a pod kept a cycle past its server deadline)",
            ["source"],
            registry=r,
        )
        self.requests = Counter(
            f"{PREFIX}_requests",
            "HTTP requests made, by target (hub, server, prometheus), retries included",
            ["target"],
            registry=r,
        )
        self.server_tokens = Counter(
            f"{PREFIX}_server_tokens",
            "Per-server tokens (owned by the server's user, for its kernel view) minted and revoked through the hub",
            ["action"],
            registry=r,
        )
        self.cycle_duration = Histogram(
            f"{PREFIX}_cycle_duration_seconds",
            "Duration of one culling cycle",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf")),
            registry=r,
        )
        self.gpu_view_up = Gauge(
            f"{PREFIX}_gpu_view_up",
            "1 if the last cycle had a GPU view from Prometheus, else 0",
            registry=r,
        )
        self.servers = Gauge(
            f"{PREFIX}_servers",
            "Running servers seen in the last cycle, by offering kind",
            ["kind"],
            registry=r,
        )
        self.last_cycle = Gauge(
            f"{PREFIX}_last_cycle_timestamp_seconds",
            "Unix time at which the last cycle ended",
            registry=r,
        )
        for source in ("hub", "server", "prometheus", "culler"):
            self.errors.labels(source)
        for target in ("hub", "server", "prometheus"):
            self.requests.labels(target)
        for action in ("minted", "revoked"):
            self.server_tokens.labels(action)
        # Every kind's stop, shutdown and reclaim counters exist from the start at 0, so that
        # Prometheus' increase()/rate() see the first one (a series born at 1 shows no increase).
        for kind in (k.value for k in Kind):
            for reason in (IDLE, MAX_AGE, GPU_IDLE_LIMIT, GPU_LEASE, UNRESPONSIVE):
                self.server_stops.labels(reason, kind)
            self.kernel_shutdowns.labels(IDLE, kind)
            for action in ("server_stop", "kernel_shutdown"):
                self.memory_reclaimed.labels(action, kind)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of a sample (0 if absent); for tests and the bench."""
        v = self.registry.get_sample_value(name, labels or {})
        return v or 0.0

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsHandler(web.RequestHandler):
    def initialize(self, metrics: CullerMetrics) -> None:
        self.metrics = metrics

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.write(self.metrics.exposition())
