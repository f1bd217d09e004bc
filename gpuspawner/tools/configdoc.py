"""Write the configuration reference (docs/config.md) from GPUSpawner's traits' own help.

    python -m gpuspawner.tools.configdoc > docs/config.md

A test checks that docs/config.md matches, so the reference cannot drift from the code.
"""

from __future__ import annotations

import inspect
import sys

from gpuspawner.spawner import GPUSpawner

HEADER = """# GPUSpawner configuration reference

Generated from the traits' help by `python -m gpuspawner.tools.configdoc`; do not edit by hand.
Set these as `c.GPUSpawner.<name>` in `jupyterhub_config.py`, or under
`hub.config.GPUSpawner` in zero-to-jupyterhub's values. Every KubeSpawner option
(`c.KubeSpawner.*`: image, storage, profile_list, ...) keeps working as documented by
KubeSpawner; the offering dict's fields are documented in
`gpuspawner.offerings.config.offering_from_config` (and below under `offerings`).
Offerings served through Dynamic Resource Allocation (NVIDIA's DRA driver): see
[dra.md](dra.md).
"""


DRA_SECTION = """
## DRA offerings (`dra` field)

Offerings served through Dynamic Resource Allocation (`resource.k8s.io/v1`, NVIDIA's DRA
driver `gpu.nvidia.com`) are discovered from the cluster's ResourceSlices (whole GPUs by
product and memory, slugs `dra-gpu-<product>`; MIG devices by product and profile, slugs
`dra-mig-<product>-<profile>`; see docs/architecture.md, "Dynamic Resource Allocation"). An
admin adds their own with a `dra` field instead of `resources` and `node_selector`:

```python
c.GPUSpawner.offerings = [
    # "any GPU with at least 40 GiB", whatever the product
    {
        "slug": "big-gpu",
        "kind": "full",
        "display_name": "Any GPU with 40 GiB or more",
        "counts": [1, 2],
        "dra": {
            "selector": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
            "match_attributes": ["gpu.nvidia.com/productName"],
        },
    },
    # a quarter of an L4 by time-slicing: four notebooks share one claim's GPU
    {
        "slug": "l4-quarter",
        "kind": "shared",
        "display_name": "L4 · 1/4 time-sliced",
        "product": "NVIDIA L4",
        "sharing": "time-slicing",
        "replicas": 4,
        "dra": {"interval": "Long"},
    },
    # MPS with NVIDIA's mpsConfig passed through
    {
        "slug": "h100-mps",
        "kind": "shared",
        "product": "NVIDIA H100 80GB HBM3",
        "sharing": "mps",
        "replicas": 2,
        "dra": {"mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "40Gi"}},
    },
]
```

`product` (NVIDIA's `productName`, e.g. `NVIDIA H100 80GB HBM3`) and a mig offering's
`profile` add selectors on those attributes. Every selector is compiled when the config is
read (`check_config(c)`, `gpuspawner offerings --config`): one that does not compile stops
the hub naming the entry. One that selects none of the devices published now is a warning
(`gpuspawner offerings`, and once in the hub's log after it lists the slices); it may match later. A shared offering's sharing becomes NVIDIA's
opaque `GpuConfig` (`MigDeviceConfig` on `mig.nvidia.com`) with `sharing.strategy`
`TimeSlicing` or `MPS`; its free count is `replicas` per selected device, less the pods
already sharing a claim with that config (`status.reservedFor`) and `replicas` for every
device another claim holds.

"This, or else that": `dra.alternatives` lists further choices, tried in order by the
scheduler when the ones before cannot be had (the claim's `firstAvailable`; Kubernetes 1.34
or newer, GA since 1.36). Each is a dict of `profile` (a MIG profile, class `mig.nvidia.com`),
`product`, `selector`, `device_class` and `label` (the words for it; from the profile or
product when not given). The page shows one choice saying each one's free count ("MIG
3g.20gb (1 free), or MIG 2g.10gb if none is free (2 free)"); the record and the notebook's
GPU view say which one the server got. Not with a shared offering.

```python
c.GPUSpawner.offerings = [
    {
        "slug": "a100-mig-3g-or-2g",
        "kind": "mig",
        "display_name": "A100 · MIG 3g.20gb or 2g.10gb",
        "product": "NVIDIA A100-SXM4-40GB",
        "profile": "3g.20gb",
        "dra": {"alternatives": [{"profile": "2g.10gb"}]},
    },
]
```
"""


#: Where the reference of an offering's fields begins in gpuspawner.offerings.config's docstring.
FIELDS_HEADING = "The fields of an entry\n----------------------\n"
FIELDS_INTRO = "Validate one entry of ``c.GPUSpawner.offerings`` and build its :class:`Offering`.\n"


def render() -> str:
    out = [HEADER]
    own = GPUSpawner.class_own_traits(config=True)
    for name in sorted(own):
        trait = own[name]
        default = trait.default_value_repr()
        out.append(f"\n## `{name}`\n")
        out.append(f"{type(trait).__name__}, default `{default}`\n")
        out.append(inspect.cleandoc(trait.help or "").strip() + "\n")
    from gpuspawner.offerings import config as offering_config

    fields = (offering_config.__doc__ or "").split(FIELDS_HEADING, 1)[-1].rstrip()
    out.append("\n## Offering fields (`offerings` entries)\n")
    out.append("```\n" + inspect.cleandoc(FIELDS_INTRO + fields) + "\n```\n")
    out.append(DRA_SECTION)
    from gpuspawner.core import cel

    out.append("\n### The CEL that selectors may use\n\n" + inspect.cleandoc((cel.__doc__ or "").split("\n\n", 1)[1]) + "\n")
    return "".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
