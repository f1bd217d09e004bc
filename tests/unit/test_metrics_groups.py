"""The group a user's GPU use is reported under (the hub's metrics, the dashboard, the report)."""

from __future__ import annotations

from gpuspawner.hub import metrics
from gpuspawner.names.vocabulary import GPU_USERS_GROUP


def test_the_first_group_alphabetically_and_none_without_groups():
    metrics.observe_groups("ann", ["students", "physics"])
    metrics.observe_groups("bo", [])
    assert metrics.USER_GROUPS["ann"] == "physics" and metrics.USER_GROUPS["bo"] == ""


def test_the_cullers_access_group_is_not_a_team():
    """Membership in the group the culler's token is filtered to (it sorts before most team
    names) never becomes the group GPU use is reported under."""
    metrics.observe_groups("cy", [GPU_USERS_GROUP, "students"])
    metrics.observe_groups("di", [GPU_USERS_GROUP])
    assert metrics.USER_GROUPS["cy"] == "students" and metrics.USER_GROUPS["di"] == ""
