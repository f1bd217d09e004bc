"""Issue 29 on the running demo: the spawn page its users get from the hub, with the simulated
NVIDIA DRA driver's nodes added to the demo's cluster, says one memory figure per GPU and MIG
profile and promises no queue place on a choice the user may not take (tests/pagewords.py, the
same rules as tests/unit/test_page_words.py checks on the page rendered without a hub)."""

from __future__ import annotations

import pytest

from gpuspawner.devcluster.dradriver import SimulatedDriver
from tests.conftest import wait_for
from tests.e2e.demo_stack import demo_with_token, spawn_page
from tests.pagewords import cards, disagreements

pytestmark = pytest.mark.cluster
MIG_1G = ("mig-nvidia-a100-sxm4-40gb-1g-5gb", "mig-gke-nvidia-tesla-a100-1g-5gb", "dra-mig-a100-40gb-1g-5gb")
MIG_3G = "mig-nvidia-a100-sxm4-40gb-3g-20gb"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with demo_with_token(tmp_path_factory, "", culler=False) as running:
        SimulatedDriver(running.cluster.client()).install()
        yield running


def seen_by(demo, user: str, settled=lambda shown: True) -> dict:
    """``user``'s cards, once the hub shows the DRA driver's devices (and ``settled`` holds)."""

    def ready():
        shown = cards(spawn_page(demo, user))
        return shown if "dra-mig-a100-40gb-1g-5gb" in shown and settled(shown) else None

    return wait_for(ready, f"{user}'s spawn page with the DRA devices", timeout=120, interval=1.0)


def test_the_demo_page_agrees_with_itself_for_a_student_and_a_researcher(demo):
    student = seen_by(demo, "student1")
    assert disagreements(student) == []
    assert {student[slug].memory for slug in MIG_1G} == {"4.8 GB"}
    assert student["gpu-nvidia-tesla-a100"].memory == "40 GB"
    assert student["gpu-nvidia-h100-80gb-hbm3"].memory == student["dra-gpu-h100-80gb"].memory == "80 GB"
    assert (student[MIG_3G].badge, student[MIG_3G].reason) == ("", "not allowed for your groups")

    # (the other team's pod holds the only 3g slice: the queue is the researcher's to join)
    researcher = seen_by(demo, "researcher1", lambda shown: "none free" in shown[MIG_3G].badge)
    assert disagreements(researcher) == []
    assert researcher[MIG_3G].badge == "none free: you would be first in the queue"
