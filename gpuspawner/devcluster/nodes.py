"""The simulated GPU nodes: read from ``nodes.yaml`` and turned into Node manifests.

``many_nodes(n)`` copies the node classes round-robin for scale tests and
benchmarks; every node gets its own loopback pod CIDR (``127.X.Y.0/24``), so a
pod's IP is an address on this machine that a real server can bind to.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

NODES_FILE = Path(__file__).with_name("nodes.yaml")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
CLASS_LABEL = "gpuspawner.io/node-class"
MAX_NODES = 254 * 256


def node_classes(path: Path = NODES_FILE) -> list[dict[str, Any]]:
    """The node entries of ``nodes.yaml`` (name, labels, taints, allocatable, class)."""
    data = yaml.safe_load(path.read_text())
    nodes: list[dict[str, Any]] = data["nodes"]
    return nodes


def pod_cidr(index: int) -> str:
    """Node ``index`` -> ``127.1.0.0/24``, ``127.1.1.0/24``, ... (65,024 nodes at most): the
    manifest's own network. A devcluster gives each node one of its own band instead
    (:mod:`gpuspawner.devcluster.podnet`), so that clusters side by side never share a pod IP."""
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index} out of range: at most {MAX_NODES} simulated nodes")
    return f"127.{1 + index // 256}.{index % 256}.0/24"


def node_manifest(entry: dict[str, Any], index: int, name: str | None = None) -> dict[str, Any]:
    """One ``nodes.yaml`` entry -> a v1 Node that kwok manages."""
    allocatable = {k: str(v) for k, v in (entry.get("allocatable") or {}).items()}
    labels = {k: str(v) for k, v in (entry.get("labels") or {}).items()}
    node_name = name or entry["name"]
    labels.update(
        {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            CLASS_LABEL: entry["x-gpuspawner-class"],
        }
    )
    cidr = pod_cidr(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": copy.deepcopy(entry.get("taints") or [])},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def standard_nodes() -> list[dict[str, Any]]:
    """One node of each class, as in ``nodes.yaml``."""
    return [node_manifest(entry, i) for i, entry in enumerate(node_classes())]


def many_nodes(count: int, classes: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """``count`` nodes, the classes of ``nodes.yaml`` repeated round-robin."""
    classes = classes or node_classes()
    for i in range(count):
        entry = classes[i % len(classes)]
        yield node_manifest(entry, i, name=f"{entry['name']}-{i:05d}")
