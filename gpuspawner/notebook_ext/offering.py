"""The offering this server holds, from the environment GPUSpawner gave the container. Pure.

GPUSpawner sets ``GPUSPAWNER_*`` in the notebook container (gpuspawner.pod.podspec); a server
not started by GPUSpawner has none, and its offering is ``None``. The values are the
spawn page's words: the notebook says what the user chose, as they chose it. They are
what the user's own pod says, shown to that user only; nothing trusts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuspawner.names.vocabulary import ENV_COUNT, ENV_DISPLAY_NAME, ENV_KIND, ENV_OFFERING, ENV_WORDS


def offering_from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """``{"slug", "display_name", "kind", "count", "words"}`` or ``None`` without GPUSpawner's env."""
    slug = env.get(ENV_OFFERING, "").strip()
    if not slug:
        return None
    count = env.get(ENV_COUNT, "").strip()
    return {
        "slug": slug,
        "display_name": env.get(ENV_DISPLAY_NAME, "").strip() or slug,
        "kind": env.get(ENV_KIND, "").strip(),
        "count": int(count) if count.isdigit() else None,
        "words": env.get(ENV_WORDS, "").strip(),
    }
