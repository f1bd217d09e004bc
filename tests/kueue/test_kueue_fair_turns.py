"""Fair turns see Kueue's queue (issue #38), on the demo stack with the real Kueue (``make demo
KUEUE=1``): the real GPUSpawner sending its GPU servers through the LocalQueue ``demo``, Kueue
v0.17.0, the real Prometheus scraping the hub, and the GPU culler as the hub's managed service.

The ClusterQueue ``demo`` has 2 H100 GPUs: the batch team's Job holds one, researcher1's
server the other. While nobody waits, researcher1 may extend the server's GPU lease. Then a
second batch Job asks Kueue for an H100 and is held (no quota left): nobody waits in the hub's
own queue (admission ``warn``; Kueue queues), yet the hub counts the Job from Kueue's
visibility API, the lease may no longer be extended ("1 person is waiting for H100 ..."), the
culler reclaims researcher1's idle server for it with that reason, and Kueue admits the Job in
the quota it freed.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest

from gpuspawner.names.kueuenames import API_VERSION
from gpuspawner.names.vocabulary import KUEUE_WORKLOADS_WAITING
from gpuspawner.tools import demokueue
from tests.e2e.demo_stack import demo_with_token
from tests.e2e.test_budgets import call
from tests.kueue.test_kueue_devcluster import condition

pytestmark = pytest.mark.cluster
H100 = "gpu-nvidia-h100-80gb-hbm3"
BOUND = 30
CULLER_ARGS = (
    f"--cull-every=3 --timeout=3600 --kind-timeout=full=3600 --reclaim-for-waiting-after={BOUND} "
    "--gpu-window=20 --gpu-min-samples=3 --GpuCuller.warn_before_seconds=10 "
    f"--offering-gpu-lease={H100}=3600 --gpu-lease-extensions=2 --gpu-lease-extension=600"
)
EXTRA_CONFIG = """
c = get_config()
c.JupyterHub.load_roles.append({"name": "e2e-actions", "scopes": ["access:services", "tokens"], "services": ["e2e-admin"]})
"""
SECOND_JOB = "second-training"


def until(what, check, demo, timeout=180):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            lines = (demo.state / "jupyterhub.log").read_text().splitlines()
            pytest.fail(f"{what}; the hub's last lines:\n" + "\n".join(lines[-60:]))
        time.sleep(1)
    return found


def server(demo):
    return call(demo, "GET", "/users/researcher1")[1]["servers"].get("")


def culler(demo, method: str, path: str, token: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{demo.url}/services/gpu-culler/{path}",
        data=b"" if method == "POST" else None,
        method=method,
        headers={"Authorization": f"token {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def hub_metrics(demo) -> str:
    request = urllib.request.Request(f"{demo.url}/hub/metrics", headers={"Authorization": f"token {demo.token}"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.read().decode()


def workload(kube, job: str) -> dict | None:
    items = kube.request("GET", f"/apis/{API_VERSION}/namespaces/{demokueue.BATCH_NAMESPACE}/workloads")["items"]
    return next((w for w in items if any(o.get("name") == job for o in w["metadata"].get("ownerReferences") or [])), None)


def test_an_idle_server_is_reclaimed_and_its_lease_not_extended_while_a_batch_job_waits_in_kueue(tmp_path_factory):
    env = {"GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}
    with demo_with_token(tmp_path_factory, EXTRA_CONFIG, env=env, kueue=True) as demo:
        kube = demo.cluster.client()
        until(
            "the demo's batch Job admitted",
            lambda: (condition(workload(kube, demokueue.BATCH_JOB), "Admitted") or {}).get("status") == "True",
            demo,
        )
        call(demo, "POST", "/users/researcher1/server", {"offering": H100})
        until("researcher1's H100 server never became ready", lambda: (server(demo) or {}).get("ready"), demo)
        _, token = call(demo, "POST", "/users/researcher1/tokens", {"scopes": ["access:services!service=gpu-culler"]})
        token = token["token"]

        # nobody waits: the lease may be extended (once the culler has seen the server)
        status, answer = until(
            "the culler to know the server's lease",
            lambda: (r := culler(demo, "POST", "api/leases?user=researcher1&server=", token))[0] != 404 and r,
            demo,
        )
        assert status == 200, answer
        assert call(demo, "GET", "/users/researcher1")[1]["servers"].get("")  # and nothing reclaimed it

        # a second batch Job asks Kueue for an H100: the queue's 2 are held, so Kueue holds it
        job = demokueue.batch_job()
        job["metadata"]["name"] = SECOND_JOB
        kube.request("POST", f"/apis/batch/v1/namespaces/{demokueue.BATCH_NAMESPACE}/jobs", job)
        until(
            "the second Job held by Kueue",
            lambda: (condition(workload(kube, SECOND_JOB), "QuotaReserved") or {}).get("status") == "False",
            demo,
        )
        # the hub counts it from Kueue's visibility API, for the culler
        labels = (f'offering="{H100}"', f'cluster_queue="{demokueue.CLUSTER_QUEUE}"')

        def counted() -> bool:
            lines = hub_metrics(demo).splitlines()
            return any(
                line.startswith(KUEUE_WORKLOADS_WAITING + "{") and all(x in line for x in labels) and line.endswith(" 1.0")
                for line in lines
            )

        until("the hub to count the held Job", counted, demo)

        # researcher1 was just active, so the reclaim lies ahead; the lease may not be extended now
        now = datetime.now(UTC).isoformat()
        call(demo, "POST", "/users/researcher1/activity", {"last_activity": now, "servers": {"": {"last_activity": now}}})
        lease = until(
            "the culler to see someone waiting",
            lambda: next(
                (lease for lease in culler(demo, "GET", "api/leases", token)[1].get("leases", []) if "waiting" in lease["why_not"]), None
            ),
            demo,
        )
        assert lease["why_not"].startswith("1 person is waiting for "), lease
        status, answer = culler(demo, "POST", "api/leases?user=researcher1&server=", token)
        assert status == 409 and "waiting for" in json.dumps(answer), (status, answer)

        # idle past the bound while the Job waits: reclaimed for it, with the reason
        until("researcher1's idle server was not reclaimed for the waiting Job", lambda: server(demo) is None, demo, timeout=240)
        request = urllib.request.Request(f"{demo.url}/services/gpu-culler/api/actions", headers={"Authorization": f"token {demo.token}"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            actions = json.loads(resp.read())["actions"]
        stops = [(a["user"], a["action"], a["reason"]) for a in actions if a["action"] == "server_stopped"]
        assert stops == [("researcher1", "server_stopped", "waiting")], actions
        why = next(a["why"] for a in actions if a["action"] == "server_stopped")
        assert why.startswith("1 person was waiting for "), why
        # and Kueue admits the Job in the quota the reclaim freed
        until("the second Job admitted", lambda: (condition(workload(kube, SECOND_JOB), "Admitted") or {}).get("status") == "True", demo)
