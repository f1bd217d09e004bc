"""The admin's offerings: ``c.GPUSpawner.offerings`` entries -> :class:`~gpuspawner.core.model.Offering`. Pure.

:func:`offering_from_config` reads an entry; the reference for every field is below (docs/config.md
points here); each error names the entry and the field that is wrong, and what to write
instead. ``c.GPUSpawner.offering_overrides`` is read by :mod:`gpuspawner.offerings.overrides` with
the same field reader.

The fields of an entry
----------------------

Every entry has ``slug`` (lower-case, digits, '-') and ``kind``; the rest is optional.

What the user sees:
  display_name, description   text (shown as text: markup is escaped)
  memory_mib, compute_share   e.g. 20480, "3/7 of the GPU's compute" (MIG fills both in, the memory
                              from NVIDIA's table of MIG profiles; a whole GPU's memory is what its
                              product's name says, e.g. "NVIDIA-H100-80GB-HBM3")
  isolation                   exclusive | hardware | partial | none | vm | site | no-gpu

What the pod gets (kind shortcuts fill these in; explicit values win):
  resources                   {"nvidia.com/gpu": 1} per unit; limits = requests
  counts                      whole GPUs only: the counts a user may pick, e.g. [1, 2, 4]
  node_selector               {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
  absent_labels               labels a node must NOT have, e.g. ["cloud.google.com/gke-gpu-partition-size"]
  tolerations                 replaces the default nvidia.com/gpu Exists/NoSchedule toleration
  extra_tolerations           added to it (AKS: sku=gpu, some sites: node-role.kubernetes.io/gpu)
  env, labels, annotations    added to the pod (never NVIDIA_VISIBLE_DEVICES: the device plugin's job)
  command_prefix              wraps the server command, e.g. ["bitfusion", "run", "-n", "1", "-p", "0.5", "--"]
  memory_guard                false | true | {"fraction": 0.25, "user_env": false}: the cooperative
                              memory limits frameworks honour (docs/memory-guard.md); default:
                              on for the kinds in c.GPUSpawner.memory_guard_kinds, sized from the share

Kind shortcuts:
  full     product -> nvidia.com/gpu on nodes of that product; never on time-sliced, MPS, MIG
           or vGPU nodes (node affinity keeps them out, also without a product)
  mig      profile ("3g.20gb", "1g.10gb+me"); mig_strategy mixed (default) | single (needs product) | gke
  shared   sharing time-slicing | mps; replicas; rename_by_default (true: nvidia.com/gpu.shared;
           false: nvidia.com/gpu on "<product>-SHARED" nodes, needs product)
  vgpu     node_selector naming the vGPU node class (or product)
  custom   resources and/or command_prefix
  cpu      nothing

Who and when:
  groups, users               only these may take it (admins always may); empty: everyone
  hidden                      not shown on the spawn page
  windows                     ["Mon-Fri 19:00-07:00", "Sat,Sun 00:00-24:00"] in c.GPUSpawner.site_timezone
  admission                   block | warn | queue when none is free (default: c.GPUSpawner.admission)
  queue_timeout               seconds a queued spawn waits
  scalable_nodes, scale_up_minutes   an autoscaled pool: never refused, "a new node starts for you, about M min"
  gpu_hour_cost               what one hour of one unit costs against a GPU-hour budget
                              (c.GPUSpawner.user_gpu_budget, docs/fair-turns.md), e.g. 2 for an H100,
                              0.25 for a T4 share; default 1 per GPU unit held (0 for kind cpu)
  price_per_hour              what one unit costs per hour, in the site's money (a number >= 0),
                              shown on the card: "5.00 per hour" (Karpenter's prices are not readable)

Dynamic Resource Allocation (kinds full, mig, shared; instead of resources and node_selector):
  dra                         {"device_class": "gpu.nvidia.com" (mig.nvidia.com for mig),
                               "selector": CEL over device.attributes / device.capacity (or a list),
                               "match_attributes": ["gpu.nvidia.com/productName"],
                               "interval": Default | Short | Medium | Long (time-slicing),
                               "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
                               "alternatives": [{"profile": "2g.10gb"}, {"selector": ..., "label": ...}],
                               "memory": "8Gi" (kind shared: a GPU-memory share, capacity.requests.memory),
                               "tolerations": [the claim's device tolerations, e.g. {"key": "k", "operator": "Exists", "effect": "NoExecute"}]}
                              product and profile add selectors on productName and profile; a shared
                              offering needs replicas (pods per device) and sharing (time-slicing | mps),
                              except a memory share (dra.memory), which needs neither;
                              alternatives: the choices tried after the entry's own (firstAvailable)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpuspawner.core.cel import SelectorError, compile_selector
from gpuspawner.core.model import (
    DEFAULT_GPU_TOLERATION,
    MAX_ALTERNATIVES,
    SLUG_RE,
    DeviceAlternative,
    DeviceClaim,
    Offering,
    subrequest_name,
)
from gpuspawner.core.nodeclass import (
    GKE_ACCELERATOR_LABEL,
    GKE_PARTITION_LABEL,
    mig_profile_parts,
    mig_resource_name,
    whole_gpu_terms,
)
from gpuspawner.core.products import gpu_memory_mib
from gpuspawner.core.quantity import QuantityError, parse_quantity
from gpuspawner.core.windows import parse_window
from gpuspawner.core.wording import mig_compute_phrase, share_phrase
from gpuspawner.names import dranames as dn
from gpuspawner.names.nvidia import GPU, GPU_SHARED, PRODUCT_LABEL
from gpuspawner.names.vocabulary import AdmissionPolicy, Isolation, Kind
from gpuspawner.offerings.entry import Entry, OfferingConfigError, as_list

LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


_COMMON_FIELDS = {
    "slug",
    "kind",
    "display_name",
    "description",
    "resources",
    "counts",
    "node_selector",
    "tolerations",
    "extra_tolerations",
    "env",
    "labels",
    "annotations",
    "command_prefix",
    "product",
    "memory_mib",
    "compute_share",
    "isolation",
    "groups",
    "users",
    "hidden",
    "admission",
    "queue_timeout",
    "gpu_hour_cost",
    "price_per_hour",
    "scalable_nodes",
    "scale_up_minutes",
    "windows",
    "absent_labels",
    "dra",
    "memory_guard",
}
_KIND_FIELDS = {
    Kind.CPU: set(),
    Kind.FULL: set(),
    Kind.MIG: {"profile", "mig_strategy"},
    Kind.SHARED: {"sharing", "replicas", "rename_by_default"},
    Kind.VGPU: set(),
    Kind.CUSTOM: set(),
}
_DEFAULT_ISOLATION = {
    Kind.CPU: Isolation.NO_GPU,
    Kind.FULL: Isolation.EXCLUSIVE,
    Kind.MIG: Isolation.HARDWARE,
    Kind.VGPU: Isolation.VM,
    Kind.CUSTOM: Isolation.SITE,
}


def offering_from_config(raw: Any, index: int, vgpu_class_labels: Iterable[str] = ("vgpu.type",)) -> Offering:
    """Validate one entry of ``c.GPUSpawner.offerings`` and build its :class:`Offering`.

    Every entry has ``slug`` (lower-case, digits, '-') and ``kind``; the fields are this
    module's reference (its docstring, "The fields of an entry")."""
    label = raw.get("slug") if isinstance(raw, Mapping) else None
    where = f"c.GPUSpawner.offerings[{index}]" + (f" (slug {label!r})" if isinstance(label, str) else "")
    entry = Entry(raw, where)
    slug = entry.text("slug", required=True)
    if not SLUG_RE.match(slug):
        raise entry.fail("slug", f"must be lower-case letters, digits and '-', at most 63 characters, got {slug!r}")
    kind_value = entry.text("kind", required=True)
    try:
        kind = Kind(kind_value)
    except ValueError:
        raise entry.fail("kind", f"must be one of {[k.value for k in Kind]}, got {kind_value!r}") from None
    known = _COMMON_FIELDS | _KIND_FIELDS[kind]
    for name in raw:
        if name not in known:
            near = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; fields for kind {kind.value!r} are {sorted(known)}"
            raise OfferingConfigError(f"{where}: unknown field {name!r}{hint}")

    if "dra" in raw and kind not in _DRA_KINDS:
        raise entry.fail("dra", f"applies to kinds {[k.value for k in _DRA_KINDS]} only, not {kind.value!r}")
    product = entry.text("product")
    resources, selector, counts, tolerations, isolation, claim, fields = _placement(entry, kind, product)
    memory = raw.get("memory_mib")
    if memory is not None:
        memory = entry.positive_int("memory_mib")
    command_prefix = entry.str_list("command_prefix")
    scaling = admission_fields(entry)
    return Offering(
        slug=slug,
        kind=kind,
        display_name=entry.text("display_name", default=slug),
        description=entry.text("description", default="") or "",
        resources=resources,
        counts=tuple(sorted(set(counts))),
        node_selector=selector,
        absent_labels=entry.str_list("absent_labels"),
        node_affinity=whole_gpu_terms(vgpu_class_labels) if kind is Kind.FULL and claim is None else (),
        claim=claim,
        tolerations=tolerations,
        env=entry.str_map("env"),
        labels=entry.str_map("labels"),
        annotations=entry.str_map("annotations"),
        command_prefix=command_prefix,
        product=product,
        memory_mib=memory if memory is not None else fields.get("memory_mib"),
        compute_share=entry.text("compute_share", default=fields.get("compute_share", "")) or "",
        isolation=isolation,
        groups=entry.str_list("groups"),
        users=entry.str_list("users"),
        hidden=entry.flag("hidden", False),
        replicas=fields.get("replicas"),
        sharing=fields.get("sharing", ""),
        memory_guard=entry.memory_guard(),
        source="config",
        **scaling,
    )


