"""What a process has used, from Linux's /proc: for the benchmarks that put a number on a hub's cost."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # (the name may hold ')')
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int | str, field: str, missing: float = 0.0) -> float:
    """A memory line of /proc/PID/status in MiB (``VmRSS`` now, ``VmHWM`` the peak); ``pid`` may be "self"."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return missing
