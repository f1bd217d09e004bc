"""`make demo AUTOSCALE=1` records Karpenter's NodeClaims itself: hub_config/demo_config.py runs
`gpuspawner record-nodeclaims` as a hub-managed service into the demo's state folder, beside the
culler's action log, and the command the demo prints (gpuspawner/tools/demo.py) is a
`gpuspawner report` that reads both files. Without autoscale there is no recorder and no such
line. (The whole story, on the real Karpenter: tests/karpenter/test_karpenter_demo.py.)"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from traitlets.config import PyFileConfigLoader

from gpuspawner.tools.cli import parser
from gpuspawner.tools.demo import ACTION_LOG, CONFIG, NODECLAIM_RECORD, Demo, autoscale_banner


def demo_config(monkeypatch, state: Path, autoscale: bool) -> Any:
    """hub_config/demo_config.py loaded as JupyterHub loads it, with what the demo's env says."""
    monkeypatch.setenv("GPUSPAWNER_DEMO_DIR", str(state))
    monkeypatch.setenv("GPUSPAWNER_DEMO_ACTION_LOG", str(state / ACTION_LOG))
    monkeypatch.setenv("KUBECONFIG", str(state / "cluster" / "kubeconfig"))
    for name in ("GPUSPAWNER_DEMO_API_TOKEN", "GPUSPAWNER_DEMO_EXTRA_CONFIG", "GPUSPAWNER_DEMO_CULLER_ARGS", "GPUSPAWNER_DEMO_KUEUE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUSPAWNER_DEMO_CULLER", "1")
    if autoscale:
        monkeypatch.setenv("GPUSPAWNER_DEMO_AUTOSCALE", "1")
        monkeypatch.setenv("GPUSPAWNER_DEMO_NODECLAIMS", str(state / NODECLAIM_RECORD))
    else:
        monkeypatch.delenv("GPUSPAWNER_DEMO_AUTOSCALE", raising=False)
        monkeypatch.delenv("GPUSPAWNER_DEMO_NODECLAIMS", raising=False)
    return PyFileConfigLoader(CONFIG.name, path=str(CONFIG.parent)).load_config()


def services(config: Any) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in config.JupyterHub.services}


def cli_args(command: list[str]) -> Any:
    """The arguments `gpuspawner` reads from a service's command (``python -m gpuspawner.tools.cli ...``)."""
    assert command[1:3] == ["-m", "gpuspawner.tools.cli"], command
    return parser().parse_args(command[3:])


def test_with_autoscale_the_hub_runs_the_recorder_into_the_state_folder_beside_the_cullers_log(monkeypatch, tmp_path):
    found = services(demo_config(monkeypatch, tmp_path, autoscale=True))
    args = cli_args(found["nodeclaim-recorder"]["command"])
    assert args.func.__module__ == "gpuspawner.tools.nodeclaimlog"
    assert Path(args.output) == tmp_path / NODECLAIM_RECORD
    assert args.kubeconfig == str(tmp_path / "cluster" / "kubeconfig")  # (a managed service gets none of the hub's env)
    culler_log = next(a for a in found["gpu-culler"]["command"] if a.startswith("--GpuCuller.action_log_path="))
    assert Path(culler_log.partition("=")[2]) == tmp_path / ACTION_LOG
    # it speaks to the API server only: no hub role, no API token
    config = demo_config(monkeypatch, tmp_path, autoscale=True)
    assert not any("nodeclaim-recorder" in (role.get("services") or []) for role in config.JupyterHub.load_roles)


def test_without_autoscale_there_is_no_recorder(monkeypatch, tmp_path):
    found = services(demo_config(monkeypatch, tmp_path, autoscale=False))
    assert "nodeclaim-recorder" not in found and "gpu-culler" in found


def demo(state: Path, autoscale: bool, culler: bool = True) -> Demo:
    fields: dict[str, Any] = dict.fromkeys(("url", "api_url", "cluster", "runner", "hub", "telemetry", "prometheus"))
    return Demo(state=state, nodeclaims=state / NODECLAIM_RECORD if autoscale else None, culler=culler, **fields)


@pytest.mark.parametrize("autoscale", [True, False])
def test_the_printed_report_reads_the_demos_record_and_action_log(tmp_path, autoscale):
    running = demo(tmp_path, autoscale)
    banner = autoscale_banner(running)
    if not autoscale:
        assert banner == "" and running.node_hours_command() == ""
        return
    command = running.node_hours_command()
    assert command in banner and "saved by idle reclaims" in banner
    words = shlex.split(command)
    assert Path(words[0]).name == "gpuspawner"
    args = parser().parse_args(words[1:])
    assert args.func.__module__ == "gpuspawner.tools.report"
    assert (Path(args.nodeclaims), Path(args.actions)) == (tmp_path / NODECLAIM_RECORD, tmp_path / ACTION_LOG)


def test_without_the_culler_the_printed_report_reads_no_action_log(tmp_path):
    """(`--no-culler`: no action log is written, and the report would refuse a missing file.)"""
    running = demo(tmp_path, autoscale=True, culler=False)
    args = parser().parse_args(shlex.split(running.node_hours_command())[1:])
    assert Path(args.nodeclaims) == tmp_path / NODECLAIM_RECORD and args.actions is None
    assert "saved by idle reclaims" not in autoscale_banner(running)
