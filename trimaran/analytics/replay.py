"""The audit: replay the durable queue tables with PySpark and prove what happened to every message.

The events table is the record. One shuffle brings every row about a message slot (queue, offset)
together: its events, its ``queue_messages`` row and its ``queue_pending`` rows. Each partition is
then replayed in one pass (``life.py``): per group, each message's life (deliveries, settlements,
releases, dead-lettering) is rebuilt in event order, the invariants below are checked as it goes, and
the rebuilt state is compared with the live rows, and each message's ledger (one fate per group)
is drawn up from the events and balanced. Group-level rules (stream commits, cursors) use a small
summary gathered on the driver, where ``copies.py`` also pairs every dead-letter and redrive copy
with its cause. Every violation names the message (``<queue>:<offset>``, the id
the broker hands to consumers) and the event that broke the rule.

A queue deleted and declared again starts its offsets over: events before a ``purged``/``delete``
event belong to an older incarnation (``epoch`` > 0), which is replayed but not compared with the
live tables (they hold only the newest).

Runs from ``trimaran audit``, in local mode or on a cluster (``--master``; ``cluster.py`` ships the
code to the executors), and under ``spark-submit`` (``__main__``). It says how far it got on stderr,
one line per phase (Spark started, tables read, replayed, report written) with counts and seconds;
Spark's own output goes to ``<report>/spark.log`` unless ``--verbose``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from trimaran.analytics import copies
from trimaran.analytics.cluster import CannotRun, Launch, audit_session, explain, parse_conf, spark_errors
from trimaran.analytics.life import (
    CLOCK_SLACK_MS,
    GROUP_KINDS,
    INPUT,
    LIFE,
    OUTPUT,
    TOTALS,
    VIOLATION,
    Context,
    message_id,
    replay_partition,
)  # fmt: skip
from trimaran.analytics.result import AuditResult, _message_id
from trimaran.analytics.source import DEBIAN_JARS, Selection, read_tables
from trimaran.analytics.tenants import label, vhost_column
from trimaran.vhosts import DEFAULT_VHOST, TENANT, prefix

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

INVARIANTS: dict[str, str] = {
    "accounted": "every published message has, in its ledger, one fate per group that existed while it "
    "was live (acked, dead-lettered, dropped, expired, purged or redriven) or is still owed (pending, or "
    "ahead of the cursor): never silently gone, whatever the cursor says",
    "single_fate": "no message has two fates in one group (say acked and dead-lettered), nor two removals",
    "copies_traced": "every dead-letter or redrive copy has exactly one cause event in its source, and "
    "every cause its one copy",
    "published_once": "each offset of a queue is published once",
    "settled_after_delivery": "no ack, nack, reject or release without a delivery of that attempt",
    "acked_once": "no message acked twice in one group",
    "attempts": "a group's deliveries of a message count attempts 1, 2, 3, ...",
    "dead_letter_explained": "every dead letter follows a reject, or a nack or release at max attempts",
    "redelivery_explained": "every redelivery follows a nack, a visibility timeout, a disconnect "
    "or a restart",
    "acked_stays_acked": "nothing is delivered to a group after its ack of the message was committed, "
    "whatever came between (a restart, a release)",
    "final": "nothing is delivered to a group after it dead-lettered or dropped the message",
    "time_ordered": "a message's events are stamped in the order they were logged "
    f"(clocks may differ by up to {CLOCK_SLACK_MS} ms)",
    "commits_monotonic": "a stream group's commits never go backwards",
    "commits_published": "a stream group commits only offsets that were published",
    "finished_removed": "a work queue's message every group finished (acked, dead-lettered or dropped) "
    "is no longer stored; groups that began after it do not count, and shared mode's compaction "
    "may keep it while every group's 'done' marker is there",
    "live_state": "the replayed state equals the live tables (messages, pending entries, cursors)",
}

EXAMPLES = 50  # offending message ids listed per invariant in the summary (all are in the Parquet)
SPARK_LOG = "spark.log"  # in the report directory: Spark's own output, unless --verbose


class Progress:
    """One line on stderr as each phase ends: what it did, with counts, and the seconds it took."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream  # None: sys.stderr when written (so a test's capture sees it)
        self.clock = clock
        self.mark = clock()

    def done(self, phase: str, what: str) -> None:
        now = self.clock()
        seconds, self.mark = now - self.mark, now
        print(f"audit: {phase:<7}{what} ({seconds:.1f} s)", file=self.stream or sys.stderr, flush=True)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _ddl(columns: dict[str, str]) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in columns.items())


