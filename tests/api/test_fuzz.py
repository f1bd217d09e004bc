"""Hypothesis fuzz of spawn requests through the real hub's REST API and spawn form.

Each example is a batch of requests, sent by a few workers at once, each request as an
idle user of its role (a user's server is stopped in the background afterwards): REST API
starts of the default server or of a named server (POST, or PUT then POST), and
form POSTs, with generated ``user_options`` / form fields (wrong types, huge and
nested values, unicode, markup, forbidden and unknown slugs, counts, KubeSpawner
profiles, junk keys) and valid choices. For every request:

* the status is never 5xx, and is of the right class: when the request is at fault
  (the oracle below, written from the hub's stated policy in tests/api/gpuhub.py,
  not from gpuspawner's code) the status of its fault (400, 403), else a start
  (201/202, or the form's redirect) or a refusal for the cluster's state (409
  nothing free, 429 over quota). A refusal that takes longer than the hub's
  slow_spawn_timeout (a loaded machine) is answered 202 by JupyterHub itself (201
  if the refusal lands just after that timeout); it must then end the spawn with its
  message on the progress stream (counted apart);
* a refusal carries a message, without markup;
* every pod that exists afterwards matches its user's policy (offering, count, limits);
* what the hub stored as ``user_options`` holds no key nobody reads.

At the end the hub's log has no traceback and no 500. CI runs a few hundred requests
with a fixed seed; ``make fuzz`` runs >= 10,000 (GPUSPAWNER_FUZZ_EXAMPLES, _BATCH, _MIN_REQUESTS).
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.gpuhub import CLOSED, NOBODYS, RESEARCHERS, STUDENTS, Answer, GPUHub, pod_problems, policy

pytestmark = pytest.mark.cluster

EXAMPLES = int(os.environ.get("GPUSPAWNER_FUZZ_EXAMPLES", "20"))
MIN_REQUESTS = int(os.environ.get("GPUSPAWNER_FUZZ_MIN_REQUESTS", "200"))
#: The fuzz's users (the other tests' are left alone); a request draws a role, and runs as an idle user of it.
POOL = {"student": STUDENTS[8:], "researcher": RESEARCHERS[8:]}
BATCH = int(os.environ.get("GPUSPAWNER_FUZZ_BATCH", "30"))  # requests per example, at most
WORKERS = int(os.environ.get("GPUSPAWNER_FUZZ_WORKERS", "16"))  # requests in flight at once
SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
PROFILES = {"python": {}, "pytorch": {"image": {"cuda12", "cpu"}}}
#: The longest value of a kept key that a hub stores or starts with (docs/api.md).
MAX_VALUE_CHARS = 4096
KNOWN_KEYS = {"offering", "count", "profile", "image", "image--unlisted-choice", "gpuspawner"}
#: Top-level body keys JupyterHub reads itself (a body with either is not user_options).
BODY_KEYS = {"user_options", "display_name"}
STARTED = {201, 202, 302}
STATE_REFUSALS = {409, 429}
SEEN: dict[str, int] = {"requests": 0}
SEEN_LOCK = threading.Lock()


# ----------------------------------------------------------------------------- the oracle


def _unwrap(value):
    if isinstance(value, list):
        return value[0] if len(value) == 1 else _MANY
    return value


_MANY = object()


def faults(user: str, options: dict) -> set[int]:
    """The status a request with these ``user_options`` gets for its own fault, as a set (empty: none).

    The checks come in the hub's order: a value of a kept key over 4096 characters as JSON
    (docs/api.md, "Keys of user_options"), KubeSpawner's profile, then the offering's
    form, whether it is offered to the user, the count, and the offering's time window.
    """
    if any(len(json.dumps(v)) > MAX_VALUE_CHARS for k, v in options.items() if k in KNOWN_KEYS - {"gpuspawner"}):
        return {400}
    profile = options.get("profile")
    if profile not in (None, ""):
        if not isinstance(profile, str) or profile not in PROFILES:
            return {400}
        for name, choices in PROFILES[profile].items():
            unlisted, choice = options.get(f"{name}--unlisted-choice"), options.get(name)
            if unlisted not in (None, ""):
                return {400}  # not enabled on this hub
            if choice not in (None, "") and not (isinstance(choice, str) and choice in choices):
                return {400}
    slug = _unwrap(options.get("offering", "cpu"))
    if not isinstance(slug, str) or not SLUG.match(slug):
        return {400}
    allowed = policy(user)
    if slug not in allowed:
        return {403}
    if "count" in options:
        count = _unwrap(options["count"])
        if isinstance(count, str) and re.fullmatch(r"[0-9]{1,3}", count.strip(" \t\r\n")):
            count = int(count.strip(" \t\r\n"))
        if isinstance(count, bool) or not isinstance(count, int) or count not in allowed[slug].counts:
            return {400}
    if slug == CLOSED:
        return {403}
    return set()


def form_options(fields: list[tuple[str, str]]) -> dict:
    """What the spawn form's fields mean as ``user_options`` (for the oracle)."""
    values: dict[str, list[str]] = {}
    for name, value in fields:
        values.setdefault(name, []).append(value)
    options: dict = {}
    if "offering" in values:
        options["offering"] = _listed(values["offering"])
        slug = options["offering"]
        key = f"count-{slug}" if isinstance(slug, str) else None
        if key and key in values:
            options["count"] = _listed(values[key])
        elif "count" in values:
            options["count"] = _listed(values["count"])
    profile = values.get("profile", [None])[0]
    if profile:
        options["profile"] = profile
        prefix = f"profile-option-{profile}--"
        for name, vals in values.items():
            if name.startswith(prefix):
                options[name[len(prefix) :]] = vals[0]
    return options