_DRA_FIELDS = {"device_class", "selector", "match_attributes", "interval", "mps", "alternatives", "memory", "tolerations"}
_ALTERNATIVE_FIELDS = {"device_class", "selector", "profile", "product", "label"}
MIB = 1024 * 1024
_DEVICE_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_DRA_KINDS = (Kind.FULL, Kind.MIG, Kind.SHARED)


def dra_claim(entry: Entry, kind: Kind, product: str | None) -> DeviceClaim:
    """An entry's ``dra`` field -> the :class:`DeviceClaim` its pods ask for; every CEL selector compiled now."""
    raw = entry.raw["dra"]
    if not isinstance(raw, Mapping) or not set(raw) <= _DRA_FIELDS:
        raise entry.fail(
            "dra",
            f"must be a dict with keys among {sorted(_DRA_FIELDS)}, got {raw!r}. Example: "
            "{'device_class': 'gpu.nvidia.com', 'selector': \"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0\"}",
        )
    default_class = dn.CLASS_MIG if kind is Kind.MIG else dn.CLASS_GPU
    device_class = raw.get("device_class", default_class)
    if not isinstance(device_class, str) or not device_class:
        raise entry.fail("dra", f"['device_class'] must be a DeviceClass name such as {default_class!r}, got {device_class!r}")
    profile = entry.text("profile", required=True) if kind is Kind.MIG and "profile" in entry.raw else None
    selectors = _selectors(entry, raw.get("selector", []), product, profile, "")
    match = raw.get("match_attributes", [])
    if not isinstance(match, (list, tuple)) or not all(isinstance(a, str) and a for a in match):
        raise entry.fail(
            "dra", f"['match_attributes'] must be a list of attribute names such as 'gpu.nvidia.com/productName', got {match!r}"
        )
    config: tuple[Mapping[str, Any], ...] = ()
    replicas = 1
    tolerations = _device_tolerations(entry, raw.get("tolerations", []))
    if "memory" in raw:
        return DeviceClaim(
            device_class, tuple(selectors), tuple(match), capacity=_memory_share(entry, kind, raw["memory"]), tolerations=tolerations
        )
    if kind is Kind.SHARED:
        replicas = entry.positive_int("replicas") if "replicas" in entry.raw else 0
        if not replicas:
            raise entry.fail(
                "replicas", "is required for a DRA shared offering: how many notebooks share one device (they share one claim)"
            )
        sharing = entry.text("sharing", default="time-slicing")
        strategy = {"time-slicing": dn.SHARING_TIME_SLICING, "mps": dn.SHARING_MPS}.get(sharing)
        if strategy is None:
            raise entry.fail("sharing", f"must be 'time-slicing' or 'mps', got {sharing!r}")
        settings: dict[str, Any] = {}
        if strategy == dn.SHARING_TIME_SLICING and "interval" in raw:
            if raw["interval"] not in dn.TIME_SLICE_INTERVALS:
                raise entry.fail("dra", f"['interval'] must be one of {list(dn.TIME_SLICE_INTERVALS)}, got {raw['interval']!r}")
            settings = {"interval": raw["interval"]}
        if "mps" in raw:
            if strategy != dn.SHARING_MPS or not isinstance(raw["mps"], Mapping):
                raise entry.fail("dra", "['mps'] is a dict of NVIDIA's mpsConfig and needs sharing 'mps'")
            settings = dict(raw["mps"])
        parameters = dn.sharing_config(strategy, settings, mig=device_class == dn.CLASS_MIG)
        config = ({"driver": dn.DRIVER, "parameters": parameters},)
    claim = DeviceClaim(device_class, tuple(selectors), tuple(match), config, replicas, tolerations=tolerations)
    if "alternatives" in raw:
        if replicas > 1:
            raise entry.fail("dra", "['alternatives'] cannot be combined with a shared offering (its servers share one claim)")
        first = (
            f"MIG {entry.raw['profile']}"
            if kind is Kind.MIG and "profile" in entry.raw
            else entry.text("display_name", default=str(entry.raw.get("slug", "")))
        )
        claim = replace(claim, alternatives=_alternatives(entry, raw["alternatives"], claim, str(first), default_class, product))
    return claim


