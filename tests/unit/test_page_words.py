"""Issue 29: the spawn page's words agree with each other, on the demo's cluster as its users see it.

The page is rendered with the real template for the demo hub's own config (hub_config/demo_config.py)
on the devcluster's nodes (nodes.yaml: an A100 in MIG mixed mode labelled by GFD, a GKE A100 split
into 1g.5gb partitions and a whole GKE A100 without GFD labels, eight H100s, ...) plus the
simulated NVIDIA DRA driver's nodes (an A100 with static MIG devices, H100s, L4s), with the other
team's pods of the demo holding what they hold there (the only MIG 3g.20gb among them).
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from traitlets.config.loader import PyFileConfigLoader

from gpuspawner.capacity.access import Requester
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.core.products import MIG_PROFILE_MIB, gpu_memory_mib, mig_profile_mib, product_memory_mib, product_name
from gpuspawner.core.wording import offering_words
from gpuspawner.devcluster import dradriver as d
from gpuspawner.devcluster.nodes import node_classes, standard_nodes
from gpuspawner.hub.form import render_form
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
from gpuspawner.page.cards import option_views
from gpuspawner.page.views import FormView, group_options
from gpuspawner.tools.demo import CONFIG, OTHER_TEAM
from tests.pagewords import cards, disagreements

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=ZoneInfo("Europe/Zurich"))
STUDENT = Requester("student1", frozenset({"students", "gpu-users"}))
RESEARCHER = Requester("researcher1", frozenset({"researchers", "gpu-users"}))
#: where the demo's scheduler puts the other team's pods (tools/demo.py, OTHER_TEAM)
OTHER_TEAM_NODES = {"finetune-llm": "gpu-h100-8x", "embeddings": "gpu-a100-mig", "course-grader": "gpu-t4-ts-renamed"}
MIG_1G = ("mig-nvidia-a100-sxm4-40gb-1g-5gb", "mig-gke-nvidia-tesla-a100-1g-5gb", "dra-mig-a100-40gb-1g-5gb")
MIG_3G = "mig-nvidia-a100-sxm4-40gb-3g-20gb"


def other_team_pods() -> list[dict]:
    return [
        {
            "metadata": {"namespace": "research-team", "name": name},
            "spec": {
                "nodeName": OTHER_TEAM_NODES[name],
                "containers": [{"name": "job", "resources": {"requests": limits, "limits": limits}}],
            },
            "status": {"phase": "Running"},
        }
        for name, limits, _ in OTHER_TEAM
    ]


@pytest.fixture(scope="module")
def demo():
    """(the demo hub's catalog, the cluster's index) for the demo's cluster with the DRA driver's nodes."""
    settings = PyFileConfigLoader(CONFIG.name, path=str(CONFIG.parent)).load_config()["GPUSpawner"]
    index = ClusterIndex()
    index.replace(nodes=standard_nodes() + [d.dra_node_manifest(spec, i) for i, spec in enumerate(d.DRA_NODES)], pods=other_team_pods())
    slices = [s for spec in d.DRA_NODES for s in d.resource_slices(spec.name, d.node_devices(spec))]
    index.dra.replace(slices=slices, classes=d.device_classes(), claims=[])
    index.dra.synced = True
    catalog = build_catalog(CatalogConfig.from_settings(settings), discovered=index.discovered())
    return catalog, index, settings.get("admission", "block")


def page(demo, who: Requester) -> str:
    catalog, index, admission = demo
    rows = option_views(catalog, who, index.availability, NOW, admission)
    return render_form(FormView(groups=group_options(rows, [k.value for k in Kind]), selected=None, selected_count=1))


@pytest.mark.parametrize("who", [STUDENT, RESEARCHER], ids=["student", "researcher"])
def test_the_demo_page_says_one_memory_figure_per_gpu_and_profile_and_promises_nothing_it_cannot_keep(demo, who):
    shown = cards(page(demo, who))
    assert disagreements(shown) == []
    # the MIG 1g.5gb of GFD's labels, of GKE's partitions (no GFD: NVIDIA's table) and of the DRA driver
    assert {shown[slug].memory for slug in MIG_1G} == {"4.8 GB"}, {slug: shown[slug].facts for slug in MIG_1G}
    # whole GPUs: GKE's A100 without a memory label says what its name says, as the H100s do
    assert shown["gpu-nvidia-tesla-a100"].memory == "40 GB"
    assert shown["gpu-nvidia-h100-80gb-hbm3"].memory == shown["dra-gpu-h100-80gb"].memory == "80 GB"


def test_a_student_is_promised_no_queue_place_on_the_slice_they_may_not_take(demo):
    student, researcher = cards(page(demo, STUDENT)), cards(page(demo, RESEARCHER))
    assert (student[MIG_3G].badge, student[MIG_3G].reason) == ("", "not allowed for your groups")
    assert (student["gpu-nvidia-h100-80gb-hbm3"].badge, student["gpu-nvidia-h100-80gb-hbm3"].reason) == ("", "not allowed for your groups")
    # a researcher may take the slice: the other team holds the only one, and the queue is theirs to join
    assert (researcher[MIG_3G].badge, researcher[MIG_3G].reason) == ("none free: you would be first in the queue", "")


def test_the_notebooks_words_say_the_pages_figure(demo):
    """The notebook's GPU view (offering_words, ENV_WORDS in the pod) and the card: one figure."""
    catalog, _, _ = demo
    shown = cards(page(demo, RESEARCHER))
    checked = 0
    for offering in catalog:
        card = shown.get(offering.slug)
        if card is None or card.memory is None or offering.kind not in (Kind.MIG, Kind.FULL):
            continue
        assert offering_words(offering.memory_mib, offering.compute_share, offering.isolation).startswith(f"{card.memory} GPU memory")
        checked += 1
    assert checked >= 8


