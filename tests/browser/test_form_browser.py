"""The spawn-page fragment in a real browser (Debian's Chromium, driven by playwright-core).

The fragment is put inside JupyterHub's own ``spawn.html`` (rendered from the installed
JupyterHub's templates, with its static files served), exactly as the hub wraps
``Spawner.options_form``. A tiny HTTP server answers GETs with that page and records
POST bodies; ``tests/browser/form_check.mjs`` clicks, submits and screenshots, and
prints what it saw as JSON. The assertions are all here.

Pages (each path has its own GET counter):

* ``/hub/spawn/submit``: always the example view (its refresh changes nothing).
* ``/hub/spawn/live``, ``/hub/spawn/live2``: the example view on the first GET, a later
  availability (and a notice that the cluster cannot be reached) on every GET after it,
  refreshed every second.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from jinja2 import Environment, FileSystemLoader
from jupyterhub._data import DATA_FILES_PATH

from gpuspawner.hub.form import render_form
from gpuspawner.page.views import user_options_from_form
from tests.unit.test_form import example_view

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "browser" / "form_check.mjs"
CHROMIUM = "/usr/bin/chromium"
HUB = Path(DATA_FILES_PATH)
SCREENSHOTS = Path(os.environ.get("GPUSPAWNER_TEST_ARTIFACTS", REPO / "test-artifacts")) / "screenshots"

MESSAGE = "You asked for 4 × H100 80GB but your quota is 2 GPUs. Pick 1 or 2, or a MIG slice."
NOTICE = "The GPU cluster cannot be reached: the free counts are as of 14:03:07 CET (44 s ago) and may be out of date."


def spawn_page(fragment: str, action: str) -> str:
    """JupyterHub's spawn.html around ``fragment``, as the hub renders it."""
    env = Environment(loader=FileSystemLoader(str(HUB / "templates")), autoescape=True)
    user = SimpleNamespace(name="ada", json_escaped_name="ada", spawner=SimpleNamespace(options_form=True))
    return env.get_template("spawn.html").render(
        static_url=lambda path, include_version=True: f"/hub/static/{path}",
        base_url="/hub/",
        prefix="/",
        logo_url="",
        user=user,
        for_user=user,
        parsed_scopes=set(),
        services=[],
        logout_url="/hub/logout",
        login_url="/hub/login",
        xsrf_token="xsrf",
        version_hash="",
        spawner_options_form=fragment,
        url=action,
    )


class Hub:
    """A stand-in for the hub's spawn handler: pages by path, POST bodies recorded."""

    def __init__(self):
        self.gets: dict[str, list[str]] = {}
        self.posts: list[dict] = []
        self.lock = threading.Lock()

    def page(self, path: str, query: str) -> str | None:
        with self.lock:
            seen = self.gets.setdefault(path, [])
            seen.append(query)
            first = len(seen) == 1
        action = f"{path}?_xsrf=" + ("nojs" if "nojs" in query else "js")
        if path == "/hub/spawn/submit":
            return spawn_page(render_form(example_view()), action)
        if path == "/hub/spawn/error":
            return spawn_page(render_form(example_view(selected="h100", selected_count=2, message=MESSAGE)), action)
        if path in ("/hub/spawn/live", "/hub/spawn/live2"):
            notice = "" if first else NOTICE  # the cluster went away between the page load and its refresh
            return spawn_page(render_form(example_view(refreshed=not first, refresh_seconds=1, notice=notice)), action)
        return None

    def serve(self) -> ThreadingHTTPServer:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                url = urlsplit(self.path)
                if url.path.startswith("/hub/static/"):
                    file = (HUB / "static" / url.path[len("/hub/static/") :]).resolve()
                    if file.is_file() and (HUB / "static").resolve() in file.parents:
                        types = {".css": "text/css", ".js": "text/javascript", ".png": "image/png", ".woff2": "font/woff2"}
                        return self.send(200, file.read_bytes(), types.get(file.suffix, "application/octet-stream"))
                    return self.send(404, b"", "text/plain")
                if url.path == "/hub/logo":
                    return self.send(200, (HUB / "static" / "images" / "jupyterhub-80.png").read_bytes(), "image/png")
                page = hub.page(url.path, url.query)
                if page is None:
                    return self.send(404, b"not found", "text/plain")
                self.send(200, page.encode(), "text/html; charset=utf-8")

            def do_POST(self):
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hub.lock:
                    hub.posts.append(
                        {"path": url.path, "query": parse_qs(url.query), "ctype": self.headers.get("Content-Type", ""), "body": body}
                    )
                self.send(200, b"<!doctype html><title>started</title><p id=started>Starting</p>", "text/html")

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def form_fields(post: dict) -> dict[str, list[str]]:
    """A recorded POST's fields, from multipart/form-data (spawn.html) or urlencoded."""
    if post["ctype"].startswith("multipart/form-data"):
        msg = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + post["ctype"].encode() + b"\r\n\r\n" + post["body"])
        fields: dict[str, list[str]] = {}
        for part in msg.iter_parts():
            fields.setdefault(part.get_param("name", header="content-disposition"), []).append(part.get_content())
        return fields
    return parse_qs(post["body"].decode(), keep_blank_values=True)


