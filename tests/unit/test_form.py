"""The spawn page's view layer: gpuspawner.hub.form.render_form, parsed back with html.parser."""

from __future__ import annotations

from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markupsafe import Markup

from gpuspawner.core.wording import group_title, isolation_phrase, memory_truth
from gpuspawner.hub import form as form_module
from gpuspawner.hub.form import render_form, ui_dir
from gpuspawner.names.vocabulary import Isolation, Kind
from gpuspawner.page.views import FormView, GroupView, OptionView, group_options, user_options_from_form

KIND_ORDER = ("cpu", "shared", "mig", "full", "vgpu", "custom")
XSS_NAME = "<script>alert(1)</script>"
XSS_ATTR = '"><img src=x onerror=alert(1)>'


def option(slug: str, kind: str, name: str, **kw) -> OptionView:
    values = dict(
        description="",
        memory="",
        compute_share="",
        isolation="",
        availability="",
        free=None,
        capacity=None,
        disabled_reason="",
        counts=(1,),
    )
    values.update(kw)
    return OptionView(slug=slug, kind=kind, display_name=name, **values)


def example_options(refreshed: bool = False) -> list[OptionView]:
    """What a data scientist sees at a mixed site; ``refreshed``: the same a little later."""
    mig3_free = 1 if refreshed else 0
    return [
        option(
            "cpu",
            "cpu",
            "No GPU",
            description="CPU only. Pick this for data preparation, plotting and anything that does not use CUDA.",
            isolation=isolation_phrase(Isolation.NO_GPU),
            compute_share="no GPU",
        ),
        option(
            "t4-shared",
            "shared",
            "T4 · time-sliced, 1/4 GPU",
            description="Good for trying out CUDA code and small models.",
            memory=memory_truth(Kind.SHARED, 16384, "time-slicing", 4, "T4"),
            compute_share="1/4 of the GPU (time-sliced)",
            isolation=isolation_phrase(Isolation.NONE),
            availability="1 of 4 free" if refreshed else "3 of 4 free",
            free=1 if refreshed else 3,
            capacity=4,
        ),
        option(
            "l4-mps",
            "shared",
            "L4 · MPS, 1/4 GPU",
            memory=memory_truth(Kind.SHARED, 6144, "mps", 4, "L4"),
            compute_share="1/4 of the GPU (MPS share)",
            isolation=isolation_phrase(Isolation.PARTIAL),
            availability="a new node starts for you, about 5 min",
            free=0,
            capacity=0,
        ),
        option(
            "a100-mig-1g-5gb",
            "mig",
            "A100 40GB · MIG 1g.5gb",
            memory=memory_truth(Kind.MIG, 5120),
            compute_share="1/7 of the GPU's compute",
            isolation=isolation_phrase(Isolation.HARDWARE),
            availability="2 of 2 free",
            free=2,
            capacity=2,
        ),
        option(
            "a100-mig-2g-10gb",
            "mig",
            "A100 40GB · MIG 2g.10gb",
            memory=memory_truth(Kind.MIG, 10240),
            compute_share="2/7 of the GPU's compute",
            isolation=isolation_phrase(Isolation.HARDWARE),
            availability="1 of 1 free",
            free=1,
            capacity=1,
        ),
        option(
            "a100-mig-3g-20gb",
            "mig",
            "A100 40GB · MIG 3g.20gb",
            memory=memory_truth(Kind.MIG, 20480),
            compute_share="3/7 of the GPU's compute",
            isolation=isolation_phrase(Isolation.HARDWARE),
            availability=f"{mig3_free} of 1 free" if mig3_free else "none free",
            free=mig3_free,
            capacity=1,
            disabled_reason="" if mig3_free else "none free right now",
        ),
        option(
            "h100",
            "full",
            "H100 80GB",
            description="For training: one or more whole GPUs, nobody else on them.",
            memory=memory_truth(Kind.FULL, 81920),
            isolation=isolation_phrase(Isolation.EXCLUSIVE),
            availability="none free" if refreshed else "5 of 8 free",
            free=0 if refreshed else 5,
            capacity=8,
            disabled_reason="none free right now" if refreshed else "",
            counts=() if refreshed else (1, 2, 4),
        ),
        option(
            "a10-vgpu-24q",
            "vgpu",
            "A10 · vGPU 24Q",
            memory=memory_truth(Kind.VGPU, 24576),
            isolation=isolation_phrase(Isolation.VM),
            availability="2 of 4 free",
            free=2,
            capacity=4,
            disabled_reason="not allowed for your groups",
        ),
        option(
            "v100-half",
            "custom",
            "Half a V100",
            description="Our site's fractional V100 (16 GB).",
            memory=memory_truth(Kind.CUSTOM, 16384),
            compute_share="1/2 of the GPU",
            isolation=isolation_phrase(Isolation.SITE),
            availability="queue: 2 waiting",
            free=0,
            capacity=None,
        ),
    ]


