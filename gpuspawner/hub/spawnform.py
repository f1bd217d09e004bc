"""The spawn page on the hub: the GPU choice rendered for one user now (with KubeSpawner's
profile form inside it), and a posted choice refused at once where the start would refuse it.

What each row says is :mod:`gpuspawner.page.cards`'; the HTML is :mod:`gpuspawner.hub.form`'s.
The spawner is read through the seam (``spawner``: :class:`gpuspawner.hub.seam.Spawner`) for the
user and the traits; KubeSpawner's profile list, initialized by KubeSpawner, is handed down.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from markupsafe import Markup

from gpuspawner.capacity.admission import REFUSE
from gpuspawner.capacity.budgetmath import COST, cost_text, standing_text
from gpuspawner.core.model import Offering
from gpuspawner.core.wording import MISCONFIGURED_MESSAGE, OVER_BUDGET, OVER_COST_BUDGET, OVER_QUOTA, counts_notice
from gpuspawner.hub import budgets, catalogs, spawnview
from gpuspawner.hub.admitting import bound_holdings, check_quota, fit_image, group_members, obstacle_now
from gpuspawner.hub.form import render_form
from gpuspawner.hub.pagecache import PAGES, view_key
from gpuspawner.hub.scheduling import SpawnRefused, WaitQueue, refusal
from gpuspawner.hub.seam import Spawner
from gpuspawner.names.vocabulary import COUNT_FIELD_PREFIX, COUNT_KEY, OFFERING_KEY, Kind
from gpuspawner.offerings.catalog import gpu_offerings_in_play
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.page.cards import RowCache, default_choice, option_views
from gpuspawner.page.useroptions import profile_image, profile_images
from gpuspawner.page.views import FormView, OptionView, group_options, user_options_from_form, with_images

#: This process's rows of the page (one hub, one event loop: no lock needed): a view after an
#: inventory event makes again only the rows whose offering's count or state moved.
ROWS = RowCache()


async def render_gpu_form(spawner: Spawner, profile_list: Callable[[], Awaitable[list[dict[str, Any]]]]) -> str:
    """The spawn page: the GPU choice with KubeSpawner's profile form inside it, or
    KubeSpawner's form alone while no GPU offering is in play. ``profile_list``: KubeSpawner's
    profile list as KubeSpawner initializes it (asked only while GPU offerings are in play).

    A page is made again only when something it shows has changed (:mod:`gpuspawner.hub.pagecache`):
    the same view again is answered with the page made before."""
    extra_html = await kubespawner_form(spawner)
    key = _key(spawner, extra_html)
    page = PAGES.get(key) if key is not None else None
    if page is not None:
        return page
    page = await _render_gpu_form(spawner, profile_list, extra_html)
    if key is not None and _key(spawner, extra_html, key[0]) == key:  # (nothing moved while it was made)
        PAGES.put(key, page)
    return page


def _key(spawner: Spawner, extra_html: str, settings: tuple[bytes | str, ...] | None = None) -> tuple[Any, ...] | None:
    """:func:`~gpuspawner.hub.pagecache.view_key`, or None (the page made now, and not kept) where the
    settings are wrong (a time zone that does not exist, say): the page made now says so."""
    try:
        return view_key(spawner, extra_html, settings)
    except Exception:
        return None


async def _render_gpu_form(spawner: Spawner, profile_list: Callable[[], Awaitable[list[dict[str, Any]]]], extra_html: str) -> str:
    """:func:`render_gpu_form` made now, with KubeSpawner's form ``extra_html``."""
    try:
        catalog = await catalogs.catalog(spawner)
    except OfferingConfigError as exc:
        spawner.log.error("GPUSpawner configuration error: %s", exc)
        return render_form(FormView(groups=(), selected=None, selected_count=1, message=MISCONFIGURED_MESSAGE))
    if not gpu_offerings_in_play(catalog):
        return extra_html
    by_slug = {o.slug: o for o in catalog}
    quotas = bool(spawner.user_quota or spawner.group_quotas)  # without any, no quota refuses (capacity.admission.check_quota)
    bound, members = (bound_holdings(spawner, by_slug), group_members(spawner)) if quotas else ({}, {})

    standing = await budgets.standing(spawner, catalog)
    spending = await budgets.standing(spawner, catalog, COST)  # the cost budget

    def quota_reason(offering: Offering) -> str:
        if quotas and check_quota(spawner, offering, offering.counts[0], bound, members).action == REFUSE:
            return OVER_QUOTA
        if standing is not None and not standing.covers(offering.hourly_cost(offering.counts[0])):
            return OVER_BUDGET
        if spending is not None and not spending.covers(budgets.hourly(offering, offering.counts[0], COST)):
            return OVER_COST_BUDGET
        return ""

    def hour_cost(offering: Offering) -> str:
        return cost_text(offering.hourly_cost(1)) + (" per GPU" if offering.kind is Kind.FULL else "") if standing is not None else ""

    # Counts of the nodes that can run the image, and an offering none of whose nodes can is disabled
    # with the versions in words: for the image the form starts with (the default profile's) and,
    # for the page's script, every image a profile or an option's choice runs.
    profiles = await profile_list() if spawner.profile_list else []
    images = profile_images(profiles, spawner.image) if spawnview.image_rules(spawner) else {"": spawner.image}
    now = spawner.now()
    availability = catalogs.availabilities(spawner)

    def rows_for(image: str) -> list[OptionView]:
        fits = {o.slug: catalogs.image_fit(spawner, o, image) for o in catalog}
        return option_views(
            catalog,
            spawnview.requester(spawner),
            # A choice of an offering's alternatives (dra.alternatives.choices) has the offering's slug: its own count.
            lambda offering: availability(
                fits[offering.slug][0] if by_slug.get(offering.slug) is offering else catalogs.image_fit(spawner, offering, image)[0]
            ),
            now,
            spawner.admission,
            quota_reason,
            WaitQueue.length,
            spawner.hide_forbidden_offerings,
            hour_cost,
            image_reason=lambda offering: fits[offering.slug][1],
            kept=ROWS,
        )

    rows = rows_for(images[""])
    if len(set(images.values())) > 1:
        rows = with_images(rows, {image: rows_for(image) for image in sorted(set(images.values()))})
    last = spawner.user_options or (spawner.orm_spawner.user_options if spawner.orm_spawner else None)
    # (JupyterHub shows the form again after a refusal: refused_options selects the refused choice)
    selected, count = default_choice(rows, spawner.default_offering, last, by_slug, spawner.refused_options)
    return render_form(
        FormView(
            groups=group_options(rows, [k.value for k in Kind]),
            selected=selected,
            selected_count=count,
            extra_html=Markup(extra_html),
            refresh_seconds=spawner.form_refresh_seconds,
            notice=counts_notice(catalogs.health(spawner), now),
            budget=" ".join(standing_text(found) for found in (standing, spending) if found is not None),
            images=json.dumps(images, sort_keys=True) if len(set(images.values())) > 1 else "",
        )
    )


