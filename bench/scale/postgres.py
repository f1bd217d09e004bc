"""A PostgreSQL server of the benchmark's own, for hubs that keep their database where large hubs
do (JupyterHub's sqlite default is one file and one writer; zero-to-jupyterhub sites of thousands
of users run PostgreSQL).

Debian's ``postgresql`` package (``apt-get install postgresql``; its binaries under
``/usr/lib/postgresql/<version>/bin``) run as the ``postgres`` system user, since PostgreSQL
refuses to run as root: a cluster of its own in the work folder, trust authentication on
127.0.0.1 only, a database per storm. JupyterHub reaches it through SQLAlchemy's ``psycopg``
dialect (``psycopg[binary]``, in the test extra).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpuspawner.devcluster.ports import free_port

#: The user PostgreSQL's own processes run as (Debian's package makes it).
PG_USER = "postgres"


def pg_bin() -> Path:
    """The newest installed PostgreSQL's binaries, or why there are none."""
    root = Path("/usr/lib/postgresql")
    versions = sorted((p for p in root.glob("*/bin") if (p / "initdb").exists()), key=lambda p: int(p.parent.name))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (Debian's package), then run again")
    return versions[-1]


class Postgres:
    """A PostgreSQL cluster in ``folder``, on a free loopback port, until :meth:`stop`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.bin = pg_bin()
        self.port = free_port()

    def _as_postgres(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        runuser = shutil.which("runuser")
        prefix = [runuser, "-u", PG_USER, "--"] if os.geteuid() == 0 and runuser else []
        return subprocess.run([*prefix, *command], check=check, capture_output=True, text=True, timeout=120)

    def start(self) -> Postgres:
        data, sockets = self.folder / "data", self.folder / "sockets"
        for path in (self.folder, sockets):
            path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, PG_USER)
            shutil.chown(sockets, PG_USER)
            work = self.folder.parent  # (a temporary folder is root's alone: postgres must pass through it)
            work.chmod(work.stat().st_mode | 0o011)
        self._as_postgres(str(self.bin / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {sockets} -c max_connections=300 -c fsync=off"
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.folder / "postgres.log"), "-o", options, "-w", "start")
        return self

    def database(self, name: str) -> str:
        """A new database ``name`` (letters, digits, '_'); its SQLAlchemy URL for JupyterHub's ``db_url``."""
        self._as_postgres(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, name)
        return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop", check=False)
