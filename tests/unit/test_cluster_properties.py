"""Properties of discovery and capacity on thousands of generated clusters.

The generator (gpuspawner.devcluster.generate) draws nodes of real label sets far beyond
the devcluster's classes and says, for every GPU resource it builds, which kind of offering
must take it or why none may (its ``truth``, written from what it built, not from
gpuspawner's rules). On each cluster:

1. every GPU resource of every node belongs to exactly one discovered offering, of the kind
   the generator built, or no offering reaches it and the generator says it is hidden (and
   gpuspawner can say why);
2. no two offerings' pods can land on the same GPU resource of the same node;
3. each offering's capacity is the sum of what its nodes advertise, and with nothing
   running its free count is what those nodes have room for (GPUs and pod slots).

GPUSPAWNER_CLUSTERS sets how many clusters (default 1,500: a few seconds);
``make fuzz-clusters`` runs 30,000.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest

from gpuspawner.capacity.counts import Tally, availability, units, unreached
from gpuspawner.core.fit import NodeFacts
from gpuspawner.devcluster.generate import random_cluster
from gpuspawner.offerings.discovery import discover

CLUSTERS = int(os.environ.get("GPUSPAWNER_CLUSTERS", "1500"))
SHARDS = 10
#: The generator's cause of a hidden GPU -> what gpuspawner's reason must mention.
CAUSES = {
    "cordoned": "cordoned",
    "not-ready": "taint node.kubernetes.io/",
    "untolerated-taint": "taint dedicated=ml-team",
    "user-pool-taint": "taint hub.jupyter.org/dedicated",
    "vm-host": "hosts VMs",
    "mig-reconfiguring": "MIG is being reconfigured",
    "not-discovered": "nvidia.com/vgpu",
}


def check_cluster(seed: int, seen: Counter) -> None:
    generated = random_cluster(random.Random(seed))
    manifests = [g.manifest for g in generated]
    offerings = discover(manifests)
    tallies = [(o, Tally(o)) for o in offerings]
    hidden = {(node, resource): why for node, resource, _, why in unreached(manifests, offerings)}
    where = f"seed {seed}"
    for g in generated:
        facts = NodeFacts.from_node(g.manifest)
        for resource, amount in facts.allocatable.items():
            if "/" not in resource or amount <= 0:
                continue
            reaching = [o.slug for o, t in tallies if resource in o.resources and t.reaches(facts)]
            truth = g.truth.get(resource, "hidden:not-discovered")
            seen[(g.scheme, truth)] += 1
            # 2. never two offerings on one node's resource
            assert len(reaching) <= 1, f"{where}: {g.name} ({g.scheme}) {resource} is reached by {reaching}"
            if truth.startswith("hidden:"):
                assert not reaching, f"{where}: {g.name} ({g.scheme}, {truth}) {resource} is reached by {reaching}"
                why = hidden.get((g.name, resource), "")
                causes = truth.removeprefix("hidden:").split("+")
                assert any(CAUSES[c] in why for c in causes), f"{where}: {g.name} ({g.scheme}) {resource}: {causes} but told {why!r}"
            else:
                assert (g.name, resource) not in hidden, f"{where}: {g.name} {resource} said hidden: {hidden[(g.name, resource)]}"
                # 1. exactly one offering, of the kind the node was built as
                assert reaching, f"{where}: {g.name} ({g.scheme}) {resource}: no offering takes it"
                kind = next(o.kind.value for o in offerings if o.slug == reaching[0])
                assert kind == truth, f"{where}: {g.name} ({g.scheme}) {resource} is offered as {kind} ({reaching[0]}), built as {truth}"
    # 3. capacity and free from what the nodes advertise
    by_name = {g.name: NodeFacts.from_node(g.manifest) for g in generated}
    for offering in offerings:
        avail = availability(offering, manifests, [])
        expected_capacity = sum(units(offering, by_name[n].allocatable) for n in avail.nodes)
        expected_free = sum(min(units(offering, by_name[n].allocatable), by_name[n].allocatable.get("pods", 0)) for n in avail.nodes)
        assert avail.capacity == expected_capacity, f"{where}: {offering.slug}"
        assert (avail.free, avail.allocated) == (expected_free, 0), f"{where}: {offering.slug}"
    total = Counter()
    for g in generated:
        for resource, truth in g.truth.items():
            if not truth.startswith("hidden:"):
                total[truth] += int(g.manifest["status"]["allocatable"][resource])
    offered = Counter()
    for offering in offerings:
        offered[offering.kind.value] += availability(offering, manifests, []).capacity * sum(offering.resources.values())
    assert offered == total, f"{where}: capacity by kind {dict(offered)} != GPUs built {dict(total)}"


@pytest.mark.parametrize("shard", range(SHARDS))
def test_generated_clusters(shard):
    seen: Counter = Counter()
    for seed in range(shard, CLUSTERS, SHARDS):
        check_cluster(seed, seen)
    # The generator must keep producing what the properties are about (not a vacuous pass).
    kinds = {truth for _, truth in seen}
    assert {"full", "shared", "mig", "vgpu"} <= kinds, kinds
    assert any(t.startswith("hidden:") for t in kinds), kinds