async def kubespawner_form(spawner: Spawner) -> str:
    """KubeSpawner's own spawn form (its profile list); "" without a profile_list."""
    form = KubeSpawner._options_form_default(spawner)
    return str(await maybe_future(form(spawner)) if callable(form) else form)


def options_from_form(
    spawner: Spawner,
    formdata: dict[str, list[str]],
    theirs: Callable[[dict[str, list[str]]], dict[str, Any]],
    profiles: Callable[[], list[dict[str, Any]]],
) -> dict[str, Any]:
    """The options of a posted form (``GPUSpawner._options_from_form``, KubeSpawner's signature:
    synchronous, a dict). ``theirs``: KubeSpawner's ``_options_from_form``; ``profiles``:
    KubeSpawner's profile list as :func:`refuse_now` takes it.

    A post without a GPU choice (KubeSpawner's own form, a query string) gets KubeSpawner's
    answer, and its profile is checked where KubeSpawner checks it, at start. With a GPU choice, its ``offering`` and ``count`` are added as posted and
    checked at once from what the hub knows without waiting (:func:`refuse_now`); the start
    checks everything again (load_user_options), as the cluster may change in between.
    """
    if OFFERING_KEY not in formdata:  # KubeSpawner's form (or a query): KubeSpawner's answer, checked at start
        return theirs(formdata)
    ours = {k for k in formdata if k in (OFFERING_KEY, COUNT_KEY) or k.startswith(COUNT_FIELD_PREFIX)}
    options = theirs({k: v for k, v in formdata.items() if k not in ours})
    options = {**options, **user_options_from_form({k: formdata[k] for k in ours})}
    try:
        refuse_now(spawner, options, profiles())
    except SpawnRefused:
        spawner.refused_options = options  # JupyterHub shows the form again: it keeps the choice
        raise
    return options


def refuse_now(spawner: Spawner, options: dict[str, Any], profiles: list[dict[str, Any]]) -> None:
    """Refuse at once what the start would refuse, from what is known without waiting.

    JupyterHub shows the form again with a start's refusal only if the start fails within
    a second of the POST; on a busy hub it takes longer and the user lands on the
    spawn-pending page instead. So a posted choice is also checked here, in the start's
    order (profile, cluster, choice, window, quota, capacity), recording nothing; the
    start checks it all again, as the cluster may change in between. Left to the start:
    a callable profile_list (it may need awaiting), and everything while the hub has not
    heard from the cluster yet. ``profiles``: KubeSpawner's profile list as KubeSpawner initializes
    it, [] where there is none or it is a callable.
    """
    if profiles:
        catalogs.check_profile_choice(options, profiles)
    try:
        if (
            not spawnview.config_problems(spawner)
            and spawnview.catalog_config(spawner).needs_inventory()
            and not spawnview.inventory(spawner).health.answered
        ):
            return
        catalog = catalogs.catalog_now(spawner)
    except OfferingConfigError as exc:
        raise catalogs.misconfigured(spawner, exc) from None
    choice = catalogs.choose(spawner, options, catalog)
    if gpu_offerings_in_play(catalog):
        choice = fit_image(spawner, choice, profile_image(options, profiles, spawner.image))
        reason, decision = obstacle_now(spawner, choice, catalog)
        if decision.action == REFUSE:
            raise refusal(reason, decision)
        budgets.check_now(spawner, choice.offering, choice.count)