def _listed(values: list[str]):
    return values[0] if len(values) == 1 else values


# ----------------------------------------------------------------------------- the generators

slugs = st.sampled_from(
    [
        "cpu",
        "shared-tesla-t4-time-slicing-4x",
        "mig-nvidia-a100-sxm4-40gb-1g-5gb",
        "mig-nvidia-a100-sxm4-40gb-3g-20gb",
        "gpu-nvidia-h100-80gb-hbm3",
        CLOSED,
        *NOBODYS,
    ]
)
unknown_slugs = st.from_regex(SLUG, fullmatch=True).filter(lambda s: len(s) < 40)
odd_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["CPU", "Cpu", " cpu", "cpu ", "<script>alert(1)</script>", "gpü", "", "-cpu", "cpu-", "1e9", "%s%n", "../etc"]),
    st.builds(lambda n: "a" * n, st.integers(64, 300_000)),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**60), 10**60), st.floats(allow_nan=False, allow_infinity=False), odd_text)
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12
)
# (Hypothesis leans towards each strategy's first, simplest values: refusals first, not starts.)
offerings = st.one_of(json_values, unknown_slugs, slugs, st.lists(slugs, min_size=0, max_size=3))
counts = st.one_of(
    st.sampled_from([1, 2, 4, 3, 8, 0, -1]),
    st.sampled_from(["1", "2", " 4", "4 ", "02", "1e9", "1.0"]),
    json_values,
    st.lists(st.sampled_from([1, 2, "1"]), max_size=2),
)
junk_keys = st.dictionaries(st.text(min_size=1, max_size=20).filter(lambda k: k not in KNOWN_KEYS | BODY_KEYS), json_values, max_size=3)


@st.composite
def api_options(draw) -> dict:
    options: dict = {}
    if draw(st.integers(0, 7)) != 7:  # mostly: without one, the default (No GPU) is a valid start
        options["offering"] = draw(offerings)
    if draw(st.integers(0, 3)) == 0:
        options["count"] = draw(counts)
    profile = draw(st.sampled_from([None, None, None, "python", "pytorch", "nope"]) | json_values)
    if profile is not None:
        options["profile"] = profile
        if draw(st.booleans()):
            options["image"] = draw(st.sampled_from(["cuda12", "cpu", "cuda99"]) | json_values)
        if draw(st.integers(0, 5)) == 0:
            options["image--unlisted-choice"] = draw(st.sampled_from(["my/image:1"]) | json_values)
    if draw(st.integers(0, 2)) == 0:
        options.update(draw(junk_keys))
    if draw(st.integers(0, 9)) == 0:
        options["gpuspawner"] = {"offering": "gpu-nvidia-h100-80gb-hbm3", "count": 8, "pod": "forged"}
    return options


