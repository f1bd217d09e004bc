"""Each devcluster's own loopback pod network.

kwok gives a pod an IP from its node's ``podCIDR``, and the pod runner serves the notebook
on that IP at the port the pod names (8888). Were every cluster to number its nodes'
networks the same way, two clusters on one machine (a test and the demo, two test modules,
two people's worktrees) would hand out the same pod IP: the second notebook could not bind,
or a hub would find a notebook left over from another cluster listening there and send its
user to it. So a cluster claims a band of whole ``127.X.0.0/16`` networks of its own, in a
registry every process on the machine shares (one file per second octet in
``$TMPDIR/gpuspawner-podnets``), and gives node ``i`` the network ``127.(X + i // 256).(i %
256).0/24``. A band is free when no claim on it is alive (neither the process that claimed
it nor that cluster's API server runs) and nothing listens on it (a notebook that outlived
its cluster). ``Cluster.down`` gives the band back.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

#: second octets a band may use: 127.0.0.0/16 is the machine's own loopback services
FIRST, LAST = 1, 254
#: /24 networks in one second octet
PER_OCTET = 256


def registry() -> Path:
    path = Path(tempfile.gettempdir()) / "gpuspawner-podnets"
    if not path.is_dir():
        path.mkdir(exist_ok=True)
        os.chmod(path, 0o1777)  # one registry for every user's clusters: loopback is the machine's
    return path


def band_width(nodes: int) -> int:
    """Second octets for ``nodes`` nodes, and one more for nodes added later (DRA nodes)."""
    return nodes // PER_OCTET + 2


def node_cidr(net: int, index: int, width: int) -> str:
    """The pod network of the cluster's ``index``-th node, inside its band."""
    if not 0 <= index < width * PER_OCTET:
        raise ValueError(f"node {index} is past this cluster's pod networks ({width * PER_OCTET} nodes)")
    return f"127.{net + index // PER_OCTET}.{index % PER_OCTET}.0/24"


def listening_octets(tables: tuple[str, ...] = ("/proc/net/tcp",)) -> set[int]:
    """Second octets of 127.X addresses something listens on (IPv4 LISTEN sockets)."""
    octets: set[int] = set()
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                address = bytes.fromhex(fields[1].split(":")[0])[::-1]
                if address[0] == 127:
                    octets.add(address[1])
    return octets


def _claim_alive(path: Path, alive: Callable[[int | None], bool], running: Callable[[str], bool]) -> bool:
    try:
        claim = json.loads(path.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # being written just now, or left half-written long ago
        return time.time() - path.stat().st_mtime < 60 if path.exists() else False
    return alive(claim.get("pid")) or running(claim.get("directory", ""))


def claim(directory: str, width: int, alive: Callable[[int | None], bool], running: Callable[[str], bool]) -> int:
    """Claim ``width`` adjacent free second octets for the cluster in ``directory``; the first.
    ``alive(pid)``: whether a process runs; ``running(directory)``: whether the cluster
    there still runs (a claim outlives the process that made it while its cluster runs)."""
    reg = registry()
    busy = listening_octets()
    starts = list(range(FIRST, LAST - width + 2))
    random.shuffle(starts)  # clusters starting at once rarely try the same band first
    body = json.dumps({"directory": directory, "pid": os.getpid()})
    for start in starts:
        octets = range(start, start + width)
        if any(o in busy or _claim_alive(reg / str(o), alive, running) for o in octets):
            continue
        taken: list[Path] = []
        for octet in octets:
            path = reg / str(octet)
            path.unlink(missing_ok=True)  # a dead claim
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:  # another cluster took it in between
                break
            with os.fdopen(fd, "w") as fh:
                fh.write(body)
            taken.append(path)
        if len(taken) == width:
            return start
        for path in taken:
            path.unlink(missing_ok=True)
    raise RuntimeError(f"no {width} free 127.X pod networks on this machine (claims in {reg}): stop a devcluster you no longer need")


def release(directory: str) -> None:
    """Give back every pod network the cluster in ``directory`` claimed."""
    for path in registry().iterdir():
        try:
            if json.loads(path.read_text()).get("directory") == directory:
                path.unlink(missing_ok=True)
        except (OSError, ValueError):
            continue
