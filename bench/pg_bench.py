"""Durable queues on PostgreSQL: Trimaran with and without ``queues.shared`` against RabbitMQ (issue 46).

The shape of issue 46's sitting: AMQP 0.9.1, a durable queue, persistent messages, publisher confirms
and consumer acks (``amqp091_load.py durable``, the README's durable row: one publisher with up to
1,000 unconfirmed, one consumer acking every 100 with prefetch 1,000), the broker and PostgreSQL 15
(fsync on) pinned to CPU 0 with this script, the generator on CPU 1. Each Trimaran run gets a
fresh database on a throwaway cluster.

Besides each broker's rate and CPU a message, what predicts how many nodes one PostgreSQL carries
(docs/cluster.md, "Scaling"): PostgreSQL's CPU a message (the postmaster and its backends, over the
generator's window like the broker's), the rows it wrote (inserted + updated + deleted, from
``pg_stat_user_tables``) and the WAL bytes a message (``pg_current_wal_lsn``), over the generator's
whole run divided by the messages it received (``pgdb.py``, which ``make bench``'s PostgreSQL rows
use too; before, the CPU was also over the whole run).

    python bench/pg_bench.py [--targets trimaran,trimaran-shared,rabbitmq] [--runs 3] [--out FILE]

The quick tool for one shape; ``make bench`` has the same rows in its table (``amqp091-durable-pg``,
``amqp091-durable-pg-shared``, bench/README.md). The generator is told PostgreSQL's postmaster
(``--storage-pid``), so its ``foreign_cpu_pct`` leaves PostgreSQL out; it keeps every run, and this
script reports that figure as ``other_cpu_pct``: read it before trusting a run (two cores, nothing
else should be running).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import brokers  # noqa: E402
import pgdb  # noqa: E402
from pgdb import Database  # noqa: E402

TARGETS = ("trimaran", "trimaran-shared", "rabbitmq")
BROKER_CPU, GEN_CPU = 0, 1


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


def generator(port: int, broker_pid: int, storage_pid: int | None, a: argparse.Namespace) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(GEN_CPU), sys.executable, str(HERE / "amqp091_load.py"), "durable"]
    cmd += ["--port", str(port), "--broker-pid", str(broker_pid), "--runs", "1", "--max-attempts", "1"]
    cmd += ["--storage-pid", str(storage_pid or 0)]
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
        if url is None or db is None:
            rec = generator(running.amqp[1], running.pid, None, a)
        else:
            rows0, wal0 = db.stats(url)
            db.reset_statements(url)
            rec = generator(running.amqp[1], running.pid, db.postmaster(), a)
            rows1, wal1 = db.stats(url)
            pgdb.annotate([rec], rows1 - rows0, wal1 - wal0)
            if db.statements:
                rec["statements"] = db.top_statements(url, int(rec.get("received") or 0))
                rec["table_rows"] = db.table_rows(url)
    rec["target"] = name
    # what the generator saw of other tenants, PostgreSQL left out (the column of recorded sittings)
    rec["other_cpu_pct"] = rec.get("foreign_cpu_pct")
    rate = rec.get("msgs_per_s_received")
    if rate and rec.get("broker_cpu_pct") is not None:
        rec["broker_us_per_msg"] = round(rec["broker_cpu_pct"] * 1e4 / rate, 1)
    return rec


def table(runs: list[dict[str, Any]]) -> str:
    def med(name: str, key: str) -> float | None:
        values = [r[key] for r in runs if r.get("target") == name and isinstance(r.get(key), int | float)]
        return statistics.median(values) if values else None

    base = med("rabbitmq", "msgs_per_s_received")
    lines = [
        "| target | delivered msg/s (median) | vs RabbitMQ | broker µs/msg | PostgreSQL µs/msg | rows/msg "
        "| WAL B/msg | drain s | gap ms | other CPU % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["target"] for r in runs):
        rate = med(name, "msgs_per_s_received")
        if rate is None:
            errors = [r.get("error", "?") for r in runs if r.get("target") == name]
            lines.append(f"| {name} | not measured: {errors[-1][:80]!r} | | | | | | | | |")
            continue
        ratio = f"{rate / base:.2f}x" if base else "-"

        def cell(key: str, fmt: str = "{:,.1f}") -> str:
            value = med(name, key)  # noqa: B023
            return "-" if value is None else fmt.format(value)

        lines.append(
            f"| {name} | {rate:,.0f} | {ratio} | {cell('broker_us_per_msg')} | {cell('pg_us_per_msg')} "
            f"| {cell('rows_per_msg', '{:.2f}')} | {cell('wal_bytes_per_msg', '{:,.0f}')} "
            f"| {cell('drain_s', '{:.2f}')} | {cell('gap_max_ms')} | {cell('other_cpu_pct')} |"
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
