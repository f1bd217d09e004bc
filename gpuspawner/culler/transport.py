"""HTTP with bounded concurrency, time-outs and retries with backoff.

One :class:`Transport` per target (hub, single-user servers, Prometheus), so that a
slow target cannot starve the others, errors are counted by source, and a
credential set on one target's transport is never sent to another. Redirects are
never followed: a notebook pod (which its user controls) must not be able to
bounce a request, and the credential on it, somewhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse

from gpuspawner.culler.cullmetrics import CullerMetrics

#: so that a pod's or the hub's logs say who asked
USER_AGENT = "gpuspawner-culler"


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one request: ``attempts`` tries in all, exponential backoff
    from ``base_delay`` up to ``max_delay`` seconds, with jitter."""

    attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 10.0
    request_timeout: float = 20.0
    connect_timeout: float = 10.0

    def delay(self, attempt: int) -> float:
        d = min(self.max_delay, self.base_delay * float(2**attempt))  # (int ** int is typed Any)
        return d * random.uniform(0.5, 1.0)


class RequestFailed(Exception):
    """A request failed after its retries; ``code`` is the last HTTP code
    (599 for a connection error or time-out)."""

    def __init__(self, source: str, method: str, url: str, code: int, message: str):
        self.source, self.method, self.url, self.code = source, method, url, code
        base, sep, query = url.partition("?")
        shown = base + (sep + query if len(query) <= 60 else "?...")
        super().__init__(f"{source}: {method} {shown} failed ({code}): {message}")


def _retryable(code: int) -> bool:
    return code == 599 or code == 429 or code >= 500


class Transport:
    """Bounded, retrying JSON-over-HTTP for one target."""

    def __init__(
        self,
        source: str,
        *,
        concurrency: int,
        retry: RetryPolicy,
        metrics: CullerMetrics,
        log: logging.Logger,
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.source = source
        self.retry = retry
        self.metrics = metrics
        self.log = log
        self.headers = dict(headers or {})
        self.ssl_context = ssl_context
        self._sem = asyncio.Semaphore(max(1, concurrency))
        # our own semaphore bounds what is in flight; the client's own queue would
        # time requests out while they wait, so it is made larger than the semaphore
        self._client = AsyncHTTPClient(force_instance=True, max_clients=max(1, concurrency) + 2)

    def close(self) -> None:
        self._client.close()

    async def fetch(
        self,
        url: str,
        method: str = "GET",
        *,
        body: str | None = None,
        headers: dict[str, str] | None = None,
        retry_if: Callable[[int], bool] = _retryable,
        attempts: int | None = None,
    ) -> HTTPResponse:
        """Fetch with retries; raise :class:`RequestFailed` when they are spent.

        A non-retryable HTTP error (e.g. 403, 404) is raised at once.
        """
        hdrs = {**self.headers, **(headers or {})}
        tries = attempts or self.retry.attempts
        last_code, last_msg = 599, "not tried"
        for attempt in range(tries):
            req = HTTPRequest(
                url,
                method=method,
                headers=hdrs,
                body=body,
                allow_nonstandard_methods=True,
                request_timeout=self.retry.request_timeout,
                connect_timeout=self.retry.connect_timeout,
                ssl_options=self.ssl_context,
                follow_redirects=False,
                user_agent=USER_AGENT,
            )
            self.metrics.requests.labels(self.source).inc()
            try:
                async with self._sem:
                    return await self._client.fetch(req)
            except HTTPClientError as e:
                last_code, last_msg = e.code, _message(e)
                if 300 <= e.code < 400:
                    where = e.response.headers.get("Location", "?") if e.response else "?"
                    last_msg = f"redirect to {where} not followed"
            except (TimeoutError, OSError) as e:
                last_code, last_msg = 599, f"{type(e).__name__}: {e}"
            if not retry_if(last_code) or attempt == tries - 1:
                break
            delay = self.retry.delay(attempt)
            self.log.warning(
                "%s %s %s failed (%s: %s); retry %d/%d in %.1fs",
                self.source,
                method,
                url,
                last_code,
                last_msg,
                attempt + 1,
                tries - 1,
                delay,
            )
            await asyncio.sleep(delay)
        raise RequestFailed(self.source, method, url, last_code, last_msg)

    async def fetch_json(self, url: str, method: str = "GET", **kw: Any) -> Any:
        resp = await self.fetch(url, method, **kw)
        if not resp.body:
            return None
        try:
            return json.loads(resp.body.decode("utf8", "replace"))
        except ValueError as e:
            raise RequestFailed(self.source, method, url, resp.code, f"bad JSON: {e}") from e


def _message(e: HTTPClientError) -> str:
    msg = e.message or ""
    if e.response is not None and e.response.body:
        try:
            detail = json.loads(e.response.body.decode("utf8", "replace"))
            if isinstance(detail, dict):
                # the hub says "message"; Prometheus says "error"
                text = detail.get("message") or detail.get("error")
                if text:
                    msg = f"{msg}: {text}"
        except ValueError:
            pass
    return msg
