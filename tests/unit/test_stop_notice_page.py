"""The home page's words for a server Kueue stopped, as JupyterHub renders the template: from
each server's saved state in the hub's database (so they survive a hub restart), for the
logged-in user's servers only, and nothing where there is nothing to say."""

from __future__ import annotations

from types import SimpleNamespace

import jinja2

from gpuspawner.hub.culleractions import hub_templates_dir
from gpuspawner.names.vocabulary import STOP_NOTICE_KEY

TEXT = "Your server 'train' was stopped at Nov 27 14:02 UTC to make room for a higher-priority job in queue research."


def render(user) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(hub_templates_dir()), autoescape=True)
    return env.get_template("gpuspawner_stops.html").render(user=user)


def user_with(*states) -> SimpleNamespace:
    spawners = {f"s{i}": SimpleNamespace(state=state) for i, state in enumerate(states)}
    return SimpleNamespace(orm_user=SimpleNamespace(orm_spawners=spawners))


def test_the_saved_notice_is_shown_escaped_and_only_where_there_is_one():
    page = render(user_with({STOP_NOTICE_KEY: {"time": "2026-11-27T14:02:00Z", "text": TEXT}}, {}, None))
    assert 'id="gpuspawner-stops"' in page and TEXT.replace("'", "&#39;") in page and page.count("<li>") == 1
    assert "<b>" not in render(user_with({STOP_NOTICE_KEY: {"time": "t", "text": "<b>x</b>"}}))  # escaped
    assert "gpuspawner-stops" not in render(user_with({}, {"gpu_usage": []}))
    assert render(None).strip() == ""  # (a page without a logged-in user)


def test_the_culler_actions_share_the_notice_markup():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(hub_templates_dir()), autoescape=True)
    items = [{"time": "2026-11-27T14:02:00Z", "text": "Your server was stopped at 14:02: idle."}]
    page = env.get_template("gpuspawner_culler_actions.html").render(gpuspawner_culler_actions=lambda: items)
    assert 'id="gpuspawner-culler-actions"' in page and "alert-info" in page and "Your server was stopped at 14:02: idle." in page
    assert env.get_template("gpuspawner_culler_actions.html").render().strip() == ""  # no culler wired
