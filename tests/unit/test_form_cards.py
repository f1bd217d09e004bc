"""The spawn page renders each card once and keeps it (gpuspawner.hub.form's card cache): a kept
card is found only by everything it shows, so no user ever reads another user's card, and a card
whose count changed is rendered again (issue 39). What a view costs is counted in cards rendered,
never timed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuspawner.hub import form as form_module
from gpuspawner.hub.form import CardCache, render_form
from gpuspawner.page.views import FormView, group_options
from tests.unit.test_form import KIND_ORDER, XSS_NAME, example_options, example_view, option, option_node, parse, radio


@pytest.fixture
def cards(monkeypatch) -> CardCache:
    """An empty card cache of this test's own."""
    fresh = CardCache()
    monkeypatch.setattr(form_module, "_CARDS", fresh)
    return fresh


def view_of(options, **kw) -> FormView:
    values = dict(selected=None, selected_count=1)
    values.update(kw)
    return FormView(groups=group_options(options, KIND_ORDER), **values)


def test_a_view_in_which_nothing_changed_renders_no_card_and_reads_the_same(cards):
    first = render_form(example_view())
    rendered = cards.renders
    assert rendered == len(example_options())
    again = render_form(example_view())
    assert cards.renders == rendered
    assert again == first


def test_a_changed_count_renders_that_card_only_and_the_page_shows_the_new_count(cards):
    render_form(example_view())
    before = cards.renders
    changed = [a.slug for a, b in zip(example_options(), example_options(refreshed=True), strict=True) if a != b]
    assert "t4-shared" in changed and len(changed) < len(example_options())
    doc = parse(render_form(example_view(refreshed=True)))  # a few counts moved
    assert cards.renders - before == len(changed)
    assert option_node(doc, "t4-shared").find(data_gs_avail="").words == "1 of 4 free"
    assert "3 of 4 free" not in doc.words
    # and back: the first count again, never the one just shown
    doc = parse(render_form(example_view()))
    assert option_node(doc, "t4-shared").find(data_gs_avail="").words == "3 of 4 free"


def test_a_card_is_never_shared_between_users_who_read_it_differently(cards):
    """The same offering for a user of its group, for one outside it and for one over quota:
    each page shows its own reader's card, in whatever order the pages are made."""
    base = option("h100", "full", "H100", availability="3 of 8 free", free=3, capacity=8, counts=(1, 2))
    allowed = view_of([base])
    forbidden = view_of([replace(base, availability="", disabled_reason="not allowed for your groups")])
    over_quota = view_of([replace(base, availability="none free", disabled_reason="over your quota")])
    for order in ([allowed, forbidden, over_quota], [over_quota, forbidden, allowed, forbidden]):
        for view in order:
            doc = parse(render_form(view))
            reason = option_node(doc, "h100").find(data_gs_reason="")
            if view is allowed:
                assert reason.has("hidden") and not radio(doc, "h100").has("disabled")
                assert "3 of 8 free" in doc.words and "not allowed" not in doc.words and "quota" not in doc.words
            elif view is forbidden:
                assert reason.words == "not allowed for your groups" and radio(doc, "h100").has("disabled")
                assert "free" not in option_node(doc, "h100").words and "quota" not in doc.words
            else:
                assert reason.words == "over your quota" and "not allowed" not in doc.words


def test_the_checked_card_and_its_count_are_the_readers_own(cards):
    options = example_options()
    one = parse(render_form(view_of(options, selected="h100", selected_count=2)))
    other = parse(render_form(view_of(options, selected="cpu")))
    assert radio(one, "h100").has("checked") and not radio(one, "cpu").has("checked")
    assert radio(other, "cpu").has("checked") and not radio(other, "h100").has("checked")
    chosen = [o.attrs["value"] for o in option_node(other, "h100").find(data_gs_count="").find_all("option") if o.has("selected")]
    assert chosen == ["1"]
    again = parse(render_form(view_of(options, selected="h100", selected_count=2)))
    assert [o.attrs["value"] for o in option_node(again, "h100").find(data_gs_count="").find_all("option") if o.has("selected")] == ["2"]


def test_kept_cards_stay_escaped(cards):
    evil = option("evil", "custom", XSS_NAME, description=XSS_NAME, availability=XSS_NAME, disabled_reason=XSS_NAME)
    for _ in range(2):  # rendered, then found
        html = render_form(view_of([evil]))
        assert "<script>alert(1)</script>" not in html
        doc = parse(html)
        assert doc.find(id=radio(doc, "evil").attrs["aria-labelledby"]).words == XSS_NAME


def test_the_cache_keeps_at_most_its_size_and_forgets_the_least_recently_shown():
    cache = CardCache(size=2)
    template = form_module._environment(str(form_module.ui_dir() / "templates")).get_template(form_module.CARD_TEMPLATE)
    a, b, c = (option(s, "cpu", s.upper()) for s in "abc")
    cache.get(template, a, False, None)
    cache.get(template, b, False, None)
    cache.get(template, a, False, None)  # a shown again: b is now the oldest
    cache.get(template, c, False, None)
    assert len(cache.cards) == 2
    renders = cache.renders
    cache.get(template, a, False, None)
    assert cache.renders == renders  # kept
    cache.get(template, b, False, None)
    assert cache.renders == renders + 1  # forgotten, rendered again
