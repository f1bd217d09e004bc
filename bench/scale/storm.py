"""The storm: hundreds of users pressing Start within a minute while others keep loading the spawn
page, measured from outside the hub as users see it.

Everything here speaks HTTP to the real hub (aiohttp; a browser's cookies and ``_xsrf`` for the
form, a service token for the REST API) or watches the real API server; times are
``time.monotonic()``, one clock for every thread of this process.
"""

from __future__ import annotations

import asyncio
import html
import http.client
import json
import random
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import quote, urljoin, urlparse

import aiohttp

from bench.scale.hubs import Choice
from gpuspawner.devcluster.clusterstate import ClusterState


@dataclass
class Spawn:
    """One user's press of Start, and what became of it."""

    user: str
    channel: str  # api | form
    choice: Choice
    sent: float = 0.0
    answered: float = 0.0  # the POST's answer
    status: int = 0
    done: float = 0.0  # ready, or refused/failed as the user is told
    outcome: str = ""  # ready | refused | failed | lost
    reason: str = ""
    bound: float = 0.0  # the pod's node was set (the bench's own watch)
    throttled: int = 0  # times JupyterHub answered 429 (its concurrent spawn limit) and was asked again

    @property
    def to_bound(self) -> float | None:
        return self.bound - self.sent if self.bound else None


@dataclass
class PageLoads:
    times: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


def form_error(page: str) -> str:
    """The refusal a re-rendered spawn form shows (JupyterHub's error block, or our card's)."""
    match = re.search(r'class="[^"]*(?:spawn-error-msg|alert-danger|gs-refusal)[^"]*"[^>]*>(.*?)</(?:p|div)>', page, re.S)
    text = match.group(1) if match else page[:200]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())[:300]