def _with_epochs(events: DataFrame) -> DataFrame:
    """``epoch``: how many deletes of its queue come at or after the event (0: the live incarnation).

    Deletes are rare: they are looked up first (a filter the source answers), and when there are
    some, each queue's delete ids ride a broadcast join, so the events are never shuffled for this.
    """
    from pyspark.sql import functions as F

    deleted = (F.col("kind") == "purged") & (F.col("reason") == "delete")
    if not events.filter(deleted).select("id").limit(1).collect():
        return events.withColumn("epoch", F.lit(0))
    deletes = events.filter(deleted).groupBy("queue").agg(F.collect_list("id").alias("_deletes"))
    later = F.filter(F.col("_deletes"), lambda d: d >= F.col("id"))
    return (
        events.join(F.broadcast(deletes), "queue", "left")
        .withColumn("epoch", F.when(F.col("_deletes").isNull(), 0).otherwise(F.size(later)).cast("int"))
        .drop("_deletes")
    )


@dataclass
class Facts:
    """The small per-queue and per-group facts, gathered on the driver in one pass over the events."""

    context: Context
    events_by_kind: dict[str, int]
    live_groups: dict[tuple[str, str], tuple[int | None, int | None]]  # cursor, committed
    commit_high: dict[tuple[str, str], int]  # the live incarnation's highest commit + 1
    delivered_high: dict[tuple[str, str], int]  # the highest offset delivered to a work group
    incarnations: set[tuple[str, int]]  # (queue, epoch) pairs with events
    span: tuple[int | None, int | None]  # the first and last event's time
    # (queue, epoch, group, highest offset committed, last offset published or None)
    commits_beyond: list[tuple[str, int, str, int, int | None]] = field(default_factory=list)


def _policy_number(policy: str | None, key: str, scale: float = 1.0) -> int | None:
    try:
        value = json.loads(policy or "{}").get(key)
        return None if value is None else int(float(value) * scale)
    except (ValueError, TypeError, AttributeError):
        return None


def gather_facts(events: DataFrame, tables: dict[str, DataFrame], selection: Selection) -> Facts:
    from pyspark.sql import functions as F

    col = F.col
    summary = (
        events.groupBy("queue", "epoch", "group", "kind")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("time").alias("first"),
            F.max("time").alias("last"),
            F.max("offset").alias("max_offset"),
            F.min("id").alias("first_id"),
            F.min("offset").alias("min_offset"),
            F.max(F.when(F.coalesce(col("reason") != "delete", F.lit(True)), col("id"))).alias("purge_id"),
        )
        .collect()
    )
    queues = tables["queues"].select("name", "mode", "policy", "next_offset").collect()
    live = tables["queue_groups"].select("queue", "group", "cursor", "committed").collect()
    spans = tables["queue_spans"].select("queue", "group", "first_offset", "last_offset").collect()
    return facts_of(summary, queues, live, selection, spans)