#: What a browser can send in a form field (no lone surrogates).
form_chars = st.characters(blacklist_categories=("Cs",))
form_text = st.one_of(st.sampled_from(["1", "2", "4", "8", "0", "-1", "x", ""]), st.text(form_chars, max_size=20))
field_names = st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="-_"), min_size=1, max_size=12)


@st.composite
def form_fields(draw) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 0]))):  # mostly one value; several are refused, none is No GPU
        fields.append(("offering", draw(st.text(form_chars, max_size=30) | unknown_slugs | slugs)))
    if fields and draw(st.booleans()):
        fields.append((f"count-{fields[0][1]}", draw(form_text)))
    if draw(st.integers(0, 3)) == 0:
        fields.append(("count", draw(form_text)))
    if draw(st.integers(0, 2)) == 0:
        profile = draw(st.sampled_from(["python", "pytorch", "nope", ""]))
        fields.append(("profile", profile))
        if draw(st.booleans()):
            fields.append((f"profile-option-{profile}--image", draw(st.sampled_from(["cuda12", "cpu", "cuda99", ""]))))
    if draw(st.booleans()):
        fields.append((draw(field_names), draw(st.text(form_chars, max_size=50))))
    return fields


@dataclass
class Request:
    role: str  # student or researcher
    channel: str  # api, api-named, put-post, form
    options: dict
    fields: list[tuple[str, str]]
    wrapped: bool = False  # the body is {"user_options": ...} (else the options themselves, JupyterHub's older form)
    user: str = ""  # an idle user of the role, given when the batch runs

    @property
    def server(self) -> str:
        return "fz" if self.channel in ("api-named", "put-post") else ""

    def expected_faults(self) -> set[int]:
        if self.refused_by_tornado:
            return {400}
        return faults(self.user, form_options(self.fields) if self.channel == "form" else self.options)

    @property
    def refused_by_tornado(self) -> bool:
        """A form field name with a control character (``count-<slug>`` of a hand-made slug) makes the
        multipart body invalid: tornado answers 400 itself, before the hub or gpuspawner see it."""
        return any(unicodedata.category(c) == "Cc" and c not in "\t\r\n" for name, _ in self.fields for c in name)

    def send(self, hub: GPUHub) -> Answer:
        if self.channel == "form":
            return hub.form_post(self.user, self.fields)
        if self.channel == "put-post":
            created = hub.api("PUT", hub.server_path(self.user, self.server), {"user_options": self.options})
            if created.status == 400:  # a value over the bound: refused, nothing stored (docs/api.md)
                return created
            assert created.status == 201, created
            return hub.api("POST", hub.server_path(self.user, self.server))
        # An empty body means "the options stored last time" to JupyterHub: an empty choice is sent wrapped.
        body = {"user_options": self.options} if self.wrapped or not self.options else self.options
        return hub.api("POST", hub.server_path(self.user, self.server), body)


