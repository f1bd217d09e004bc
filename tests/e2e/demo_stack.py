"""The demo stack for end-to-end tests, with an admin API token and extra hub config."""

from __future__ import annotations

import contextlib
import http.cookiejar
import secrets
import urllib.parse
import urllib.request
from collections.abc import Iterator

from gpuspawner.devcluster.ports import free_port
from gpuspawner.tools.demo import Demo, running_demo


@contextlib.contextmanager
def demo_with_token(
    tmp_path_factory,
    extra_config: str,
    culler: bool = True,
    env: dict[str, str] | None = None,
    kueue: bool = False,
    autoscale: bool = False,
) -> Iterator[Demo]:
    """``running_demo`` plus ``extra_config`` (Python appended to the hub's config) and ``env``
    (say ``GPUSPAWNER_DEMO_CULLER_ARGS``), with the real Kueue where ``kueue``, the real Karpenter's
    GPU pools at zero nodes where ``autoscale``; the yielded demo
    has ``.token``, an API token with admin:users, admin:servers and read:metrics."""
    token = secrets.token_hex(16)
    extra = tmp_path_factory.mktemp("hubcfg") / "extra_config.py"
    extra.write_text(extra_config)
    extra_env = {**(env or {}), "GPUSPAWNER_DEMO_API_TOKEN": token, "GPUSPAWNER_DEMO_EXTRA_CONFIG": str(extra)}
    with running_demo(
        port=free_port(), hub_port=free_port(), culler=culler, quiet=True, extra_env=extra_env, kueue=kueue, autoscale=autoscale
    ) as running:
        running.token = token  # type: ignore[attr-defined]
        yield running


def login(demo, user: str):
    """A browser's session for ``user`` (the demo's password): (opener, its _xsrf token)."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{demo.url}/hub/login", timeout=60).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    form = urllib.parse.urlencode({"username": user, "password": "gpu", "_xsrf": xsrf}).encode()
    opener.open(f"{demo.url}/hub/login", data=form, timeout=60).read()
    opener.open(f"{demo.url}/hub/home", timeout=60).read()  # a logged-in page: the session's own _xsrf
    return opener, next(c.value for c in jar if c.name == "_xsrf")


def spawn_page(demo, user: str, server: str = "") -> str:
    """The spawn page as ``user`` sees it."""
    opener, _ = login(demo, user)
    with opener.open(f"{demo.url}/hub/spawn/{user}/{server}" if server else f"{demo.url}/hub/spawn", timeout=60) as resp:
        return resp.read().decode()
