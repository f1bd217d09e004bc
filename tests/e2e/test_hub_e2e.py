"""End to end: the demo stack (devcluster + pod runner + real JupyterHub behind a real
configurable-http-proxy + GPUSpawner + the GPU culler), driven by headless Chromium.

A student logs in, sees the offerings with the right free counts and disabled
reasons, has a hand-made POST for a whole GPU refused, picks a MIG slice and lands
in a real JupyterLab served from the pod's IP; stopping the server removes the pod
and the local server. A researcher does the same without JavaScript.
Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from gpuspawner.tools.demo import NAMESPACE
from tests.conftest import ARTIFACTS, wait_for
from tests.e2e.demo_stack import demo_with_token

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "browser" / "hub_flow.mjs"
SHOTS = ARTIFACTS / "screenshots"
MIG_1G = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
H100 = "gpu-nvidia-h100-80gb-hbm3"

EXTRA_CONFIG = """
c = get_config()
c.GPUSpawner.offerings.append({
    "slug": "markup-test", "kind": "custom", "command_prefix": ["env"], "display_name": "CPU <b>bold</b> test",
    "description": "<script>window.__pwned = 1</script><img src=x onerror=alert(1)> plain text",
})
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with demo_with_token(tmp_path_factory, EXTRA_CONFIG) as running:
        yield running


def api(demo, method: str, path: str):
    req = urllib.request.Request(f"{demo.api_url}{path}", method=method, headers={"Authorization": f"token {demo.token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def browse(demo, **env) -> dict:
    node = shutil.which("node")
    assert node, "Node.js is needed (it also runs configurable-http-proxy)"
    SHOTS.mkdir(parents=True, exist_ok=True)
    run_env = {**os.environ, "BASE_URL": demo.url, "SCREENSHOTS": str(SHOTS), **env}
    done = subprocess.run([node, str(SCRIPT)], cwd=REPO, env=run_env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in result, result["error"] + "\nhub log:\n" + (demo.state / "jupyterhub.log").read_text()[-4000:]
    return result


def user_pods(demo, user: str) -> list[dict]:
    pods = demo.cluster.client().request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=hub.jupyter.org/username={user}")
    return pods["items"]


def stop_server(demo, user: str) -> None:
    api(demo, "DELETE", f"/users/{user}/server")
    wait_for(lambda: api(demo, "GET", f"/users/{user}")["servers"] == {}, f"{user}'s server stopped", timeout=60)
    wait_for(lambda: user_pods(demo, user) == [], f"{user}'s pod gone", timeout=60)


def test_student_picks_a_mig_slice_and_lands_in_jupyterlab(demo):
    result = browse(demo, HUB_USER="student1", SLUG=MIG_1G, JS="1", FORBIDDEN=H100)
    options = {o["slug"]: o for o in result["options"]}

    # What a student sees: live counts (another team holds a 3g slice and 4 H100s), reasons.
    assert options[MIG_1G]["availability"] == "2 of 2 free" and options[MIG_1G]["disabled"] is False
    assert options["shared-tesla-t4-time-slicing-4x"]["availability"] == "3 of 4 free"
    assert options[H100]["disabled"] is True and options[H100]["reason"] == "not allowed for your groups"
    assert options["mig-nvidia-a100-sxm4-40gb-3g-20gb"]["reason"] == "not allowed for your groups"
    assert options["cpu"]["disabled"] is False

    # Markup in an admin's description is shown as text, never run.
    markup = options["markup-test"]
    assert markup["name"] == "CPU <b>bold</b> test"
    assert "&lt;script&gt;" in markup["description"] and "<script" not in markup["description"]
    assert result["scripts_in_options"] == 0

    # The hand-made POST for a whole GPU was refused on the form (403, as the REST API answers), and made no pod.
    assert result["forbidden"]["status"] == 403
    assert "is not offered to you" in result["forbidden"]["error"]

    # The real spawn: JupyterLab, served from the pod's IP by the pod runner.
    assert "/user/student1/lab" in result["final_url"] and result["lab_rendered"], result
    pods = user_pods(demo, "student1")
    assert len(pods) == 1
    pod = pods[0]
    assert pod["spec"]["nodeName"] == "gpu-a100-mig"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.5gb"] == "1"
    model = api(demo, "GET", "/users/student1")["servers"][""]
    assert model["user_options"]["offering"] == MIG_1G
    assert model["user_options"]["gpuspawner"]["kind"] == "mig"
    assert model["user_options"]["gpuspawner"]["url"].startswith(f"http://{pod['status']['podIP']}:8888/user/student1/")
    local = [s for s in demo.runner.servers.values() if s.ip == pod["status"]["podIP"]]
    assert len(local) == 1 and local[0].process.poll() is None

    stop_server(demo, "student1")
    wait_for(lambda: local[0].process.poll() is not None, "the local server stopped", timeout=30)


def test_researcher_takes_two_whole_gpus_without_javascript(demo):
    result = browse(demo, HUB_USER="researcher1", SLUG=H100, COUNT="2", JS="0", SHOT_PREFIX="researcher1-nojs")
    options = {o["slug"]: o for o in result["options"]}
    assert options[H100]["availability"] == "4 of 8 free" and options[H100]["disabled"] is False
    assert "/user/researcher1/lab" in result["final_url"], result
    assert "JupyterLab" in result["title"]
    pod = user_pods(demo, "researcher1")[0]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    stop_server(demo, "researcher1")


def test_the_hub_serves_gpuspawner_metrics(demo):
    req = urllib.request.Request(f"{demo.url}/hub/metrics", headers={"Authorization": f"token {demo.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    assert f'gpuspawner_offering_capacity{{kind="mig",offering="{MIG_1G}"}} 2.0' in text
    # the counters exist at 0 from the first catalog on; a MIG spawn was admitted here
    admitted = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('gpuspawner_admissions_total{decision="admit",kind="mig",offering="')
    ]
    assert admitted and max(admitted) >= 1, admitted
