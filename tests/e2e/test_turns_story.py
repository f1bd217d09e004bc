"""Fair turns as two people see them (issue #28): the demo stack (devcluster, pod runner,
real JupyterHub behind configurable-http-proxy, GPUSpawner and its queue, the GPU culler as
the hub's managed service, the real Prometheus), the real notebook and JupyterLab
extensions, and Debian's Chromium driving both browsers.

researcher1 takes the A100's only MIG 3g.20gb from the spawn page, lands in JupyterLab and
goes away. researcher2 asks for the same slice: the spawn-pending page says when an idle one
will be reclaimed for them; the culler stops researcher1's server, researcher2 lands in
JupyterLab, and researcher1's hub home page says why. (The warning researcher1's notebook
gets is checked in tests/e2e/test_fair_turns.py, from the culler's side: with JupyterLab
in front, its own polling is activity to jupyter_server, so nobody would be idle.) ``tests/browser/turns_story.mjs`` acts and records; every assertion is
here. Screenshots go to test-artifacts/screenshots/turns-*.png.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS
from tests.e2e.demo_stack import demo_with_token

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "browser" / "turns_story.mjs"
CHROMIUM = "/usr/bin/chromium"
SHOTS = ARTIFACTS / "screenshots"
SLICE = "mig-nvidia-a100-sxm4-40gb-3g-20gb"
BOUND = 60
CULLER_ARGS = (
    f"--cull-every=3 --timeout=3600 --kind-timeout=mig=3600 --reclaim-for-waiting-after={BOUND} "
    "--gpu-window=20 --gpu-min-samples=3 --GpuCuller.warn_before_seconds=30"
)
EXTRA_CONFIG = ""


def test_the_waiting_are_told_the_idle_warned_and_the_turn_is_taken(tmp_path_factory):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make install` (scripts/install-browser.sh)"
    node = shutil.which("node")
    assert node, "Node.js is needed (it also runs configurable-http-proxy)"
    with demo_with_token(tmp_path_factory, EXTRA_CONFIG, env={"GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}) as demo:
        # the other team's job that holds the slice in the demo ends
        demo.cluster.client().request("DELETE", "/api/v1/namespaces/research-team/pods/embeddings?gracePeriodSeconds=0")
        SHOTS.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "BASE_URL": demo.url,
            "SLUG": SLICE,
            "HOLDER": "researcher1",
            "WAITER": "researcher2",
            "SCREENSHOTS": str(SHOTS),
            "CHROMIUM": CHROMIUM,
        }
        done = subprocess.run([node, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        hub_log = (demo.state / "jupyterhub.log").read_text()
    assert done.returncode == 0, f"turns_story.mjs failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    about = "\n".join(line for line in hub_log.splitlines() if "researcher" in line and "GET /hub/api/users" not in line)
    assert "error" not in seen, f"{json.dumps(seen, indent=1)}\nhub log about the researchers:\n{about[-8000:]}"

    # the waiting person is told, in the spawn's progress, that an idle slice will be theirs
    assert re.search(r"An idle .+ will be reclaimed for you (now|in about a minute|in about \d+ minutes)\.", seen["waiter"]["progress"]), (
        seen
    )
    # the waiting person's spawn started on the slice that came free
    assert "/user/researcher2/lab" in seen["waiter"]["landed"], seen
    # and the idle person's home page says why the server was stopped
    home = seen["holder"]["homeActions"]
    assert re.search(r"Your server was stopped at .+: 1 person was waiting for .+ and the MIG slice was idle for ", home), home
