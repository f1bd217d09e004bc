"""Images that fit the node (gpuspawner.core.imagefit): the admin's setting, the node-affinity
terms on GFD's labels, the DRA selectors on NVIDIA's version attributes, the counts and the words."""

from __future__ import annotations

import copy
import random
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gpuspawner.capacity.access import Requester
from gpuspawner.capacity.checks import GPUSpawnerConfigError, check_config
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.core.cel import compile_selector
from gpuspawner.core.imagefit import ImageNeedsError, device_selectors, fitted, needs_for, node_terms, parse_needs, parse_rules
from gpuspawner.devcluster import dradriver as d
from gpuspawner.devcluster.nodes import standard_nodes
from gpuspawner.dra.slices import slice_devices
from gpuspawner.names.selectors import terms_match, terms_to_k8s
from gpuspawner.page.cards import option_views
from gpuspawner.page.useroptions import profile_image

H100_SLUG = "gpu-nvidia-h100-80gb-hbm3"
MAJOR, MINOR, REV = (
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
)
CUDA_MAJOR, CUDA_MINOR = "nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor"
CC_MAJOR, CC_MINOR = "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"


def gfd(driver: str, cuda: str, compute: str) -> dict[str, str]:
    """The version labels GFD's version and architecture labelers write (internal/lm/nvml.go, resource.go)."""
    parts = driver.split(".") + [""]
    return {
        MAJOR: parts[0],
        MINOR: parts[1],
        REV: parts[2],
        "nvidia.com/cuda.driver-version.full": driver,
        CUDA_MAJOR: cuda.split(".")[0],
        CUDA_MINOR: cuda.split(".")[1],
        "nvidia.com/cuda.runtime-version.full": cuda,
        CC_MAJOR: compute.split(".")[0],
        CC_MINOR: compute.split(".")[1],
    }


# ------------------------------------------------------------------------ the setting


def test_a_dict_and_nvidia_require_cuda_say_the_same():
    as_dict = parse_needs({"min_cuda": "12.4"}, "x")
    as_string = parse_needs("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471", "x")
    assert as_dict == as_string and as_dict.words() == "CUDA >= 12.4"
    both = parse_needs("NVIDIA_REQUIRE_CUDA=cuda>=12.8,driver>=570,arch>=8.0", "x")
    assert both.words() == "driver >= 570 and CUDA >= 12.8 and compute capability >= 8.0"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"min_driver": 12.8}, "must be a version written as text"),
        ({"min_driver": "570.x"}, "must be a version written as text"),
        ({"min_cuda": "12.8.1"}, "min_cuda has at most 2 parts"),
        ({"min_drivers": "570"}, "unknown key(s) min_drivers"),
        ("brand=tesla,driver>=470", "'brand=tesla' is not read"),
        ("", "is empty"),
        (["cuda>=12"], "must be a dict"),
    ],
)
def test_wrong_entries_are_refused_naming_the_setting_and_the_pattern(value, words):
    with pytest.raises(ImageNeedsError) as info:
        parse_rules({"quay.io/jupyter/*": value})
    assert "c.GPUSpawner.image_requirements['quay.io/jupyter/*']" in str(info.value) and words in str(info.value)


def test_check_config_lists_a_wrong_image_requirement():
    config = {"GPUSpawner": {"image_requirements": {"img:*": {"min_driver": "five"}}}}
    with pytest.raises(GPUSpawnerConfigError, match=r"image_requirements\['img:\*'\]: min_driver must be a version"):
        check_config(config)
    check_config({"GPUSpawner": {"image_requirements": {"img:*": {"min_driver": "570"}}}})


def test_the_first_matching_pattern_wins_and_an_empty_entry_needs_nothing():
    rules = parse_rules(
        {
            "quay.io/jupyter/pytorch-notebook:cuda12-cpu*": {},
            "quay.io/jupyter/pytorch-notebook:cuda12-*": {"min_driver": "570"},
            "*": {"min_driver": "535"},
        }
    )
    assert needs_for("quay.io/jupyter/pytorch-notebook:cuda12-2025-01-06", rules).words() == "driver >= 570"
    assert not needs_for("quay.io/jupyter/pytorch-notebook:cuda12-cpu-2025", rules)
    assert needs_for("jupyter/scipy-notebook", rules).words() == "driver >= 535"
    assert not needs_for("anything", ())