def _selectors(entry: Entry, given: Any, product: str | None, profile: str | None, where: str) -> list[str]:
    """A ``selector`` field (one CEL expression or a list), with the product's and the MIG
    profile's selectors added, each compiled now (``where``: the field's place in ``dra``)."""
    selectors = [given] if isinstance(given, str) else given
    if not isinstance(selectors, (list, tuple)) or not all(isinstance(e, str) and e.strip() for e in selectors):
        raise entry.fail("dra", f"{where}['selector'] must be a CEL expression or a list of them, got {given!r}")
    selectors = list(selectors)
    if product:
        selectors.append(f"device.attributes['{dn.DRIVER}'].{dn.ATTR_PRODUCT} == {_quoted(product)}")
    if profile:
        selectors.append(f"device.attributes['{dn.DRIVER}'].{dn.ATTR_PROFILE} == {_quoted(profile)}")
    for i, expression in enumerate(selectors):
        try:
            compile_selector(expression)
        except SelectorError as exc:
            raise entry.fail("dra", f"{where}['selector'][{i}] {exc}") from None
    return selectors


def _alternatives(
    entry: Entry, given: Any, claim: DeviceClaim, first_label: str, default_class: str, product: str | None
) -> tuple[DeviceAlternative, ...]:
    """``dra.alternatives`` -> every choice of the claim, its own first ("this, or else that")."""
    example = "[{'profile': '2g.10gb'}] or [{'selector': \"...\", 'label': 'any GPU of 40 GB or more'}]"
    if not isinstance(given, (list, tuple)) or not given or len(given) >= MAX_ALTERNATIVES:
        raise entry.fail("dra", f"['alternatives'] must list 1 to {MAX_ALTERNATIVES - 1} more choices, e.g. {example}; got {given!r}")
    first_match = str(entry.raw.get("profile") or product or "")
    out = [DeviceAlternative(subrequest_name(first_label), claim.device_class, claim.selectors, first_label, first_match)]
    for i, item in enumerate(given):
        where = f"['alternatives'][{i}]"
        if not isinstance(item, Mapping) or not item or not set(item) <= _ALTERNATIVE_FIELDS:
            raise entry.fail("dra", f"{where} must be a dict with keys among {sorted(_ALTERNATIVE_FIELDS)}, e.g. {example}; got {item!r}")
        texts = {k: item[k] for k in ("device_class", "profile", "product", "label") if k in item}
        bad = next((k for k, v in texts.items() if not isinstance(v, str) or not v.strip()), None)
        if bad:
            raise entry.fail("dra", f"{where}['{bad}'] must be a non-empty string, got {item[bad]!r}")
        device_class = str(item.get("device_class") or (dn.CLASS_MIG if "profile" in item else claim.device_class or default_class))
        chosen_product = item.get("product", product)
        if product and "product" not in item and f".{dn.ATTR_PRODUCT}" in str(item.get("selector", "")):
            raise entry.fail(
                "dra",
                f"{where} picks a product by its own 'selector' but gives no 'product', so it would keep the entry's "
                f"product {product!r} as well (all of a choice's selectors must hold) and could never match: give the "
                f"choice's product as {where}['product'] (and drop productName from its selector)",
            )
        selectors = _selectors(entry, item.get("selector", []), chosen_product, item.get("profile"), where)
        label = item.get("label") or (f"MIG {item['profile']}" if "profile" in item else chosen_product)
        if not label or "{" in label or "}" in label:
            raise entry.fail("dra", f"{where} needs a 'label' without braces: the words that tell the user what this choice gives")
        name = subrequest_name(label, [a.name for a in out])
        out.append(DeviceAlternative(name, device_class, tuple(selectors), str(label), str(item.get("profile") or chosen_product or "")))
    return tuple(out)


