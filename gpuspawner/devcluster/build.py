"""Build the devcluster's control-plane binaries from Go modules.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager come from the
wrapper module in ``gomod/`` (k8s.io/kubernetes with its staging modules pinned
to their published twins); kwok comes from ``go install``. Everything lands in a
per-user cache folder keyed by the versions, so a second build is a no-op and an
interrupted one resumes (Go's own build cache keeps the finished packages).

The devcluster runs the newest Kubernetes of :data:`RELEASES`; ``GPUSPAWNER_K8S_VERSION``
picks another (the oldest one GPUSpawner supports: ``make test-oldest-k8s``), built from
its own go.mod in ``gomod/`` (``go build -modfile``) into a cache folder of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

#: The Kubernetes releases the devcluster builds: version -> (the wrapper module's go.mod in
#: ``gomod/``, with its go.sum twin; etcd's server version that module pins, as Kubernetes'
#: own go.mod does). The first is the default; the last is the oldest release GPUSpawner
#: supports (DRA's resource.k8s.io/v1 is GA from 1.34; docs/dra.md says which feature needs
#: which release).
RELEASES = {
    "v1.37.2": ("go.mod", "v3.7.0"),
    "v1.34.4": ("k8s-v1.34.mod", "v3.6.4"),
}
#: picks the release (unset: the newest; ``oldest``: the oldest supported, as `make
#: test-oldest-k8s` does), for `gpuspawner devcluster build|up` and the tests alike
K8S_VERSION_ENV = "GPUSPAWNER_K8S_VERSION"
_ASKED = os.environ.get(K8S_VERSION_ENV, "").strip()
K8S_VERSION = list(RELEASES)[-1] if _ASKED == "oldest" else _ASKED or next(iter(RELEASES))
GOMOD_FILE, ETCD_VERSION = RELEASES.get(K8S_VERSION, ("", ""))
KWOK_VERSION = "v0.8.0"
#: Prometheus' Go module version for server v3.16.0 (Go modules number v3.x as v0.3xx).
PROMETHEUS_VERSION = "v0.316.0"
#: Kueue's controller (``go list -m -versions sigs.k8s.io/kueue`` on the module proxy here).
KUEUE_VERSION = "v0.17.0"
#: Karpenter and its kwok cloud provider (the module's ``kwok`` command). v1.14.1 is the newest
#: release whose go.mod (``go 1.26.6``) the Go here (1.26.8) builds without downloading a
#: toolchain: v1.14.3 says ``go 1.26.10``, v1.15.0 ``go 1.26.9``.
KARPENTER_VERSION = "v1.14.1"
#: its cold build on 2 cores, in minutes, as measured: 4 min 49 s with an empty Go build cache (its modules
#: downloaded, tests running beside it), 78 s with the cache warm from the devcluster's other builds
KARPENTER_MINUTES = 5

GOMOD_DIR = Path(__file__).with_name("gomod")
KUBE_COMMANDS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
ALL_BINARIES = ("etcd", *KUBE_COMMANDS, "kwok")
#: kwok's stage configs (shipped in its module) that the devcluster runs: nodes become
#: Ready once, pods bound to them go Running with an IP from the node's podCIDR, and
#: deleted pods go away. No heartbeat stage: nothing here marks silent nodes NotReady.
KWOK_STAGES = ("node/fast/node-initialize.yaml", "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")


class BuildError(RuntimeError):
    """A build step failed; the message says which and how to retry."""


def cache_root() -> Path:
    base = os.environ.get("GPUSPAWNER_CACHE") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    if not os.environ.get("GPUSPAWNER_CACHE"):
        root = root / "gpuspawner"
    return root


def check_release() -> None:
    """BuildError unless :data:`K8S_VERSION` (``GPUSPAWNER_K8S_VERSION``) is one of :data:`RELEASES`."""
    if K8S_VERSION not in RELEASES:
        known = ", ".join(f"{v} ({GOMOD_DIR.name}/{mod})" for v, (mod, _etcd) in RELEASES.items())
        raise BuildError(
            f"{K8S_VERSION_ENV}={K8S_VERSION} is not a Kubernetes release the devcluster builds; "
            f"it builds {known}. Unset {K8S_VERSION_ENV} for the default, {next(iter(RELEASES))}."
        )


def bin_dir() -> Path:
    key = f"k8s-{K8S_VERSION}_etcd-{ETCD_VERSION}_kwok-{KWOK_VERSION}"
    return cache_root() / "devcluster" / key / "bin"


def tools_dir() -> Path:
    """Prometheus and promtool: beside the control plane, under a key of their own (a new
    Prometheus does not rebuild Kubernetes, and the reverse)."""
    key = f"prometheus-{PROMETHEUS_VERSION}"
    return cache_root() / "devcluster" / key / "bin"


#: (binary, go install package@version, build tags, -X version flags) of the tools in
#: :func:`tools_dir`. ``remove_all_sd`` leaves Prometheus' service-discovery plugins out:
#: the tests and the demo use static targets, and one plugin's module is not on every
#: module proxy. The -X flags make ``--version`` say what was built.
_PROM_VERSION_FLAGS = (
    f"-X github.com/prometheus/common/version.Version=3.{int(PROMETHEUS_VERSION.split('.')[1]) - 300}.{PROMETHEUS_VERSION.split('.')[2]}"
)
TOOLS = (
    ("prometheus", f"github.com/prometheus/prometheus/cmd/prometheus@{PROMETHEUS_VERSION}", "remove_all_sd", _PROM_VERSION_FLAGS),
    ("promtool", f"github.com/prometheus/prometheus/cmd/promtool@{PROMETHEUS_VERSION}", "remove_all_sd", _PROM_VERSION_FLAGS),
)


def tool(name: str) -> Path:
    """The path of a built tool (prometheus, promtool); BuildError if it is not built."""
    path = tools_dir() / name
    if not path.is_file():
        raise BuildError(f"{name} is not built in {tools_dir()}: run `gpuspawner devcluster build` (or `make test`) first.")
    return path


def stages_file() -> Path:
    return bin_dir().parent / "kwok-stages.yaml"


#: A pod annotated so (any value) is left Running by kwok's pod-complete stage, which otherwise
#: completes every Running pod a Job owns at once: the Kueue demo's batch Job then holds its
#: GPU, and its quota, until it is deleted.
KEEP_RUNNING = "gpuspawner.dev/keep-running"


def cluster_stages(stages: str) -> str:
    """kwok's stages (:func:`stages_file`'s text) as a devcluster runs them: the pod-complete
    stage skips pods annotated :data:`KEEP_RUNNING`."""
    docs = [d for d in yaml.safe_load_all(stages) if d]
    for doc in docs:
        if doc.get("kind") == "Stage" and doc["metadata"]["name"] == "pod-complete":
            doc["spec"]["selector"].setdefault("matchExpressions", []).append(
                {"key": f'.metadata.annotations["{KEEP_RUNNING}"]', "operator": "DoesNotExist"}
            )
    return str(yaml.safe_dump_all(docs, sort_keys=False))


def missing_binaries(directory: Path | None = None) -> list[str]:
    directory = directory or bin_dir()
    return [name for name in ALL_BINARIES if not (directory / name).is_file()]


def _write_kwok_stages() -> None:
    """Copy kwok's stage configs out of its module, into one multi-document file."""
    module_dir = _module_dir(f"sigs.k8s.io/kwok@{KWOK_VERSION}")
    docs = [(module_dir / "kustomize" / "stage" / rel).read_text() for rel in KWOK_STAGES]
    tmp = stages_file().with_suffix(".tmp")
    tmp.write_text("\n---\n".join(d.strip() for d in docs) + "\n")
    os.replace(tmp, stages_file())


