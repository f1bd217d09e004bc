"""The notebook's GPU view in a real JupyterLab and Debian's Chromium (playwright-core).

A real ``jupyter lab`` subprocess loads the committed prebuilt extension (as the wheel
installs it, under ``share/jupyter/labextensions``) and the server extension, with
NVIDIA's library replaced by the stand-in (tests/notebook_ext/nvml_standin.py). The test
PUTs the culler's view as the culler does; ``tests/browser/gpu_view.mjs`` opens Lab,
reads the status bar, screenshots the warning, clicks Keep and opens the panel. The
assertions are all here. The warning screenshot is the one in docs/img.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.notebook_ext.jupyter_proc import JupyterProcess

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "browser" / "gpu_view.mjs"
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(os.environ.get("GPUSPAWNER_TEST_ARTIFACTS", REPO / "test-artifacts")) / "screenshots"
REASON = "the kernels were idle for 24 minutes (limit 30)"


def iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make install` (scripts/install-browser.sh)"
    node = shutil.which("node")
    assert node, "Node.js is needed for the browser tests"
    assert (REPO / "node_modules" / "playwright-core").is_dir(), "run `npm install` in the repository (playwright-core)"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    lab = JupyterProcess(tmp_path_factory.mktemp("lab"), app="lab").start()
    try:
        kernel = lab.fetch("api/kernels", "POST", {"name": "python3"}).json()
        now = datetime.now(UTC)
        view = {
            "idle_since": iso(now - timedelta(minutes=24)),
            "action": "kernels",
            "act_at": iso(now + timedelta(minutes=6, seconds=30)),
            "reason": REASON,
            "warning": True,
            "limit_seconds": 1800,
        }
        assert lab.fetch("api/gpuspawner/culler", "PUT", view).status == 204
        kernel_before = lab.fetch(f"api/kernels/{kernel['id']}?no_track_activity=1").json()["last_activity"]
        env = {
            **os.environ,
            "LAB_URL": f"{lab.base}lab?token={lab.token}",
            "CULLER_URL": f"{lab.base}api/gpuspawner/culler",
            "TOKEN": lab.token,
            "KERNEL_ID": kernel["id"],
            "SCREENSHOTS": str(SCREENSHOTS),
            "CHROMIUM": CHROMIUM,
        }
        done = subprocess.run([node, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
        assert done.returncode == 0, f"gpu_view.mjs failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert "error" not in seen, f"{seen['error']}\nscreenshots: {seen['screenshots']}\n{lab.log_text()[-3000:]}"
        after = {
            "status": lab.fetch("api/gpuspawner/status").json(),
            "kernel": lab.fetch(f"api/kernels/{kernel['id']}?no_track_activity=1").json()["last_activity"],
        }
        yield seen, kernel_before, after
    finally:
        lab.stop()


def test_the_status_bar_shows_the_offering_memory_and_countdown(run):
    seen, _, _ = run
    assert re.fullmatch(r"MIG 1g\.10gb · 3\.1 / 10 GB · idle \d+ min, kernels reclaimed in \d+ min", seen["text"]), seen["text"]


def test_the_warning_is_shown_with_keep_in_the_bar_and_a_notification(run):
    seen, _, _ = run
    assert seen["warningClass"] is True
    # the headline, whole (JupyterLab cuts a notification at 140 characters); the reason is in the panel
    assert re.fullmatch(
        r"To free the GPU, your idle kernels will be shut down in \d+ min\. Click Keep or run a cell to keep them\.KeepWhy\?", seen["toast"]
    )
    assert seen["toastHasKeep"] is True
    assert Path(seen["screenshots"][0]).stat().st_size > 10_000


def test_keep_drops_the_warning_and_is_activity_for_the_kernel(run):
    seen, kernel_before, after = run
    assert seen["warningClassAfterKeep"] is False
    assert [n for n in after["status"]["notices"] if n["kind"] == "warning"] == []
    assert after["kernel"] > kernel_before  # ISO 8601 UTC: text order is time order
    assert seen["textAfterKeep"] == "MIG 1g.10gb · 3.1 / 10 GB · active"  # until the culler's next view
    assert seen["toastAfterKeep"] == 0


def test_the_panel_lays_out_the_details(run):
    seen, _, _ = run
    panel = seen["panel"]
    for text in (
        "10 GB GPU memory · 1/7 of the GPU's compute",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb: 3.1 / 10.0 GB, utilisation not reported",
        "Next\tnothing planned",
        "Idle limit\t30 min",
    ):
        assert text in panel, (text, panel)
    assert REASON not in panel  # opened after Keep: the warned action, and its reason, are gone


def test_a_reclaimed_kernel_is_announced_as_reclaimed_for_idleness_not_a_crash(run):
    seen, _, _ = run
    assert seen["reclaimPut"] == 204
    assert re.fullmatch(
        r"Kernel [0-9a-f]{8} was reclaimed for idleness at \d\d:\d\d UTC\. It did not crash; start a new one to go on\.Why\?",
        seen["reclaimedToast"],
    ), seen["reclaimedToast"]