def example_view(refreshed: bool = False, **kw) -> FormView:
    values = dict(selected="cpu", selected_count=1)
    values.update(kw)
    return FormView(groups=group_options(example_options(refreshed), KIND_ORDER), **values)


# ----------------------------------------------------------------------------- a tiny DOM

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    @property
    def words(self) -> str:
        return " ".join(self.text.split())

    def iter(self):
        for child in self.children:
            if isinstance(child, Node):
                yield child
                yield from child.iter()

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        def match(node: Node) -> bool:
            if tag and node.tag != tag:
                return False
            return all(k.replace("_", "-") in node.attrs and (node.attrs[k.replace("_", "-")] or "") == v for k, v in attrs.items())

        return [n for n in self.iter() if match(n)]

    def find(self, tag: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, **attrs)
        assert len(found) == 1, f"expected one <{tag or '*'} {attrs}>, found {len(found)}"
        return found[0]

    def by_id(self, ident: str) -> Node:
        return self.find(id=ident)

    def has(self, attr: str) -> bool:
        return attr in self.attrs

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class Tree(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.current = self.root
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        names = [name for name, _ in attrs]
        if len(names) != len(set(names)):
            self.errors.append(f"<{tag}> repeats an attribute: {names}")
        node = Node(tag, dict(attrs), self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Node(tag, dict(attrs), self.current))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self.current.tag != tag:
            self.errors.append(f"</{tag}> closes <{self.current.tag}>")
            return
        self.current = self.current.parent

    def handle_data(self, data):
        self.current.children.append(data)


def parse(html: str) -> Node:
    tree = Tree()
    tree.feed(html)
    tree.close()
    assert not tree.errors, tree.errors
    assert tree.current is tree.root, f"<{tree.current.tag}> is never closed"
    return tree.root


def option_node(doc: Node, slug: str) -> Node:
    return doc.find("div", data_slug=slug)


def radio(doc: Node, slug: str) -> Node:
    return doc.find("input", type="radio", value=slug)


# ----------------------------------------------------------------------------- tests


def test_fragment_is_well_formed_and_has_no_form_or_submit_button():
    html = render_form(example_view())
    doc = parse(html)
    assert not doc.find_all("form")
    assert not doc.find_all("button")
    assert not [n for n in doc.find_all("input") if n.attrs.get("type") in ("submit", "image", "reset")]
    roots = [c for c in doc.children if isinstance(c, Node)]
    assert [n.tag for n in roots] == ["div"] and roots[0].has("data-gpuspawner")


def test_groups_follow_the_given_kind_order_and_skip_empty_kinds():
    options = example_options()
    groups = group_options(reversed(options), ["full", "mig", "cpu", "vgpu", "shared", "custom", "nonesuch"])
    assert [g.kind for g in groups] == ["full", "mig", "cpu", "vgpu", "shared", "custom"]
    assert [g.title for g in groups] == [group_title(g.kind) for g in groups]
    # Order within a group is the order the options came in.
    assert [o.slug for o in groups[1].options] == ["a100-mig-3g-20gb", "a100-mig-2g-10gb", "a100-mig-1g-5gb"]

    doc = parse(render_form(FormView(groups=groups, selected=None, selected_count=1)))
    fieldsets = doc.find_all("fieldset")
    assert [f.attrs["data-kind"] for f in fieldsets] == ["full", "mig", "cpu", "vgpu", "shared", "custom"]
    assert [f.find("legend").words for f in fieldsets] == ["Whole GPU", "MIG slice", "No GPU", "vGPU class", "Shared GPU", "Site-specific"]
    # Every option sits in the fieldset of its kind.
    for fieldset in fieldsets:
        kinds = {o.kind for o in options if o.slug in {n.attrs["data-slug"] for n in fieldset.find_all("div") if n.has("data-slug")}}
        assert kinds == {fieldset.attrs["data-kind"]}


def test_group_options_keeps_kinds_missing_from_the_order_last_and_drops_empty_ones():
    options = [option("a", "mig", "A"), option("b", "cpu", "B"), option("c", "custom", "C"), option("d", "mig", "D")]
    groups = group_options(options, ["cpu", "full"])
    assert [(g.kind, [o.slug for o in g.options]) for g in groups] == [("cpu", ["b"]), ("mig", ["a", "d"]), ("custom", ["c"])]
    assert group_options([], KIND_ORDER) == ()


def test_every_field_of_every_option_is_shown():
    options = example_options()
    doc = parse(render_form(example_view()))
    for opt in options:
        node = option_node(doc, opt.slug)
        r = radio(doc, opt.slug)
        assert r.attrs["name"] == "offering"
        label = next(n for n in node.iter() if "gs-label" in n.classes())
        assert r in list(label.iter()), "the label wraps the radio, so a click anywhere on it picks the option"
        assert doc.by_id(r.attrs["aria-labelledby"]).words == opt.display_name
        described = [doc.by_id(i) for i in r.attrs["aria-describedby"].split()]
        described_text = " ".join(n.words for n in described)
        for text in (opt.memory, opt.compute_share, opt.isolation, opt.description, opt.availability):
            assert text in node.words
            assert text in described_text
        badge = node.find(data_gs_avail="")
        assert badge.words == opt.availability
        assert badge.has("hidden") == (not opt.availability)
        assert "badge" in badge.classes()


def test_facts_share_a_line_and_isolation_has_its_own():
    doc = parse(render_form(example_view()))
    details = next(n for n in option_node(doc, "a100-mig-3g-20gb").iter() if "gs-details" in n.classes())
    lines = [n.words for n in details.children if isinstance(n, Node)]
    assert lines == ["MIG: 20 GB, enforced by the hardware · 3/7 of the GPU's compute", "hardware isolated (own memory and compute)"]


def test_cpu_details_do_not_repeat_the_same_phrase():
    doc = parse(render_form(example_view()))
    details = next(n for n in option_node(doc, "cpu").iter() if "gs-details" in n.classes())
    assert [n.words for n in details.children if isinstance(n, Node)] == ["no GPU"]


def test_availability_badge_tone_follows_the_free_count():
    doc = parse(render_form(example_view()))
    tones = {
        o.slug: next(c for c in option_node(doc, o.slug).find(data_gs_avail="").classes() if c.startswith("gs-tone-"))
        for o in example_options()
    }
    assert tones["t4-shared"] == "gs-tone-ok"
    assert tones["l4-mps"] == "gs-tone-wait"
    assert tones["v100-half"] == "gs-tone-wait"
    assert tones["a100-mig-3g-20gb"] == "gs-tone-off"
    assert tones["a10-vgpu-24q"] == "gs-tone-off"
    assert tones["cpu"] == "gs-tone-info"


def test_no_isolation_is_called_out():
    doc = parse(render_form(example_view()))
    warned = [n.words for n in doc.find_all("span") if "gs-warn" in n.classes()]
    assert warned == [isolation_phrase(Isolation.NONE)]


def test_disabled_option_has_a_disabled_radio_and_its_reason_linked_to_it():
    doc = parse(render_form(example_view()))
    for slug, reason in (("a100-mig-3g-20gb", "none free right now"), ("a10-vgpu-24q", "not allowed for your groups")):
        r = radio(doc, slug)
        assert r.has("disabled")
        node = option_node(doc, slug)
        assert "gs-disabled" in node.classes()
        reason_node = node.find(data_gs_reason="")
        assert reason_node.words == reason and not reason_node.has("hidden")
        described = [doc.by_id(i) for i in r.attrs["aria-describedby"].split()]
        assert any(reason_node in list(n.iter()) for n in described), "the reason is read out with the radio"
    for slug in ("cpu", "t4-shared", "h100"):
        r = radio(doc, slug)
        assert not r.has("disabled")
        reason_node = option_node(doc, slug).find(data_gs_reason="")
        assert reason_node.has("hidden") and reason_node.words == ""


def test_selected_option_is_checked_and_only_it():
    doc = parse(render_form(example_view(selected="a100-mig-2g-10gb")))
    checked = [n.attrs["value"] for n in doc.find_all("input", type="radio") if n.has("checked")]
    assert checked == ["a100-mig-2g-10gb"]


def test_a_selected_option_that_cannot_be_picked_now_is_not_checked():
    doc = parse(render_form(example_view(selected="a100-mig-3g-20gb")))
    assert not [n for n in doc.find_all("input", type="radio") if n.has("checked")]
    assert all(n.has("required") for n in doc.find_all("input", type="radio"))


def test_no_selection_checks_nothing():
    doc = parse(render_form(example_view(selected=None)))
    assert not [n for n in doc.find_all("input", type="radio") if n.has("checked")]


def test_one_count_select_per_whole_gpu_option_with_only_the_given_counts():
    a100 = option("a100-x", "full", "A100 80GB", counts=(1, 2))
    h100 = next(o for o in example_options() if o.slug == "h100")
    gone = option("b200", "full", "B200", counts=(), disabled_reason="over your quota (2 GPUs)")
    view = FormView(groups=group_options([*example_options(), a100, gone], KIND_ORDER), selected="h100", selected_count=4)
    doc = parse(render_form(view))
    selects = doc.find_all("select")
    assert sorted(s.attrs["name"] for s in selects) == ["count-a100-x", "count-b200", "count-h100"]

    h = doc.find("select", name="count-h100")
    assert [o.attrs["value"] for o in h.find_all("option")] == [str(c) for c in h100.counts]
    assert [o.words for o in h.find_all("option")] == ["1", "2", "4"]
    assert [o.attrs["value"] for o in h.find_all("option") if o.has("selected")] == ["4"]
    assert not h.has("disabled")
    assert h in list(option_node(doc, "h100").iter())
    assert doc.find("label", **{"for": h.attrs["id"]}).words == "Number of GPUs"

    other = doc.find("select", name="count-a100-x")
    assert [o.attrs["value"] for o in other.find_all("option")] == ["1", "2"]
    assert [o.attrs["value"] for o in other.find_all("option") if o.has("selected")] == ["1"]

    b200 = doc.find("select", name="count-b200")
    assert b200.has("disabled") and not b200.find_all("option")
    assert option_node(doc, "b200").find(data_gs_reason="").words == "over your quota (2 GPUs)"


def test_selected_count_not_allowed_falls_back_to_the_first_count():
    doc = parse(render_form(example_view(selected="h100", selected_count=3)))
    h = doc.find("select", name="count-h100")
    assert [o.attrs["value"] for o in h.find_all("option") if o.has("selected")] == ["1"]


def test_message_is_shown_escaped_above_the_choices():
    message = "The GPU option '<b>x</b>' is not offered to you & was refused."
    doc = parse(render_form(example_view(message=message)))
    alert = doc.find(role="alert")
    assert {"alert", "alert-danger"} <= alert.classes()
    assert alert.text == message
    assert not alert.find_all("b")
    top = doc.find("div", data_gpuspawner="")
    blocks = [c for c in top.children if isinstance(c, Node) and c.tag not in ("style", "script")]
    assert blocks[0] is alert


def test_no_message_no_alert():
    doc = parse(render_form(example_view()))
    assert not doc.find_all(role="alert")


def test_markup_in_offering_text_is_only_text():
    hostile = replace(
        example_options()[1],
        display_name=XSS_NAME,
        description=XSS_ATTR,
        memory=XSS_ATTR,
        compute_share=XSS_NAME,
        availability=XSS_NAME,
        disabled_reason=XSS_ATTR,
    )
    hostile_full = option("h200", "full", XSS_ATTR, description=XSS_NAME, counts=(1, 2))
    view = FormView(
        groups=(GroupView(kind="shared", title=XSS_NAME, options=(hostile,)), GroupView("full", XSS_ATTR, (hostile_full,))),
        selected=None,
        selected_count=1,
        message=XSS_NAME + XSS_ATTR,
    )
    html = render_form(view)
    doc = parse(html)
    assert not doc.find_all("img")
    assert len(doc.find_all("script")) == 1, "only gpuspawner's own script"
    assert XSS_NAME not in html and "<img" not in html
    for node in doc.iter():
        assert not any(name.startswith("on") for name in node.attrs), f"event handler attribute on <{node.tag}>"
    shared = option_node(doc, "t4-shared")
    assert shared.find(id=radio(doc, "t4-shared").attrs["aria-labelledby"]).text == XSS_NAME
    assert shared.find(data_gs_reason="").text == XSS_ATTR
    assert shared.find(data_gs_avail="").text == XSS_NAME
    assert XSS_ATTR in shared.text and XSS_NAME in shared.text
    assert [f.find("legend").text for f in doc.find_all("fieldset")] == [XSS_NAME, XSS_ATTR]
    assert doc.find(role="alert").text == XSS_NAME + XSS_ATTR
    assert option_node(doc, "h200").find(id=radio(doc, "h200").attrs["aria-labelledby"]).text == XSS_ATTR


def test_hostile_slug_stays_inside_its_attributes():
    evil = option('x" onclick="alert(1)', "full", "Evil", counts=(1,))
    doc = parse(render_form(FormView(groups=(GroupView("full", "Whole GPU", (evil,)),), selected=None, selected_count=1)))
    for node in doc.iter():
        assert "onclick" not in node.attrs
    assert doc.find("input", type="radio").attrs["value"] == 'x" onclick="alert(1)'
    assert doc.find("select").attrs["name"] == 'count-x" onclick="alert(1)'


def test_no_two_ids_on_a_page_are_the_same_whatever_the_slugs():
    """A card's ids are its slug and a suffix a slug cannot hold: slugs that read like another card's
    id plus a suffix ("h100-a" beside "h100") never give two elements one id."""
    slugs = ["h100", "h100-a", "h100-d", "h100-n", "a", "d"]
    cards = tuple(option(slug, "full", slug.upper(), counts=(1, 2)) for slug in slugs)
    doc = parse(render_form(FormView(groups=(GroupView("full", "Whole GPU", cards),), selected=None, selected_count=1)))
    ids = [n.attrs["id"] for n in doc.iter() if "id" in n.attrs]
    assert len(ids) == len(set(ids)) == 4 * len(slugs)  # its name, its badge, the rest of its words, its count
    for slug in slugs:
        r = radio(doc, slug)
        assert doc.by_id(r.attrs["aria-labelledby"]).words == slug.upper()
        count = option_node(doc, slug).find(data_gs_count="")
        assert option_node(doc, slug).find("label", **{"for": count.attrs["id"]}).words == "Number of GPUs"


def test_extra_html_is_inserted_as_is_and_plain_text_is_escaped():
    extra = '<div class="form-group" id="kubespawner-profiles-list"><input type="radio" name="profile" value="small" checked> Small</div>'
    html = render_form(example_view(extra_html=Markup(extra)))
    assert extra in html
    doc = parse(html)
    assert doc.find("input", name="profile").attrs["value"] == "small"
    assert doc.find(id="kubespawner-profiles-list").parent.classes() == {"gs-extra"}

    escaped = render_form(example_view(extra_html="<b>not trusted</b>"))
    assert "<b>" not in escaped and "&lt;b&gt;not trusted&lt;/b&gt;" in escaped

    assert not parse(render_form(example_view())).find_all(**{"class": "gs-extra"})


def test_style_and_script_are_inlined_from_the_static_folder():
    html = render_form(example_view(refresh_seconds=7))
    doc = parse(html)
    static = ui_dir() / "static"
    assert doc.find("style").text == (static / "gpuspawner.css").read_text(encoding="utf-8")
    script = doc.find("script").text
    assert script == (static / "gpuspawner.js").read_text(encoding="utf-8").replace("</", "<\\/")
    assert html.count("</script>") == 1 and html.count("</style>") == 1
    root = doc.find("div", data_gpuspawner="")
    assert root.attrs["data-refresh-seconds"] == "7"
    status = doc.find(data_gs_status="")
    assert status.has("hidden"), "the refresh note is shown only once the script runs"
    assert "7 seconds" in status.words


def test_refresh_can_be_turned_off():
    doc = parse(render_form(example_view(refresh_seconds=0)))
    assert doc.find("div", data_gpuspawner="").attrs["data-refresh-seconds"] == "0"
    assert not doc.find_all(data_gs_status="")


def test_no_options_at_all_says_so():
    doc = parse(render_form(FormView(groups=(), selected=None, selected_count=1)))
    assert "No GPU options are offered to you" in doc.words


def test_templates_are_read_from_the_installed_package_first(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "gpuspawner"
    (package / "ui" / "templates").mkdir(parents=True)
    (package / "ui" / "static").mkdir()
    (package / "ui" / "templates" / "gpuspawner_form.html").write_text("installed {{ view.selected }}")
    (package / "ui" / "static" / "gpuspawner.css").write_text("")
    (package / "ui" / "static" / "gpuspawner.js").write_text("")
    monkeypatch.setattr(form_module, "__file__", str(package / "hub" / "form.py"))
    assert ui_dir() == package / "ui"
    assert render_form(example_view(selected="h100")) == "installed h100"


def test_repository_ui_folder_is_the_fallback():
    assert ui_dir() == Path(form_module.__file__).resolve().parents[2] / "ui"


def test_missing_templates_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(form_module, "__file__", str(tmp_path / "a" / "gpuspawner" / "hub" / "form.py"))
    with pytest.raises(FileNotFoundError, match="Reinstall gpuspawner"):
        ui_dir()


# ------------------------------------------------------------------- reading the POST


def test_user_options_read_the_count_of_the_chosen_offering():
    formdata = {
        "offering": ["h100"],
        "count-h100": ["2"],
        "count-a100-x": ["1"],
        "profile": ["small"],
    }
    assert user_options_from_form(formdata) == {"offering": "h100", "count": "2", "profile": ["small"]}


def test_user_options_fall_back_to_the_plain_count_field():
    assert user_options_from_form({"offering": ["h100"], "count": ["4"]}) == {"offering": "h100", "count": "4"}
    assert user_options_from_form({"offering": ["h100"], "count-h100": ["2"], "count": ["4"]})["count"] == "2"


def test_user_options_without_a_count_leave_it_to_the_default():
    assert user_options_from_form({"offering": ["cpu"], "count-h100": ["2"]}) == {"offering": "cpu"}
    assert user_options_from_form({"count-h100": ["2"]}) == {}


def test_user_options_keep_several_values_for_validation_to_refuse():
    out = user_options_from_form({"offering": ["h100", "cpu"], "count": ["1", "2"]})
    assert out == {"offering": ["h100", "cpu"], "count": ["1", "2"]}


def test_user_options_decode_bytes():
    assert user_options_from_form({"offering": [b"h100"], "count-h100": [b"2"]}) == {"offering": "h100", "count": "2"}


def test_the_budget_and_each_offerings_hour_cost_are_shown_as_text():
    options = [replace(o, hour_cost="0.5 GPU-hours of budget per hour <b>") for o in example_options()]
    budget = "Your GPU budget: 4.5 of 20 GPU-hours used this week (15.5 left; measured by Prometheus)."
    html = render_form(FormView(groups=group_options(options, KIND_ORDER), selected=None, selected_count=1, budget=budget))
    assert f'<div class="alert alert-info gs-budget" role="status" data-gs-budget>{budget}</div>' in html
    assert html.count('<span class="gs-cost" data-gs-cost>0.5 GPU-hours of budget per hour &lt;b&gt;</span>') == len(options)
    # without a budget: neither
    plain = render_form(example_view())
    assert "gs-budget" not in plain and "gs-cost" not in plain