def facts_of(
    summary: list[Any], queues: list[Any], live: list[Any], selection: Selection, spans: Sequence[Any] = ()
) -> Facts:
    """The facts from the events' summary per (queue, epoch, group, kind) (n, first, last,
    max_offset, first_id, min_offset, purge_id), the ``queues`` rows, the ``queue_groups`` rows and
    the ``queue_spans`` rows; plain Python."""
    modes: dict[str, str] = {}
    max_attempts: dict[str, int | None] = {}
    visibility_ms: dict[str, int | None] = {}
    next_offset: dict[str, int | None] = {}
    for q in queues:
        if q["mode"] is not None:
            modes[q["name"]] = q["mode"]
        max_attempts[q["name"]] = _policy_number(q["policy"], "max_attempts")
        visibility_ms[q["name"]] = _policy_number(q["policy"], "visibility_timeout_s", 1000)
        next_offset[q["name"]] = q["next_offset"]
    live_groups = {(g["queue"], g["group"]): (g["cursor"], g["committed"]) for g in live}
    stream_epochs = {(r["queue"], r["epoch"]) for r in summary if r["kind"] == "committed"}
    context = Context(
        modes=modes, stream_epochs=frozenset(stream_epochs), max_attempts=max_attempts,
        visibility_ms=visibility_ms, next_offset=next_offset,
        since_ms=selection.since_ms, until_ms=selection.until_ms,
    )  # fmt: skip
    groups: dict[str, dict[str, int | None]] = {}
    committed: dict[str, dict[str, int | None]] = {}
    for (queue, group), (cursor, position) in live_groups.items():
        groups.setdefault(queue, {})[group] = cursor
        committed.setdefault(queue, {})[group] = position
    kinds: dict[str, int] = {}
    purge_ids: dict[str, int] = {}
    starts: dict[str, dict[str, tuple[int, int | None]]] = {}
    commit_high: dict[tuple[str, str], int] = {}
    delivered_high: dict[tuple[str, str], int] = {}
    for r in summary:
        kind, queue, group = r["kind"], r["queue"], r["group"]
        kinds[kind] = kinds.get(kind, 0) + int(r["n"])
        if r["epoch"] != 0:
            continue
        if kind == "purged" and r["purge_id"] is not None:
            purge_ids[queue] = max(purge_ids.get(queue, 0), int(r["purge_id"]))
        if group is not None and r["first_id"] is not None:
            known = starts.setdefault(queue, {})
            first, low = known.get(group, (r["first_id"], r["min_offset"]))
            lows = [o for o in (low, r["min_offset"]) if o is not None]
            known[group] = (min(first, r["first_id"]), min(lows) if lows else None)
        if group is None or r["max_offset"] is None:
            continue
        work = context.mode(queue, 0) == "work"
        if kind in GROUP_KINDS and work:
            groups.setdefault(queue, {}).setdefault(group, None)
        if kind == "committed":
            commit_high[(queue, group)] = int(r["max_offset"]) + 1
        elif kind == "delivered" and work:
            delivered_high[(queue, group)] = int(r["max_offset"])
    # A stream group's position in the ledger comes from its commit events (the live row is checked
    # against them in _group_violations); a group with none keeps its row's.
    for (queue, group), high in commit_high.items():
        committed.setdefault(queue, {})[group] = high
    held: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for s in spans:
        held.setdefault(s["queue"], {}).setdefault(s["group"], []).append(
            (int(s["first_offset"]), int(s["last_offset"]))
        )
    for by_group in held.values():
        for runs in by_group.values():
            runs.sort()
    context = dataclasses.replace(
        context, groups=groups, committed=committed, purge_ids=purge_ids, firsts=starts, spans=held
    )
    incarnations = {(r["queue"], r["epoch"]) for r in summary}
    firsts = [r["first"] for r in summary if r["first"] is not None]
    lasts = [r["last"] for r in summary if r["last"] is not None]
    span = (min(firsts, default=None), max(lasts, default=None))
    facts = Facts(context, kinds, live_groups, commit_high, delivered_high, incarnations, span)
    facts.commits_beyond = _commits_beyond(summary, next_offset, selection.windowed)
    return facts


def _commits_beyond(
    summary: list[Any], next_offset: dict[str, int | None], windowed: bool
) -> list[tuple[str, int, str, int, int | None]]:
    """Stream groups whose highest commit is past the last offset published in their incarnation.
    With a time window the publications may lie before it: the live queue's next_offset bounds
    the newest incarnation instead."""
    published: dict[tuple[str, int], int] = {}
    for r in summary:
        if r["kind"] == "published" and r["group"] is None and r["max_offset"] is not None:
            key = (r["queue"], r["epoch"])
            published[key] = max(published.get(key, -1), int(r["max_offset"]))
    beyond = []
    for r in summary:
        if r["kind"] != "committed" or r["group"] is None or r["max_offset"] is None:
            continue
        queue, epoch, high = r["queue"], r["epoch"], int(r["max_offset"])
        last = published.get((queue, epoch))
        if windowed:
            bound = next_offset.get(queue) if epoch == 0 else None
            if bound is None:
                continue
            last = bound - 1
        if last is None or high > last:
            beyond.append((queue, epoch, r["group"], high, last))
    return sorted(beyond)


