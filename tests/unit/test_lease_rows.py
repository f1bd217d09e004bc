"""The home page and the leases page list the leases of servers that run now only: the culler
forgets a stopped server's lease at its next cycle, and until then its row lingered (issue 38)."""

from __future__ import annotations

from types import SimpleNamespace

from gpuspawner.hub import culleractions
from gpuspawner.hub.culleractions import LEASES_VAR, template_vars
from gpuspawner.hub.leasepage import running_servers

LEASES = [{"user": "ann", "server": "", "words": "default"}, {"user": "ann", "server": "train", "words": "train"}]


def user(**active: bool) -> SimpleNamespace:
    return SimpleNamespace(name="ann", spawners={name: SimpleNamespace(active=on) for name, on in active.items()})


def test_only_servers_that_run_or_start_are_running():
    assert running_servers(user(**{"": True, "train": False})) == {""}
    assert running_servers(SimpleNamespace(name="ann")) is None  # (an object that does not say: nothing left out)


async def test_the_home_pages_leases_leave_out_a_server_stopped_since_the_cullers_cycle(monkeypatch):
    async def leases_for(self, name):
        return [dict(lease) for lease in LEASES if lease["user"] == name]

    monkeypatch.setattr(culleractions.CullerActions, "leases_for", leases_for)
    leases = template_vars("http://127.0.0.1:1/services/gpu-culler/api/actions", "token")[LEASES_VAR]
    assert [lease["server"] for lease in await leases(user(**{"": True, "train": False}))()] == [""]
    assert [lease["server"] for lease in await leases(user(**{"": True, "train": True}))()] == ["", "train"]
    assert await leases(None)() == []