# ----------------------------------------------------------------- nodes: the scheduler's reading


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def test_node_terms_hold_exactly_where_the_versions_are_new_enough():
    """Against the plain comparison, over many versions (a fixed seed): Gt/Lt as Kubernetes reads them."""
    rng = random.Random(29)
    for _ in range(600):
        driver = f"{rng.choice([470, 535, 550, 569, 570, 571, 580])}.{rng.choice([0, 9, 54, 86, 124])}.{rng.choice(['01', '05', '15'])}"
        cuda = f"12.{rng.randint(0, 9)}"
        compute = f"{rng.choice([7, 8, 9])}.{rng.choice([0, 5, 6, 9])}"
        want = {
            "min_driver": rng.choice(["570", "570.86", "550.54.15", "535.104"]),
            "min_cuda": rng.choice(["12.0", "12.4", "12.8"]),
            "min_compute": rng.choice(["7.5", "8.0", "8.6", "9.0"]),
        }
        needs = parse_needs({k: v for k, v in want.items() if rng.random() < 0.7}, "x")
        have = {"min_driver": driver, "min_cuda": cuda, "min_compute": compute}
        expected = all(_version(have[n.key])[: len(v)] >= v for n, v in needs.minimum)
        assert terms_match(node_terms(needs), gfd(driver, cuda, compute)) is expected, (driver, cuda, compute, want)


def test_a_node_without_the_labels_never_fits():
    needs = parse_needs({"min_driver": "535"}, "x")
    assert not terms_match(node_terms(needs), {"nvidia.com/gpu.product": "Tesla-T4"})
    assert terms_to_k8s(node_terms(needs)) == [{"matchExpressions": [{"key": MAJOR, "operator": "Gt", "values": ["534"]}]}]


# --------------------------------------------------------------------- counts and words


def _nodes(h100_driver: str, second_driver: str | None = None) -> list[dict]:
    """The devcluster's nodes, the H100 node on ``h100_driver`` (and a second H100 node on another)."""
    nodes = standard_nodes()
    h100 = next(n for n in nodes if n["metadata"]["name"] == "gpu-h100-8x")
    h100["metadata"]["labels"].update(gfd(h100_driver, "12.8" if h100_driver >= "570" else "12.4", "9.0"))
    if second_driver:
        other = copy.deepcopy(h100)
        other["metadata"]["name"] = "gpu-h100-8x-b"
        other["metadata"]["labels"].update(gfd(second_driver, "12.8" if second_driver >= "570" else "12.4", "9.0"))
        nodes.append(other)
    return nodes


def _index(nodes: list[dict]) -> ClusterIndex:
    index = ClusterIndex()
    index.replace(nodes=nodes, pods=[])
    return index


def test_counts_are_of_the_nodes_that_can_run_the_image():
    index = _index(_nodes("550.54.15", "570.124.06"))
    h100 = next(o for o in index.discovered() if o.slug == H100_SLUG)
    assert index.availability(h100).capacity == 16
    fit, reason = index.fit(h100, parse_needs({"min_driver": "570"}, "x"))
    assert reason == "" and fit.slug == h100.slug
    assert index.availability(fit).capacity == 8 and index.availability(fit).nodes == ("gpu-h100-8x-b",)
    assert index.availability(h100).capacity == 16  # both are counted side by side
    assert index.reserve("ns/pod", fit, 2) == "gpu-h100-8x-b"


def test_an_offering_none_of_whose_nodes_fits_says_what_they_have():
    index = _index(_nodes("550.54.15", "535.183.01"))
    h100 = next(o for o in index.discovered() if o.slug == H100_SLUG)
    _, reason = index.fit(h100, parse_needs({"min_driver": "570"}, "x"))
    assert reason == "needs driver >= 570; these nodes have 535.183.01 and 550.54.15"
    _, reason = _index(_nodes("550.54.15", "560.35.03")).fit(h100, parse_needs({"min_driver": "550", "min_cuda": "12.8"}, "x"))
    assert reason == "needs CUDA >= 12.8; these nodes have 12.4"  # the driver is not what fails
    _, reason = index.fit(h100, parse_needs({"min_driver": "570", "min_cuda": "12.8"}, "x"))
    assert reason == "needs driver >= 570 and CUDA >= 12.8; these nodes have driver 535.183.01 and 550.54.15, CUDA 12.4"
    _, reason = index.fit(h100, parse_needs({"min_driver": "550", "min_compute": "9.0"}, "x"))
    assert reason == ""


def test_nodes_without_gfd_labels_are_named():
    index = _index(standard_nodes())
    gke = next(o for o in index.discovered() if o.slug.startswith("gpu-") and "a100" in o.slug and o.kind.value == "full")
    _, reason = index.fit(gke, parse_needs({"min_driver": "535"}, "x"))
    assert reason == "needs driver >= 535; these nodes have no driver label"


