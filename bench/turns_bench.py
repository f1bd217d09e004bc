"""Reclaim when someone waits vs the normal idle timeout: how long a waiting spawn waits.

On the demo stack (real JupyterHub and GPUSpawner, the GPU culler as its managed service,
the real Prometheus, the devcluster's real scheduler), the A100's single MIG 3g.20gb
(``admission: queue``): researcher1's server takes it and goes idle at once; researcher2
asks for the same slice and waits in the queue. Measured from researcher2's request to its
pod bound to the node, twice in one run:

* with ``reclaim_for_waiting_after`` (the idle server makes room after that bound), and
* without it (the slice comes free only at the offering's idle timeout),

with the same idle timeout. Printed side by side, with how long past its limit the idle
server was stopped (the scrape, the culler's cycles and the stop); nothing asserted.

    python -m bench.turns_bench [--timeout 120] [--bound 20]
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import urllib.request
from datetime import UTC, datetime

from gpuspawner.devcluster.ports import free_port
from gpuspawner.tools.demo import NAMESPACE, running_demo

SLICE = "mig-nvidia-a100-sxm4-40gb-3g-20gb"


def _call(api: str, token: str, method: str, path: str, body: dict | None = None) -> dict | None:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(f"{api}{path}", data=data, method=method, headers=headers), timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def one_run(timeout: int, bound: int | None) -> tuple[float, float, float]:
    """(request -> the waiting pod bound, request -> the idle server gone, how long the idle
    server had been idle when the request came), in seconds."""
    token = secrets.token_hex(16)
    args = f"--cull-every=3 --timeout=3600 --kind-timeout=mig={timeout} --gpu-window=20 --gpu-min-samples=3"
    if bound is not None:
        args += f" --reclaim-for-waiting-after={bound}"
    env = {"GPUSPAWNER_DEMO_API_TOKEN": token, "GPUSPAWNER_DEMO_CULLER_ARGS": args}
    with running_demo(port=free_port(), hub_port=free_port(), quiet=True, extra_env=env) as demo:
        kube = demo.cluster.client()
        kube.request("DELETE", "/api/v1/namespaces/research-team/pods/embeddings?gracePeriodSeconds=0")  # the slice comes free
        _call(demo.api_url, token, "POST", "/users/researcher1/server", {"offering": SLICE})
        deadline = time.monotonic() + 300
        while not ((_call(demo.api_url, token, "GET", "/users/researcher1") or {})["servers"].get("") or {}).get("ready"):
            if time.monotonic() > deadline:
                raise RuntimeError("researcher1's server never became ready")
            time.sleep(0.5)
        model = (_call(demo.api_url, token, "GET", "/users/researcher1") or {})["servers"][""]
        idle_before = (datetime.now(UTC) - datetime.fromisoformat(model["last_activity"])).total_seconds()
        asked = time.monotonic()
        _call(demo.api_url, token, "POST", "/users/researcher2/server", {"offering": SLICE})
        gone = bound_at = None
        deadline = asked + timeout + 600
        while bound_at is None:
            if time.monotonic() > deadline:
                raise RuntimeError("researcher2's pod was never bound")
            pods = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=component=singleuser-server")["items"]
            users = {p["metadata"]["labels"].get("hub.jupyter.org/username"): p for p in pods}
            if gone is None and "researcher1" not in users:
                gone = time.monotonic() - asked
            if (users.get("researcher2") or {}).get("spec", {}).get("nodeName"):
                bound_at = time.monotonic() - asked
            time.sleep(0.2)
        return bound_at, gone if gone is not None else bound_at, idle_before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=int, default=120, help="the MIG offering's idle timeout, seconds")
    parser.add_argument("--bound", type=int, default=20, help="reclaim_for_waiting_after, seconds")
    opts = parser.parse_args(argv)
    print(f"# A spawn waiting for the only MIG 3g.20gb while an idle server holds it (idle timeout {opts.timeout} s)")
    with_turns = one_run(opts.timeout, opts.bound)
    without = one_run(opts.timeout, None)
    print(f"{'':40} {'request -> bound':>17} {'idle one gone':>14} {'its idleness then':>18} {'beyond the limit':>17}")
    for label, (bound_at, gone, before), limit in (
        (f"reclaim_for_waiting_after={opts.bound} s", with_turns, opts.bound),
        (f"idle timeout only ({opts.timeout} s)", without, opts.timeout),
    ):
        print(f"{label:40} {bound_at:16.1f}s {gone:13.1f}s {before + gone:17.1f}s {before + gone - limit:16.1f}s")
    print(f"ratio idle timeout : reclaim for waiting = {without[0] / with_turns[0]:.1f}x sooner")
    return 0


if __name__ == "__main__":
    sys.exit(main())
