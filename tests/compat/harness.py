"""What the compatibility suite compares: a site's KubeSpawner config, spawners of both
classes made from it, and what a spawn leaves behind (user_options, the pod manifest,
the saved state) flattened to ``path -> value`` so two spawns compare field by field.

The expectations come from KubeSpawner 7.1's own documentation (its trait help texts
and docstrings): profile_list with kubespawner_override, profile_options and unlisted
choices, slugs generated from display names, ``{username}``-style expansion, the
``profile-option-<profile>--<option>`` form fields, state kept across hub restarts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from jupyterhub import orm
from jupyterhub.objects import Hub, Server
from traitlets.config import Config

from gpuspawner.pod.memguard import GUARD_ENV

#: KubeSpawner settings of a plausible zero-to-jupyterhub site (no GPU anywhere).
SITE: dict[str, Any] = {
    "image": "quay.io/jupyter/base-notebook:2025-11-17",
    "cpu_limit": 2.0,
    "mem_limit": "2G",
    "mem_guarantee": "1G",
    "start_timeout": 60,
    "environment": {
        "SITE": "example",
        "WHO": "{username}",
        "RAW_WHO": "{unescaped_username}",
        "SERVER": "{servername}",
        "USER_SERVER": "{user_server}",
    },
    "extra_labels": {"team-member": "{username}"},
    "extra_annotations": {"example.org/owner": "{unescaped_username}"},
    "node_selector": {"pool": "users"},
    "tolerations": [{"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"}],
    "volumes": [{"name": "scratch", "emptyDir": {}}],
    "volume_mounts": [{"name": "scratch", "mountPath": "/scratch/{username}"}],
    "pod_name_template": "jupyter-{user_server}",
}

OTHER_IMAGE = "quay.io/example/custom-notebook:1.0"

#: A profile_list using every documented feature: a default, a slug generated from
#: display_name, dict overrides merged into the site's, profile_options with a default
#: choice and an unlisted choice checked by a regex, and a callable override.
PROFILE_LIST: list[dict[str, Any]] = [
    {
        "display_name": "Small",
        "slug": "small",
        "description": "1 CPU",
        "kubespawner_override": {"cpu_limit": 1.0, "mem_limit": "1G"},
    },
    {
        "display_name": "Data Science Large",  # slug generated: data-science-large
        "default": True,
        "kubespawner_override": {
            "environment": {"SIZE": "large"},
            "extra_labels": {"size": "large"},
            "node_selector": {"pool": "large"},
        },
        "profile_options": {
            "image": {
                "display_name": "Image",
                "choices": {
                    "scipy": {"display_name": "SciPy", "kubespawner_override": {"image": "quay.io/jupyter/scipy-notebook:2025-11-17"}},
                    "r": {"display_name": "R", "default": True, "kubespawner_override": {"image": "quay.io/jupyter/r-notebook:2025-11-17"}},
                },
                "unlisted_choice": {
                    "enabled": True,
                    "display_name": "Other image",
                    "validation_regex": r"^quay\.io/[a-z0-9./-]+:[A-Za-z0-9.-]+$",
                    "kubespawner_override": {"image": "{value}"},
                },
            },
            "cpus": {
                "display_name": "CPUs",
                "choices": {
                    "2": {"display_name": "2", "kubespawner_override": {"cpu_limit": 2.0}},
                    "4": {"display_name": "4", "kubespawner_override": {"cpu_limit": 4.0}},
                },
            },
        },
    },
    {
        "display_name": "Per-user",
        "slug": "per-user",
        "kubespawner_override": {"environment": lambda spawner: {"HOME_OF": spawner.user.name}},
    },
]

#: GPUSpawner settings that turn GPU offerings off: nothing configured, no discovery.
GPU_OFF: dict[str, Any] = {"discover_offerings": False}

#: A configured GPU offering that needs no free counts (a remote GPU through a wrapper
#: command), so that GPU offerings are in play without a cluster to count on.
REMOTE_GPU: dict[str, Any] = {
    "slug": "remote-half",
    "kind": "custom",
    "display_name": "Half a remote GPU",
    "command_prefix": ["bitfusion", "run", "-n", "1", "-p", "0.5", "--"],
    "env": {"BITFUSION_SITE": "lab"},
    "labels": {"example.org/gpu-path": "remote"},
    "annotations": {"example.org/gpu-note": "remote half"},
    "node_selector": {"bitfusion-client": "true"},
    "tolerations": [{"key": "bitfusion", "operator": "Exists", "effect": "NoSchedule"}],
}
GPU_ON_OFFLINE: dict[str, Any] = {"discover_offerings": False, "offerings": [REMOTE_GPU]}

#: On every GPUSpawner pod, GPU offerings in play or not (docs/kubespawner-compat.md): whose it is.
#: These spawners have no hub database, so no derived identity: the user's key is all they add.
WHOSE = "pod.metadata.annotations[gpuspawner.io/hub-user]"
#: ... and which start made it (a random value per start, for a creation retried after a lost answer).
SPAWN = "pod.metadata.annotations[gpuspawner.io/spawn]"
#: What every GPUSpawner pod carries beyond KubeSpawner's where no GPU offering is in play.
#: ... and that Karpenter's consolidation may not evict it (``block_node_disruption``).
NO_DISRUPT = "pod.metadata.annotations[karpenter.sh/do-not-disrupt]"
STAMPS = sorted([SPAWN, WHOSE, NO_DISRUPT])

#: What GPUSpawner adds to a spawn when GPU offerings are in play, each with its reason.
#: docs/kubespawner-compat.md lists the same patterns (checked by test_docs_list_the_differences).
#: ``<...>`` stands for each key the chosen offering sets (resources, its env, labels, ...).
DOCUMENTED_DIFFERENCES: dict[str, str] = {
    "user_options.offering": "the chosen offering's slug: the REST API and the next spawn's preselection read it",
    "user_options.count": "how many units were chosen (1 unless a whole-GPU offering allows more)",
    "user_options.gpuspawner": "the server's GPU record (offering, kind, count, resources, pod, url) for the GPU culler and admins",
    "state.gpuspawner": "the same record, so a restarted hub still knows what a running server holds: at its first quota check the hub gives each running server's record back to the quota ledger (its kind and count, also a DRA server's devices, a pod not bound yet, and every server where the hub may not read the cluster), and windows read it",
    "state.gpu_usage": "the server's GPU-hour ledger (each start and stop with its cost per hour), kept after it stops and across hub restarts: GPU-hour budgets count from it when Prometheus cannot be asked ([fair-turns.md](fair-turns.md#gpu-hour-budgets))",
    "pod.spec.containers[notebook].env[GPUSPAWNER_BUDGET_*]": "only where the user has a GPU-hour budget: the figures measured at spawn, from which the notebook's GPU view shows the running total",
    "pod.spec.containers[notebook].env[GPUSPAWNER_COST_BUDGET_*]": "only where the user has a cost budget: the same figures in the site's money",
    "pod.metadata.labels[gpuspawner.io/offering]": "lets the inventory count GPU pods by offering and the orphan reconciler find them",
    "pod.metadata.labels[gpuspawner.io/kind]": "the offering's kind, for the same readers and for dashboards",
    "pod.metadata.labels[gpuspawner.io/hub]": "this hub's identity (`c.GPUSpawner.hub_id`, derived and kept in the hub's database where not set), on every pod, GPU offerings in play or not: the orphan reconciler, the quotas' count of bound pods and the shared DRA claims select on it, and no spawn deletes a pod of another identity, so hubs on one cluster never count or delete each other's pods",
    "pod.metadata.annotations[gpuspawner.io/hub-user]": "whose server it is in the hub's database, `<user id>/<user's creation time>`, on every pod: the orphan reconciler follows a renamed user's pods and leaves alone a pod whose user its database does not have, and a spawn replaces only its own server's leftover pod",
    "pod.metadata.annotations[gpuspawner.io/spawn]": "the start that made the pod (a random value per start): a creation whose answer never came (a slow API server) is tried again, and a pod of that name with this start's value is the one the lost answer made, taken as made instead of deleted and made again; on every pod",
    "pod.metadata.annotations[karpenter.sh/do-not-disrupt]": "Karpenter's consolidation never evicts a running notebook (its kernels' memory would be lost) to pack or remove its node; drift waits too unless the NodeClaim has a terminationGracePeriod: the culler, which never stops a busy notebook, frees the node. On every pod, GPU offerings in play or not; `c.GPUSpawner.block_node_disruption = False` leaves it off, a value in `extra_annotations` wins ([autoscaling.md](autoscaling.md#disruption))",
    "pod.spec.containers[notebook].env[GPUSPAWNER_OFFERING]": "tells the notebook what it got",
    "pod.spec.containers[notebook].env[GPUSPAWNER_KIND]": "tells the notebook what kind of GPU access it got",
    "pod.spec.containers[notebook].env[GPUSPAWNER_GPU_COUNT]": "the number of GPUs or units, for offerings with a GPU resource",
    "pod.spec.containers[notebook].env[GPUSPAWNER_DISPLAY_NAME]": "the offering's name as the spawn page shows it, for the notebook's GPU view",
    "pod.spec.containers[notebook].env[GPUSPAWNER_OFFERING_WORDS]": "the spawn page's line about the offering (memory, compute, isolation), for the notebook's GPU view",
    "pod.spec.containers[notebook].resources.limits[<resource>]": "the offering's extended resources: the device plugin hands out the GPU",
    "pod.spec.containers[notebook].resources.requests[<resource>]": "Kubernetes needs requests equal to limits for extended resources",
    "pod.spec.nodeSelector[<node_selector>]": "the offering's node class (GPU product, MIG profile, vGPU class)",
    "pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.*": "labels the node must not carry (absent_labels)",
    "pod.spec.tolerations[*]": "the offering's tolerations for tainted GPU nodes",
    "pod.spec.containers[notebook].args[*]": "the memory guard's shell (the hook first on PYTHONPATH) and the offering's command_prefix go before the notebook command",
    "pod.metadata.labels[<labels>]": "the offering's own labels, as the admin configured them",
    "pod.metadata.annotations[<annotations>]": "the offering's own annotations, as the admin configured them",
    "pod.spec.containers[notebook].env[<env>]": "the offering's own env, as the admin configured it",
    "pod.spec.containers[notebook].env[<memory guard>]": "the memory guard's limits for the frameworks (docs/memory-guard.md)",
    "pod.metadata.annotations[gpuspawner.io/memguard-hook]": "the memory guard's start-up hook, which the volume below projects as a file",
    "pod.spec.volumes[gpuspawner-memguard]": "a downwardAPI volume: the hook as sitecustomize.py",
    "pod.spec.containers[notebook].volumeMounts[gpuspawner-memguard]": "the hook's directory, read-only, which the shell in args puts first on PYTHONPATH",
}


class Group:
    def __init__(self, name: str, users: Iterable[Any] = ()):
        self.name = name
        self.users = list(users)


class User:
    """The parts of JupyterHub's User a spawner reads. ``groups`` is stored as given
    (JupyterHub's own is a list of Group objects)."""

    _MISSING = object()

    def __init__(self, name: str, groups: Any = _MISSING, admin: bool = False):
        self.name = name
        self.escaped_name = name
        self.id = 1000 + sum(map(ord, name)) % 1000
        self.url = f"/user/{name}/"
        self.admin = admin
        if groups is not User._MISSING:
            self.groups = groups


def site_config(gpu: Mapping[str, Any] | None = None, profile_list: Any = PROFILE_LIST, **kube: Any) -> Config:
    """The site's KubeSpawner config (read by both classes) plus GPUSpawner's own settings."""
    config = Config()
    for key, value in {**SITE, "profile_list": profile_list, **kube}.items():
        setattr(config.KubeSpawner, key, value)
    for key, value in (gpu or {}).items():
        setattr(config.GPUSpawner, key, value)
    return config


def make_spawner(cls: type, config: Config, user: User | str = "alice", name: str = "", server: bool = True, **traits: Any):
    """A spawner as JupyterHub makes one for ``user``'s server ``name`` (with the hub's own
    database objects, not stored): with its Server object, which JupyterHub sets before
    start, unless ``server`` is False."""
    user = User(user) if isinstance(user, str) else user
    row = orm.Spawner(name=name, display_name=name)
    hub = Hub(ip="127.0.0.1", port=8081, base_url="/hub/")  # Hub() alone picks a random port
    spawner = cls(hub=hub, user=user, orm_spawner=row, config=config, user_options={}, **traits)
    if server:
        spawner.server = Server(
            orm_server=orm.Server(
                proto="http", ip="", port=0, cookie_name="jupyterhub-user", base_url=f"{user.url}{name}/" if name else user.url
            )
        )
    return spawner


def manifest_dict(spawner: Any, pod: Any) -> dict[str, Any]:
    """A V1Pod (or the API server's JSON) as plain JSON data."""
    return spawner.api.api_client.sanitize_for_serialization(pod) if not isinstance(pod, dict) else pod


def _key(name: str) -> str:
    return f"[{name}]" if re.search(r"[./]", name) or not name.isidentifier() else f".{name}"


def flatten(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``path -> leaf value``. Lists of named items (containers, env, volumes, ports ...)
    are keyed by name, so an added env var is one new path, not a shift of all others."""
    if isinstance(value, Mapping):
        if not value:
            yield path, {}
        for key, item in value.items():
            if path.endswith((".env", ".labels", ".annotations", ".nodeSelector", ".limits", ".requests")):
                sub = f"{path}[{key}]"
            else:
                sub = f"{path}{_key(str(key))}"
            yield from flatten(item, sub)
    elif isinstance(value, list):
        if not value:
            yield path, []
        named = all(isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in value)
        for index, item in enumerate(value):
            if named:
                rest = {k: v for k, v in item.items() if k != "name"}
                yield from flatten(rest or {"name": item["name"]}, f"{path}[{item['name']}]")
            else:
                yield from flatten(item, f"{path}[{index}]")
    else:
        yield path, value


def flat(prefix: str, value: Any) -> dict[str, Any]:
    return dict(flatten(value, prefix))


def differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The paths at which two flattened outcomes differ (present in one only, or unequal).
    An empty dict or list on one side where the other has entries is told by those entries."""

    def filled(outcome: Mapping[str, Any], path: str) -> bool:
        return any(k.startswith((f"{path}.", f"{path}[")) for k in outcome)

    out = []
    for path in set(a) | set(b):
        left, right = a.get(path, _ABSENT), b.get(path, _ABSENT)
        if left == right or (left in ({}, []) and filled(b, path)) or (right in ({}, []) and filled(a, path)):
            continue
        out.append(path)
    return sorted(out)


_ABSENT = object()


def _pattern(text: str) -> re.Pattern:
    return re.compile("^" + re.escape(text).replace(r"\*", ".*") + r"(\..*|\[.*)?$")


def allowed_patterns(offering: Mapping[str, Any]) -> list[re.Pattern]:
    """DOCUMENTED_DIFFERENCES made concrete for one chosen offering (its config dict)."""
    fills = {
        "<resource>": list(offering.get("resources") or {}),
        "<node_selector>": list(offering.get("node_selector") or {}),
        "<labels>": list(offering.get("labels") or {}),
        "<annotations>": list(offering.get("annotations") or {}),
        "<env>": list(offering.get("env") or {}),
        "<memory guard>": list(GUARD_ENV),
    }
    out = []
    for item in DOCUMENTED_DIFFERENCES:
        holes = [h for h in fills if h in item]
        if not holes:
            out.append(_pattern(item))
        for hole in holes:
            out.extend(_pattern(item.replace(hole, key)) for key in fills[hole])
    return out


def undocumented(paths: Iterable[str], offering: Mapping[str, Any]) -> list[str]:
    """The paths no documented difference explains."""
    patterns = allowed_patterns(offering)
    return [p for p in paths if not any(r.match(p) for r in patterns)]