def _group_violations(facts: Facts) -> list[tuple[Any, ...]]:
    """Group rows against the replay: stream committed offsets, work cursors past every delivery."""
    found = []
    for queue, group in sorted(
        facts.live_groups.keys() | facts.commit_high.keys() | facts.delivered_high.keys()
    ):
        cursor, committed = facts.live_groups.get((queue, group), (None, None))
        expect = facts.commit_high.get((queue, group))
        delivered = facts.delivered_high.get((queue, group))
        if cursor is None:
            problem = "events for a group with no queue_groups row"
        elif expect is not None and committed is not None and committed != expect:
            problem = f"committed {committed} but the commits replay to {expect}"
        elif delivered is not None and cursor > 0 and delivered >= cursor:
            problem = f"cursor {cursor} but offset {delivered} was delivered"
        else:
            continue
        offset = next((v for v in (committed, expect, delivered) if v is not None), None)
        found.append(("live_state", queue, group, offset, 0, message_id(queue, offset, 0), None, problem))
    for queue, epoch, group, high, last in facts.commits_beyond:
        published = "nothing was published" if last is None else f"the last offset published is {last}"
        found.append(
            ("commits_published", queue, group, high, epoch, message_id(queue, high, epoch), None,
             f"committed offset {high}, but {published}")
        )  # fmt: skip
    return found


def _slots(events: DataFrame, tables: dict[str, DataFrame], partitions: int) -> DataFrame:
    """Every row about each message slot in one partition, in replay order (``life.INPUT``)."""
    from pyspark.sql import functions as F

    def shaped(frame: DataFrame, **given: Any) -> DataFrame:
        """INPUT's columns: given here, else the frame's own of that name, else null."""
        cols = []
        for name, kind in INPUT.items():
            value = given.get(name, name if name in frame.columns else None)
            expr = F.col(value) if isinstance(value, str) else F.lit(value)
            cols.append(expr.cast(kind).alias(name))
        return frame.select(*cols)

    rows = (
        shaped(events.filter(F.col("offset").isNotNull()), src=F.lit("e"))
        .unionByName(shaped(tables["queue_messages"], src=F.lit("m"), epoch=F.lit(0)))
        .unionByName(
            shaped(tables["queue_pending"], src=F.lit("p"), epoch=F.lit(0), attempt="attempts", reason=None)
        )
    )
    return rows.repartition(partitions, "queue", "offset").sortWithinPartitions(
        "queue", "offset", "epoch", "id"
    )


def _replay_arrow(context: Context) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The executor side: Arrow batches of sorted slot rows in, Arrow batches of OUTPUT rows out."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        types = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "boolean": pa.bool_()}
        schema = pa.schema([(name, types[kind]) for name, kind in OUTPUT.items()])

        def rows() -> Iterator[tuple[Any, ...]]:
            for batch in batches:
                yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)

        for out in replay_partition(context, rows()):
            columns = list(zip(*out.rows, strict=True))
            yield pa.RecordBatch.from_arrays(
                [pa.array(values, type=t) for values, t in zip(columns, schema.types, strict=True)],
                schema=schema,
            )

    return run