def test_the_table_of_mig_profiles_agrees_with_the_devclusters_labels_and_slices():
    """The simulated GFD labels (nodes.yaml) and DRA driver (NVML's figures) say what NVIDIA's table says."""
    a100 = next(c for c in node_classes() if c["name"] == "gpu-a100-mig")["labels"]
    labelled = {
        key.removeprefix("nvidia.com/mig-").removesuffix(".memory"): int(v)
        for key, v in a100.items()
        if key.startswith("nvidia.com/mig-") and key.endswith(".memory")
    }
    assert len(labelled) == 3 and all(MIG_PROFILE_MIB["A100 40GB"][profile] == mib for profile, mib in labelled.items())
    assert {p: spec[1] for p, spec in d.A100_40GB_MIG.items()} == {p: MIG_PROFILE_MIB["A100 40GB"][p] for p in d.A100_40GB_MIG}


@pytest.mark.parametrize(
    ("product", "profile", "measured", "mib"),
    [
        ("NVIDIA-A100-SXM4-40GB", "1g.5gb", 4864, 4864),  # GFD's label, used as it is
        ("NVIDIA-A100-SXM4-40GB", "1g.5gb", None, 4864),  # NVIDIA's table, not 5 * 1024
        ("nvidia-tesla-a100", "1g.5gb+me", None, 4864),  # GKE's name; +me has its profile's memory
        ("NVIDIA A100-SXM4-40GB", "3g.20gb", None, 19968),  # NVML's spelling, as DRA devices carry it
        ("NVIDIA H100 80GB HBM3", "1c.3g.40gb", None, 40448),  # a compute instance: its GPU instance's
        ("NVIDIA-A100-SXM4-80GB", "1g.10gb", None, None),  # not in the table: no figure, never "10gb"
        (None, "1g.5gb", None, 4864),  # no product: every GPU in the table with a 1g.5gb says 4864
        (None, "1g.10gb", None, None),  # ... but a 1g.10gb is 9856 MiB on an A100 40GB, 9984 on an H100
        ("NVIDIA-A100-SXM4-40GB", None, None, 40960),  # a whole GPU: what its name says
        ("A100 40GB PCIe", None, None, 40960),
        ("NVIDIA-H100-80GB-HBM3", None, 81559, 81559),  # the label wins over the name
        ("Tesla-T4", None, None, None),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", None, None, 40960),  # the name of a single-strategy MIG node says its GPU's
    ],
)
def test_gpu_memory_mib_sources(product, profile, measured, mib):
    assert gpu_memory_mib(product, profile, measured) == mib


def test_product_names_and_their_memory():
    assert product_name("NVIDIA H100 80GB HBM3") == product_name("NVIDIA-H100-80GB-HBM3") == "H100 80GB"
    assert product_memory_mib("nvidia-h100-80gb") == 81920 and product_memory_mib("NVIDIA-GeForce-RTX-4090") is None
    assert mig_profile_mib("NVIDIA-A100-SXM4-40GB", "not-a-profile") is None
