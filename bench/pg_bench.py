"""Durable queues on PostgreSQL: Trimaran with and without ``queues.shared`` against RabbitMQ (issue 46).

The shape of issue 46's sitting: AMQP 0.9.1, a durable queue, persistent messages, publisher confirms
and consumer acks (``amqp091_load.py durable``, the README's durable row: one publisher with up to
1,000 unconfirmed, one consumer acking every 100 with prefetch 1,000), the broker and PostgreSQL 15
(fsync on) pinned to CPU 0 with this script, the generator on CPU 1. Each Trimaran run gets a
fresh database on a throwaway cluster.

Besides each broker's rate and CPU a message, what predicts how many nodes one PostgreSQL carries
(docs/cluster.md, "Scaling"): PostgreSQL's CPU a message (the postmaster and its backends), the rows
it wrote (inserted + updated + deleted, from ``pg_stat_user_tables``) and the WAL bytes a message
(``pg_current_wal_lsn``), all over the generator's whole run divided by the messages it received.

    python bench/pg_bench.py [--targets trimaran,trimaran-shared,rabbitmq] [--runs 3] [--out FILE]

The generator's own contamination check counts PostgreSQL as foreign CPU, so it is told to keep every
run; this script subtracts PostgreSQL's share and reports what is left (``other_cpu_pct``): read it
before trusting a run (two cores, nothing else should be running).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import benchlib as bl  # noqa: E402
import brokers  # noqa: E402

TARGETS = ("trimaran", "trimaran-shared", "rabbitmq")
BROKER_CPU, GEN_CPU = 0, 1


class Database:
    """A throwaway PostgreSQL cluster with fsync on (tests/support/postgres.py), one database per run."""

    def __init__(self, *, statements: bool = False) -> None:
        from tests.support.postgres import PostgresCluster, find_bindir

        bindir = find_bindir()
        if bindir is None:
            raise brokers.BrokerUnavailable("PostgreSQL is not installed (apt-get install postgresql)")
        settings = {"shared_preload_libraries": "pg_stat_statements"} if statements else {}
        self.cluster = PostgresCluster(bindir, fsync=True, settings=settings).start()
        self.statements = statements
        self.count = 0

    def new(self) -> str:
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

    def postmaster(self) -> int:
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


@contextlib.contextmanager
def started(name: str, db: Database | None) -> Iterator[tuple[brokers.Running, str | None]]:
    """The broker, and the database URL a Trimaran target stores in."""
    if name == "rabbitmq":
        with brokers.rabbitmq(mqtt=False) as running:
            yield running, None
        return
    assert db is not None
    url = db.new()
    if name == "trimaran-shared":
        os.environ["TRIMARAN_QUEUES__SHARED"] = "true"
    try:
        python = str(HERE.parent / ".venv" / "bin" / "python")
        with brokers.trimaran(python=python if Path(python).exists() else sys.executable,
                              extra_args=["--storage", url]) as running:  # fmt: skip
            yield running, url
    finally:
        os.environ.pop("TRIMARAN_QUEUES__SHARED", None)


def generator(port: int, broker_pid: int, a: argparse.Namespace) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(GEN_CPU), sys.executable, str(HERE / "amqp091_load.py"), "durable"]
    cmd += ["--port", str(port), "--broker-pid", str(broker_pid), "--runs", "1", "--max-attempts", "1"]
    cmd += ["--warmup", str(a.warmup), "--duration", str(a.duration), "--max-foreign-pct", "1000"]
    cmd += ["--quiet-pct", "1000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.warmup + a.duration + 240)
    for line in out.stdout.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and not rec.get("summary") and "msgs_per_s_received" in rec:
                return dict(rec)
    return {"error": f"generator exited {out.returncode}: {(out.stderr or out.stdout).strip()[-600:]}"}


def measure(name: str, db: Database | None, a: argparse.Namespace) -> dict[str, Any]:
    with started(name, db) as (running, url):
        assert running.amqp is not None
        pg = db.postmaster() if url is not None and db is not None else None
        rows0, wal0 = db.stats(url) if url is not None and db is not None else (0, 0)
        if url is not None and db is not None:
            db.reset_statements(url)
        pg0 = bl.proc_cpu_seconds(pg) if pg else 0.0
        t0 = time.monotonic()
        rec = generator(running.amqp[1], running.pid, a)
        elapsed = time.monotonic() - t0
        pg_s = bl.proc_cpu_seconds(pg) - pg0 if pg else 0.0
        rows1, wal1 = db.stats(url) if url is not None and db is not None else (0, 0)
        if url is not None and db is not None and db.statements:
            rec["statements"] = db.top_statements(url, int(rec.get("received") or 0))
            rec["table_rows"] = db.table_rows(url)
    rec["target"] = name
    rate, received = rec.get("msgs_per_s_received"), rec.get("received")
    if rate and rec.get("broker_cpu_pct") is not None:
        rec["broker_us_per_msg"] = round(rec["broker_cpu_pct"] * 1e4 / rate, 1)
    if pg and received:
        rec["pg_us_per_msg"] = round(pg_s * 1e6 / received, 1)
        rec["pg_cpu_pct_avg"] = round(100 * pg_s / elapsed, 1)
        rec["rows_per_msg"] = round((rows1 - rows0) / received, 2)
        rec["wal_bytes_per_msg"] = round((wal1 - wal0) / received)
    if rec.get("foreign_cpu_pct") is not None:  # PostgreSQL counted as foreign by the generator
        rec["other_cpu_pct"] = round(max(0.0, rec["foreign_cpu_pct"] - rec.get("pg_cpu_pct_avg", 0.0)), 1)
    return rec


def table(runs: list[dict[str, Any]]) -> str:
    def med(name: str, key: str) -> float | None:
        values = [r[key] for r in runs if r.get("target") == name and isinstance(r.get(key), int | float)]
        return statistics.median(values) if values else None

    base = med("rabbitmq", "msgs_per_s_received")
    lines = [
        "| target | delivered msg/s (median) | vs RabbitMQ | broker µs/msg | PostgreSQL µs/msg | rows/msg "
        "| WAL B/msg | drain s | other CPU % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["target"] for r in runs):
        rate = med(name, "msgs_per_s_received")
        if rate is None:
            errors = [r.get("error", "?") for r in runs if r.get("target") == name]
            lines.append(f"| {name} | not measured: {errors[-1][:80]!r} | | | | | | | |")
            continue
        ratio = f"{rate / base:.2f}x" if base else "-"

        def cell(key: str, fmt: str = "{:,.1f}") -> str:
            value = med(name, key)  # noqa: B023
            return "-" if value is None else fmt.format(value)

        lines.append(
            f"| {name} | {rate:,.0f} | {ratio} | {cell('broker_us_per_msg')} | {cell('pg_us_per_msg')} "
            f"| {cell('rows_per_msg', '{:.2f}')} | {cell('wal_bytes_per_msg', '{:,.0f}')} "
            f"| {cell('drain_s', '{:.2f}')} | {cell('other_cpu_pct')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--runs", type=int, default=3, help="rounds; each target once per round")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--out", help="append every run as a JSON line here")
    parser.add_argument(
        "--statements", action="store_true",
        help="record pg_stat_statements' top statements and the rows per table in each Trimaran run",
    )  # fmt: skip
    parser.add_argument("--table", metavar="JSONL", help="print the table of a recorded --out file")
    a = parser.parse_args()
    if a.table:
        print(table([json.loads(line) for line in Path(a.table).read_text().splitlines() if line.strip()]))
        return
    os.sched_setaffinity(0, {BROKER_CPU})  # the brokers and PostgreSQL inherit it
    names = [n.strip() for n in a.targets.split(",") if n.strip()]
    db = Database(statements=a.statements) if any(n.startswith("trimaran") for n in names) else None
    runs: list[dict[str, Any]] = []
    try:
        for round_ in range(1, a.runs + 1):
            for name in names:
                try:
                    rec = measure(name, db, a)
                except brokers.BrokerUnavailable as exc:
                    rec = {"target": name, "error": str(exc)}
                rec["round"] = round_
                runs.append(rec)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                print(
                    f"{name} round {round_}: {rec.get('msgs_per_s_received', rec.get('error'))} msg/s, "
                    f"PostgreSQL {rec.get('pg_us_per_msg', '-')} µs/msg, "
                    f"other CPU {rec.get('other_cpu_pct')}%",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if db is not None:
            db.stop()
    print(table(runs))


if __name__ == "__main__":
    main()
