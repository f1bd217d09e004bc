"""GPU telemetry for the culler's tests: the real Prometheus scraping dcgm-exporter
stand-ins every second.

Two stand-ins, as an admin's Prometheus sees dcgm-exporter:

* ``direct``: scraped with honor_labels (the GPU operator's ServiceMonitor default),
  so the exporter's ``pod``/``namespace``/``container`` labels stay as they are;
* ``service``: scraped as a target that has pod labels of its own (a ServiceMonitor
  without honorLabels): Prometheus itself renames the exporter's labels to
  ``exported_pod``/``exported_namespace``/``exported_container``.

The culler is pointed at :attr:`Telemetry.url`, a :class:`FaultyProxy` in front of
Prometheus, so a test can make Prometheus answer 503 ("down") or hang ("slow").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpuspawner.culler.gpu_metrics import GpuView, parse_query_response
from gpuspawner.culler.gpu_query import GpuQuerySettings, build_query
from gpuspawner.devcluster.dcgmstandin import DcgmStandIn
from gpuspawner.devcluster.prometheus import Prometheus, ScrapeJob
from tests.culler.culler_fakes import FaultyProxy

#: the labels Prometheus gives a dcgm-exporter pod it scrapes through a Service
EXPORTER_TARGET = {"pod": "nvidia-dcgm-exporter-7xk2p", "namespace": "gpu-operator", "container": "nvidia-dcgm-exporter"}


class Telemetry:
    def __init__(self, tmp: Path, extra_jobs: tuple[ScrapeJob, ...] = ()) -> None:
        tmp = Path(tmp)
        self.direct = DcgmStandIn(access_log=tmp / "dcgm-direct.access.log")
        self.service = DcgmStandIn(access_log=tmp / "dcgm-service.access.log")
        self.prom = Prometheus(
            tmp / "prometheus",
            [
                ScrapeJob("dcgm-exporter", [self.direct.target]),
                ScrapeJob("nvidia-dcgm-exporter", [self.service.target], honor_labels=False, labels=EXPORTER_TARGET),
                *extra_jobs,
            ],
        )
        self.faulty: FaultyProxy | None = None

    def start(self) -> Telemetry:
        self.direct.start()
        self.service.start()
        self.prom.start()
        return self

    def start_proxy(self) -> None:
        """The fault-injecting proxy (needs a running tornado/asyncio loop)."""
        self.faulty = FaultyProxy(self.prom.url)
        self.faulty.start()

    def stop(self) -> None:
        if self.faulty is not None:
            self.faulty.stop()
        self.prom.stop()
        self.direct.stop()
        self.service.stop()

    @property
    def url(self) -> str:
        """What the culler is pointed at: the proxy if there is one, else Prometheus."""
        return self.faulty.url if self.faulty is not None else self.prom.url

    @property
    def mode(self) -> str:
        return self.faulty.mode if self.faulty else "ok"

    @mode.setter
    def mode(self, value: str) -> None:
        assert self.faulty is not None, "start_proxy() first"
        self.faulty.mode = value

    # ------------------------------------------------------------------ devices
    def put(self, key: str, labels: Mapping[str, str], *, exported: bool = False, **values: float | None) -> None:
        """Report one device (engine=, util=, fb_used=, fb_free=) from the next scrape on.
        ``exported``: through the Service-scraped exporter (exported_pod labels)."""
        (self.service if exported else self.direct).set(key, labels, **values)
        (self.direct if exported else self.service).remove(key)

    def remove_pod(self, pod: str) -> None:
        for standin in (self.direct, self.service):
            standin.remove_where(pod=pod)

    def settle(self, scrapes: int = 2) -> None:
        """Wait until both stand-ins have been scraped ``scrapes`` times from now."""
        for job in ("dcgm-exporter", "nvidia-dcgm-exporter"):
            self.prom.wait_scrapes(job, scrapes)

    def view(self, settings: GpuQuerySettings, at: float | None = None) -> GpuView:
        """The culler's GPU view from the real Prometheus (its exact query and parser)."""
        query = build_query(settings)
        if at is None:
            return parse_query_response(self.prom.raw_query(query), settings)
        return parse_query_response(
            {"status": "success", "data": {"resultType": "vector", "result": self.prom.query(query, at=at)}}, settings
        )

    def wait_view(self, settings: GpuQuerySettings, ready, what: str, timeout: float = 90.0) -> GpuView:
        """Poll the view until ``ready(view)``: e.g. until enough samples are in the window."""
        return self.prom.wait_for(lambda: (lambda v: v if ready(v) else None)(self.view(settings)), what, timeout)


def pod_labels(template: Mapping[str, str], pod: str, namespace: str, **extra: str) -> dict[str, str]:
    """A reference row's labels for another pod (the label order kept)."""
    labels = dict(template)
    labels.update(pod=pod, namespace=namespace, **extra)
    labels.setdefault("container", "notebook")
    return labels


async def user_gpu(prom: Telemetry, user: str, shared: bool, engine: float, fb: float | None = None) -> None:
    """dcgm-exporter's rows for ``jupyter-<user>`` in namespace jhub -- a time-sliced
    share of an A100 (``shared``) or a whole A100 (no vgpu label), a GPU of its own
    (``UUID`` GPU-<user>) -- and a wait until the real Prometheus has enough samples
    of them for the culler's query."""
    import asyncio

    from gpuspawner.culler.gpu_query import FB_USED
    from tests.culler.culler_fakes import SHARED_A100, template

    if shared:
        labels = template(SHARED_A100, FB_USED, 1)
    else:
        labels = {k: v for k, v in template(SHARED_A100, FB_USED, 0).items() if k != "vgpu"}
    labels.update(pod=f"jupyter-{user}", namespace="jhub", container="notebook", UUID=f"GPU-{user}")
    prom.put(f"jupyter-{user}", labels, engine=engine, fb_used=fb)
    state = "active" if engine > GpuQuerySettings().engine_threshold else "idle"

    def ready(view: GpuView) -> bool:
        pod = view.for_pod("jhub", f"jupyter-{user}")
        return pod.state == state and pod.memory_mib == fb

    await asyncio.to_thread(prom.wait_view, GpuQuerySettings(), ready, f"{user}'s GPU {state}, {fb} MiB")