def replay(
    tables: dict[str, DataFrame], selection: Selection | None = None, progress: Progress | None = None
) -> AuditResult:
    """Replay and check; nothing is written. ``tables`` come from :func:`source.read_tables`;
    ``progress`` hears when the tables are read and when the replay is done."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    selection = selection or Selection()
    started = time.monotonic()
    col, lit = F.col, F.lit
    spark = tables["queue_events"].sparkSession
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)

    events = _with_epochs(tables["queue_events"]).persist(StorageLevel.MEMORY_AND_DISK)
    facts = gather_facts(events, tables, selection)
    context = facts.context
    if progress is not None:
        queues = len({queue for queue, _epoch in facts.incarnations})
        progress.done(
            "read",
            f"{_plural(sum(facts.events_by_kind.values()), 'event')} of {_plural(queues, 'queue')}",
        )

    # Each message slot's events, live row and pending rows, replayed in one pass (life.py).
    replayed = (
        _slots(events, tables, partitions)
        .mapInArrow(_replay_arrow(context), _ddl(OUTPUT))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    record = col("record")
    lives = replayed.filter(record == "life").select(*LIFE)
    ledger = replayed.filter(record.isin("life", "ledger")).select(*LIFE)
    violations = [replayed.filter(record == "violation").select(*VIOLATION)]

    # Stream commits, in order per group: never backwards.
    commits = events.filter(
        (col("kind") == "committed") & col("group").isNotNull() & col("offset").isNotNull()
    )
    commit_order = Window.partitionBy("queue", "epoch", "group").orderBy("id")
    commits = commits.withColumn(
        "highest_before", F.max("offset").over(commit_order.rowsBetween(Window.unboundedPreceding, -1))
    ).filter(col("offset") < col("highest_before"))
    violations.append(
        commits.select(
            lit("commits_monotonic").alias("invariant"), "queue", "group", "offset", "epoch",
            _message_id(col("queue"), col("offset"), col("epoch")).alias("message_id"),
            col("id").alias("event_id"),
            F.format_string("commit of offset %d after offset %d was committed", col("offset"),
                            col("highest_before")).alias("detail"),
        )
    )  # fmt: skip
    # The per-partition totals, outcome counts, samples, and the events copies.py matches: a few
    # rows per partition and one per dead letter, in one job.
    totals = dict.fromkeys(TOTALS, 0)
    outcomes: dict[tuple[str, str | None], dict[str, int]] = {}
    samples: set[tuple[str, int, int, str]] = set()
    causes: list[tuple[Any, ...]] = []
    made: list[tuple[Any, ...]] = []
    small = replayed.filter(record.isin("totals", "outcome", "sample", "cause", "copy"))
    columns = (
        "record",
        "invariant",
        "queue",
        "group",
        "offset",
        "epoch",
        "event_id",
        "detail",
        "outcome",
        "n",
    )
    for r in small.select(*columns, *TOTALS).collect():
        kind = r["record"]
        if kind == "totals":
            for name in TOTALS:
                totals[name] += int(r[name] or 0)
        elif kind == "outcome":
            counted = outcomes.setdefault((r["queue"], r["group"]), {})
            counted[r["outcome"]] = counted.get(r["outcome"], 0) + int(r["n"])
        elif kind == "sample":
            samples.add((r["queue"], int(r["offset"]), int(r["epoch"]), r["outcome"]))
        elif kind == "cause":
            causes.append((r["queue"], r["offset"], r["epoch"], r["event_id"], r["invariant"], r["group"],
                           r["detail"]))  # fmt: skip
        else:
            made.append((r["queue"], r["offset"], r["epoch"], r["event_id"], r["detail"]))
    group_rows = _group_violations(facts) + copies.trace(causes, made, set(context.next_offset))
    if group_rows:
        violations.append(spark.createDataFrame(group_rows, schema=_ddl(VIOLATION)))

    every = violations[0]
    for frame in violations[1:]:
        every = every.unionByName(frame)
    every = every.persist(StorageLevel.MEMORY_AND_DISK)
    # One job for both the count per invariant and its first examples.
    by_invariant = Window.partitionBy("invariant")
    ranked = (
        every.withColumn("n", F.count(lit(1)).over(by_invariant))
        .withColumn("rank", F.row_number().over(by_invariant.orderBy("queue", "offset", "event_id")))
        .filter(col("rank") <= EXAMPLES)
    )
    counts_by: dict[str, int] = {}
    examples: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(ranked.collect(), key=lambda r: (r["invariant"], r["rank"])):
        counts_by[r["invariant"]] = int(r["n"])
        examples.setdefault(r["invariant"], []).append(
            label(
                {
                    "message_id": r["message_id"],
                    "queue": r["queue"],
                    "offset": r["offset"],
                    "epoch": r["epoch"],
                    "group": r["group"],
                    "event_id": r["event_id"],
                    "detail": r["detail"],
                }
            )
        )
    if any(queue.startswith(TENANT) for queue, _ in facts.incarnations):
        # A tenant's own share of the failures: one more small job, only when there are tenants.
        per_vhost = every.groupBy(vhost_column(col("queue")).alias("vhost"), "invariant").count()
        by_vhost: dict[str, dict[str, int]] = {}
        for r in per_vhost.collect():
            by_vhost.setdefault(r["vhost"], {})[r["invariant"]] = int(r["count"])
    else:
        by_vhost = {DEFAULT_VHOST: dict(counts_by)} if counts_by else {}
    invariants = {
        name: {
            "ok": counts_by.get(name, 0) == 0,
            "description": text,
            "violations": counts_by.get(name, 0),
            "message_ids": sorted({e["message_id"] for e in examples.get(name, [])}),
            "examples": examples.get(name, []),
        }
        for name, text in INVARIANTS.items()
    }
    if progress is not None:
        found = sum(counts_by.values())
        progress.done(
            "replay",
            f"{_plural(totals['messages'], 'message')} ({totals['group_message_pairs']:,} lives in "
            f"consumer groups), {_plural(found, 'violation')}",
        )
    counts: dict[str, Any] = {
        "events": sum(facts.events_by_kind.values()),
        "events_by_kind": dict(sorted(facts.events_by_kind.items())),
        **totals,
        "first_event_at": facts.span[0],
        "last_event_at": facts.span[1],
    }
    # The report's view of the events: with each incarnation's mode.
    modes = spark.createDataFrame(
        [(q, e, context.mode(q, e)) for q, e in sorted(facts.incarnations)] or [("", 0, "work")],
        schema="queue string, epoch int, mode string",
    )
    events = events.join(F.broadcast(modes), ["queue", "epoch"], "left").withColumn(
        "mode", F.coalesce(col("mode"), lit("work"))
    )
    frames = {"events": events, "lives": lives, "ledger": ledger}
    return AuditResult(
        ok=all(v["ok"] for v in invariants.values()),
        invariants=invariants,
        counts=counts,
        violations=every,
        lives=lives,
        frames=frames,
        seconds=time.monotonic() - started,
        outcomes=outcomes,
        samples=sorted(samples),
        violations_by_vhost=by_vhost,
    )


# -- command line (``trimaran audit`` and spark-submit) --------------------------------------------


def parse_time(text: str | None) -> int | None:
    """Epoch milliseconds, or an ISO 8601 date/time (UTC unless it says otherwise)."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    from datetime import UTC, datetime

    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def add_arguments(parser: argparse.ArgumentParser, *, master_default: str | None) -> None:
    parser.add_argument("--parquet", metavar="DIR", help="audit a `trimaran export` instead of the database")
    parser.add_argument(
        "--since", metavar="TIME", help="only messages published at or after (epoch ms or ISO)"
    )
    parser.add_argument("--until", metavar="TIME", help="only messages published before (epoch ms or ISO)")
    parser.add_argument(
        "--queue",
        dest="queues",
        action="append",
        metavar="NAME",
        help="audit this queue (repeatable; default all): its key, or its name in --vhost",
    )
    parser.add_argument(
        "--vhost", metavar="NAME", help="audit only this vhost's queues (default every vhost)"
    )
    parser.add_argument("--output", "-o", default="audit-report", metavar="DIR", help="report directory")
    parser.add_argument(
        "--master",
        default=master_default,
        help="Spark master: local[*], spark://HOST:7077, yarn, k8s://https://HOST:443 (default: "
        + (master_default or "the audit.master setting, local[*]; under spark-submit, its --master")
        + ")",
    )
    parser.add_argument(
        "--jars",
        default=None,
        metavar="JAR[,JAR]",
        help="JDBC driver jars, shipped to the executors (default: " + ", ".join(DEBIAN_JARS) + ")",
    )
    parser.add_argument(
        "--conf",
        action="append",
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.executor.memory=4g (repeatable)",
    )
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts and HTML page")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=f"show Spark's own log and progress bars (default: kept in <output>/{SPARK_LOG})",
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        metavar="N",
        help="spark.sql.shuffle.partitions (default: the cores, local or the cluster's executors')",
    )


