"""Each devcluster's own pod networks (gpuspawner.devcluster.podnet): two clusters side by
side never hand out one pod IP, a dead cluster's band comes back, and a band something
still listens on (a notebook that outlived its cluster) is never handed out."""

from __future__ import annotations

import json
import os
import socket

import pytest

from gpuspawner.devcluster import podnet


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A registry of this test's own; nothing listens on any band (the machine's own
    listeners, say a demo's notebooks, are the last test's subject only)."""
    monkeypatch.setattr(podnet.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(podnet, "listening_octets", lambda: set())
    return tmp_path / "gpuspawner-podnets"


def nobody(_pid):
    return False


def never(_directory):
    return False


def test_two_clusters_get_disjoint_bands_and_node_networks(registry):
    width = podnet.band_width(300)  # two octets of nodes and a spare one
    assert width == 3
    a = podnet.claim("/clusters/a", width, lambda pid: pid == os.getpid(), never)
    b = podnet.claim("/clusters/b", width, lambda pid: pid == os.getpid(), never)
    assert set(range(a, a + width)).isdisjoint(range(b, b + width))
    cidrs_a = {podnet.node_cidr(a, i, width) for i in range(width * 256)}
    cidrs_b = {podnet.node_cidr(b, i, width) for i in range(width * 256)}
    assert len(cidrs_a) == width * 256 and cidrs_a.isdisjoint(cidrs_b)
    assert podnet.node_cidr(a, 257, width) == f"127.{a + 1}.1.0/24"
    with pytest.raises(ValueError, match="past this cluster's pod networks"):
        podnet.node_cidr(a, width * 256, width)


def test_a_dead_claim_is_taken_over_and_release_gives_the_band_back(registry):
    every = podnet.LAST - podnet.FIRST + 1
    first = podnet.claim("/clusters/old", every, nobody, never)  # the whole range, by a process now gone
    assert first == podnet.FIRST
    assert json.loads((registry / "7").read_text())["directory"] == "/clusters/old"
    again = podnet.claim("/clusters/new", 2, lambda pid: False, never)
    assert json.loads((registry / str(again)).read_text())["directory"] == "/clusters/new"
    podnet.release("/clusters/new")
    assert not (registry / str(again)).exists() and (registry / "7").exists()


def test_a_claim_lives_while_its_cluster_runs(registry):
    every = podnet.LAST - podnet.FIRST + 1
    podnet.claim("/clusters/up", every, nobody, never)
    with pytest.raises(RuntimeError, match="no 2 free 127.X pod networks"):
        podnet.claim("/clusters/other", 2, nobody, lambda directory: directory == "/clusters/up")


def test_a_band_something_listens_on_is_skipped(registry, monkeypatch):
    monkeypatch.undo()
    monkeypatch.setattr(podnet.tempfile, "gettempdir", lambda: str(registry.parent))
    octet = next(o for o in range(200, 250) if o not in podnet.listening_octets())  # one nobody else uses now
    with socket.socket() as listener:
        listener.bind((f"127.{octet}.0.1", 0))
        listener.listen()
        assert octet in podnet.listening_octets()
        for _ in range(40):  # random starts: none of them may cover the busy octet
            start = podnet.claim("/clusters/x", 3, nobody, never)
            assert octet not in range(start, start + 3)
            podnet.release("/clusters/x")
