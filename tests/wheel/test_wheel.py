"""What users install: the wheel, built from this tree and installed into an empty venv.

The checks run with that venv's Python, from a folder outside the repository, so nothing
can come from the source tree: the hub's entry point, the spawn page's templates and
static files, ``gpuspawner offerings --nodes``, the culler's ``--help`` and the devcluster
CLI. The demo is a development tool that needs the repository (its hub config and
configurable-http-proxy from ``npm install``), so it is left out of the wheel; the test
checks that the wheel holds no half of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import gpuspawner
from gpuspawner.devcluster.nodes import standard_nodes

REPO = Path(__file__).resolve().parents[2]


def run(command: list, cwd: Path, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KUBECONFIG")}, **env}
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, REPO], cwd=out)
    (built,) = out.glob("gpuspawner-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """An empty venv with only the wheel and its dependencies (from the package index)."""
    root = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    python = root / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", wheel], cwd=root)
    return python


def test_the_wheel_holds_the_package_and_its_files_only(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "gpuspawner/spawner.py" in names and "gpuspawner/culler/__main__.py" in names
    assert "gpuspawner/ui/templates/gpuspawner_form.html" in names
    assert "gpuspawner/pod/memguard_hook.py" in names  # the memory guard's start-up hook, mounted into pods
    assert any(n.startswith("gpuspawner/ui/static/") for n in names)
    # the hub's home and spawn pages with the culler's actions (gpuspawner.hub.culleractions)
    assert {"gpuspawner/ui/hub_templates/home.html", "gpuspawner/ui/hub_templates/spawn.html"} <= names
    assert "gpuspawner/devcluster/nodes.yaml" in names and "gpuspawner/devcluster/gomod/go.mod" in names
    # the notebook's GPU view: the server extension enabled on install, the prebuilt JupyterLab extension
    data = f"gpuspawner-{gpuspawner.__version__}.data/data/"
    assert data + "etc/jupyter/jupyter_server_config.d/gpuspawner.json" in names
    assert data + "share/jupyter/labextensions/gpuspawner-gpu-view/package.json" in names
    assert any(n.startswith(data + "share/jupyter/labextensions/gpuspawner-gpu-view/static/remoteEntry.") for n in names)
    assert not [
        n
        for n in names
        if n.startswith("gpuspawner/notebook_ext/labextension/") or "node_modules" in n or n.startswith("gpuspawner/ui/labextension")
    ]
    assert "gpuspawner/tools/demo.py" not in names  # needs the repository: run it from a clone (README.md)
    assert not [n for n in names if n.startswith("tests/") or "/__pycache__/" in n or n.endswith(".pyc")]


def test_the_installed_wheel_works_outside_the_repository(venv, tmp_path):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": standard_nodes()}))
    kubeconfig = tmp_path / "kubeconfig"  # KubeSpawner loads one when it is made; nothing answers there
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "none",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "users": [{"name": "none", "user": {"token": "unused"}}],
            }
        )
    )
    script = Path(__file__).with_name("installed_checks.py")
    done = run([venv, "-I", script, nodes], cwd=tmp_path, KUBECONFIG=str(kubeconfig))  # -I: isolated, no cwd or user site on the path
    assert done.stdout.splitlines() == [
        "ok imported from the installed wheel",
        "ok c.JupyterHub.spawner_class = 'gpu' loads GPUSpawner",
        "ok spawn page rendered from the wheel's templates",
        "ok memory guard hook read from the wheel",
        "ok hub page templates in the wheel",
        "ok gpuspawner offerings --nodes",
        "ok gpuspawner-culler --help",
        "ok gpuspawner probe --once without a GPU",
    ], done.stdout + done.stderr


@pytest.mark.cluster
def test_the_devcluster_runs_from_the_wheel(venv, devcluster, tmp_path):
    """The devcluster CLI works from the wheel (its Go module files and node classes are in
    it; the binaries are the ones this test run already built), and ``gpuspawner offerings``
    reads the live cluster it started."""
    cli = venv.with_name("gpuspawner")
    state = tmp_path / "cluster"
    try:
        run([cli, "devcluster", "up", "--dir", state], cwd=tmp_path, timeout=300)
        status = run([cli, "devcluster", "status", "--dir", state], cwd=tmp_path)
        assert "KUBECONFIG=" in status.stdout, status.stdout
        live = run([cli, "offerings", "--kubeconfig", state / "kubeconfig", "--json"], cwd=tmp_path, timeout=120)
        rows = {row["slug"]: row for row in json.loads(live.stdout)}
        assert rows["gpu-nvidia-h100-80gb-hbm3"]["capacity"] == 8, rows.get("gpu-nvidia-h100-80gb-hbm3")
    finally:
        subprocess.run([str(cli), "devcluster", "down", "--dir", str(state)], cwd=tmp_path, capture_output=True, timeout=120)