def local_cores(master: str | None) -> int:
    """Cores a ``local[N]`` / ``local[*]`` master runs on: one shuffle partition each is enough here."""
    import os

    inner = (master or "").partition("[")[2].partition("]")[0].split(",")[0]
    if inner.isdigit():
        return max(1, int(inner))
    return max(1, len(os.sched_getaffinity(0)))


def launch_of(args: argparse.Namespace, *, default_jars: bool = True) -> Launch:
    """How to start Spark, from the audit's arguments (the CLI has merged ``[audit]`` into them)."""
    given = getattr(args, "jars", None)
    jars = given.split(",") if given else (list(DEBIAN_JARS) if default_jars else None)
    launch = Launch(
        master=args.master,
        jars=jars,
        jars_given=bool(given),
        conf=parse_conf(getattr(args, "conf", None)),
        shuffle_partitions=getattr(args, "shuffle_partitions", None),
    )
    timeout = getattr(args, "executor_timeout_s", None)
    if timeout is not None:
        launch.executor_timeout_s = timeout
    launch.verbose = bool(getattr(args, "verbose", False))
    if not launch.verbose:
        launch.log_file = Path(args.output) / SPARK_LOG
    return launch


def selection_of(args: argparse.Namespace) -> Selection:
    """What the command line asks to audit; with ``--vhost``, ``--queue`` names queues in it."""
    vhost = getattr(args, "vhost", None)  # a Namespace built by a caller may not have it
    queues = args.queues
    if vhost is not None and queues:
        queues = [prefix(vhost) + name for name in queues]  # names in the vhost, as its clients use
    return Selection(tuple(queues) if queues else None, parse_time(args.since), parse_time(args.until), vhost)