@st.composite
def batches(draw) -> list[Request]:
    out = []
    for _ in range(draw(st.integers(max(1, BATCH // 2), BATCH))):  # at least half: MIN_REQUESTS stays reachable
        role = draw(st.sampled_from(["student", "researcher"]))
        channel = draw(st.sampled_from(["api", "api", "api-named", "put-post", "form", "form"]))
        options = draw(api_options()) if channel != "form" else {}
        fields = draw(form_fields()) if channel == "form" else []
        out.append(Request(role, channel, options, fields, wrapped=draw(st.booleans())))
    return out


# ----------------------------------------------------------------------------- the test


class Users:
    """Idle users by role; a used one is stopped in the background and comes back when its server is gone."""

    def __init__(self, hub: GPUHub):
        self.hub = hub
        self.idle = {role: queue.Queue() for role in POOL}
        for role, names in POOL.items():
            for name in names:
                self.idle[role].put(name)
        self.cleaner = ThreadPoolExecutor(max_workers=4 * WORKERS)  # a start that went on takes ~25 s to end
        self.errors: list[BaseException] = []

    def take(self, role: str) -> str:
        return self.idle[role].get(timeout=300)

    def give_back(self, role: str, user: str, server: str, started: bool) -> None:
        """Back to the pool once its server is gone: at once after a refusal, in the background after a start."""

        def stop() -> None:
            try:
                # A start that went on ends by itself after http_timeout: ask now and then, not in a loop.
                self.hub.stop_server(user, server, interval=2.0 if started else 0.3)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
            finally:
                self.idle[role].put(user)

        if started:
            self.cleaner.submit(stop)
        else:
            stop()


@pytest.fixture(scope="module")
def fuzz_hub(devcluster, hub_namespace, tmp_path_factory):
    # A refusal comes back within a few seconds even on a loaded machine (16 requests in flight); a
    # start that goes on answers 202 after 10 s, and ends (no notebook answers) 15 s after its pod runs.
    hub = GPUHub(tmp_path_factory.mktemp("fuzzhub"), devcluster, hub_namespace, slow_spawn_timeout=10.0, http_timeout=15.0)
    try:
        yield hub.start()
    finally:
        hub.stop()


def check(hub: GPUHub, request: Request, answer: Answer) -> None:
    expected = request.expected_faults()
    where = f"{request}\n-> {answer.status} {answer.message!r}"
    assert answer.status < 500, where + "\n" + hub.log_tail()
    late = {302} if request.channel == "form" else {201, 202}
    if expected and answer.status in late:
        # JupyterHub answers 202 (the form: a redirect to the spawn-pending page) when a start
        # takes longer than slow_spawn_timeout (the form: 1 s), which a refusal at start may on
        # a loaded machine; it then reaches the spawn-pending page's event stream instead. The
        # REST API answers 201 when, after that timeout, the spawn is no longer pending
        # (apihandlers/users.py: `202 if spawner.pending == 'spawn' else 201`): a start refused
        # in between gets 201 too. Either way the refusal must be what the server's progress
        # stream ends with, and no pod may be left.
        result = hub.spawn_result(request.user, request.server)
        own = "\n".join(line for line in hub.log_text().splitlines() if request.user and request.user in line)
        assert result.get("failed") and result["message"].startswith("Spawn failed: "), (where, result, own[-3000:])
        answer.message = result["message"][len("Spawn failed: ") :]
        with SEEN_LOCK:
            SEEN["refusals answered late (then failed)"] = SEEN.get("refusals answered late (then failed)", 0) + 1
    elif expected:
        assert answer.status in expected, where
    else:
        assert answer.status in STARTED | STATE_REFUSALS, where
    if (answer.status >= 400 or expected) and not request.refused_by_tornado:
        assert answer.message and "<" not in answer.message and len(answer.message) < 600, where


def sent(hub: GPUHub, request: Request) -> Answer:
    try:
        return request.send(hub)
    except Exception as exc:
        raise AssertionError(f"{request}: {type(exc).__name__}: {exc}\n{hub.log_tail()}") from exc


def test_fuzz_spawn_requests(fuzz_hub):
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    users = Users(fuzz_hub)

    def handle(request: Request) -> None:
        request = replace(request, user=users.take(request.role))
        answer = None
        try:
            answer = sent(fuzz_hub, request)
            with SEEN_LOCK:
                SEEN["requests"] += 1
                SEEN[str(answer.status)] = SEEN.get(str(answer.status), 0) + 1
            check(fuzz_hub, request, answer)
            for pod in fuzz_hub.pods(request.user):
                assert not pod_problems(pod, request.user), (request, pod_problems(pod, request.user))
            stored = fuzz_hub.user_model(request.user)["servers"].get(request.server, {}).get("user_options") or {}
            assert set(stored) <= KNOWN_KEYS, (request, sorted(stored))
        finally:
            users.give_back(request.role, request.user, request.server, started=answer is None or answer.status in STARTED)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )
    @given(batch=batches())
    def run(batch: list[Request]) -> None:
        list(pool.map(handle, batch))
        for pod in fuzz_hub.pods():  # everyone's, also of servers being stopped
            user = pod["metadata"]["labels"]["hub.jupyter.org/username"]
            assert not pod_problems(pod, user), (user, pod_problems(pod, user))

    started = time.monotonic()
    try:
        run()
    finally:
        pool.shutdown(cancel_futures=True)
        users.cleaner.shutdown(wait=True)
        took = time.monotonic() - started
        print(
            f"\nfuzz: {SEEN['requests']} requests in {took:.0f}s; statuses: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(SEEN.items()) if k != "requests")
        )
    assert not users.errors, users.errors[:3]
    log = fuzz_hub.log_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 :][:6000]
    assert not re.search(r"\] 500 ", log), [line for line in log.splitlines() if "] 500 " in line][:5]
    assert SEEN["requests"] >= MIN_REQUESTS
