"""Process -> pod and container from /proc/<pid>/cgroup, in each layout the kubelet and the
runtimes write (cgroup v1 and v2; systemd and cgroupfs drivers; containerd, CRI-O, Docker)."""

from __future__ import annotations

import pytest

from gpuspawner.devcluster.nvmlstandin import ProcTree, cgroup_line
from gpuspawner.probe.cgroup import PodRef, pod_of

UID = "0f2ad3c1-6b7e-4b8a-9d3e-2c1f5a7b9e10"
CID = "4c1f" * 16

# verbatim shapes of real nodes' /proc/<pid>/cgroup
CONTAINERD_V2 = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)
CRIO_V2 = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n"
CGROUPFS_V1 = "".join(
    f"{h}:/kubepods/burstable/pod{UID}/{CID}\n" for h in ("12:pids", "11:memory", "7:devices", "4:cpu,cpuacct", "1:name=systemd")
)
CONMON = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope\n"


@pytest.mark.parametrize(
    ("text", "runtime"),
    [(CONTAINERD_V2, "containerd"), (CRIO_V2, "cri-o"), (CGROUPFS_V1, "")],
    ids=["containerd-systemd-v2", "crio-systemd-v2", "cgroupfs-v1"],
)
def test_real_layouts_name_pod_and_container(text: str, runtime: str) -> None:
    assert pod_of(text) == PodRef(UID, CID, runtime)


@pytest.mark.parametrize("runtime", ["containerd", "cri-o", "docker"])
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("namespaced", [False, True])
def test_every_layout_the_standin_writes(tmp_path, runtime, driver, qos, version, namespaced) -> None:
    tree = ProcTree(tmp_path)
    tree.add(42, cgroup_line(UID, CID, runtime=runtime, driver=driver, qos=qos), cgroup_version=version, namespaced=namespaced)
    ref = pod_of((tmp_path / "42" / "cgroup").read_text())
    assert ref is not None
    assert (ref.pod_uid, ref.container_id) == (UID, CID)
    assert ref.runtime == ("" if driver == "cgroupfs" else runtime)


def test_conmon_and_pod_level_cgroups_name_the_pod_but_no_container() -> None:
    assert pod_of(CONMON) == PodRef(UID)
    assert pod_of(f"0::/kubepods/pod{UID}\n") == PodRef(UID)


@pytest.mark.parametrize(
    "text",
    ["0::/system.slice/containerd.service\n", "0::/user.slice/user-0.slice/session-3.scope\n", "0::/\n", "", "garbage\n"],
)
def test_processes_outside_pods_have_none(text: str) -> None:
    assert pod_of(text) is None


def test_static_pod_uid_is_a_hash() -> None:
    uid = "6f1e3c2b9a8d7e6f5a4b3c2d1e0f9a8b"
    assert pod_of(f"0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{CID}.scope\n") == PodRef(uid, CID, "containerd")
