"""`gpuspawner offerings` offline: what the spawner would show, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuspawner.devcluster.nodes import standard_nodes


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gpuspawner.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture
def nodes_file(tmp_path):
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": standard_nodes()}))
    return path


def test_json_lists_every_offering_with_capacity_and_free(nodes_file, tmp_path):
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"items": [{
        "metadata": {"name": "x", "namespace": "other"},
        "spec": {"nodeName": "gpu-h100-8x", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
        "status": {"phase": "Running"},
    }]}))
    done = run("offerings", "--nodes", str(nodes_file), "--pods", str(pods), "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["slug"]: r for r in json.loads(done.stdout)}
    h100 = rows["gpu-nvidia-h100-80gb-hbm3"]
    assert (h100["capacity"], h100["free"]) == (8, 5)
    assert h100["limits"] == {"nvidia.com/gpu": "1"} and h100["kind"] == "full"
    assert h100["node_selector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in h100["tolerations"]
    for key in ("slug", "kind", "display_name", "limits", "node_selector", "tolerations", "capacity", "free"):
        assert all(key in row for row in rows.values())
    assert rows["cpu"]["capacity"] is None


def test_table_output_names_offerings(nodes_file):
    done = run("offerings", "--nodes", str(nodes_file))
    assert done.returncode == 0
    assert "A100 40GB · MIG 3g.20gb" in done.stdout and "nvidia.com/mig-3g.20gb=1" in done.stdout


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{not json", "not JSON"),
        ('{"items": 3}', "expected a JSON object with an 'items' list"),
        ("[1, 2]", "expected a JSON object with an 'items' list"),
    ],
)
def test_malformed_nodes_file_is_one_line_and_exit_2(tmp_path, content, problem):
    bad = tmp_path / "nodes.json"
    bad.write_text(content)
    done = run("offerings", "--nodes", str(bad))
    assert done.returncode == 2
    assert problem in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_missing_file_and_broken_config(nodes_file, tmp_path):
    done = run("offerings", "--nodes", str(tmp_path / "nope.json"))
    assert done.returncode == 2 and "no such file" in done.stderr
    config = tmp_path / "jupyterhub_config.py"
    config.write_text('c = get_config()\nc.GPUSpawner.offerings = [{"slug": "x", "kind": "full", "count": [1]}]\n')
    done = run("offerings", "--nodes", str(nodes_file), "--config", str(config))
    assert done.returncode == 2
    assert "offerings[0] (slug 'x'): unknown field 'count'; did you mean 'counts'?" in done.stderr
    assert "Traceback" not in done.stderr
