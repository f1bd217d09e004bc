"""The test run leaves nothing running: a pytest plugin (tests/conftest.py loads it).

At the session's start every process the tests will start is marked: this process's
environment gets ``GPUSPAWNER_TEST_RUN=<id>``, which every child inherits (a hub, its proxy,
its notebooks and managed services, a devcluster's servers, their children), even once its
parent has died and it belongs to init. At the session's end (every fixture torn down), each
process whose environment carries this run's mark and that has not ended within a grace period
is named, ended (SIGKILL) and fails the run. A process started with an environment of its own
that leaves the mark out is not seen: the tests pass ``{**os.environ, ...}``.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import pytest

MARK = "GPUSPAWNER_TEST_RUN"
GRACE = float(os.environ.get("GPUSPAWNER_LEFTOVER_GRACE", "20"))  # seconds for processes that are ending (a proxy after its hub) to go


def marked(run: str) -> dict[int, str]:
    """Live processes (not zombies) whose environment carries ``run``'s mark: pid -> command line."""
    want = f"{MARK}={run}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    os.environ[MARK] = f"{os.getpid()}-{secrets.token_hex(4)}"  # (a pytest run by a test marks its own)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = os.environ.get(MARK)
    if not run or not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + GRACE
    left = marked(run)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = marked(run)
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    lines = "\n".join(f"  {pid}: {cmd[:300]}" for pid, cmd in sorted(left.items()))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = f"the tests left {len(left)} process(es) running {GRACE:.0f} s after the run (now killed):\n{lines}"
    if reporter is not None:
        reporter.write_sep("=", "processes left running", red=True)
        reporter.write_line(text)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
