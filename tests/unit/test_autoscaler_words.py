"""Karpenter's refusal in its words (gpuspawner/hub/autoscaler.py), from the events the real
Karpenter v1.14.1 wrote on the devcluster (tests/karpenter/test_karpenter_demo.py sees them live)."""

from __future__ import annotations

from gpuspawner.hub.autoscaler import claim_steps, karpenter_refusal, nominated_claim

AT_LIMIT = (
    "Failed to schedule pod, incompatible requirements, key nvidia.com/gpu.product, nvidia.com/gpu.product In"
    " [NVIDIA-H100-80GB-HBM3] not in nvidia.com/gpu.product In [Tesla-T4-SHARED]; node limits have been exhausted for"
    " nodepool (NodePool=gpu-h100); incompatible requirements, key nvidia.com/gpu.product, nvidia.com/gpu.product In"
    " [NVIDIA-H100-80GB-HBM3] not in nvidia.com/gpu.product In [NVIDIA-A100-SXM4-40GB]"
)
EXCLUDED = (
    "Failed to schedule pod, incompatible requirements, key nvidia.com/gpu.product, nvidia.com/gpu.product In"
    " [NVIDIA-B200] not in nvidia.com/gpu.product In [Tesla-T4-SHARED]"
)


def event(message: str, component: str = "karpenter", reason: str = "FailedScheduling") -> dict:
    return {"reason": reason, "message": message, "source": {"component": component}, "involvedObject": {"name": "p"}}


def test_the_pool_that_fits_says_why_the_others_are_left_out():
    assert karpenter_refusal([event(AT_LIMIT)]) == "node limits have been exhausted for nodepool (NodePool=gpu-h100)."


def test_a_pools_requirements_key_after_key_stay_one_part():
    two_keys = AT_LIMIT.replace(
        "[Tesla-T4-SHARED]; ",
        "[Tesla-T4-SHARED]; key nvidia.com/gpu.replicas, nvidia.com/gpu.replicas In [1] not in nvidia.com/gpu.replicas In [4]; ",
    )
    assert karpenter_refusal([event(two_keys)]) == "node limits have been exhausted for nodepool (NodePool=gpu-h100)."


def test_where_no_pool_fits_that_is_the_reason():
    assert karpenter_refusal([event(EXCLUDED)]) == (
        "incompatible requirements, key nvidia.com/gpu.product, nvidia.com/gpu.product In [NVIDIA-B200] not in"
        " nvidia.com/gpu.product In [Tesla-T4-SHARED]."
    )


def test_only_karpenters_failures_count_and_the_latest_wins():
    scheduler = event("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.", "default-scheduler")
    nominated = event("Pod should schedule on: nodeclaim/gpu-h100-abcde", reason="Nominated")
    assert karpenter_refusal([scheduler, nominated]) is None
    assert karpenter_refusal([event(EXCLUDED), scheduler, event(AT_LIMIT)]).startswith("node limits have been exhausted")
    assert karpenter_refusal([{"reason": "FailedScheduling", "reportingComponent": "karpenter", "message": AT_LIMIT}]) is not None


def test_the_nodeclaim_nominated_and_its_steps_with_their_times():
    nominated = event("Pod should schedule on: nodeclaim/gpu-h100-x7k2p", reason="Nominated")
    assert nominated_claim([event(EXCLUDED), nominated]) == "gpu-h100-x7k2p"
    assert nominated_claim([event("Pod should schedule on: nodeclaim/a", "default-scheduler", "Nominated")]) is None
    claim = {
        "metadata": {"name": "gpu-h100-x7k2p", "creationTimestamp": "2026-11-29T03:39:26Z"},
        "status": {
            "conditions": [
                {"type": "Launched", "status": "True", "lastTransitionTime": "2026-11-29T03:39:27Z"},
                {"type": "Registered", "status": "True", "lastTransitionTime": "2026-11-29T03:39:47Z"},
                {"type": "Initialized", "status": "Unknown", "lastTransitionTime": "2026-11-29T03:39:26Z"},
            ]
        },
    }
    assert claim_steps(claim) == [
        "NodeClaim gpu-h100-x7k2p launched, 1 s after it was created",
        "NodeClaim gpu-h100-x7k2p registered, 21 s after it was created",
    ]
    assert claim_steps({"metadata": {"name": "n"}}) == []


class _Spawner:
    """What karpenter_verdict reads of a spawner: its pod in KubeSpawner's reflector and the events of its pod's name."""

    namespace, pod_name, api = "jhub", "jupyter-ada", None

    def __init__(self, uid: str | None, events: list[dict]):
        pods = {} if uid is None else {"jhub/jupyter-ada": {"metadata": {"name": "jupyter-ada", "uid": uid}}}
        self.pod_reflector = type("Reflector", (), {"pods": pods})()
        self.events = events


def of(uid: str, message: str) -> dict:
    return {**event(message), "involvedObject": {"kind": "Pod", "name": "jupyter-ada", "uid": uid}}


async def test_a_previous_pods_refusal_is_not_this_pods():
    """A spawn Karpenter refused, started again (the admin raised the pool's limit): KubeSpawner's
    events of the pod's name may still hold the old pod's refusal while the new start waits for its
    node (the wait begins before KubeSpawner marks the last old event); it is not the new pod's, and
    the new spawn is not refused with it. Seen in bench/autoscale_start.py: a refusal in 0.01 s."""
    import asyncio

    from gpuspawner.hub.autoscaler import karpenter_verdict, pod_events

    old = of("old-uid", AT_LIMIT)
    assert pod_events(_Spawner(None, [old])) == []  # no pod yet: nothing of it
    assert pod_events(_Spawner("new-uid", [old])) == []
    waiting = asyncio.ensure_future(karpenter_verdict(_Spawner("new-uid", [old]), []))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # still waiting for this pod's node (or this pod's refusal)
    waiting.cancel()
    mine = _Spawner("new-uid", [old, of("new-uid", AT_LIMIT)])
    assert await asyncio.wait_for(karpenter_verdict(mine, []), 5) == "node limits have been exhausted for nodepool (NodePool=gpu-h100)."
