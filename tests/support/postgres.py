"""A throwaway PostgreSQL cluster for the storage tests (Debian's ``postgresql`` package).

``initdb`` and ``pg_ctl`` refuse to run as root, so they run as the ``postgres`` user via
``runuser`` when the tests run as root.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.support.server import unused_port


def find_bindir() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresCluster:
    def __init__(self, bindir: Path, *, fsync: bool = False, settings: dict[str, str] | None = None) -> None:
        """``fsync=False`` (tests) trades durability for speed; benchmarks turn it on. ``settings``
        are further server settings (``-c name=value``)."""
        self.bindir = bindir
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.root = Path(tempfile.mkdtemp(prefix="trimaran-pg-"))
        self.datadir = self.root / "data"
        self.port = unused_port()
        self.as_root = os.geteuid() == 0
        self.options = ""

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> PostgresCluster:
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            "initdb", "-D", str(self.datadir), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"
        )
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        options += " -c fsync=on -c synchronous_commit=on" if self.fsync else " -c fsync=off"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self.options = options
        self._start()
        return self

    def _start(self) -> None:
        self._run(
            "pg_ctl", "-D", str(self.datadir), "-o", self.options, "-w", "-l", str(self.root / "log"), "start"
        )

    def restart(self, mode: str = "immediate", *, while_down: Callable[[], None] | None = None) -> None:
        """Stop the server (``mode``: ``immediate`` is a crash: no checkpoint, every connection cut,
        crash recovery at the start) and start it again; returns once it accepts connections.
        ``while_down`` runs between the stop and the start (``pg_ctl restart`` without it)."""
        if while_down is None:
            self._run(
                "pg_ctl", "-D", str(self.datadir), "-m", mode, "-o", self.options, "-w",
                "-l", str(self.root / "log"), "restart",
            )  # fmt: skip
            return
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop")
        try:
            while_down()
        finally:
            self._start()

    def terminate_backends(self, database: str) -> int:
        """``pg_terminate_backend`` every connection to ``database`` (but the one asking): a
        database that cuts its clients off, as an operator or a fail-over does. How many it ended."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as connection:
            rows = connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
        return sum(1 for (ended,) in rows if ended)

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return self.url(name)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
