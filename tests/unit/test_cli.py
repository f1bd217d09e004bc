"""`gpuspawner offerings` offline: what the spawner would show, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuspawner.devcluster.nodes import standard_nodes


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gpuspawner.tools.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture
def nodes_file(tmp_path):
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": standard_nodes()}))
    return path


def test_json_lists_every_offering_with_capacity_and_free(nodes_file, tmp_path):
    pods = tmp_path / "pods.json"
    pods.write_text(
        json.dumps(
            {
                "items": [
                    {
                        "metadata": {"name": "x", "namespace": "other"},
                        "spec": {"nodeName": "gpu-h100-8x", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
                        "status": {"phase": "Running"},
                    }
                ]
            }
        )
    )
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


def test_config_guarantees_count_as_the_hub_counts(nodes_file, tmp_path):
    # A job holds all but 512Mi of the H100 node's memory: with z2jh's 1G guarantee no notebook fits beside it.
    pods = tmp_path / "pods.json"
    pods.write_text(
        json.dumps(
            {
                "items": [
                    {
                        "metadata": {"name": "hog", "namespace": "batch"},
                        "spec": {
                            "nodeName": "gpu-h100-8x",
                            "containers": [{"name": "c", "resources": {"requests": {"memory": "261632Mi"}}}],
                        },
                        "status": {"phase": "Running"},
                    }
                ]
            }
        )
    )
    config = tmp_path / "jupyterhub_config.py"
    config.write_text('c = get_config()\nc.KubeSpawner.mem_guarantee = "1G"\nc.GPUSpawner.cpu_guarantee = 0.5\n')

    def h100(*extra):
        done = run("offerings", "--nodes", str(nodes_file), "--pods", str(pods), "--json", *extra)
        assert done.returncode == 0, done.stderr
        return next(r for r in json.loads(done.stdout) if r["slug"] == "gpu-nvidia-h100-80gb-hbm3")

    assert (h100()["capacity"], h100()["free"]) == (8, 8)
    assert (h100("--config", str(config))["capacity"], h100("--config", str(config))["free"]) == (8, 0)
    assert h100("--mem-guarantee", "256M")["free"] == 2  # two 256 MiB notebooks still fit; one may take all 8 GPUs
    assert h100("--mem-guarantee", "256M")["largest_free"] == 8
    table = run("offerings", "--nodes", str(nodes_file), "--config", str(config))
    assert "cpu 500m, memory 1.00 GiB (c.GPUSpawner.cpu_guarantee, c.KubeSpawner.mem_guarantee)" in table.stdout.splitlines()[0]


def test_table_says_which_gpus_no_offering_can_use(nodes_file):
    done = run("offerings", "--nodes", str(nodes_file))
    assert "GPUs no offering can use:" in done.stdout
    assert "gpu-v100-fractional: 1000 x nvidia.com/vgpu: nvidia.com/vgpu is no GPU kind discovery knows" in done.stdout


def test_bad_guarantee_is_one_line_and_exit_2(nodes_file):
    done = run("offerings", "--nodes", str(nodes_file), "--mem-guarantee", "lots")
    assert done.returncode == 2
    assert done.stderr.strip() == "gpuspawner: --mem-guarantee must be bytes or a size such as '1G' or '512M', got 'lots'"


def test_notebook_settings_from_every_spawner_section_and_appends(nodes_file, tmp_path):
    # The hub's own node selector, built up in two sections with update(), keeps notebooks on one node.
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "c = get_config()\n"
        "c.Spawner.mem_guarantee = '2G'\n"
        "c.KubeSpawner.node_selector.update({'kubernetes.io/hostname': 'gpu-t4-ts-shared'})\n"
        "c.GPUSpawner.node_selector.update({'type': 'kwok'})\n"
    )
    done = run("offerings", "--nodes", str(nodes_file), "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["slug"]: r for r in json.loads(done.stdout)}
    assert rows["shared-tesla-t4-shared-time-slicing-4x"]["capacity"] == 4
    assert rows["shared-tesla-t4-time-slicing-4x"]["capacity"] == 0  # the other T4 node: not the hub's
    table = run("offerings", "--nodes", str(nodes_file), "--config", str(config))
    assert "memory 2.00 GiB (c.Spawner.mem_guarantee)" in table.stdout.splitlines()[0]