class Hub:
    """The hub under test, as the benchmark talks to it."""

    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self.token = token
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            headers={"Authorization": f"token {token}"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )
        self.browsers: dict[str, Browser] = {}

    async def close(self) -> None:
        for browser in self.browsers.values():
            await browser.session.close()
        await self.session.close()

    async def api(self, method: str, path: str, body=None, timeout: float = 120) -> tuple[int, object]:
        async with self.session.request(
            method, f"{self.url}/hub/api{path}", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text

    async def wait_up(self, timeout: float = 300, proc=None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the hub exited with {proc.returncode}")
            try:
                status, _ = await self.api("GET", "/", timeout=5)
                if status == 200:
                    return
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.5)
        raise RuntimeError(f"the hub at {self.url} did not answer within {timeout:.0f}s")

    async def create_users(self, names: list[str], batch: int = 500) -> None:
        for i in range(0, len(names), batch):
            status, body = await self.api("POST", "/users", {"usernames": names[i : i + batch]}, timeout=600)
            if status not in (201, 409):
                raise RuntimeError(f"creating users: HTTP {status} {str(body)[:300]}")

    async def metrics(self, tries: int = 5) -> str:
        """The hub's /hub/metrics (asked again after a broken connection: a loaded proxy may reset one)."""
        for attempt in range(tries):
            try:
                async with self.session.get(f"{self.url}/hub/metrics", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    return await resp.text()
            except (TimeoutError, aiohttp.ClientError):
                if attempt == tries - 1:
                    raise
                await asyncio.sleep(1)
        return ""

    async def browser(self, user: str) -> Browser:
        if user not in self.browsers:
            browser = Browser(self.url, user)
            await browser.login()
            self.browsers[user] = browser
        return self.browsers[user]


class Browser:
    """One user's browser: logged in with the dummy authenticator, cookies and ``_xsrf`` kept."""

    def __init__(self, url: str, user: str):
        self.url, self.user = url, user
        self.session = aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            connector=aiohttp.TCPConnector(limit=4),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )
        self.action = ""

    def xsrf(self) -> str:
        return next((c.value for c in self.session.cookie_jar if c.key == "_xsrf"), "")

    async def login(self) -> None:
        async with self.session.get(f"{self.url}/hub/login") as resp:
            await resp.read()
        data = {"username": self.user, "password": "bench", "_xsrf": self.xsrf()}
        async with self.session.post(f"{self.url}/hub/login", data=data, allow_redirects=False) as resp:
            await resp.read()
            if resp.status != 302:
                raise RuntimeError(f"login as {self.user}: HTTP {resp.status}")

    @property
    def spawn_path(self) -> str:
        return f"/hub/spawn/{quote(self.user)}"

    async def load_form(self) -> tuple[int, str]:
        async with self.session.get(f"{self.url}{self.spawn_path}", allow_redirects=False) as resp:
            page = await resp.text()
        match = re.search(r'<form[^>]*id="spawn_form"[^>]*action="([^"]*)"', page)
        if match:
            self.action = urljoin(f"{self.url}{self.spawn_path}", html.unescape(match.group(1)))
        return resp.status, page

    async def submit(self, fields: dict) -> tuple[int, str, str]:
        """POST the form as spawn.html does (multipart); (status, Location, page)."""
        form = aiohttp.FormData()
        for key, value in fields.items():
            form.add_field(key, str(value))
        async with self.session.post(self.action, data=form, allow_redirects=False) as resp:
            return resp.status, resp.headers.get("Location", ""), await resp.text()


async def follow_progress(hub: Hub, session: aiohttp.ClientSession, user: str, timeout: float, xsrf: str = "") -> tuple[str, str]:
    """Read the spawn's progress stream (as the spawn-pending page does, with its ``_xsrf``) to its
    end: (outcome, message). Like the page's EventSource, it connects again when the stream
    breaks (a hub restarting); a stream with no verdict is settled by the user's model."""
    last = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(
                f"{hub.url}/hub/api/users/{quote(user)}/server/progress",
                params={"_xsrf": xsrf} if xsrf else None,
                headers={"Accept": "text/event-stream"},
                timeout=aiohttp.ClientTimeout(total=max(1.0, deadline - time.monotonic())),
            ) as resp:
                if resp.status == 200:
                    async for raw in resp.content:
                        line = raw.decode("utf-8", "replace").strip()
                        if not line.startswith("data:"):
                            continue
                        event = json.loads(line[5:])
                        last = event.get("message") or last
                        if event.get("ready"):
                            return "ready", last
                        if event.get("failed"):
                            return "failed", last
        except TimeoutError:
            break
        except aiohttp.ClientError:
            await asyncio.sleep(1)
            continue
        # No verdict on the stream (it ended, or no spawn is pending): what does the hub say?
        try:
            _, model = await hub.api("GET", f"/users/{quote(user)}", timeout=30)
        except (TimeoutError, aiohttp.ClientError):
            await asyncio.sleep(1)
            continue
        if not isinstance(model, dict):  # the proxy's answer while the hub restarts, not the hub's
            await asyncio.sleep(1)
            continue
        server = ((model or {}).get("servers") or {}).get("") if isinstance(model, dict) else None
        if server and server.get("ready"):
            return "ready", last
        if not server:
            return "stopped", last  # no verdict: the hub dropped the start (a restart); its words are looked up after

        await asyncio.sleep(1)
    return "lost", f"no verdict within {timeout:.0f}s ({last})"


def from_the_proxy(status: int, body) -> bool:
    """An answer of configurable-http-proxy while the hub is away (restarting): a 404 (a new proxy
    without the hub's route yet, its page fetched from the hub's /hub/error/404 once the hub is
    back: the hub itself never answers 404 to a start of a user who exists), or a 502/503 that is
    not the hub's own JSON or page."""
    if status == 404:
        return True
    if status not in (502, 503):
        return False
    text = body if isinstance(body, str) else ""
    return not isinstance(body, dict) and "jupyterhub" not in text.lower()


def throttled(status: int, body) -> float | None:
    """Seconds JupyterHub asks to wait when its concurrent spawn limit is reached (429, "Too many
    users trying to log in right now. Try again in 40 seconds."), else None."""
    text = body.get("message", "") if isinstance(body, dict) else str(body)
    if status != 429 or "Too many users" not in text:
        return None
    match = re.search(r"Try again in (\d+) seconds", text)
    return float(match.group(1)) if match else 30.0


async def retried(call, deadline: float, s: Spawn | None = None):
    """``call()`` again while the hub does not answer (restarting: no connection, or the proxy's
    own error), as a user presses again a second later; and after the wait JupyterHub asks for
    when its concurrent spawn limit is reached, as its page tells the user to."""
    while True:
        pause = 1.0
        try:
            answer = await call()
            wait = throttled(answer[0], answer[-1])
            if wait is not None and s is not None:
                s.throttled += 1
                pause = wait
            elif not from_the_proxy(answer[0], answer[-1]):
                return answer
            if time.monotonic() + pause > deadline:
                return answer
        except aiohttp.ClientConnectionError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(pause)


async def spawn(hub: Hub, s: Spawn, gpu: bool, timeout: float) -> None:
    """Press Start as ``s`` says and follow it to its end."""
    s.sent = time.monotonic()
    deadline = s.sent + timeout
    try:
        if s.channel == "api":
            options = s.choice.gpu_options if gpu else {"profile": s.choice.kube_profile}
            status, body = await retried(lambda: hub.api("POST", f"/users/{quote(s.user)}/server", options, timeout=timeout), deadline, s)
            s.answered, s.status = time.monotonic(), status
            if status == 201:
                s.done, s.outcome = s.answered, "ready"
                return
            if status != 202:
                s.done, s.outcome = s.answered, "refused"
                s.reason = (body.get("message") if isinstance(body, dict) else str(body)) or f"HTTP {status}"
                return
            session, xsrf = hub.session, ""
        else:
            browser = hub.browsers[s.user]
            fields = s.choice.gpu_form if gpu else {"profile": s.choice.kube_profile}
            status, location, page = await retried(lambda: browser.submit(fields), deadline, s)
            s.answered, s.status = time.monotonic(), status
            if status >= 400 or (status == 200 and "spawn_form" in page):
                s.done, s.outcome, s.reason = s.answered, "refused", form_error(page)
                return
            if status == 302 and "/spawn-pending/" not in location:
                s.done, s.outcome = s.answered, "ready"
                return
            session, xsrf = browser.session, browser.xsrf()
        s.outcome, s.reason = await follow_progress(hub, session, s.user, max(1.0, deadline - time.monotonic()), xsrf)
        s.done = time.monotonic()
    except (TimeoutError, aiohttp.ClientError) as exc:
        s.done, s.outcome, s.reason = time.monotonic(), "lost", f"{type(exc).__name__}: {exc}"


async def load_pages(hub: Hub, users: list[str], interval: float, stop: asyncio.Event, out: PageLoads) -> None:
    """Each of ``users`` loads the spawn page every ``interval`` seconds (random phase) until ``stop``."""

    async def one(user: str, phase: float) -> None:
        browser = hub.browsers[user]
        await asyncio.sleep(phase)
        while not stop.is_set():
            started = time.monotonic()
            try:
                status, page = await browser.load_form()
                took = time.monotonic() - started
                if status == 200 and "spawn_form" in page:
                    out.times.append(took)
                else:
                    out.errors[f"HTTP {status}"] = out.errors.get(f"HTTP {status}", 0) + 1
            except (TimeoutError, aiohttp.ClientError) as exc:
                out.errors[type(exc).__name__] = out.errors.get(type(exc).__name__, 0) + 1
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, interval - (time.monotonic() - started)))
            except TimeoutError:
                pass

    rng = random.Random(7)
    await asyncio.gather(*(one(u, rng.uniform(0, interval)) for u in users))


