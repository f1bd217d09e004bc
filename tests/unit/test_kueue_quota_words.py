"""The smaller of the nodes' count and what a Kueue queue still admits, which one limits, and the
words the spawn page and a refused spawn use for it (one phrase: core.wording.queue_words)."""

from __future__ import annotations

from gpuspawner.capacity.admission import REFUSE, WARN, Decision, admit
from gpuspawner.core.model import Availability, QueueRoom
from gpuspawner.hub.scheduling import refusal
from gpuspawner.names.vocabulary import Refusal
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.page.cards import availability_text

H100 = offering_from_config(
    {"slug": "h100", "kind": "full", "display_name": "H100", "product": "NVIDIA-H100-80GB-HBM3", "counts": [1, 2, 4]}, 0
)
NODES = Availability(capacity=8, allocated=6, free=2, largest_free=2)


def test_the_smaller_of_nodes_and_queue_and_which_limits():
    by_queue = NODES.within(QueueRoom("ml-course", free=1, largest=1))
    assert (by_queue.free, by_queue.largest_free, by_queue.node_free, by_queue.queue_limits) == (1, 1, 2, True)
    by_nodes = NODES.within(QueueRoom("ml-course", free=5, largest=4))
    assert (by_nodes.free, by_nodes.largest_free, by_nodes.queue_limits) == (2, 2, False)
    unknown = NODES.within(QueueRoom("ml-course", unknown="Kueue is not installed"))
    assert (unknown.free, unknown.queue_limits, unknown.queue_unknown) == (2, False, True)


def test_page_words():
    assert availability_text(H100, NODES.within(QueueRoom("ml-course", free=1, largest=1)), "block", 0) == (
        "2 free on the nodes; your queue 'ml-course' allows 1 more",
        "",
    )
    assert availability_text(H100, NODES.within(QueueRoom("ml-course", free=0, largest=0)), "block", 0) == (
        "2 free on the nodes; your queue 'ml-course' allows none more",
        "your queue 'ml-course' allows none more right now",
    )
    assert availability_text(H100, NODES.within(QueueRoom("ml-course", free=0, largest=0)), "warn", 0) == (
        "2 free on the nodes; your queue 'ml-course' allows none more: your server would wait",
        "",
    )
    assert availability_text(H100, NODES.within(QueueRoom("ml-course", free=5, largest=4)), "block", 0) == ("2 of 8 free", "")
    assert availability_text(H100, NODES.within(QueueRoom("ml-course", unknown="403")), "block", 0) == (
        "2 of 8 free on the nodes; your queue's limit is unknown",
        "",
    )


def test_a_block_spawn_the_queue_allows_none_is_refused_in_the_same_words():
    decision = admit(H100, 1, NODES.within(QueueRoom("ml-course", free=0, largest=0)), "block")
    assert decision == Decision(REFUSE, "No H100 is free now: 2 free on the nodes; your queue 'ml-course' allows none more.", "ml-course")
    refused = str(refusal(Refusal.NO_CAPACITY, decision))
    assert refused.endswith("allows none more. Please pick another option, or try again when a server of your queue has stopped.")
    # four GPUs for one server where the queue's flavors leave at most two in one: the queue says so
    decision = admit(H100, 4, Availability(8, 0, 8, 8).within(QueueRoom("ml-course", free=3, largest=2)), "warn")
    assert (
        decision.action == WARN
        and "No 4 x H100 on one node is free now: 8 free on the nodes; your queue 'ml-course' allows 2 more." in decision.message
    )
    assert admit(H100, 1, NODES.within(QueueRoom("ml-course", free=1, largest=1)), "block").action == "admit"
    # the nodes refuse: the nodes' words
    decision = admit(H100, 1, Availability(8, 8, 0, 0).within(QueueRoom("ml-course", free=3, largest=3)), "block")
    assert decision.message == "No H100 is free (0 of 8 free)."
