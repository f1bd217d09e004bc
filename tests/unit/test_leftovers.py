"""The run's check for processes the tests left running (tests/leftovers.py), on a run of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_left.py"
    test.write_text(textwrap.dedent(body))
    env = {**os.environ, "GPUSPAWNER_LEFTOVER_GRACE": "2", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.leftovers",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(test),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_process_left_running_fails_the_run_and_is_ended(tmp_path):
    proc = run(
        tmp_path,
        f"""
        import subprocess
        def test_leaves_a_process():
            # in a session of its own, never waited for: as a hub's proxy whose hub died
            p = subprocess.Popen(["sleep", "600"], start_new_session=True)
            open({str(tmp_path / "pid")!r}, "w").write(str(p.pid))
        """,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "the tests left 1 process(es) running" in proc.stdout, proc.stdout
    pid = int((tmp_path / "pid").read_text())
    assert f"{pid}: sleep 600" in proc.stdout
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # killed (a zombie until init reaps it)


def test_a_run_that_ends_what_it_started_passes(tmp_path):
    proc = run(
        tmp_path,
        """
        import subprocess
        def test_ends_its_process():
            p = subprocess.Popen(["sleep", "600"], start_new_session=True)
            p.kill()
            p.wait()
        """,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "processes left running" not in proc.stdout
