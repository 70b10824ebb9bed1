"""PostgreSQL for the bench: a throwaway cluster with fsync on, a fresh database per Trimaran run, and
what PostgreSQL spent a message (issue 46). Used by `run.py` (the `*-pg*` rows of `make bench`) and by
`pg_bench.py` (the quick single-shape tool), so that both measure PostgreSQL the same way:

- its CPU a message (`pg_us_per_msg`): the postmaster's and its backends' CPU over the generator's
  window (`storage_cpu_pct`, which the generator samples when given `--storage-pid`, as it samples
  the broker's) over the delivered rate: the same measure as the broker's CPU a message beside it;
- rows written a message (`rows_per_msg`: inserted + updated + deleted, `pg_stat_user_tables`) and
  WAL bytes a message (`wal_bytes_per_msg`, `pg_current_wal_lsn`): over the generator's whole call,
  divided by the messages it received (a table's row counters cannot be cut at the window).

The cluster comes from tests/support/postgres.py (Debian's `postgresql` binaries; as root, initdb and
pg_ctl run as the `postgres` user). It is started pinned to the broker's core: the broker's storage
is part of what one core carries, as in issue 46's sitting.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # tests.support.postgres

INSTALL_HINT = "apt-get install postgresql"


def unavailable() -> str | None:
    """Why a PostgreSQL cluster cannot be started and read here, or None when it can."""
    from tests.support.postgres import find_bindir

    if find_bindir() is None:
        return f"PostgreSQL is not installed ({INSTALL_HINT})"
    if importlib.util.find_spec("psycopg") is None:  # the stats a message are read with it
        return f"psycopg is not installed in {sys.executable} (pip install 'psycopg[binary]')"
    return None


class Database:
    """A throwaway PostgreSQL cluster with fsync on, one database per run; ``cpu`` pins it (the
    postmaster, and so every backend it forks) to that core."""

    def __init__(self, *, cpu: int | None = None, statements: bool = False) -> None:
        from tests.support.postgres import PostgresCluster, find_bindir

        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(f"PostgreSQL is not installed ({INSTALL_HINT})")
        settings = {"shared_preload_libraries": "pg_stat_statements"} if statements else {}
        self.cluster = PostgresCluster(bindir, fsync=True, settings=settings)
        # pg_ctl's children inherit the affinity of the thread that starts them: pin it for the start only
        before = os.sched_getaffinity(0)
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        try:
            self.cluster.start()
        finally:
            os.sched_setaffinity(0, before)
        self.statements = statements
        self.count = 0

    def new(self) -> str:
        """A fresh database's URL: one per Trimaran run, so no run reads another's tables."""
        self.count += 1
        url = self.cluster.create_database(f"bench{self.count}")
        if self.statements:
            self._execute(url, "CREATE EXTENSION pg_stat_statements")
        return url

    @staticmethod
    def _execute(url: str, sql: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(url, autocommit=True) as connection:
            cursor = connection.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def reset_statements(self, url: str) -> None:
        if self.statements:
            self._execute(url, "SELECT pg_stat_statements_reset()")

    def top_statements(self, url: str, received: int, limit: int = 12) -> list[dict[str, Any]]:
        """The statements that took PostgreSQL's time in this run, the most first, per message received."""
        if not self.statements or not received:
            return []
        rows = self._execute(
            url,
            "SELECT total_exec_time, calls, rows, shared_blks_hit + shared_blks_read, query "
            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = "
            "current_database()) ORDER BY total_exec_time DESC LIMIT " + str(limit),
        )
        return [
            {"us_per_msg": round(ms * 1e3 / received, 2), "calls": calls, "rows": n,
             "blocks_per_call": round(blocks / calls, 1) if calls else 0, "query": " ".join(q.split())[:240]}
            for ms, calls, n, blocks, q in rows
        ]  # fmt: skip

    def table_rows(self, url: str) -> dict[str, list[int]]:
        """Rows inserted, updated and deleted so far, per table."""
        rows = self._execute(
            url, "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables ORDER BY relname"
        )
        return {name: [ins, upd, dele] for name, ins, upd, dele in rows if ins or upd or dele}

    def version(self) -> str:
        return str(self._execute(self.cluster.url(), "SHOW server_version")[0][0])

    def postmaster(self) -> int:
        """The postmaster's PID: the generator's --storage-pid (its backends are its children)."""
        return int((self.cluster.datadir / "postmaster.pid").read_text().split()[0])

    def stats(self, url: str) -> tuple[int, int]:
        """Rows written so far in ``url``'s database, and the cluster's WAL position (bytes)."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("SELECT pg_stat_force_next_flush()")
            rows = connection.execute(
                "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
            ).fetchone()
            wal = connection.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert rows is not None and wal is not None
        return int(rows[0]), int(wal[0])

    def stop(self) -> None:
        self.cluster.stop()


def us_per_message(rec: dict[str, Any]) -> float | None:
    """PostgreSQL's CPU µs a delivered message: its CPU in the window over the delivered rate."""
    cpu, rate = rec.get("storage_cpu_pct"), rec.get("msgs_per_s_received")
    if not isinstance(cpu, int | float) or not isinstance(rate, int | float) or not rate:
        return None
    return cpu / 100 * 1e6 / rate


def annotate(records: Iterable[dict[str, Any]], rows: int, wal_bytes: int) -> None:
    """Add PostgreSQL's cost a message to the run lines of one generator call, which wrote ``rows``
    rows and ``wal_bytes`` of WAL in all (every attempt: a discarded run's messages were written too)."""
    records = list(records)
    received = sum(r["received"] for r in records if isinstance(r.get("received"), int))
    for rec in records:
        us = us_per_message(rec)
        if us is not None:
            rec["pg_us_per_msg"] = round(us, 2)
        if received:
            rec["rows_per_msg"] = round(rows / received, 2)
            rec["wal_bytes_per_msg"] = round(wal_bytes / received)
