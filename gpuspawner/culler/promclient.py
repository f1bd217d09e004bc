"""The GPU view's one HTTP request per cycle to Prometheus (or any server of its
HTTP API: Thanos, Mimir, VictoriaMetrics)."""

from __future__ import annotations

from urllib.parse import urlencode

from gpuspawner.culler.gpu_metrics import GpuView, parse_query_response, unavailable
from gpuspawner.culler.gpu_query import GpuQuerySettings, build_query
from gpuspawner.culler.transport import RequestFailed, Transport


class PrometheusClient:
    def __init__(self, url: str, settings: GpuQuerySettings, transport: Transport) -> None:
        self.url = url.rstrip("/")
        self.settings = settings
        self.transport = transport
        self.query = build_query(settings)

    async def gpu_view(self) -> GpuView:
        """One instant query (retried with backoff on failure); never raises.

        No ``time`` parameter: Prometheus evaluates at its own "now".
        """
        url = f"{self.url}/api/v1/query?" + urlencode({"query": self.query})
        try:
            body = await self.transport.fetch_json(url)
        except RequestFailed as e:
            # a 4xx with Prometheus' own error JSON still says why
            return unavailable(str(e), self.settings.window_s)
        return parse_query_response(body, self.settings)