def run_audit(
    args: argparse.Namespace,
    storage_url: str | None,
    *,
    default_jars: bool = True,
    spark: SparkSession | None = None,
) -> int:
    """Run, write the report, print a summary; 0 when every invariant holds, 1 when one fails, 2
    (one line on stderr) when the audit could not run. ``spark``: a session to use as it is."""
    selection = selection_of(args)
    if args.parquet:
        storage_url = None
    progress = Progress()
    try:
        if spark is not None:
            return _audit(spark, args, storage_url, selection, progress)
        launch = launch_of(args, default_jars=default_jars)
        with audit_session(launch, storage_url=storage_url) as session:
            partitions = session.conf.get("spark.sql.shuffle.partitions")
            progress.done(
                "spark", f"started on {session.sparkContext.master}, {partitions} shuffle partitions"
            )
            return _audit(session, args, storage_url, selection, progress)
    except CannotRun as exc:
        print(f"trimaran audit: {exc}", file=sys.stderr)
        return 2
    except spark_errors() as exc:
        log.debug("the audit could not run", exc_info=exc)
        print(f"trimaran audit: {explain(exc)}", file=sys.stderr)
        return 2


def _audit(
    spark: SparkSession,
    args: argparse.Namespace,
    storage_url: str | None,
    selection: Selection,
    progress: Progress,
) -> int:
    from trimaran.analytics import report

    if storage_url is None:
        tables = read_tables(spark, selection, parquet=args.parquet)
        source = f"parquet:{args.parquet}"
    else:
        tables = read_tables(spark, selection, storage_url=storage_url)
        source = storage_url.split("@")[-1]  # never print a password
    result = replay(tables, selection, progress)
    summary = report.write(
        result, Path(args.output), source=source, selection=selection, charts=not args.no_charts
    )
    output = Path(args.output)
    charts = len(list((output / "charts").glob("*.png"))) if not args.no_charts else 0
    pages = len([page for page in (output / "messages").glob("*.html") if page.name != "index.html"])
    progress.done(
        "report", f"{output}/index.html, {_plural(charts, 'chart')}, {_plural(pages, 'message page')}"
    )
    for name, outcome in result.invariants.items():
        mark = "ok  " if outcome["ok"] else "FAIL"
        ids = ", ".join(outcome["message_ids"][:10])
        print(f"{mark} {name}: {outcome['violations']} violation(s){' e.g. ' + ids if ids else ''}")
    print(
        f"{summary['counts']['messages']} messages, {summary['counts']['events']} events replayed in "
        f"{result.seconds:.1f} s; report in {args.output}/index.html"
    )
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point under spark-submit: ``spark-submit .../replay.py --storage URL -o DIR``."""
    parser = argparse.ArgumentParser(
        prog="trimaran-audit", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--storage", metavar="URL", help="sqlite:///path or postgresql://user@host/db")
    add_arguments(parser, master_default=None)
    args = parser.parse_args(argv)
    if not args.storage and not args.parquet:
        parser.error("give --storage URL or --parquet DIR")
    return run_audit(args, args.storage, default_jars=False)


if __name__ == "__main__":
    sys.exit(main())
