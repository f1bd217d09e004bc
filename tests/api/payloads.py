"""The 41 classes of spawn requests of issue #11 (items 4 and 5), each with the answer it must get.

Run by tests/api/test_api_errors.py. Also a script that prints the table of answers a
hub gives (``python -m tests.api.payloads``; with ``--src DIR`` the hub runs the
gpuspawner found in DIR, e.g. an older commit, to compare).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.conftest import _has_default_sa, wait_for

from .gpuhub import CLOSED, H100, MIG1, MIG3, NOBODYS, T4, Answer, GPUHub

STUDENT = "student1"
RESEARCHER = "researcher1"
NOT_OFFERED = "is not offered to you on this hub"
NOT_VALID = "is not a valid GPU option"
TOO_LONG = "The value of 'offering' is too long (at most 4096 characters as JSON)."
WHOLE = "must be a whole number such as 1 or 2"


@dataclass
class Case:
    id: str
    what: str
    status: int | tuple[int, ...]
    message: str  # a part of the answer's message ("" when none is expected)
    run: Callable[[GPUHub], Answer]
    user: str = STUDENT
    servers: list[str] = field(default_factory=lambda: [""])  # the servers to stop afterwards

    def statuses(self) -> tuple[int, ...]:
        return self.status if isinstance(self.status, tuple) else (self.status,)


def post(options, user: str = STUDENT, server: str = "") -> Callable[[GPUHub], Answer]:
    return lambda hub: hub.api("POST", hub.server_path(user, server), options)


def raw(data: bytes, user: str = STUDENT) -> Callable[[GPUHub], Answer]:
    return lambda hub: hub.api("POST", hub.server_path(user), data=data)


def put_then_post(options, user: str = STUDENT, server: str = "lab") -> Callable[[GPUHub], Answer]:
    def run(hub: GPUHub) -> Answer:
        created = hub.api("PUT", hub.server_path(user, server), {"user_options": options})
        assert created.status == 201, created
        return hub.api("POST", hub.server_path(user, server))  # no body: the stored options are used

    return run


def form(fields: dict, user: str = STUDENT) -> Callable[[GPUHub], Answer]:
    return lambda hub: hub.form_post(user, fields)


def junk_key(hub: GPUHub) -> Answer:
    answer = hub.api("POST", hub.server_path(STUDENT), {"offering": "cpu", "junk": "x" * (20 * 1024 * 1024)})
    stored = hub.user_model(STUDENT)["servers"][""]["user_options"]
    answer.message = "the junk key was stored" if "junk" in stored else "the junk key was not stored"
    return answer


def forged_record(hub: GPUHub) -> Answer:
    forged = {"offering": H100, "kind": "full", "count": 8, "pod": "someone-else", "url": "http://evil/"}
    answer = hub.api("POST", hub.server_path(STUDENT), {"offering": "cpu", "gpuspawner": forged})
    stored = hub.user_model(STUDENT)["servers"][""]["user_options"]
    record = stored.get("gpuspawner") or {}  # none yet, or the spawner's own once the pod runs
    answer.message = "the forged record was stored" if record.get("pod") == "someone-else" else "the forged record was not stored"
    return answer


def nothing_free(hub: GPUHub) -> Answer:
    """Someone else's job holds the only MIG 3g.20gb slice."""
    kube = hub.kube
    ns = f"{hub.namespace}-other"
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holder"},
        "spec": {
            "containers": [{"name": "job", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.20gb": "1"}}}],
            "tolerations": [{"operator": "Exists"}],
        },
    }
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    try:
        wait_for(
            lambda: kube.request("GET", f"/api/v1/namespaces/{ns}/pods/holder")["status"].get("phase") == "Running", "the holder running"
        )
        time.sleep(1.0)  # the hub's inventory hears of it through its watch
        return hub.api("POST", hub.server_path(RESEARCHER), {"offering": MIG3})
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/holder?gracePeriodSeconds=0")
        kube.request("DELETE", f"/api/v1/namespaces/{ns}")


def over_quota(hub: GPUHub) -> Answer:
    """Two whole H100s on a named server are the user's quota of 2 units; then a T4 share."""
    first = hub.api("POST", hub.server_path(RESEARCHER, "big"), {"offering": H100, "count": 2})
    assert first.status in (201, 202), first
    wait_for(lambda: any(p["spec"].get("nodeName") for p in hub.pods(RESEARCHER, "big")), "the big server's pod bound", timeout=60)
    time.sleep(1.0)  # the hub's inventory hears of the bound pod through its watch
    return hub.api("POST", hub.server_path(RESEARCHER), {"offering": T4})


CASES = [
    # the offering
    Case("offering-forbidden", "a whole H100 for a student", 403, NOT_OFFERED, post({"offering": H100})),
    Case("offering-unknown", "an offering that does not exist", 403, NOT_OFFERED, post({"offering": "no-such-gpu"})),
    Case("offering-nobodys", "a discovered offering of a group nobody is in", 403, NOT_OFFERED, post({"offering": NOBODYS[0]})),
    Case("offering-CPU", '"CPU" (not a slug)', 400, NOT_VALID, post({"offering": "CPU"})),
    Case("offering-int", "offering 5", 400, NOT_VALID, post({"offering": 5})),
    Case("offering-float", "offering 1.0", 400, NOT_VALID, post({"offering": 1.0})),
    Case("offering-bool", "offering true", 400, NOT_VALID, post({"offering": True})),
    Case("offering-null", "offering null", 400, NOT_VALID, post({"offering": None})),
    Case("offering-list", "two offerings in a list", 400, "Please choose exactly one GPU option", post({"offering": ["cpu", MIG1]})),
    Case("offering-dict", "offering {}", 400, NOT_VALID, post({"offering": {"slug": "cpu"}})),
    Case("offering-1MB", "a 1 MB offering string", 400, TOO_LONG, post({"offering": "a" * 1_000_000})),
    Case("offering-unicode", "offering 'gpü-ä'", 400, NOT_VALID, post({"offering": "gpü-ä"})),
    Case("offering-empty", 'offering ""', 400, NOT_VALID, post({"offering": ""})),
    Case("offering-markup", "offering <script>", 400, NOT_VALID, post({"offering": "<script>alert(1)</script>"})),
    # the count
    Case("count-0", "count 0", 400, "can be taken 1 at a time, not 0", post({"offering": MIG1, "count": 0})),
    Case("count-minus-1", "count -1", 400, WHOLE, post({"offering": MIG1, "count": -1})),
    Case(
        "count-8",
        "8 H100s (1, 2 or 4 allowed)",
        400,
        "can be taken 1, 2, 4 at a time, not 8",
        post({"offering": H100, "count": 8}, RESEARCHER),
        user=RESEARCHER,
    ),
    Case("count-1e9", 'count "1e9"', 400, WHOLE, post({"offering": MIG1, "count": "1e9"})),
    Case("count-list", "count [1, 2]", 400, "Please choose exactly one GPU count", post({"offering": MIG1, "count": [1, 2]})),
    Case("count-dict", "count {}", 400, WHOLE, post({"offering": MIG1, "count": {"n": 1}})),
    Case("count-float", "count 1.0", 400, WHOLE, post({"offering": MIG1, "count": 1.0})),
    Case("count-bool", "count true", 400, WHOLE, post({"offering": MIG1, "count": True})),
    Case("count-null", "count null", 400, WHOLE, post({"offering": MIG1, "count": None})),
    Case("count-10e50", "count 10**50", 400, "not 'a very large number'", post({"offering": MIG1, "count": 10**50})),
    Case("count-text", 'count "two"', 400, WHOLE, post({"offering": MIG1, "count": "two"})),
    Case("count-no-offering", "count 2 and no offering (the default: No GPU)", 400, "at a time, not 2", post({"count": 2})),
    # the body
    Case("body-options-list", '{"user_options": [1]}', 400, "user_options must be an object or null", post({"user_options": [1]})),
    Case("body-list", "a JSON list as the body", 400, "Body must be a JSON object", raw(b'["offering", "cpu"]')),
    Case("body-not-json", "a body that is not JSON", 400, "Invalid JSON", raw(b'{"offering": ')),
    # KubeSpawner's profiles
    Case(
        "profile-unknown",
        "a profile that does not exist",
        400,
        "The profile 'gpu-max' does not exist on this hub",
        post({"offering": "cpu", "profile": "gpu-max"}),
    ),
    Case(
        "profile-choice-unknown",
        "a profile option choice that does not exist",
        400,
        "'cuda99' is not a choice for Image",
        post({"offering": "cpu", "profile": "pytorch", "image": "cuda99"}),
    ),
    Case(
        "profile-list",
        "profile ['python']",
        400,
        "The profile must be the name of one profile",
        post({"offering": "cpu", "profile": ["python"]}),
    ),
    # keys nobody reads
    Case("junk-key-20MB", "a 20 MB key nobody reads, beside a valid choice", (201, 202), "the junk key was not stored", junk_key),
    Case("forged-record", "a forged 'gpuspawner' record", (201, 202), "the forged record was not stored", forged_record),
    # named servers: PUT stores, POST starts with what was stored
    Case(
        "put-post-forbidden",
        "PUT then POST of a named server with a forbidden offering",
        403,
        NOT_OFFERED,
        put_then_post({"offering": H100}),
        servers=["lab"],
    ),
    Case(
        "put-post-count",
        "PUT then POST of a named server with count 'lots'",
        400,
        WHOLE,
        put_then_post({"offering": MIG1, "count": "lots"}),
        servers=["lab"],
    ),
    # policy and the cluster's state
    Case("window-closed", "an offering outside its time window", 403, "is only available", post({"offering": CLOSED})),
    Case(
        "nothing-free",
        "the only MIG 3g.20gb slice is taken",
        409,
        "No A100 40GB · MIG 3g.20gb is free (0 of 1 free)",
        nothing_free,
        user=RESEARCHER,
    ),
    Case(
        "over-quota",
        "a T4 share while holding 2 H100s (quota: 2)",
        429,
        "Over your quota",
        over_quota,
        user=RESEARCHER,
        servers=["", "big"],
    ),
    Case("form-forbidden", "the form, posted by hand with a whole H100", 403, NOT_OFFERED, form({"offering": H100})),
    Case("valid", "a MIG 1g.5gb slice (allowed, free)", (201, 202), "", post({"offering": MIG1})),
]
#: The 41st class, "the cluster cannot be reached" (503), needs an outage: tests/api/test_outage.py.
OUTAGE_CASE = ("cluster-down", "any spawn while the API server is down", 503, "The GPU cluster cannot be reached")


def main(argv: list[str] | None = None) -> int:
    """Print the answers a hub gives to every case, as a Markdown table."""
    import argparse
    import os
    import tempfile
    from pathlib import Path

    from gpuspawner.devcluster.cluster import DevCluster

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--src", help="run the hub with the gpuspawner package found in this folder (e.g. an older commit)")
    args = parser.parse_args(argv)
    if args.src:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [args.src, os.environ.get("PYTHONPATH")]))
    tmp = Path(tempfile.mkdtemp(prefix="gpuspawner-payloads-"))
    cluster = DevCluster(tmp / "cluster")
    cluster.up(log=lambda m: None)
    hub = None
    try:
        kube = cluster.client()
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "payloads"}})
        wait_for(lambda: _has_default_sa(kube, "payloads"), "default service account")
        hub = GPUHub(tmp / "hub", cluster, "payloads").start()
        print("| # | class | status | message |\n|---|---|---|---|")
        for number, case in enumerate(CASES, 1):
            try:
                answer = case.run(hub)
                status, message = answer.status, answer.message
            except Exception as exc:  # noqa: BLE001 - a table row, whatever happened
                status, message = 0, f"{type(exc).__name__}: {exc}"
            print(f"| {number} | {case.what} | {status} | {message[:160].replace('|', '/')} |", flush=True)
            for server in case.servers:
                for user in {case.user, "researcher1"}:
                    try:
                        hub.stop_server(user, server)
                    except Exception:  # noqa: BLE001
                        pass
        traces = hub.log_text().count("Traceback")
        print(f"\nhub log: {traces} tracebacks")
    finally:
        if hub is not None:
            hub.stop()
        cluster.down(quiet=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
