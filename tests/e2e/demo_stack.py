"""The demo stack for end-to-end tests, with an admin API token and extra hub config."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

from gpuspawner.devcluster.ports import free_port
from gpuspawner.tools.demo import Demo, running_demo


@contextlib.contextmanager
def demo_with_token(tmp_path_factory, extra_config: str, culler: bool = True, env: dict[str, str] | None = None) -> Iterator[Demo]:
    """``running_demo`` plus ``extra_config`` (Python appended to the hub's config) and ``env``
    (say ``GPUSPAWNER_DEMO_CULLER_ARGS``); the yielded demo has ``.token``, an API token with
    admin:users, admin:servers and read:metrics."""
    token = secrets.token_hex(16)
    extra = tmp_path_factory.mktemp("hubcfg") / "extra_config.py"
    extra.write_text(extra_config)
    extra_env = {**(env or {}), "GPUSPAWNER_DEMO_API_TOKEN": token, "GPUSPAWNER_DEMO_EXTRA_CONFIG": str(extra)}
    with running_demo(port=free_port(), hub_port=free_port(), culler=culler, quiet=True, extra_env=extra_env) as running:
        running.token = token  # type: ignore[attr-defined]
        yield running