def _memory_share(entry: Entry, kind: Kind, memory: Any) -> dict[str, str]:
    """``dra.memory``: a GPU-memory share's ``capacity.requests`` (kind shared, without replicas or sharing)."""
    if kind is not Kind.SHARED or "replicas" in entry.raw or "sharing" in entry.raw:
        raise entry.fail(
            "dra",
            "['memory'] makes a GPU-memory share (each claim asks capacity.requests.memory of a GPU that allows "
            "multiple allocations): it needs kind 'shared' and neither replicas nor sharing, e.g. "
            "{'slug': 'l40s-8gb', 'kind': 'shared', 'product': 'NVIDIA L40S', 'dra': {'memory': '8Gi'}}",
        )
    try:
        amount = parse_quantity(memory) if isinstance(memory, str) else None
    except QuantityError:
        amount = None
    if amount is None or amount < MIB or amount % MIB:
        raise entry.fail(
            "dra", f"['memory'] must be a quantity of whole MiB, at least 1Mi (NVIDIA's driver takes 1Mi steps), e.g. '8Gi', got {memory!r}"
        )
    return {dn.CAP_MEMORY: memory}


def with_effects(tolerations: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Each device toleration without an effect as two, one per effect (NoSchedule, NoExecute):
    what an admin means by it, and what keeps a pod on a NoExecute-tainted device it tolerates
    (kube-controller-manager's device taint eviction counts only tolerations of effect NoExecute;
    :func:`gpuspawner.dra.capacity.blocked`)."""
    out: list[dict[str, Any]] = []
    for t in tolerations:
        out.extend([dict(t)] if t.get("effect") else [{**t, "effect": effect} for effect in ("NoSchedule", "NoExecute")])
    return tuple(out)


def _device_tolerations(entry: Entry, value: Any) -> tuple[dict[str, Any], ...]:
    """``dra.tolerations``: the claim's device tolerations (a tainted device is allocated only to a claim that tolerates it)."""
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(t, Mapping)
        and set(t) <= _DEVICE_TOLERATION_KEYS
        and t.get("operator", "Equal") in ("Equal", "Exists")
        and t.get("effect", "") in ("", "NoSchedule", "NoExecute")
        and (t.get("key") or t.get("operator") == "Exists")
        and not (t.get("operator") == "Exists" and t.get("value"))
        for t in value
    )
    if not ok:
        raise entry.fail(
            "dra",
            f"['tolerations'] must be a list of device tolerations (keys {sorted(_DEVICE_TOLERATION_KEYS)}, operator Equal or "
            f"Exists, effect NoSchedule or NoExecute or none; no key only with Exists), e.g. "
            f"[{{'key': 'gpu.nvidia.com/maintenance', 'operator': 'Exists', 'effect': 'NoSchedule'}}], got {value!r}",
        )
    return with_effects(value)  # one per effect: a toleration without one would not keep the pod on a NoExecute-tainted device


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def admission_fields(entry: Entry) -> dict[str, Any]:
    """``admission``, ``queue_timeout``, ``scalable_nodes``, ``scale_up_minutes`` of an entry."""
    out: dict[str, Any] = {}
    if "admission" in entry.raw:
        policy = entry.text("admission", required=True)
        if policy not in tuple(AdmissionPolicy):
            raise entry.fail("admission", f"must be one of {[p.value for p in AdmissionPolicy]}, got {policy!r}")
        out["admission"] = policy
    for name in ("queue_timeout", "scalable_nodes", "scale_up_minutes"):
        if name in entry.raw:
            out[name] = entry.positive_int(name)
    if "windows" in entry.raw:
        windows = entry.str_list("windows")
        for text in windows:
            try:
                parse_window(text)
            except ValueError as exc:
                raise entry.fail("windows", f"has an entry that is wrong: {exc}") from None
        out["windows"] = windows
    if "gpu_hour_cost" in entry.raw:
        cost = entry.raw["gpu_hour_cost"]
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < float("inf"):
            raise entry.fail("gpu_hour_cost", f"must be a number >= 0 (what one unit's hour costs), got {cost!r}")
        out["gpu_hour_cost"] = float(cost)
    if "price_per_hour" in entry.raw:
        price = entry.raw["price_per_hour"]
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price < float("inf"):
            raise entry.fail("price_per_hour", f"must be a number >= 0 (what one unit costs per hour), got {price!r}")
        out["price_per_hour"] = float(price)
    if out.get("scalable_nodes") and not out.get("scale_up_minutes"):
        raise entry.fail("scale_up_minutes", "is required with scalable_nodes: how long a new node takes, e.g. 5")
    return out


