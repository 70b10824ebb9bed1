"""How long the Spark audit takes on about a million events, in local mode.

Generates consistent queue tables (events plus the live rows they imply) with a realistic mix:
work queues with one or two groups and three consumers each, where most messages are acked on the
first attempt and the rest are nacked and retried, time out and are redelivered, are rejected or
exhaust their attempts into the dead-letter queue, are still held, or wait unread at the tail;
and a stream read by one group committing every ten messages. The tables go to a Parquet export
(default) or a SQLite database, then ``trimaran audit`` replays them; the audit must come out clean.

    python bench/audit_bench.py --events 1000000 [--format sqlite] [--master local[*]]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# A life per (group, message): steps of (kind, attempt, reason, ms after the previous step).
LIVES: dict[str, tuple[float, list[tuple[str, int, str | None, int]]]] = {
    "acked": (0.80, [("delivered", 1, "first", 3), ("acked", 1, None, 8)]),
    "nack_retry": (
        0.07,
        [("delivered", 1, "first", 3), ("nacked", 1, "delay_ms=1000", 8), ("delivered", 2, "nack", 1000),
         ("acked", 2, None, 8)],
    ),
    "timeout": (
        0.04,
        [("delivered", 1, "first", 3), ("released", 1, "timeout", 30_000), ("delivered", 2, "timeout", 0),
         ("acked", 2, None, 8)],
    ),
    "rejected": (
        0.02,
        [("delivered", 1, "first", 3), ("rejected", 1, "cannot parse", 5),
         ("dead_lettered", 1, "cannot parse", 0)],
    ),
    "max_attempts": (
        0.01,
        [("delivered", 1, "first", 3), ("nacked", 1, "delay_ms=1000", 8), ("delivered", 2, "nack", 1000),
         ("nacked", 2, "delay_ms=2000", 8), ("delivered", 3, "nack", 2000), ("nacked", 3, "max_attempts", 8),
         ("dead_lettered", 3, "max_attempts", 0)],
    ),
    "held": (0.06, [("delivered", 1, "first", 3)]),
}  # fmt: skip
WORK_QUEUES = {"orders": ["$default", "billing"], "emails": ["$default"], "jobs": ["$default"]}
STREAM = "ticks"
POLICY = {"mode": "work", "max_attempts": 3, "visibility_timeout_s": 30.0}
TAIL = 0.02  # share of each work queue still unread at the end
EVENTS_PER_MESSAGE = 4.0  # published + about 2.25 events per group, 4/3 groups per queue (measured)


def generate(total_events: int, seed: int = 7) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    start = 1_790_000_000_000
    n_work = int(total_events * 0.85 / EVENTS_PER_MESSAGE / len(WORK_QUEUES))
    n_stream = int(total_events * 0.15 / 2.1)
    ev: list[pd.DataFrame] = []
    messages, groups, pending, queues = [], [], [], []
    dlq_rows: list[pd.DataFrame] = []

    def frame(**cols: Any) -> pd.DataFrame:
        n = max(len(v) for v in cols.values() if isinstance(v, np.ndarray | list))
        return pd.DataFrame(
            {k: (v if isinstance(v, np.ndarray | list) else [v] * n) for k, v in cols.items()}
        )

    for queue, group_names in WORK_QUEUES.items():
        offsets = np.arange(n_work)
        pub_time = start + np.sort(rng.integers(0, 600_000, n_work))
        ev.append(frame(time=pub_time, seq=0, queue=queue, group=None, offset=offsets, consumer="publisher",
                        kind="published", attempt=None, reason=None))  # fmt: skip
        tail = int(n_work * (1 - TAIL))
        live = np.zeros(n_work, dtype=bool)
        live[tail:] = True
        names = list(LIVES)
        shares = np.array([LIVES[n][0] for n in names])
        for group in group_names:
            life = rng.choice(len(names), size=tail, p=shares / shares.sum())
            consumer = rng.integers(0, 3, tail)
            for li, name in enumerate(names):
                picked = np.nonzero(life == li)[0]
                if not len(picked):
                    continue
                t = pub_time[picked].copy()
                who = np.array([f"{group}-c{c}" for c in consumer[picked]], dtype=object)
                for step, (kind, attempt, reason, delay) in enumerate(LIVES[name][1], start=1):
                    t = t + delay + (rng.integers(0, 3, len(picked)) if delay else 0)
                    text: Any = reason
                    if kind == "dead_lettered":
                        text = [
                            f"{reason} -> $dlq/{queue}:{i}" for i in range(len(picked))
                        ]  # renumbered below
                    ev.append(frame(time=t, seq=step, queue=queue, group=group, offset=picked,
                                    consumer=who if kind != "dead_lettered" else None, kind=kind,
                                    attempt=attempt, reason=text))  # fmt: skip
                    if kind == "dead_lettered":
                        dlq_rows.append(frame(time=t, seq=step + 1, source=queue, source_offset=picked))
                if name == "held":
                    live[picked] = True
                    pending.append(frame(queue=queue, group=group, offset=picked, state="held", consumer=who,
                                         node="local", delivered_at=t, attempts=1, available_at=None,
                                         reason=None))  # fmt: skip
            groups.append({"queue": queue, "group": group, "cursor": tail, "committed": 0})
        messages.append(frame(queue=queue, offset=offsets[live], published_at=pub_time[live], expires_at=None,
                              publisher="publisher", protocol="mqtt"))  # fmt: skip
        queues.append({"name": queue, "mode": "work", "policy": json.dumps(POLICY), "next_offset": n_work})

    # Dead letters arrive in the DLQ in time order, numbered from 0 per queue.
    if dlq_rows:
        dead = pd.concat(dlq_rows, ignore_index=True).sort_values(["time", "seq"], kind="stable")
        for source, d in dead.groupby("source"):
            name = f"$dlq/{source}"
            d = d.reset_index(drop=True)
            ev.append(frame(time=d["time"].to_numpy(), seq=d["seq"].to_numpy(), queue=name, group=None,
                            offset=np.arange(len(d)), consumer=None, kind="published", attempt=None,
                            reason=[f"dead_letter from {source}:{o}" for o in d["source_offset"]],
                            ))  # fmt: skip
            messages.append(frame(queue=name, offset=np.arange(len(d)), published_at=d["time"].to_numpy(),
                                  expires_at=None, publisher="publisher", protocol="mqtt"))  # fmt: skip
            queues.append({"name": name, "mode": "work", "policy": json.dumps(POLICY), "next_offset": len(d)})

    # The stream: every message delivered once to one group, committed every ten.
    offsets = np.arange(n_stream)
    pub_time = start + np.sort(rng.integers(0, 600_000, n_stream))
    ev.append(frame(time=pub_time, seq=0, queue=STREAM, group=None, offset=offsets, consumer="publisher",
                    kind="published", attempt=None, reason=None))  # fmt: skip
    ev.append(frame(time=pub_time + 2, seq=1, queue=STREAM, group="readers", offset=offsets,
                    consumer="reader",
                    kind="delivered", attempt=1, reason="first"))  # fmt: skip
    commit_at = offsets[9::10]
    ev.append(frame(time=pub_time[commit_at] + 5, seq=2, queue=STREAM, group="readers", offset=commit_at,
                    consumer="reader", kind="committed", attempt=None, reason=None))  # fmt: skip
    messages.append(frame(queue=STREAM, offset=offsets, published_at=pub_time, expires_at=None,
                          publisher="publisher", protocol="mqtt"))  # fmt: skip
    groups.append(
        {"queue": STREAM, "group": "readers", "cursor": n_stream, "committed": int(commit_at[-1]) + 1}
    )
    queues.append({"name": STREAM, "mode": "stream", "policy": json.dumps({**POLICY, "mode": "stream"}),
                   "next_offset": n_stream})  # fmt: skip

    events = pd.concat(ev, ignore_index=True)
    events["dlq_key"] = events["queue"].str.startswith("$dlq/")
    events = events.sort_values(["time", "seq"], kind="stable").reset_index(drop=True)
    events.insert(0, "id", np.arange(1, len(events) + 1))
    events["node"] = "local"
    events["span"] = 1  # one event a row (the broker joins neighbours; the audit expands them)
    pending_frame = (
        pd.concat(pending, ignore_index=True)
        if pending
        else pd.DataFrame(columns=["queue", "group", "offset", "state", "consumer", "node", "delivered_at",
                                   "attempts", "available_at", "reason"])
    )  # fmt: skip
    return {
        "queues": pd.DataFrame(queues),
        "queue_messages": pd.concat(messages, ignore_index=True),
        "queue_groups": pd.DataFrame(groups),
        "queue_pending": pending_frame,
        "queue_spans": pd.DataFrame(
            columns=["queue", "group", "first_offset", "last_offset", "node", "lease_until"]
        ),
        "queue_events": events.drop(columns=["seq", "dlq_key"]),
    }


def _dlq_reasons(events: pd.DataFrame) -> None:
    """Point each dead_lettered reason at its DLQ offset (as the broker writes it)."""
    dead = events["kind"] == "dead_lettered"
    numbered = events[dead].groupby("queue").cumcount()
    events.loc[dead, "reason"] = [
        f"{r.split(' -> ')[0]} -> $dlq/{q}:{n}"
        for r, q, n in zip(events.loc[dead, "reason"], events.loc[dead, "queue"], numbered, strict=True)
    ]


def write_parquet(tables: dict[str, pd.DataFrame], directory: Path) -> None:
    from trimaran.analytics.source import TABLES

    for name, frame in tables.items():
        out = directory / name
        out.mkdir(parents=True, exist_ok=True)
        cols = {c: frame.get(c) for c in TABLES[name]}
        pd.DataFrame(cols).to_parquet(out / "part-0.parquet", index=False)


def write_sqlite(tables: dict[str, pd.DataFrame], path: Path) -> str:
    import sqlite3

    from trimaran.storage.store import Storage

    url = f"sqlite:///{path}"
    storage = Storage.from_url(url)
    storage.migrate()
    storage.close()
    with sqlite3.connect(path) as db:
        for name, frame in tables.items():
            cols = list(frame.columns)
            if name == "queue_messages":
                extra = {"topic": "t", "routing_key": "", "payload": b"", "qos": 1, "properties": "{}"}
                frame = frame.assign(**extra)
                cols = list(frame.columns)
            if name == "queue_groups":
                frame = frame.assign(updated_at=0)
                cols = list(frame.columns)
            if name == "queues":
                frame = frame.assign(created_at=0)
                cols = list(frame.columns)
            if name == "queue_events":  # rows added by hand (injected faults) are single events
                frame = frame.assign(span=frame["span"].fillna(1) if "span" in frame else 1)
                cols = list(frame.columns)
            rows = frame.astype(object).where(frame.notna(), None).itertuples(index=False, name=None)
            quoted = ", ".join(f'"{c}"' for c in cols)
            db.executemany(f"INSERT INTO {name} ({quoted}) VALUES ({', '.join('?' * len(cols))})", rows)
    return url


def process_tree_cpu(root: int) -> float:
    """CPU seconds (user + system) used so far by ``root`` and every process under it: the driver,
    the JVM (with its JIT threads) and the Python workers. On a shared host this moves far less
    with the other jobs' load than wall time does."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    ticks, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
        stack += children.get(pid, [])
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--format", choices=["parquet", "sqlite"], default="parquet")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--keep", metavar="DIR", help="write the data and report here (default: a temp dir)")
    parser.add_argument("--no-charts", action="store_true")
    parser.add_argument("--results", metavar="FILE", help="append the measurement as one JSON line")
    args = parser.parse_args()

    from trimaran.analytics.replay import local_cores, run_audit
    from trimaran.analytics.source import DEBIAN_JARS, spark_session

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="audit-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tables = generate(args.events)
    _dlq_reasons(tables["queue_events"])
    n_events = len(tables["queue_events"])
    if args.format == "parquet":
        write_parquet(tables, work / "export")
        storage_url = None
    else:
        storage_url = write_sqlite(tables, work / "trimaran.db")
    generated = time.monotonic() - t0
    print(f"generated {n_events} events in {generated:.1f} s ({args.format}, {work})")

    cpu_before = process_tree_cpu(os.getpid())
    load_before = os.getloadavg()[0]
    t1 = time.monotonic()
    spark = spark_session(args.master, list(DEBIAN_JARS), shuffle_partitions=local_cores(args.master))
    started = time.monotonic() - t1
    audit_args = argparse.Namespace(
        parquet=str(work / "export") if args.format == "parquet" else None, since=None, until=None,
        queues=None, output=str(work / "report"), master=args.master, jars=None, no_charts=args.no_charts,
        shuffle_partitions=None,
    )  # fmt: skip
    t2 = time.monotonic()
    code = run_audit(audit_args, storage_url, spark=spark)
    audited = time.monotonic() - t2
    cpu = process_tree_cpu(os.getpid()) - cpu_before
    summary = json.loads((work / "report" / "summary.json").read_text())
    record = {
        "events": n_events,
        "messages": summary["counts"]["messages"],
        "format": args.format,
        "master": args.master,
        "charts": not args.no_charts,
        "spark_start_s": round(started, 1),
        "replay_s": summary["seconds"],
        "audit_with_report_s": round(audited, 1),
        "cpu_s": round(cpu, 1),  # Spark start, replay and report: every process, every core
        "clean": code == 0,
        "host": f"{platform.node()} {len(os.sched_getaffinity(0))} CPUs, load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(record))
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps(record) + "\n")
    spark.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
