"""Run by tests/wheel/test_wheel.py with the Python of a fresh venv that holds only the built
wheel and its dependencies, from a folder outside the repository. Each check prints one
line ``ok <name>`` or raises; the test reads the lines.

It imports nothing from the repository (there is no repository on its path).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import sysconfig
from pathlib import Path


def ok(name: str) -> None:
    print(f"ok {name}", flush=True)


def from_the_venv() -> None:
    import gpuspawner

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    where = Path(gpuspawner.__file__).resolve()
    assert site in where.parents, f"gpuspawner imported from {where}, not from the venv's {site}"
    ok("imported from the installed wheel")


def hub_entry_point() -> None:
    from jupyterhub.app import JupyterHub

    app = JupyterHub()
    app.spawner_class = "gpu"  # what README.md tells admins to write
    assert app.spawner_class.__name__ == "GPUSpawner", app.spawner_class
    ok("c.JupyterHub.spawner_class = 'gpu' loads GPUSpawner")


def spawn_page() -> None:
    """The spawn page of a hub with one configured offering, rendered from the wheel's templates
    (``$KUBECONFIG`` names a cluster nobody answers: this page asks nothing of one)."""
    from jupyterhub import orm
    from jupyterhub.objects import Hub
    from traitlets.config import Config

    from gpuspawner.spawner import GPUSpawner

    class User:  # the parts of JupyterHub's User a spawner reads
        id = 1
        name = escaped_name = "ada"
        url = "/user/ada/"
        groups: list = []
        admin = False
        spawners: dict = {}

    config = Config()
    config.GPUSpawner.discover_offerings = False
    config.GPUSpawner.offerings = [
        {"slug": "remote-half", "kind": "custom", "display_name": "Half a remote accelerator", "resources": {"example.com/accel": 1}}
    ]

    async def page() -> str:  # KubeSpawner makes its API client on the hub's running loop
        spawner = GPUSpawner(
            hub=Hub(ip="127.0.0.1", port=8081, base_url="/hub/"),
            user=User(),
            orm_spawner=orm.Spawner(name=""),
            config=config,
            user_options={},
        )
        return await spawner.get_options_form()

    html = asyncio.run(page())
    assert 'value="remote-half"' in html and "Half a remote accelerator" in html, html[:2000]
    assert "gpuspawner" in html and "<script" in html, "the page's own CSS/JS are missing"
    ok("spawn page rendered from the wheel's templates")


def memory_guard_hook() -> None:
    from gpuspawner import spawner
    from gpuspawner.hub.choosing import hook_source

    source = hook_source()  # what a guarded pod's annotation carries (braces doubled for KubeSpawner)
    assert "class AfterImport" in source and source.replace("{{", "{").replace("}}", "}") == (
        Path(spawner.__file__).with_name("pod").joinpath("memguard_hook.py").read_text()
    ), source[:200]
    ok("memory guard hook read from the wheel")


def hub_page_templates() -> None:
    """The hub's home and spawn pages with the culler's actions (docs/culler.md): their
    templates come from the installed package, not from a repository."""
    from gpuspawner.hub.culleractions import hub_templates_dir

    where = Path(hub_templates_dir()).resolve()
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert site in where.parents, f"hub page templates found at {where}, not in the venv's {site}"
    assert {"home.html", "spawn.html"} <= {p.name for p in where.iterdir()}, sorted(p.name for p in where.iterdir())
    ok("hub page templates in the wheel")


def cli(nodes_file: str) -> None:
    done = subprocess.run(
        [Path(sys.executable).with_name("gpuspawner"), "offerings", "--nodes", nodes_file, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    slugs = {row["slug"] for row in json.loads(done.stdout)}
    assert "gpu-nvidia-h100-80gb-hbm3" in slugs and "mig-nvidia-a100-sxm4-40gb-1g-5gb" in slugs, sorted(slugs)
    ok("gpuspawner offerings --nodes")


def culler_help() -> None:
    for command in (
        [str(Path(sys.executable).with_name("gpuspawner-culler")), "--help"],
        [sys.executable, "-m", "gpuspawner.culler", "--help"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "--prometheus-url" in done.stdout, (command, done.stdout[-1500:], done.stderr[-1500:])
    ok("gpuspawner-culler --help")


def probe_without_a_gpu() -> None:
    """The probe and its binding are in the wheel: here, with no NVIDIA driver, NVML is
    reported down as a metric and the exit status, never a traceback."""
    done = subprocess.run(
        [Path(sys.executable).with_name("gpuspawner"), "probe", "--once", "--node", "n1"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-1500:])
    assert "gpuspawner_probe_nvml_up 0.0" in done.stdout and 'error="LibraryNotFound"' in done.stdout, done.stdout[-1500:]
    ok("gpuspawner probe --once without a GPU")


if __name__ == "__main__":
    from_the_venv()
    hub_entry_point()
    spawn_page()
    memory_guard_hook()
    hub_page_templates()
    cli(sys.argv[1])
    culler_help()
    probe_without_a_gpu()
