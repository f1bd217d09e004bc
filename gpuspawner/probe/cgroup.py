"""Which pod and container a process belongs to, read from ``/proc/<pid>/cgroup``.

The kubelet puts every container in a cgroup whose path names the pod's UID and the
container's ID. The layouts this reads (cgroup v1: one line per hierarchy, v2: the
single ``0::`` line; paths may start with ``/..`` segments when the reader sits in a
cgroup namespace of its own, as a container does)::

    systemd driver, containerd:  /kubepods.slice/kubepods-burstable.slice/
                                 kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope
    systemd driver, CRI-O:       .../kubepods-besteffort-pod<uid with _>.slice/crio-<id>.scope
    systemd driver, Docker:      .../kubepods-pod<uid with _>.slice/docker-<id>.scope
    cgroupfs driver:             /kubepods/burstable/pod<uid>/<id>   (Guaranteed: /kubepods/pod<uid>/<id>)

A process outside any pod (the host's own, a system daemon) has no pod; a pause or
``crio-conmon-`` cgroup is not a container. Pure: text in, plain data out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a pod UID as the kubelet writes it in cgroup names: dashes (cgroupfs) or underscores
#: (systemd, which reserves "-"); static pods' UIDs are 32 hex digits without either
_POD = re.compile(r"(?:^|[-/])pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")
RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True)
class PodRef:
    """The pod (by UID) and container (by runtime ID) a process runs in."""

    pod_uid: str
    container_id: str = ""
    #: "containerd", "cri-o", "docker", or "" (cgroupfs paths do not say)
    runtime: str = ""


def _from_path(path: str) -> PodRef | None:
    segments = [s for s in path.split("/") if s and s != ".."]
    for i, segment in enumerate(segments):
        pod = _POD.search(segment)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-")
        rest = segments[i + 1 :]
        if rest:
            container = _CONTAINER.match(rest[0])
            if container:
                return PodRef(uid, container.group(2), RUNTIMES.get(container.group(1) or "", ""))
        return PodRef(uid)
    return None


def pod_of(cgroup_text: str) -> PodRef | None:
    """The pod of the process whose ``/proc/<pid>/cgroup`` reads ``cgroup_text``, or None.

    cgroup v2's unified line wins; on v1 the first hierarchy whose path names a pod
    (every controller the kubelet manages has the same pod path)."""
    lines = [line.split(":", 2) for line in cgroup_text.splitlines() if line.count(":") >= 2]
    v2 = [parts[2] for parts in lines if parts[:2] == ["0", ""]]
    v1 = [parts[2] for parts in lines if parts[:2] != ["0", ""]]
    best: PodRef | None = None
    for path in v2 + v1:
        ref = _from_path(path.strip())
        if ref is not None and ref.container_id:
            return ref
        best = best or ref
    return best