class PodWatch:
    """The bench's own watch of the hub's namespace: when each user's pod got its node."""

    def __init__(self, state: ClusterState, namespace: str):
        self.state, self.namespace = state, namespace
        self.bound: dict[str, float] = {}
        self.pods: dict[str, dict] = {}
        self._stop = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{namespace}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._conn is not None and self._conn.sock is not None:
            try:
                self._conn.sock.shutdown(2)
            except OSError:
                pass
        self._thread.join(timeout=10)

    def _run(self) -> None:
        url = urlparse(self.state.server)
        context = ssl.create_default_context(cafile=str(self.state.path / "pki" / "ca.crt"))
        headers = {"Authorization": f"Bearer {self.state.token}"}
        version = ""
        while not self._stop.is_set():
            try:
                self._conn = conn = http.client.HTTPSConnection(url.hostname, url.port, context=context, timeout=600)
                path = f"/api/v1/namespaces/{self.namespace}/pods?watch=1&allowWatchBookmarks=true"
                conn.request("GET", path + (f"&resourceVersion={version}" if version else ""), headers=headers)
                resp = conn.getresponse()
                for line in resp:
                    if self._stop.is_set():
                        return
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion") or version
                    if event.get("type") == "ERROR":
                        version = ""
                        break
                    user = (meta.get("annotations") or {}).get("hub.jupyter.org/username") or (meta.get("labels") or {}).get(
                        "hub.jupyter.org/username"
                    )
                    if user and event.get("type") == "DELETED":
                        self.pods.pop(user, None)
                    elif user:
                        self.pods[user] = obj
                        if (obj.get("spec") or {}).get("nodeName") and user not in self.bound:
                            self.bound[user] = time.monotonic()
            except (OSError, http.client.HTTPException, ValueError):
                if self._stop.is_set():
                    return
                time.sleep(0.5)


def parse_free(text: str, offering: str) -> float | None:
    """``gpuspawner_offering_free`` of ``offering`` in the hub's /hub/metrics."""
    match = re.search(r'^gpuspawner_offering_free\{[^}]*offering="' + re.escape(offering) + r'"[^}]*\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None
