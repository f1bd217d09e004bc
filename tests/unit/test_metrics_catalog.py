"""The free-count metrics follow the cluster, not the last page view: a hub whose last catalog was
made while it could not read the cluster (started during an outage, then nobody looked at a page)
makes it again at the scrape once the discovered offerings have changed."""

from __future__ import annotations

from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.hub import metrics
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def gpu_node(name: str, gpus: int) -> dict:
    allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name, "labels": dict(H100)}, "spec": {}, "status": {"allocatable": allocatable}}


def free_series() -> dict[str, float]:
    families = {f.name: f for f in metrics.CAPACITY.collect()}
    return {sample.labels["offering"]: sample.value for sample in families["gpuspawner_offering_free"].samples}


def test_a_catalog_made_before_the_cluster_answered_is_made_again_at_the_scrape():
    index = ClusterIndex()  # nothing listed yet: the hub started during an outage
    built: list[int] = []

    def catalog_now() -> list:
        built.append(1)
        catalog = build_catalog(CatalogConfig(), discovered=index.discovered())
        metrics.observe_catalog(index, catalog, rebuild=catalog_now)
        return catalog

    catalog_now()
    assert free_series() == {} and len(built) == 1
    index.replace(nodes=[gpu_node("gpu-1", 8)], pods=[])  # the cluster answers again; no page is viewed
    assert free_series() == {"gpu-nvidia-h100-80gb-hbm3": 8.0} and len(built) == 2
    assert free_series() == {"gpu-nvidia-h100-80gb-hbm3": 8.0} and len(built) == 2  # nothing changed: not made again


def test_the_admins_prices_are_exported_for_the_report():
    import dataclasses

    from gpuspawner.core.model import Offering
    from gpuspawner.names.vocabulary import Kind

    index = ClusterIndex()
    index.replace(nodes=[gpu_node("gpu-1", 8)], pods=[])
    priced = Offering(slug="h100", kind=Kind.FULL, display_name="H100", resources={"nvidia.com/gpu": 1}, price_per_hour=5.0)
    unpriced = dataclasses.replace(priced, slug="t4", price_per_hour=None)
    metrics.observe_catalog(index, [priced, unpriced], hub="hub-a")
    families = {f.name: f for f in metrics.CAPACITY.collect()}
    samples = families["gpuspawner_offering_price_per_hour"].samples
    assert [(s.labels, s.value) for s in samples] == [({"offering": "h100", "kind": "full", "hub": "hub-a"}, 5.0)]
