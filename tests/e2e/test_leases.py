"""A GPU lease its user extends, then its end (issue #28), on the demo stack: the real
GPUSpawner, the GPU culler as the hub's managed service (its ``api/leases``), the hub's page
``/hub/gpuspawner/leases`` and its home page, the real notebook and JupyterLab extensions, the
real Prometheus, and Debian's Chromium.

researcher1 starts a MIG slice from the spawn page; its lease is 2 minutes, with one
extension of a minute. In JupyterLab, the GPU panel shows the lease and links "Extend it on
the hub"; on that page researcher1 clicks Extend and reads what was granted; the lease's
warning then reaches JupyterLab with no Keep and no Extend. A second extension is refused
with why, a forged form by the hub, another user's token by the culler. The culler stops the
server when the extended lease ends, and the home page says why.
``tests/browser/lease_story.mjs`` acts in the browser and records; every assertion is here.
Screenshots go to test-artifacts/screenshots/lease-*.png.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS
from tests.e2e.demo_stack import demo_with_token
from tests.e2e.test_budgets import call, login

pytestmark = pytest.mark.cluster
SLICE = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
LEASE, EXTENSION = 120, 60
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "browser" / "lease_story.mjs"
CHROMIUM = "/usr/bin/chromium"
SHOTS = ARTIFACTS / "screenshots"
CULLER_ARGS = (
    "--cull-every=3 --timeout=3600 --kind-timeout=mig=3600 --gpu-window=20 --gpu-min-samples=3 "
    f"--GpuCuller.warn_before_seconds=20 --offering-gpu-lease={SLICE}={LEASE} "
    f"--gpu-lease-extensions=1 --gpu-lease-extension={EXTENSION}"
)
EXTRA_CONFIG = """
c = get_config()
c.JupyterHub.load_roles.append({"name": "e2e-actions", "scopes": ["access:services", "tokens"], "services": ["e2e-admin"]})
"""


def leases_page(opener, demo, xsrf: str | None = None, server: str = "") -> tuple[int, dict]:
    """GET (or, with ``xsrf``, POST "Extend" on) the hub's lease page as JSON."""
    data = urllib.parse.urlencode({"server": server, "_xsrf": xsrf}).encode() if xsrf else None
    request = urllib.request.Request(f"{demo.url}/hub/gpuspawner/leases", data=data, headers={"Accept": "application/json"})
    try:
        with opener.open(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:  # the hub's own refusals (a forged form) are its HTML error page
            return exc.code, {"page": raw.decode(errors="replace")}


def until(what, check, demo, timeout=180):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            lines = (demo.state / "jupyterhub.log").read_text().splitlines()
            about = [line for line in lines if "researcher1" in line and "GET /hub/api/users" not in line]
            pytest.fail(f"{what}; the hub's lines about researcher1:\n" + "\n".join(about[-60:]))
        time.sleep(1)
    return found


def test_a_lease_extended_on_the_hubs_page_ends_later_with_its_reason(tmp_path_factory):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make install` (scripts/install-browser.sh)"
    node = shutil.which("node")
    assert node, "Node.js is needed (it also runs configurable-http-proxy)"
    with demo_with_token(tmp_path_factory, EXTRA_CONFIG, env={"GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}) as demo:
        SHOTS.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "BASE_URL": demo.url, "SLUG": SLICE, "USER": "researcher1", "SCREENSHOTS": str(SHOTS), "CHROMIUM": CHROMIUM}
        story = subprocess.Popen([node, str(SCRIPT)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        # meanwhile, what the hub and the notebook say, asked as the user would
        until("researcher1's server never became ready", lambda: (server(demo) or {}).get("ready"), demo)
        started = datetime.fromisoformat(server(demo)["started"].replace("Z", "+00:00"))
        opener, xsrf = login(demo, "researcher1")
        _, token = call(demo, "POST", "/users/researcher1/tokens", {"scopes": ["access:servers!user=researcher1"]})
        status_url = f"{demo.url}/user/researcher1/api/gpuspawner/status"

        def notebook_lease():
            req = urllib.request.Request(status_url, headers={"Authorization": f"token {token['token']}"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read()).get("lease")

        shown = until("the notebook never showed the lease", notebook_lease, demo, timeout=90)
        assert shown["extend_url"] == "/hub/gpuspawner/leases" and shown["ends_at"] == (started + timedelta(seconds=LEASE)).isoformat()

        out, err = story.communicate(timeout=600)
        hub_log = (demo.state / "jupyterhub.log").read_text()
        assert story.returncode == 0, f"lease_story.mjs failed:\n{out[-3000:]}\n{err[-3000:]}"
        seen = json.loads(out.strip().splitlines()[-1])
        about = "\n".join(line for line in hub_log.splitlines() if "researcher1" in line and "GET /hub/api/users" not in line)
        assert "error" not in seen, f"{json.dumps(seen, indent=1)}\nhub log about researcher1:\n{about[-8000:]}"

        # JupyterLab's panel showed the lease and linked the hub's page
        assert seen["panelLease"].startswith("Your server may hold the MIG slice until "), seen
        assert "You may extend it by 1 minute, once more." in seen["panelLease"] and seen["extendHref"] == "/hub/gpuspawner/leases", seen
        # the hub's page extended it when the user clicked Extend, and offers no more
        assert seen["message"].startswith("The GPU lease of your server was extended by 1 minute, until "), seen
        assert seen["message"].endswith("(the last extension of this lease)."), seen
        assert seen["extendButtonsAfter"] == 0 and "Extend" in seen["leasePageBefore"]
        # the lease's warning reached JupyterLab: no Keep, no Extend (none left)
        assert (
            "this server will be stopped" in seen["warningToast"] and "Save your work: Keep cannot prevent this." in seen["warningToast"]
        ), seen
        assert seen["statusWarning"] is True and seen["keepVisible"] is False
        assert not {"Keep", "Extend"} & set(seen["toastButtons"]), seen

        # a second extension is refused with why; a forged form is refused by the hub
        code, answer = leases_page(opener, demo, xsrf)
        assert code == 409 and answer["message"] == "the GPU lease cannot be extended: its one extension is used", answer
        code, answer = leases_page(opener, demo, "forged")
        assert code == 403 and "XSRF" in answer.get("page", ""), answer
        # (the culler's API: a user extends only their own lease)
        code, answer = culler_post(demo, "researcher2")
        assert code == 403 and "only your own GPU leases" in answer["message"], answer

        # the extended lease ends: the server is stopped, and the home page says why
        until(
            "the server was not stopped at the end of its extended lease",
            lambda: server(demo) is None,
            demo,
            timeout=LEASE + EXTENSION + 120,
        )
        assert (datetime.now(started.tzinfo) - started).total_seconds() >= LEASE + EXTENSION
        log = (demo.state / "jupyterhub.log").read_text()
        assert "warned researcher1: server stop in" in log and "whatever happens (its GPU lease ends)" in log
        with opener.open(f"{demo.url}/hub/home", timeout=60) as resp:
            home = resp.read().decode().replace("&#39;", "'")
        assert "The GPU lease of your server was extended at " in home, home[-3000:]
        assert (
            "Your server was stopped at " in home
            and "the server's GPU lease ended: the MIG slice may be held for 3 minutes (with 1 extension) at most" in home
        ), home[-3000:]


def server(demo):
    return call(demo, "GET", "/users/researcher1")[1]["servers"].get("")


def culler_post(demo, user: str) -> tuple[int, dict]:
    """``POST api/leases`` on the culler, with a token of ``user``'s own, for researcher1's lease."""
    _, token = call(demo, "POST", f"/users/{user}/tokens", {"scopes": ["access:services!service=gpu-culler"]})
    request = urllib.request.Request(
        f"{demo.url}/services/gpu-culler/api/leases?user=researcher1&server=",
        data=b"",
        method="POST",
        headers={"Authorization": f"token {token['token']}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