def test_the_page_disables_the_card_with_the_reason_and_counts_only_fitting_nodes():
    index = _index(_nodes("550.54.15", "570.124.06"))
    catalog = [o for o in index.discovered() if o.slug in (H100_SLUG, "mig-nvidia-a100-sxm4-40gb-3g-20gb")]
    needs = parse_needs({"min_driver": "570"}, "x")
    fits = {o.slug: index.fit(o, needs) for o in catalog}
    rows = option_views(
        catalog,
        Requester("ann", frozenset()),
        lambda o: index.availability(fits[o.slug][0]),
        datetime(2026, 11, 27, 9, tzinfo=ZoneInfo("UTC")),
        image_reason=lambda o: fits[o.slug][1],
    )
    by = {r.slug: r for r in rows}
    assert by[H100_SLUG].availability == "8 of 8 free" and not by[H100_SLUG].disabled
    mig = by["mig-nvidia-a100-sxm4-40gb-3g-20gb"]
    assert mig.disabled_reason == "needs driver >= 570; these nodes have 550.54.15" and mig.availability == "not for this image"


def test_fitting_leaves_cpu_and_a_needless_image_alone():
    index = _index(standard_nodes())
    h100 = next(o for o in index.discovered() if o.slug == H100_SLUG)
    assert fitted(h100, parse_needs({}, "x")) is h100
    from gpuspawner.core.model import CPU_OFFERING

    assert fitted(CPU_OFFERING, parse_needs({"min_driver": "570"}, "x")) is CPU_OFFERING


# ------------------------------------------------------------------------ DRA devices


def _device(driver: str, cuda: str):
    raw = d.gpu_device("n", 0, d.H100_80GB)
    raw["attributes"]["driverVersion"] = {"version": driver}
    raw["attributes"]["cudaDriverVersion"] = {"version": cuda}
    (device,) = slice_devices({"spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n"}, "devices": [raw]}})
    return device


@pytest.mark.parametrize(
    ("needs", "driver", "cuda", "selected"),
    [
        ({"min_driver": "570"}, "570.124.6", "12.8.0", True),
        ({"min_driver": "570"}, "550.54.15", "12.4.0", False),
        ({"min_driver": "570.124.6"}, "570.124.6", "12.8.0", True),
        ({"min_driver": "570.125"}, "570.124.6", "12.8.0", False),
        ({"min_cuda": "12.8"}, "570.124.6", "12.8.0", True),
        ({"min_cuda": "12.8"}, "560.35.3", "12.6.0", False),
        ({"min_compute": "9.0"}, "550.54.15", "12.4.0", True),  # an H100 is 9.0
        ({"min_compute": "10.0"}, "570.124.6", "12.8.0", False),
    ],
)
def test_device_selectors_on_the_drivers_version_attributes(needs, driver, cuda, selected):
    device = _device(driver, cuda)
    selectors = device_selectors(parse_needs(needs, "x"))
    assert all(compile_selector(s).matches(device.activation) for s in selectors) is selected


def test_a_dra_offering_for_an_image_selects_only_fitting_devices_and_says_what_they_have():
    index = ClusterIndex()
    index.replace(nodes=[d.dra_node_manifest(n, i) for i, n in enumerate(d.DRA_NODES)])
    index.dra.replace(
        slices=[s for n in d.DRA_NODES for s in d.resource_slices(n.name, d.node_devices(n))], classes=d.device_classes(), claims=[]
    )
    index.dra.synced = True
    h100 = next(o for o in index.discovered() if o.slug == "dra-gpu-h100-80gb")
    fit, reason = index.fit(h100, parse_needs({"min_driver": "570"}, "x"))
    assert fit.claim is not None and fit.claim.selectors[-1].endswith(".driverVersion.compareTo(semver('570.0.0')) >= 0")
    assert index.availability(fit).capacity == 0 and reason == f"needs driver >= 570; these GPUs have {d.DRIVER_VERSION}"
    fit, reason = index.fit(h100, parse_needs({"min_driver": "550"}, "x"))
    assert index.availability(fit).capacity == 2 and reason == ""


# --------------------------------------------------------------------- the profile's image


PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "default": True, "kubespawner_override": {}},
    {
        "slug": "torch",
        "display_name": "PyTorch",
        "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook:cuda12-latest"},
        "profile_options": {
            "image": {
                "display_name": "Image",
                "choices": {
                    "new": {
                        "display_name": "new",
                        "default": True,
                        "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook:cuda12-2025"},
                    },
                    "old": {"display_name": "old", "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook:cuda11-2023"}},
                },
                "unlisted_choice": {"enabled": True, "kubespawner_override": {"image": "{value}"}},
            }
        },
    },
]


def test_the_image_a_profile_choice_runs_is_kubespawners():
    assert profile_image({}, PROFILES, "jupyter/base") == "jupyter/base"
    assert profile_image({"profile": "torch"}, PROFILES, "jupyter/base") == "quay.io/jupyter/pytorch-notebook:cuda12-2025"
    assert profile_image({"profile": "torch", "image": "old"}, PROFILES, "b") == "quay.io/jupyter/pytorch-notebook:cuda11-2023"
    assert profile_image({"profile": "torch", "image--unlisted-choice": "my/own:1"}, PROFILES, "b") == "my/own:1"
    assert profile_image({"profile": "x"}, [], "jupyter/base") == "jupyter/base"


MIG_3G = "mig-nvidia-a100-sxm4-40gb-3g-20gb"


def cards_per_image(requirements: dict, images: dict[str, str]) -> list:
    """The H100 card (nodes on 550 and 570) and the A100 3g.20gb one (on 550) for the form's default
    image ``images[""]``, each with what it says for every image of ``images``."""
    from gpuspawner.page.views import with_images

    index = _index(_nodes("550.54.15", "570.124.06"))
    catalog = [o for o in index.discovered() if o.slug in (H100_SLUG, MIG_3G)]
    rules = parse_rules(requirements)

    def rows(image):
        fits = {o.slug: index.fit(o, needs_for(image, rules)) for o in catalog}
        when = datetime(2026, 11, 27, 9, tzinfo=ZoneInfo("UTC"))
        return option_views(
            catalog,
            Requester("ann", frozenset()),
            lambda o: index.availability(fits[o.slug][0]),
            when,
            image_reason=lambda o: fits[o.slug][1],
        )

    return with_images(rows(images[""]), {image: rows(image) for image in set(images.values())})


def test_the_page_carries_what_each_card_says_for_each_image_of_the_form():
    from gpuspawner.hub.form import render_form
    from gpuspawner.page.useroptions import profile_images
    from gpuspawner.page.views import FormView, group_options

    images = profile_images(PROFILES, "jupyter/base")
    assert images == {
        "": "jupyter/base",
        "cpu": "jupyter/base",
        "torch": "quay.io/jupyter/pytorch-notebook:cuda12-2025",
        "torch--image=new": "quay.io/jupyter/pytorch-notebook:cuda12-2025",
        "torch--image=old": "quay.io/jupyter/pytorch-notebook:cuda11-2023",
    }
    shown = cards_per_image({"*:cuda12-*": {"min_driver": "570"}}, images)
    mig = next(r for r in shown if r.slug == "mig-nvidia-a100-sxm4-40gb-3g-20gb")
    assert not mig.disabled  # the default image needs nothing
    import json

    said = json.loads(mig.by_image)
    assert said["jupyter/base"] == ["1 of 1 free", "", "ok"]
    assert said["quay.io/jupyter/pytorch-notebook:cuda12-2025"] == [
        "not for this image",
        "needs driver >= 570; these nodes have 550.54.15",
        "off",
    ]
    html = render_form(FormView(groups=group_options(shown, ["full", "mig"]), selected=None, selected_count=1, images=json.dumps(images)))
    assert "data-gs-images=" in html and html.count("data-gs-by-image=") == 2
    assert "needs driver &gt;= 570; these nodes have 550.54.15" in html  # escaped in the attribute


def test_servers_of_a_shared_dra_offering_share_a_claim_only_for_the_same_selectors():
    from gpuspawner.core.model import DeviceClaim, Offering
    from gpuspawner.dra.claimspec import device_claim_spec
    from gpuspawner.hub.claims import claim_selectors
    from gpuspawner.names.vocabulary import Kind

    shared = Offering(
        "l4-half",
        Kind.SHARED,
        "L4 · 1/2",
        claim=DeviceClaim("gpu.nvidia.com", ("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'",), replicas=2),
    )
    newer = fitted(shared, parse_needs({"min_driver": "570"}, "x"))
    assert claim_selectors(device_claim_spec(shared.claim, 1)) == list(shared.claim.selectors)
    assert claim_selectors(device_claim_spec(newer.claim, 1)) != claim_selectors(device_claim_spec(shared.claim, 1))
    assert claim_selectors(None) == []