def _version_ldflags() -> str:
    major, minor, _patch = K8S_VERSION.lstrip("v").split(".")
    pkg = "k8s.io/component-base/version"
    # Without these the servers report v0.0.0, and tools such as Helm refuse them.
    flags = {
        "gitVersion": K8S_VERSION,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "gpuspawner-devcluster",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    parts = [f"-X {pkg}.{k}={v}" for k, v in flags.items()]
    return "-s -w " + " ".join(parts)


def _go_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env.setdefault("CGO_ENABLED", "0")
    env.setdefault("GOFLAGS", "-mod=mod")
    return env


def _run(cmd: list[str], cwd: Path | None, what: str, **env: str) -> None:
    started = time.monotonic()
    print(f"[devcluster build] {what} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=cwd, env=_go_env(**env))
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise BuildError(
            f"{what} failed (exit {proc.returncode}) after {took:.0f}s. "
            "Run `gpuspawner devcluster build` again to resume: finished packages are cached."
        )
    print(f"[devcluster build] {what}: done in {took:.0f}s", file=sys.stderr, flush=True)


def build_tools(force: bool = False) -> Path:
    """Build Prometheus and promtool with `go install` unless they are there."""
    target = tools_dir()
    todo = [t for t in TOOLS if force or not (target / t[0]).is_file()]
    if not todo:
        print(f"[devcluster build] prometheus and promtool present in {target}", file=sys.stderr, flush=True)
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        for name, pkg, tags, version_flags in todo:
            gobin = Path(scratch) / name
            gobin.mkdir()
            cmd = ["go", "install", "-trimpath", f"-ldflags=-s -w {version_flags}", *(["-tags", tags] if tags else []), pkg]
            _run(cmd, None, f"{name} {pkg.rpartition('@')[2]}", GOBIN=str(gobin), GOFLAGS="")
            os.replace(gobin / name, target / name)
    return target


def kueue_dir() -> Path:
    """Kueue's controller and the manifests shipped in its module (CRDs, webhook configuration),
    under a key of their own: only ``devcluster up --kueue`` and its tests need them."""
    return cache_root() / "devcluster" / f"kueue-{KUEUE_VERSION}"


#: what :func:`build_kueue` copies out of Kueue's module, beside the binary
KUEUE_FILES = ("kueue", "crds.yaml", "webhooks.yaml")


def _joined_yaml(paths: list[Path]) -> str:
    return "\n---\n".join(p.read_text().strip() for p in paths) + "\n"


def _build_controller(
    name: str,
    module: str,
    command: str,
    version: str,
    target: Path,
    files: tuple[str, ...],
    minutes: int,
    copy: Callable[[Path, Path], None],
    force: bool,
) -> Path:
    """`go install module/command@version` as ``target/files[0]``, and ``copy(module's folder,
    scratch)`` writing the rest of ``files`` out of the module, unless they are all there."""
    if not force and all((target / f).is_file() for f in files):
        print(f"[devcluster build] {name} {version} present in {target}", file=sys.stderr, flush=True)
        return target
    if shutil.which("go") is None:
        raise BuildError("Go is not on PATH: install Go 1.26 or newer, then run this again.")
    target.mkdir(parents=True, exist_ok=True)
    print(
        f"[devcluster build] a cold build of {name} takes about {minutes} minutes on 2 cores; later runs reuse it",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        gobin = Path(scratch) / "bin"
        gobin.mkdir()
        cmd = ["go", "install", "-trimpath", "-ldflags=-s -w", f"{module}/{command}@{version}"]
        _run(cmd, None, f"{name} {version}", GOBIN=str(gobin), GOFLAGS="")
        copy(_module_dir(f"{module}@{version}"), Path(scratch))
        for extra in files[1:]:
            os.replace(Path(scratch) / extra, target / extra)
        os.replace(gobin / command.rpartition("/")[2], target / files[0])  # last: its presence says the rest is there
    return target


def build_kueue(force: bool = False) -> Path:
    """Build Kueue's controller with `go install` and copy its CRDs and webhook configuration
    out of its module, unless they are there; returns :func:`kueue_dir`."""

    def copy(module: Path, scratch: Path) -> None:
        (scratch / "crds.yaml").write_text(_joined_yaml(sorted((module / "config" / "components" / "crd" / "bases").glob("*.yaml"))))
        shutil.copyfile(module / "config" / "components" / "webhook" / "manifests.yaml", scratch / "webhooks.yaml")

    return _build_controller("kueue", "sigs.k8s.io/kueue", "cmd/kueue", KUEUE_VERSION, kueue_dir(), KUEUE_FILES, 6, copy, force)


def karpenter_dir() -> Path:
    """Karpenter with its kwok cloud provider, and the CRDs shipped in its module, under a key of
    their own: only ``devcluster up --karpenter`` and its tests need them."""
    return cache_root() / "devcluster" / f"karpenter-{KARPENTER_VERSION}"


#: what :func:`build_karpenter` writes: the controller (the module's ``kwok`` command) and the CRDs
#: of its kwok chart (karpenter.sh's NodePool, NodeClaim, NodeOverlay; CapacityBuffer) and the
#: KWOKNodeClass (kwok/apis/crds), in one file
KARPENTER_FILES = ("karpenter-kwok", "crds.yaml")


def build_karpenter(force: bool = False) -> Path:
    """Build Karpenter's kwok cloud provider with `go install` and copy its CRDs out of its
    module, unless they are there; returns :func:`karpenter_dir`."""

    def copy(module: Path, scratch: Path) -> None:
        crds = sorted((module / "kwok" / "charts" / "crds").glob("*.yaml")) + sorted((module / "kwok" / "apis" / "crds").glob("*.yaml"))
        (scratch / "crds.yaml").write_text(_joined_yaml(crds))

    return _build_controller(
        "karpenter", "sigs.k8s.io/karpenter", "kwok", KARPENTER_VERSION, karpenter_dir(), KARPENTER_FILES, KARPENTER_MINUTES, copy, force
    )


def _module_dir(module: str) -> Path:
    """Where the Go module cache holds ``module`` (path@version), downloading it if needed."""
    proc = subprocess.run(["go", "mod", "download", "-json", module], capture_output=True, text=True, env=_go_env(GOFLAGS=""))
    if proc.returncode != 0:
        raise BuildError(f"could not fetch {module}: {proc.stderr.strip() or proc.stdout.strip()}")
    return Path(json.loads(proc.stdout)["Dir"])


def build(force: bool = False) -> Path:
    """Build whatever is missing and return the folder holding the control-plane binaries."""
    if shutil.which("go") is None:
        raise BuildError("Go is not on PATH: install Go 1.26 or newer, then run this again.")
    check_release()
    build_tools(force)
    target = bin_dir()
    todo = list(ALL_BINARIES) if force else missing_binaries(target)
    if not todo:
        if not stages_file().is_file():
            _write_kwok_stages()
        print(f"[devcluster build] all binaries present in {target}", file=sys.stderr, flush=True)
        return target
    target.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"[devcluster build] building {', '.join(todo)} into {target}", file=sys.stderr, flush=True)
    print("[devcluster build] a cold build takes about 8 minutes on 2 cores; later runs reuse it", file=sys.stderr, flush=True)
    # Build into a scratch folder next to the target and rename each binary into
    # place, so an interrupted build never leaves a half-written file behind.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        out = Path(scratch)
        for name in todo:
            if name == "kwok":
                env_bin = out / "kwok-gobin"
                env_bin.mkdir()
                cmd = ["go", "install", "-ldflags=-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"]
                # GOFLAGS=-mod=mod is for our wrapper module only; `go install pkg@v` refuses it.
                _run(cmd, None, f"kwok {KWOK_VERSION}", GOBIN=str(env_bin), GOFLAGS="")
                built = env_bin / "kwok"
            else:
                pkg = "./cmd/etcd" if name == "etcd" else f"k8s.io/kubernetes/cmd/{name}"
                built = out / name
                cmd = ["go", "build", f"-modfile={GOMOD_FILE}", "-trimpath", f"-ldflags={_version_ldflags()}", "-o", str(built), pkg]
                version = ETCD_VERSION if name == "etcd" else K8S_VERSION
                _run(cmd, GOMOD_DIR, f"{name} {version}")
            os.replace(built, target / name)
    _write_kwok_stages()
    print(f"[devcluster build] finished in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return target


def main(argv: list[str] | None = None) -> int:
    force = "--force" in (argv or sys.argv[1:])
    try:
        build(force=force)
    except BuildError as exc:
        print(f"gpuspawner devcluster build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
