"""Write the configuration reference (docs/config.md) from GPUSpawner's traits' own help.

    python -m gpuspawner.configdoc > docs/config.md

A test checks that docs/config.md matches, so the reference cannot drift from the code.
"""

from __future__ import annotations

import inspect
import sys

from .spawner import GPUSpawner

HEADER = """# GPUSpawner configuration reference

Generated from the traits' help by `python -m gpuspawner.configdoc`; do not edit by hand.
Set these as `c.GPUSpawner.<name>` in `jupyterhub_config.py`, or under
`hub.config.GPUSpawner` in zero-to-jupyterhub's values. Every KubeSpawner option
(`c.KubeSpawner.*`: image, storage, profile_list, ...) keeps working as documented by
KubeSpawner; the offering dict's fields are documented in
`gpuspawner.offerings.offering_from_config` (and below under `offerings`).
Offerings served through Dynamic Resource Allocation (NVIDIA's DRA driver): see
[dra.md](dra.md).
"""


def render() -> str:
    out = [HEADER]
    own = GPUSpawner.class_own_traits(config=True)
    for name in sorted(own):
        trait = own[name]
        default = trait.default_value_repr()
        out.append(f"\n## `{name}`\n")
        out.append(f"{type(trait).__name__}, default `{default}`\n")
        out.append(inspect.cleandoc(trait.help or "").strip() + "\n")
    from .offerings import offering_from_config

    out.append("\n## Offering fields (`offerings` entries)\n")
    out.append("```\n" + inspect.cleandoc(offering_from_config.__doc__ or "") + "\n```\n")
    return "".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