def _derive(kind: Kind, entry: Entry, product: str | None, fields: dict[str, Any]) -> tuple[dict[str, int], dict[str, str]]:
    """The Kubernetes form a kind's shortcuts stand for: (resources, node_selector)."""
    selector: dict[str, str] = {PRODUCT_LABEL: product} if product else {}
    if kind is Kind.CPU:
        return {}, {}
    if kind in (Kind.FULL, Kind.VGPU, Kind.CUSTOM):
        if kind is Kind.FULL:
            fields["memory_mib"] = gpu_memory_mib(product)  # what the product's name says, if it says it
        return ({GPU: 1} if kind is not Kind.CUSTOM else {}), selector
    if kind is Kind.MIG:
        profile = entry.text("profile", required=True)
        parts = mig_profile_parts(profile)
        if parts is None:
            raise entry.fail("profile", f"must be a MIG profile such as '1g.5gb', '3g.20gb' or '1g.10gb+me', got {profile!r}")
        fields["memory_mib"] = gpu_memory_mib(product, profile)  # NVIDIA's table, never the name's "5gb"
        fields["compute_share"] = mig_compute_phrase(parts[0])
        strategy = entry.text("mig_strategy", default="mixed")
        if strategy == "mixed":
            return {mig_resource_name(profile): 1}, selector
        if strategy == "single":
            if not product:
                raise entry.fail(
                    "product",
                    "is required with mig_strategy 'single': slices are told apart only by the product label (e.g. 'A100-SXM4-40GB')",
                )
            return {GPU: 1}, {PRODUCT_LABEL: f"{product}-MIG-{profile}"}
        if strategy == "gke":
            gke = {GKE_PARTITION_LABEL: profile}
            if product:
                gke[GKE_ACCELERATOR_LABEL] = product
            return {GPU: 1}, gke
        raise entry.fail("mig_strategy", f"must be 'mixed', 'single' or 'gke', got {strategy!r}")
    # shared
    sharing = entry.text("sharing", default="time-slicing")
    if sharing not in ("time-slicing", "mps"):
        raise entry.fail("sharing", f"must be 'time-slicing' or 'mps', got {sharing!r}")
    replicas = entry.positive_int("replicas") if "replicas" in entry.raw else None
    rename = entry.flag("rename_by_default", True)
    fields["isolation"] = Isolation.PARTIAL if sharing == "mps" else Isolation.NONE
    fields["sharing"], fields["replicas"] = sharing, replicas
    if replicas:
        fields["compute_share"] = share_phrase(replicas, sharing)
    if rename:
        return {GPU_SHARED: 1}, selector
    if not product and "node_selector" not in entry.raw:
        raise entry.fail(
            "product",
            "is required with rename_by_default false (or give a node_selector): "
            "shared GPUs are then plain nvidia.com/gpu, told apart only by the '-SHARED' product label",
        )
    return {GPU: 1}, ({PRODUCT_LABEL: f"{product}-SHARED"} if product else {})


