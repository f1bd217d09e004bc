"""The data scientist's whole story with both real halves at once (issue #17): the demo
stack (devcluster, pod runner, real JupyterHub behind configurable-http-proxy,
GPUSpawner, the GPU culler as the hub's managed service, the real Prometheus scraping the
dcgm-exporter stand-in), the real notebook extension and the prebuilt JupyterLab
extension in each single-user server, and Debian's Chromium driving JupyterLab.

Two students and a researcher each pick the time-sliced T4 share on the spawn page, land in JupyterLab,
open a notebook, run a cell and go idle. The status bar counts down once the culler's
warning window opens, and the warning arrives as a notification with "Keep".

* student1 does nothing: the kernel is shut down at the time the warning named, the
  notebook announces it as reclaimed for idleness (not a crash), and the hub's home page
  says why. The culler's action log (its service API, read with a hub token) agrees.
* student2 clicks Keep, researcher1 runs a cell instead: past the time the warning
  named, each kernel is still there, no reclaim is announced, the culler's view has moved
  on, and the culler has recorded no action for either.

``tests/browser/gpu_story.mjs`` acts in the browser and records what each user saw;
every assertion is here. Screenshots go to test-artifacts/screenshots/story-*.png.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS
from tests.e2e.demo_stack import demo_with_token

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "browser" / "gpu_story.mjs"
CHROMIUM = "/usr/bin/chromium"
SHOTS = ARTIFACTS / "screenshots"
SHARED_T4 = "shared-tesla-t4-time-slicing-4x"
T4_NAME = "T4 · 1/4 time-sliced (teaching pool)"  # hub_config/demo_config.py renames it
KERNEL_TIMEOUT = 150
WARN_BEFORE = 100
CULLER_ARGS = (
    f"--cull-every=3 --timeout=3600 --kernel-timeout={KERNEL_TIMEOUT} --kind-timeout=shared=3600 "
    f"--gpu-window=30 --gpu-min-samples=3 --GpuCuller.warn_before_seconds={WARN_BEFORE}"
)
# the e2e token may also use the culler's service API (its action log)
EXTRA_CONFIG = """
c = get_config()
c.JupyterHub.load_roles.append({"name": "e2e-actions", "scopes": ["access:services"], "services": ["e2e-admin"]})
"""
WARNING = re.compile(
    r"To free the GPU, your idle kernels will be shut down in (<1|\d+) min\. Click Keep or run a cell to keep them\.KeepWhy\?"
)
COUNTDOWN = re.compile(re.escape(T4_NAME) + r" · .+ · idle [^,]+, kernels reclaimed (in \d+ min|within a minute)")


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make install` (scripts/install-browser.sh)"
    node = shutil.which("node")
    assert node, "Node.js is needed (it also runs configurable-http-proxy)"
    culler = {"GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}
    with demo_with_token(tmp_path_factory, EXTRA_CONFIG, env=culler) as demo:
        SHOTS.mkdir(parents=True, exist_ok=True)
        users = [
            {"user": "student1", "slug": SHARED_T4, "keep": False},
            {"user": "student2", "slug": SHARED_T4, "keep": "button"},
            {"user": "researcher1", "slug": SHARED_T4, "keep": "cell"},
        ]
        env = {
            **os.environ,
            "BASE_URL": demo.url,
            "USERS": json.dumps(users),
            "SCREENSHOTS": str(SHOTS),
            "CHROMIUM": CHROMIUM,
            "WAIT_S": str(KERNEL_TIMEOUT + 180),
        }
        done = subprocess.run([node, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        hub_log = (demo.state / "jupyterhub.log").read_text()
        assert done.returncode == 0, f"gpu_story.mjs failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nhub log:\n{hub_log[-4000:]}"
        seen = {r["user"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}
        errors = {u: {k: r.get(k) for k in ("error", "errorUrl", "errorPage")} for u, r in seen.items() if "error" in r}
        # the hub's lines about the users who were stuck, not just the log's tail
        about = "\n".join(line for line in hub_log.splitlines() if any(u in line for u in errors))
        assert not errors, f"{errors}\nscreenshots: {[r['screenshots'] for r in seen.values()]}\nhub log about them:\n{about[-8000:]}"
        req = urllib.request.Request(f"{demo.url}/services/gpu-culler/api/actions", headers={"Authorization": f"token {demo.token}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            actions = json.loads(resp.read())["actions"]
        yield seen, actions


def test_the_status_bar_counts_down_once_the_warning_window_opens(story):
    seen, _ = story
    for user in ("student1", "student2", "researcher1"):
        texts = [t["text"] for t in seen[user]["texts"]]
        countdown = [t for t in texts if COUNTDOWN.fullmatch(t)]
        assert countdown, (user, texts)
        # before the window opens the bar names the share and says nothing of a reclaim
        assert any(t.startswith(T4_NAME) and "reclaimed" not in t for t in texts), (user, texts)
    # student1 watched the whole window: the countdown moved
    assert len({t for t in (x["text"] for x in seen["student1"]["texts"]) if COUNTDOWN.fullmatch(t)}) >= 2, seen["student1"]["texts"]


def test_the_warning_says_when_offers_keep_and_why(story):
    seen, _ = story
    for user in ("student1", "student2", "researcher1"):
        toast = seen[user]["warningToast"]
        # whole (a JupyterLab notification shows 140 characters), then its two buttons
        assert WARNING.fullmatch(toast), toast
        culler = seen[user]["statusWarned"]["culler"]
        assert culler["reason"].startswith("an idle kernel holds 1536 MiB of the shared GPU's memory while idle for "), culler
        assert culler["reason"].endswith(f"(limit {KERNEL_TIMEOUT // 60})"), culler
        assert culler["action"] == "kernels" and culler["warning"] is True, culler
        # the warning came about WARN_BEFORE seconds ahead of the time it names
        lead = parse(culler["act_at"]).timestamp() - seen[user]["warnedAt"] / 1000
        assert 0 < lead <= WARN_BEFORE, lead
    # "Why?" shows the reason in full, with the warning's whole text
    panel = seen["student1"]["panel"]
    reason = seen["student1"]["statusWarned"]["culler"]["reason"]
    assert reason in panel and "Click Keep or run a cell to keep them." in panel, panel


def test_doing_nothing_the_kernel_is_reclaimed_announced_and_explained(story):
    seen, actions = story
    s1 = seen["student1"]
    assert s1["kernelId"] and s1["kernelId"] not in s1["kernelsAfter"]
    toast = s1["reclaimedToast"]
    assert re.fullmatch(
        re.escape(f"{s1['notebook']}: Kernel {s1['kernelId'][:8]} was reclaimed for idleness at ")
        + r"\d\d:\d\d UTC\. It did not crash; start a new one to go on\.Why\?",
        toast,
    ), toast
    # the status bar keeps the trace
    texts = [t["text"] for t in s1["texts"]]
    assert any(re.fullmatch(re.escape(T4_NAME) + r" · .+ · kernel reclaimed for idleness at \d\d:\d\d UTC", t) for t in texts), texts
    # not before the time the warning named
    assert s1["reclaimedAt"] / 1000 >= parse(s1["statusWarned"]["culler"]["act_at"]).timestamp() - 1
    mine = [a for a in actions if a["user"] == "student1"]
    assert [a["action"] for a in mine] == ["kernels_shut_down"], actions
    assert mine[0]["kernels"] == [s1["kernelId"]]
    # "Why?" on it: the culler's reason in full, the same words as its action log
    assert mine[0]["why"] in s1["panelAfterReclaim"], (mine[0]["why"], s1["panelAfterReclaim"])
    home = s1["homeActions"]
    assert home and mine[0]["why"] in home and mine[0]["what"] in home, (home, mine)


def test_keep_drops_the_warning_at_once(story):
    seen, _ = story
    after = seen["student2"]["textAfterKeep"]
    assert after.startswith(T4_NAME) and "reclaimed" not in after, after


@pytest.mark.parametrize("user", ["student2", "researcher1"])  # Keep; a cell run
def test_keep_or_a_cell_keeps_the_kernel_past_the_warned_time(story, user):
    seen, actions = story
    s = seen[user]
    warned_act_at = parse(s["statusWarned"]["culler"]["act_at"]).timestamp()
    assert s["checkedAt"] / 1000 > warned_act_at + 9  # three of the culler's cycles later
    assert s["kernelId"] in s["kernelsAfter"]
    assert s["reclaimedToasts"] == 0
    assert [n for n in s["statusAfter"]["notices"] if n["kind"] == "reclaimed"] == []
    culler = s["statusAfter"]["culler"]
    assert culler["act_at"] is None or parse(culler["act_at"]).timestamp() > warned_act_at, culler
    assert [a for a in actions if a["user"] == user] == []
    assert s["homeActions"] is None


def parse(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))
