"""What the culler's own credential can do (issue #25 item 4), on a REAL JupyterHub
with the culler's role exactly as hub_config/culler_service_example.py writes it.

Its ``tokens`` scope is filtered to the group of GPU users (``tokens!group=gpu-users``):
whoever holds the culler's token can mint a token for a member of that group -- with at
most that member's own scopes, which is what the kernel view needs -- and for no one
else: not for an admin, not for a user outside the group. It cannot put anyone in the
group, nor make anyone admin. docs/culler.md, "Threat model".
"""

from __future__ import annotations

import logging

import pytest
import pytest_asyncio
from tornado.httpclient import HTTPClientError

from gpuspawner.culler.hubclient import server_record
from gpuspawner.culler.settings import GPU_USERS_GROUP, scope_problems
from gpuspawner.culler.tokens import TokenUnavailable
from tests.culler.culler_hub import EXAMPLE_ROLE, Hub, in_process_culler, join_gpu_users

pytestmark = pytest.mark.asyncio(loop_scope="session")

CONFIG = (
    EXAMPLE_ROLE
    + """
c.Authenticator.admin_users = {"root"}
"""
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def hub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("hub"), CONFIG)
    await h.start()
    try:
        await h.create_users(["root", "gina", "otto"])
        await join_gpu_users(h, ["gina"])  # otto holds no GPU server; root is the admin
        yield h
    finally:
        await h.stop()


async def as_culler(hub: Hub, method: str, path: str, body: object = None) -> tuple[int, dict]:
    """The hub's answer to the culler's own token: (200 for any success, or the refusal's status; body)."""
    try:
        return 200, await hub.api(method, path, body, token=hub.culler_token) or {}
    except HTTPClientError as e:
        return e.code, {}


async def test_the_culler_token_cannot_obtain_admin(hub):
    # what the hub says the culler's token holds: no unfiltered "tokens"
    code, me = await as_culler(hub, "GET", "/user")
    assert code == 200
    assert "tokens" not in me["scopes"] and f"tokens!group={GPU_USERS_GROUP}" in me["scopes"]
    assert scope_problems(me["scopes"]) == []
    assert any("unfiltered 'tokens'" in p for p in scope_problems([*me["scopes"], "tokens"]))

    # a token for the admin, with admin's powers or none named: refused
    for body in ({"scopes": ["admin:users"], "expires_in": 600}, {"roles": ["admin"], "expires_in": 600}, {"expires_in": 600}):
        code, _ = await as_culler(hub, "POST", "/users/root/tokens", body)
        assert code == 403, (body, code)
    # ... nor for a user outside the group
    code, _ = await as_culler(hub, "POST", "/users/otto/tokens", {"expires_in": 600})
    assert code == 403
    # nor can it put the admin in the group, or make a member admin
    code, _ = await as_culler(hub, "POST", f"/groups/{GPU_USERS_GROUP}/users", {"users": ["root"]})
    assert code == 403
    code, _ = await as_culler(hub, "PATCH", "/users/gina", {"admin": True})
    assert code == 403
    # for a member: never more than the member holds ...
    code, _ = await as_culler(hub, "POST", "/users/gina/tokens", {"scopes": ["admin:users"], "expires_in": 600})
    assert code == 400
    # ... and the per-server token the kernel view needs
    code, minted = await as_culler(hub, "POST", "/users/gina/tokens", {"scopes": ["access:servers!server=gina/"], "expires_in": 600})
    assert code == 200 and minted["token"], minted  # created
    code, _ = await as_culler(hub, "DELETE", f"/users/gina/tokens/{minted['id']}")
    assert code == 200  # revoked
    admin = await hub.user("root")
    assert admin["admin"] and not [
        t for t in (await hub.api("GET", "/users/root/tokens"))["api_tokens"] if "gpu-culler" in (t["note"] or "")
    ]
    assert not (await hub.user("gina"))["admin"]


async def test_the_culler_says_why_a_user_outside_the_group_has_no_kernel_view(hub):
    c, rec, app = in_process_culler(hub.api_url, "", hub.culler_token)
    try:
        await app.check_hub(c)  # as at start-up: the culler reads its own scopes
        otto = server_record({"name": "otto"}, "", {"name": "", "ready": True, "url": "/user/otto/", "user_options": {}})
        with pytest.raises(TokenUnavailable, match=GPU_USERS_GROUP):
            await c.tokens.get(otto)
        assert f"user 'otto' is not in the group {GPU_USERS_GROUP!r}" in rec.text(logging.ERROR)
    finally:
        await c.close()