def offerings_from_config(raw: Any, vgpu_class_labels: Iterable[str] = ("vgpu.type",)) -> list[Offering]:
    """Validate the whole ``c.GPUSpawner.offerings`` list (slugs must be unique)."""
    if not isinstance(raw, (list, tuple)):
        raise OfferingConfigError(f"c.GPUSpawner.offerings must be a list of dicts, got {type(raw).__name__}")
    seen: dict[str, int] = {}
    out = []
    for index, entry in enumerate(raw):
        offering = offering_from_config(entry, index, vgpu_class_labels)
        if offering.slug in seen:
            raise OfferingConfigError(
                f"c.GPUSpawner.offerings[{index}]: slug {offering.slug!r} is already used by entry {seen[offering.slug]}; slugs must be unique"
            )
        seen[offering.slug] = index
        out.append(offering)
    return out


def _placement(
    entry: Entry, kind: Kind, product: str | None
) -> tuple[dict[str, int], dict[str, str], tuple[int, ...], tuple[Any, ...], Isolation, DeviceClaim | None, dict[str, Any]]:
    """What an entry of ``kind`` asks of the cluster: its resources, node selector, counts,
    tolerations, isolation and DRA claim (the kind shortcuts fill in what is not given), and
    the fields the shortcuts derived (memory, compute share, pods per GPU, sharing)."""
    raw = entry.raw
    resources = entry.resources()
    selector = entry.str_map("node_selector") if "node_selector" in raw else None
    for key, value in (selector or {}).items():
        if not LABEL_VALUE_RE.match(value):
            raise entry.fail(
                "node_selector",
                f"has {key}={value!r}, which is not a valid label value "
                "(at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)",
            )
    counts = tuple(entry.positive_int("counts", c) for c in as_list(entry, "counts", [1]))
    if kind is not Kind.FULL and counts != (1,):
        raise entry.fail("counts", f"applies to whole GPUs only; a {kind.value} offering is always exactly 1 unit")
    fields: dict[str, Any] = {}
    derived_resources, derived_selector = _derive(kind, entry, product, fields)
    resources = derived_resources if resources is None else resources
    selector = derived_selector if selector is None else selector
    if kind is Kind.CUSTOM and not resources and not entry.raw.get("command_prefix"):
        raise entry.fail(
            "resources", "is required for a custom offering (or give a command_prefix such as ['bitfusion', 'run', '-n', '1', '--'])"
        )
    if kind is Kind.VGPU and not selector:
        raise entry.fail(
            "node_selector", "is required for a vgpu offering: it names the vGPU node class, e.g. {'vgpu.type': 'v100-8g-8GB'}"
        )
    if kind is Kind.CPU and resources:
        raise entry.fail("resources", "must be empty for a cpu offering")
    if kind is Kind.CPU and "memory_guard" in raw:
        raise entry.fail("memory_guard", "applies to GPU offerings only: a cpu offering has no GPU memory to guard")

    if "tolerations" in raw:
        tolerations = entry.tolerations("tolerations")
    else:
        tolerations = (dict(DEFAULT_GPU_TOLERATION),) if kind is not Kind.CPU else ()
    tolerations += entry.tolerations("extra_tolerations")

    isolation_value = entry.text("isolation")
    if isolation_value is None:
        isolation = fields.pop("isolation", None) or _DEFAULT_ISOLATION[kind]
    else:
        try:
            isolation = Isolation(isolation_value)
        except ValueError:
            raise entry.fail("isolation", f"must be one of {[i.value for i in Isolation]}, got {isolation_value!r}") from None
    claim = dra_claim(entry, kind, product) if "dra" in raw else None
    if claim is not None and claim.capacity:  # a GPU-memory share: the amount, not 1/replicas
        fields.update(sharing="memory", replicas=None, memory_mib=int(parse_quantity(claim.capacity[dn.CAP_MEMORY]) // MIB))
        fields["compute_share"] = "shared with the other users of the GPU"
    if claim is not None:
        for name in ("resources", "node_selector", "absent_labels"):
            if raw.get(name):
                raise entry.fail(name, "cannot be combined with 'dra': a DRA offering's devices are chosen by its claim, not by node")
        resources, selector = {}, {}
    return resources, selector, counts, tolerations, isolation, claim, fields
