"""The contract between GPUSpawner and the culler, parsed in one place.

GPUSpawner records the chosen offering in the server's ``user_options`` (returned
by the hub's REST API in every server model, scope ``read:servers``)::

    user_options = {
      "offering": "<slug>", "count": 1, ...,        # the user's validated choice
      "gpuspawner": {                                 # written by GPUSpawner at start()
         "offering": "<slug>", "kind": "full|mig|shared|vgpu|custom|cpu",
         "resources": {"nvidia.com/mig-3g.20gb": "1"},
         "pod": "<pod name>", "namespace": "<ns>",
         "url": "http://<pod ip>:<port>/user/<name>/",  # direct address, for the kernel API
      }
    }

A server without the ``gpuspawner`` key is a plain server: kind ``cpu``, no GPU
view, no kernel view (there is no direct address to ask).
If the contract changes, change :func:`parse_offering` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: every kind the spawner may write, in the order the docs list them
KINDS: tuple[str, ...] = ("full", "mig", "shared", "vgpu", "custom", "cpu")
#: kinds whose pod holds (part of) a GPU
GPU_KINDS: frozenset[str] = frozenset({"full", "mig", "shared", "vgpu", "custom"})
CONTRACT_KEY = "gpuspawner"


@dataclass(frozen=True)
class ServerOffering:
    """What the culler needs to know about one server's offering."""

    kind: str
    slug: str | None = None
    pod: str | None = None
    namespace: str | None = None
    #: direct address of the single-user server (ends with "/"), or None
    url: str | None = None
    resources: Mapping[str, str] = field(default_factory=dict)
    #: True when the spawner wrote the ``gpuspawner`` key
    declared: bool = False
    #: a problem found while parsing (logged by the caller), or None
    problem: str | None = None

    @property
    def is_gpu(self) -> bool:
        return self.kind in GPU_KINDS

    @property
    def expected_devices(self) -> int | None:
        """How many GPU devices (GPUs or MIG instances) dcgm-exporter should show
        for the pod, from its resources; None when that cannot be told (no
        resources, or a site's fractional resource)."""
        n = 0
        for key, value in self.resources.items():
            if key in ("nvidia.com/gpu", "nvidia.com/gpu.shared") or key.startswith(
                "nvidia.com/mig-"
            ):
                try:
                    n += int(value)
                except ValueError:
                    return None
        return n or None


def _str_or_none(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def parse_offering(user_options: Mapping[str, Any] | None) -> ServerOffering:
    """Read the spawner's contract out of a server model's ``user_options``.

    Never raises: a malformed contract gives the most conservative reading
    (an unknown kind is read as ``custom``, a GPU kind, so that the server is
    only stopped with a known-idle GPU view) and says why in ``problem``.
    """
    if not isinstance(user_options, Mapping):
        return ServerOffering(kind="cpu")
    slug = _str_or_none(user_options.get("offering"))
    contract = user_options.get(CONTRACT_KEY)
    if contract is None:
        return ServerOffering(kind="cpu", slug=slug)
    if not isinstance(contract, Mapping):
        return ServerOffering(
            kind="custom",
            slug=slug,
            declared=True,
            problem=f"user_options[{CONTRACT_KEY!r}] is a {type(contract).__name__}, "
            "not a mapping; treated as kind 'custom'",
        )
    problem = None
    kind = contract.get("kind")
    if kind not in KINDS:
        problem = f"unknown offering kind {kind!r}; treated as kind 'custom'"
        kind = "custom"
    url = _str_or_none(contract.get("url"))
    if url is not None:
        if not url.startswith(("http://", "https://")):
            problem = f"server url {url!r} is not http(s); kernel view disabled"
            url = None
        elif not url.endswith("/"):
            url += "/"
    resources = contract.get("resources")
    if not isinstance(resources, Mapping):
        resources = {}
    return ServerOffering(
        kind=kind,
        slug=_str_or_none(contract.get("offering")) or slug,
        pod=_str_or_none(contract.get("pod")),
        namespace=_str_or_none(contract.get("namespace")),
        url=url,
        resources={str(k): str(v) for k, v in resources.items()},
        declared=True,
        problem=problem,
    )
