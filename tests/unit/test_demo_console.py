"""What the demo's console shows of the hub's log: its messages and the culler's
decisions, not the access log of requests that went well (Prometheus scrapes the hub
every few seconds; those lines stay in jupyterhub.log)."""

from __future__ import annotations

import threading

from gpuspawner.tools.demo import console_line, follow

SHOWN = [
    "[I 2026-11-23 20:49:07.101 GpuCuller cycle:344] cycle done in 0.02s: 1 servers; 0 stop, 0 reclaim (0 kernels), 0 held back, 1 keep",
    "[I 2026-11-23 20:49:07.101 GpuCuller actions:150] stop server student1 [mig mig-nvidia-a100-sxm4-40gb-1g-5gb] (idle)",
    "[W 2026-11-23 20:38:36.315 JupyterHub log:192] 403 GET /hub/api/user (@127.0.0.1) 2.78ms",
    "[E 2026-11-23 20:38:36.315 JupyterHub log:192] 500 GET /hub/spawn (student1@127.0.0.1) 12.00ms",
    "[I 2026-11-23 20:38:30.000 JupyterHub app:3300] JupyterHub is now running at http://127.0.0.1:8000/",
]
HIDDEN = [
    "[I 2026-11-23 20:38:33.524 JupyterHub log:192] 200 GET /hub/metrics (prometheus@127.0.0.1) 33.56ms",
    "[I 2026-11-23 20:38:33.524 JupyterHub log:192] 302 GET / -> /hub/ (@127.0.0.1) 0.66ms",
    "[D 2026-11-23 20:38:33.524 JupyterHub log:192] 200 GET /hub/health (@127.0.0.1) 0.50ms",
    "",
]


def test_the_console_keeps_messages_and_problems_and_drops_successful_requests():
    assert [line for line in SHOWN + HIDDEN if console_line(line)] == SHOWN


def test_follow_prints_only_what_the_log_gains_after_the_banner(tmp_path):
    log = tmp_path / "jupyterhub.log"
    log.write_text(SHOWN[0] + "\n")  # before the banner: already in the file, not repeated
    shown: list[str] = []
    stop = threading.Event()
    start = log.stat().st_size
    thread = threading.Thread(target=follow, args=(log, stop, start, lambda line, flush: shown.append(line)))
    thread.start()
    try:
        with log.open("a") as f:
            f.write("\n".join(HIDDEN[:2] + SHOWN[1:3]) + "\n")
        deadline = threading.Event()
        for _ in range(100):
            if len(shown) == 2:
                break
            deadline.wait(0.05)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert shown == SHOWN[1:3]
