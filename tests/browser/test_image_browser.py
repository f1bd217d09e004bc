"""Images that fit the node on the spawn page, in a real browser (Debian's Chromium through
playwright-core): the GPU cards follow the image KubeSpawner's profile form chooses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from markupsafe import Markup

from gpuspawner.hub.form import render_form
from gpuspawner.page.useroptions import profile_images
from gpuspawner.page.views import FormView, group_options
from tests.browser.test_form_browser import CHROMIUM, REPO
from tests.unit.test_imagefit import H100_SLUG, PROFILES, cards_per_image
from tests.unit.test_imagefit import MIG_3G as MIG

#: KubeSpawner's profile form, as its form.html names the fields (profile, profile-option-<slug>--<option>).
KUBESPAWNER_FORM = """
<div id="kubespawner-profiles-list">
  <label><input type="radio" name="profile" id="profile-item-cpu" value="cpu" checked> CPU</label>
  <label><input type="radio" name="profile" id="profile-item-torch" value="torch"> PyTorch
    <select name="profile-option-torch--image" id="profile-option-torch--image">
      <option value="new" selected>new</option><option value="old">old</option>
    </select></label>
</div>
"""


def page() -> str:
    images = profile_images(PROFILES, "jupyter/base")
    shown = cards_per_image({"*:cuda12-*": {"min_driver": "570"}, "*:cuda11-*": {"min_driver": "600"}}, images)
    view = FormView(
        groups=group_options(shown, ["full", "mig"]),
        selected=None,
        selected_count=1,
        refresh_seconds=0,
        extra_html=Markup(KUBESPAWNER_FORM),
        images=json.dumps(images),
    )
    return f"<!doctype html><html><body><form>{render_form(view)}</form></body></html>"


def test_the_cards_follow_the_image_the_profile_chooses(tmp_path):
    node = shutil.which("node")
    assert node and (REPO / "node_modules" / "playwright-core").is_dir(), "Node.js and playwright-core are needed (npm install)"
    html = tmp_path / "page.html"
    html.write_text(page())
    env = {**os.environ, "PAGE": str(html), "CHROMIUM": CHROMIUM}
    done = subprocess.run(
        [node, str(REPO / "tests" / "browser" / "image_check.mjs")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # CPU profile: the base image needs nothing, both cards as counted.
    assert seen["start"][MIG] == {"disabled": False, "radioDisabled": False, "reason": "", "avail": "1 of 1 free"}
    # PyTorch, CUDA 12 image: only the upgraded H100 node; the A100 on 550 cannot run it.
    assert seen["torch"][MIG]["disabled"] and seen["torch"][MIG]["radioDisabled"]
    assert seen["torch"][MIG]["reason"] == "needs driver >= 570; these nodes have 550.54.15"
    assert seen["torch"][H100_SLUG] == {"disabled": False, "radioDisabled": False, "reason": "", "avail": "8 of 8 free"}
    # The older image choice needs a driver no node has.
    assert seen["old"][H100_SLUG]["reason"] == "needs driver >= 600; these nodes have 550.54.15 and 570.124.06"
    # Back to CPU: as at the start.
    assert seen["cpu"] == seen["start"]
