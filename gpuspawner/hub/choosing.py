"""One spawn's choice, taken at start (``load_user_options``): KubeSpawner's profile first (its
own call, handed down), then the offering the options ask for, fitted to the image, admitted,
and what it adds to the pod kept in the spawn's state, never in KubeSpawner's settings
(docs/architecture.md, "The pod settings").

The spawner is read through the seam (``spawner``: :class:`gpuspawner.hub.seam.Spawner`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.resources
from collections.abc import Awaitable, Callable
from typing import Any

from gpuspawner.hub import admitting, catalogs, spawnview
from gpuspawner.hub.scheduling import ProfileRefused, SpawnRefused
from gpuspawner.hub.seam import Spawner
from gpuspawner.names.vocabulary import COUNT_KEY, OFFERING_KEY, RECORD_KEY
from gpuspawner.offerings.catalog import gpu_offerings_in_play
from gpuspawner.offerings.choice import Choice
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.pod.memguard import GuardConfigError, guarded
from gpuspawner.pod.podspec import pod_changes


async def load_user_options(spawner: Spawner, load_profile: Callable[[bool], Awaitable[None]]) -> None:
    """The offering the spawn's options ask for, checked and admitted after KubeSpawner's profile
    (``load_profile(gpu_in_play)``: KubeSpawner's ``load_user_options``, with the profile's checks).

    With no GPU offering in play this is KubeSpawner's own: user_options, the pod, the state and
    the refusals of a wrong profile stay KubeSpawner's (an ``offering`` key, which KubeSpawner
    would ignore, is still checked, so a request for a GPU this hub does not have is refused).
    Nothing here changes KubeSpawner's pod settings: the offering is added to the pod as it is
    built (``GPUSpawner.get_pod_manifest``). Raises :class:`SpawnRefused` (its status and
    message become the hub's answer).
    """
    spawner.spawn_state.restart()  # (KubeSpawner's _start calls this, after our _start began timing it)
    try:
        try:
            catalog = await catalogs.catalog(spawner)  # once per spawn: the choice, quotas and capacity read this one
        except OfferingConfigError as exc:
            raise catalogs.misconfigured(spawner, exc) from None
        in_play = gpu_offerings_in_play(catalog)
        before = copy.deepcopy(spawner.environment)  # what the config and the hooks set
        await load_profile(in_play)
        spawner.spawn_state.profile_env_keys = frozenset(k for k, v in spawner.environment.items() if k not in before or before[k] != v)
        choice = catalogs.choose(spawner, spawner.user_options, catalog)
        if in_play:
            choice = admitting.fit_image(spawner, choice, spawner.image)  # the profile has set the image by now
            apply_choice(spawner, choice)
            await admitting.admit(spawner, choice, catalog)
    except SpawnRefused:
        spawner.spawn_state.refused = True
        spawner.refused_options = dict(spawner.user_options)
        raise
    finally:
        spawner.spawn_state.decided.set()
    spawner.refused_options = None


async def load_profile_options(
    spawner: Spawner,
    gpu_in_play: bool,
    theirs: Callable[[], Awaitable[None]],
    profile_list: Callable[[], Awaitable[list[dict[str, Any]]]],
) -> None:
    """KubeSpawner's profile choice, by KubeSpawner's own ``load_user_options`` (``theirs``;
    ``profile_list``: KubeSpawner's profile list as KubeSpawner initializes it).

    A wrong profile or option is refused where KubeSpawner refuses it, with its words and
    as a ``ValueError`` (a :class:`~gpuspawner.hub.scheduling.ProfileRefused`, which the hub
    answers with 400 where KubeSpawner's plain ``ValueError`` gets a 500). While GPU
    offerings are in play it is checked first, with a short message (the form's choice
    was checked the same way when it was posted: :func:`gpuspawner.hub.spawnform.refuse_now`).
    """
    if gpu_in_play and spawner.profile_list:
        catalogs.check_profile_choice(spawner.user_options, await profile_list())
    try:
        await theirs()
    except ValueError as exc:  # KubeSpawner's unlisted-choice and profile checks
        message = f"The profile options were not accepted: {exc}" if gpu_in_play else str(exc)
        raise ProfileRefused(message) from None


def apply_choice(spawner: Spawner, choice: Choice) -> None:
    """Take ``choice`` for this spawn: what it adds to the pod (layered onto KubeSpawner's
    settings by ``GPUSpawner.get_pod_manifest``, never written into them) and the user_options
    that name it."""
    try:
        guard, user_env = guarded(choice.offering, choice.count, spawner.memory_guard_kinds, spawner.memory_guard_user_env, hook_source)
    except GuardConfigError as exc:  # config_problems has refused the spawn before this
        raise OfferingConfigError(str(exc)) from None
    changes = pod_changes(choice.offering, choice.count, guard)
    queued = spawnview.kueue_routing(spawner).labels(choice.offering, spawnview.requester(spawner).groups)
    if queued:  # Kueue admits this server by its queue's quota (docs/kueue.md)
        changes = dataclasses.replace(changes, labels={**changes.labels, **queued})
    state = spawner.spawn_state
    state.choice, state.pod_changes, state.user_env = choice, changes, user_env
    spawner.user_options = {**choice.as_user_options(), **passthrough_options(spawner.user_options), RECORD_KEY: spawnview.record(spawner)}
    offered = f"{choice.offering.slug} x{choice.count}"
    spawner.log.info("%s: offering %s -> limits %s, selector %s", spawner.log_name, offered, changes.limits, changes.node_selector)


def passthrough_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """Options that are not gpuspawner's (e.g. KubeSpawner's ``profile``) are kept as they were."""
    ours = {OFFERING_KEY, COUNT_KEY, RECORD_KEY}
    return {k: v for k, v in (options or {}).items() if k not in ours}


@functools.cache
def hook_source() -> str:
    """The memory guard's start-up hook as shipped in the package (read once), its braces
    doubled: KubeSpawner expands ``{username}``-style templates in every annotation, and
    gives the source back exactly as shipped."""
    source = importlib.resources.files("gpuspawner.pod").joinpath("memguard_hook.py").read_text(encoding="utf-8")
    return source.replace("{", "{{").replace("}", "}}")
