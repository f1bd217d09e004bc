"""`gpuspawner offerings` with DRA files: slices, device classes and claims beside the nodes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuspawner.devcluster import dradriver as d
from gpuspawner.devcluster.nodes import standard_nodes


def run(*args):
    return subprocess.run([sys.executable, "-m", "gpuspawner.tools.cli", *args], capture_output=True, text=True, timeout=60)


def write(path, items):
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


@pytest.fixture
def files(tmp_path):
    nodes = standard_nodes() + [d.dra_node_manifest(spec, i) for i, spec in enumerate(d.DRA_NODES)]
    slices = [s for spec in d.DRA_NODES for s in d.resource_slices(spec.name, d.node_devices(spec))]
    held = {
        "metadata": {"name": "someone", "namespace": "other"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "dra-l4", "device": "gpu-2"}]}}
        },
    }
    return {
        "--nodes": write(tmp_path / "nodes.json", nodes),
        "--slices": write(tmp_path / "slices.json", slices),
        "--device-classes": write(tmp_path / "classes.json", d.device_classes()),
        "--claims": write(tmp_path / "claims.json", [held]),
    }


def args(files, *only):
    return [x for k, v in files.items() if not only or k in only for x in (k, v)]


def test_dra_offerings_appear_beside_device_plugin_ones_with_free_counts(files):
    done = run("offerings", *args(files), "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["slug"]: r for r in json.loads(done.stdout)}
    assert (rows["dra-gpu-l4"]["capacity"], rows["dra-gpu-l4"]["free"]) == (4, 3)
    assert rows["dra-mig-a100-40gb-1g-5gb"]["free"] == 2 and rows["dra-gpu-h100-80gb"]["source"] == "dra"
    assert rows["gpu-nvidia-h100-80gb-hbm3"]["capacity"] == 8  # the device plugin's H100 node, counted as before
    table = run("offerings", *args(files))
    assert table.returncode == 0 and "DRA claim: gpu.nvidia.com" in table.stdout


def test_without_claims_every_published_device_is_free(files):
    done = run("offerings", *args(files, "--nodes", "--slices", "--device-classes"), "--json")
    rows = {r["slug"]: r for r in json.loads(done.stdout)}
    assert rows["dra-gpu-l4"]["free"] == 4


def test_slices_without_classes_is_a_usage_error_that_says_why(files):
    done = run("offerings", *args(files, "--nodes", "--slices"))
    assert done.returncode == 2 and "--slices and --device-classes go together" in done.stderr


def test_an_admin_selector_that_matches_nothing_is_a_warning_and_a_broken_one_an_error(files, tmp_path):
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        "c.GPUSpawner.offerings = [{'slug': 'huge', 'kind': 'full', 'display_name': 'Any GPU with 200 GiB',"
        " 'dra': {'selector': \"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('200Gi')) >= 0\"}},"
        " {'slug': 'big', 'kind': 'full', 'display_name': 'Any GPU with 40 GiB', 'counts': [1, 2],"
        " 'dra': {'selector': \"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0\"}}]\n"
    )
    done = run("offerings", *args(files), "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    assert "offering 'huge': its DRA selectors match none of the 10 devices published now" in done.stderr
    rows = {r["slug"]: r for r in json.loads(done.stdout)}
    assert (rows["big"]["capacity"], rows["big"]["free"]) == (2, 2)  # the H100s: L4s have 22.5 GiB
    config.write_text("c.GPUSpawner.offerings = [{'slug': 'bad', 'kind': 'full', 'dra': {'selector': \"device.attributes[\"}}]\n")
    done = run("offerings", *args(files), "--config", str(config))
    assert done.returncode == 2
    assert "c.GPUSpawner.offerings[0] (slug 'bad'): field 'dra' ['selector'][0] CEL expression does not compile" in done.stderr


def test_mapped_offerings_and_dra_node_filters_read_the_pages_count(tmp_path):
    """Issue 41: the CLI counts with the hub's own index: a plain nvidia.com/gpu offering counts the
    GPUs of DRA nodes the mapping serves it on, devices an admin's DeviceTaintRule taints are not
    free, and a cordoned DRA node offers nothing."""
    mapped = d.dra_node_manifest(d.EXTRES_NODE, 0)
    l4 = d.dra_node_manifest(d.DraNode("dra-l4", d.L4, 4), 1)
    l4["spec"]["unschedulable"] = True
    slices = [s for spec in (d.EXTRES_NODE, d.DRA_NODES[1]) for s in d.resource_slices(spec.name, d.node_devices(spec))]
    rule = {"metadata": {"name": "drain"}, "spec": {"deviceSelector": {"device": "gpu-1"}, "taint": {"key": "k", "effect": "NoSchedule"}}}
    config = tmp_path / "config.py"
    config.write_text(
        "c.GPUSpawner.offerings = [{'slug': 'plain-h100', 'kind': 'full', 'display_name': 'H100', "
        "'resources': {'nvidia.com/gpu': 1}, 'node_selector': {'nvidia.com/gpu.product': 'NVIDIA-H100-80GB-HBM3'}}]\n"
    )
    common = [
        "--nodes", write(tmp_path / "nodes.json", [mapped, l4]),
        "--slices", write(tmp_path / "slices.json", slices),
        "--device-classes", write(tmp_path / "classes.json", d.device_classes()),
        "--config", str(config), "--json",
    ]  # fmt: skip
    rows = {r["slug"]: r for r in json.loads(run("offerings", *common).stdout)}
    assert (rows["plain-h100"]["capacity"], rows["plain-h100"]["free"]) == (2, 2)
    assert rows["dra-gpu-l4"]["free"] == 0  # its node is cordoned
    done = run("offerings", *common, "--taint-rules", write(tmp_path / "rules.json", [rule]))
    rows = {r["slug"]: r for r in json.loads(done.stdout)}
    assert rows["plain-h100"]["free"] == 1 and rows["dra-gpu-h100-80gb"]["free"] == 1