@pytest.fixture(scope="module")
def run():
    """Start the page server, run the browser script once, return (results, hub)."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make install` (scripts/install-browser.sh)"
    node = shutil.which("node")
    assert node, "Node.js is needed for the browser tests (it also runs configurable-http-proxy)"
    assert (REPO / "node_modules" / "playwright-core").is_dir(), "run `npm install` in the repository (playwright-core)"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    hub = Hub()
    server = hub.serve()
    try:
        env = {
            **os.environ,
            "BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "SCREENSHOTS": str(SCREENSHOTS),
            "CHROMIUM": CHROMIUM,
        }
        done = subprocess.run([node, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, f"form_check.mjs failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return results, hub


def posts_for(hub: Hub, path: str, xsrf: str) -> list[dict[str, list[str]]]:
    return [form_fields(p) for p in hub.posts if p["path"] == path and p["query"].get("_xsrf") == [xsrf]]


def test_click_an_option_choose_a_count_and_submit(run):
    results, hub = run
    js = results["js"]
    assert js["checkedAfterClick"] == "h100"
    assert js["countAfterSelect"] == "2"
    assert js["submitted"] is True
    posts = posts_for(hub, "/hub/spawn/submit", "js")
    assert posts == [{"offering": ["h100"], "count-h100": ["2"]}]
    assert user_options_from_form(posts[0]) == {"offering": "h100", "count": "2"}


def test_a_disabled_option_cannot_be_picked(run):
    results, _ = run
    for mode in ("js", "nojs"):
        seen = results[mode]["disabled"]
        assert seen["radioDisabled"] is True, mode
        assert seen["checkedAfterClick"] == "cpu", f"{mode}: clicking a disabled option changed the choice"
        assert seen["reasonVisible"] == "none free right now", mode
    # Arrow keys skip it too: from the 2g slice straight on to the H100.
    assert results["js"]["disabled"]["arrowFrom2g"] == "h100"


def test_choosing_a_count_picks_its_option(run):
    results, _ = run
    assert results["js"]["countPicksOption"] == "h100"


def test_the_same_submit_works_without_javascript(run):
    results, hub = run
    nojs = results["nojs"]
    assert nojs["scriptsRan"] is False
    assert nojs["statusVisible"] is False, "the live-refresh note must stay hidden without JavaScript"
    assert nojs["submitted"] is True
    posts = posts_for(hub, "/hub/spawn/submit", "nojs")
    assert posts == [{"offering": ["h100"], "count-h100": ["2"]}]


def test_live_refresh_updates_availability_and_keeps_the_selection(run):
    results, hub = run
    live = results["live"]
    before, after = live["before"], live["after"]
    assert before["checked"] == "h100" and before["count"] == "4"
    assert before["avail"]["t4-shared"] == "3 of 4 free"
    assert after["refreshes"] >= 1
    # New facts are copied in ...
    assert after["avail"]["t4-shared"] == "1 of 4 free"
    assert after["avail"]["a100-mig-3g-20gb"] == "1 of 1 free"
    assert after["disabled"]["a100-mig-3g-20gb"] is False, "a slice that became free can be picked"
    assert after["reason"]["a100-mig-3g-20gb"] == ""
    assert after["disabled"]["a10-vgpu-24q"] is True
    # ... but the user's choice stays: the H100 is still checked, with its reason shown and its count kept.
    assert after["checked"] == "h100"
    assert after["disabled"]["h100"] is False
    assert after["reason"]["h100"] == "none free right now"
    assert after["count"] == "4"
    assert after["optionClass"]["h100"] is True
    # The notice that the counts are not live comes (and would go) with the refresh.
    assert before["notice"] == "" and after["notice"] == NOTICE
    # The refresh fetched the page's path without its query string: JupyterHub spawns on a GET with query arguments.
    gets = hub.gets["/hub/spawn/live"]
    assert gets[0] == "_xsrf=abc" and len(gets) >= 2
    assert set(gets[1:]) == {""}
    # Submitting sends the (now stale) choice; the hub re-validates it.
    assert posts_for(hub, "/hub/spawn/live", "js") == [{"offering": ["h100"], "count-h100": ["4"]}]


def test_an_unavailable_choice_is_disabled_once_the_user_moves_away(run):
    results, _ = run
    moved = results["live2"]
    assert moved["checkedAfterRefresh"] == "h100"
    assert moved["checkedAfterMove"] == "t4-shared"
    assert moved["h100DisabledAfterMove"] is True
    assert moved["h100CountDisabledAfterMove"] is True


def test_error_message_is_shown_above_the_choices(run):
    results, _ = run
    err = results["error"]
    assert err["alert"] == MESSAGE
    assert err["alertAboveFirstOption"] is True
    assert err["checked"] == "h100" and err["count"] == "2"


def test_page_is_readable_at_phone_width(run):
    results, _ = run
    narrow = results["narrow"]
    assert narrow["scrollWidth"] <= narrow["clientWidth"], "no horizontal scrolling at 375px"
    assert narrow["badgeBelowName"] is True, "details stack under the name on a phone"
    assert narrow["focusVisible"] is True, "keyboard focus is visible"


def test_screenshots_are_saved(run):
    results, _ = run
    names = sorted(Path(p).name for p in results["screenshots"])
    assert names == sorted(
        [
            "spawn-form-1280.png",
            "spawn-form-1280-dark.png",
            "spawn-form-375.png",
            "spawn-form-error-375.png",
            "spawn-form-live-1280.png",
            "spawn-form-nojs-375.png",
        ]
    )
    for path in results["screenshots"]:
        data = Path(path).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, path
