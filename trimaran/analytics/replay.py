"""The audit: replay the durable queue tables with PySpark and prove what happened to every message.

The events table is the record. Per (queue, group, offset) the job orders the events by id and
rebuilds each message's life (deliveries, settlements, releases, dead-lettering) and each group's
final state (cursor, committed offset, pending entries); then it checks the invariants below and
compares the rebuilt state with the live tables. Every violation names the message
(``<queue>:<offset>``, the id the broker hands to consumers) and the event that broke the rule.

A queue deleted and declared again starts its offsets over: events before a ``purged``/``delete``
event belong to an older incarnation (``epoch`` > 0), which is replayed but not compared with the
live tables (they hold only the newest).

Runs in local mode from ``trimaran audit`` and on a cluster with ``spark-submit`` (``__main__``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trimaran.analytics.source import DEBIAN_JARS, Selection, read_tables, spark_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

INVARIANTS: dict[str, str] = {
    "accounted": "every published message is, per group, acked, pending, expired, dead-lettered, "
    "dropped, redriven or purged: never silently gone",
    "settled_after_delivery": "no ack, nack, reject or release without a delivery of that attempt",
    "acked_once": "no message acked twice in one group",
    "attempts": "a group's deliveries of a message count attempts 1, 2, 3, ...",
    "dead_letter_explained": "every dead letter follows a reject, or a nack or release at max attempts",
    "redelivery_explained": "every redelivery follows a nack, a visibility timeout, a disconnect "
    "or a restart",
    "commits_monotonic": "a stream group's commits never go backwards",
    "live_state": "the replayed state equals the live tables (messages, pending entries, cursors)",
}

KEY = ["queue", "epoch", "group", "offset"]
GROUP_KINDS = ["delivered", "acked", "nacked", "rejected", "released", "dead_lettered", "dropped"]
FINISHED = "finished"
EXAMPLES = 50  # offending message ids listed per invariant in the summary (all are in the Parquet)


@dataclass
class AuditResult:
    ok: bool
    invariants: dict[str, dict[str, Any]]
    counts: dict[str, Any]
    violations: DataFrame
    lives: DataFrame
    frames: dict[str, DataFrame] = field(default_factory=dict)
    seconds: float = 0.0


def _message_id(queue: Column, offset: Column, epoch: Column) -> Column:
    from pyspark.sql import functions as F

    base = F.concat(queue, F.lit(":"), offset.cast("string"))
    return F.when(epoch > 0, F.concat(base, F.lit("@epoch"), epoch.cast("string"))).otherwise(base)


def _violation(frame: DataFrame, invariant: str | Column, detail: Column) -> DataFrame:
    """Offending rows in one shape: invariant, queue, group, offset, message id, event id, detail."""
    from pyspark.sql import functions as F

    cols = set(frame.columns)
    epoch = F.col("epoch") if "epoch" in cols else F.lit(0)
    return frame.select(
        (F.lit(invariant) if isinstance(invariant, str) else invariant).cast("string").alias("invariant"),
        F.col("queue"),
        (F.col("group") if "group" in cols else F.lit(None)).cast("string").alias("group"),
        F.col("offset").cast("bigint").alias("offset"),
        epoch.cast("int").alias("epoch"),
        _message_id(F.col("queue"), F.col("offset"), epoch).alias("message_id"),
        (F.col("id") if "id" in cols else F.lit(None)).cast("bigint").alias("event_id"),
        detail.cast("string").alias("detail"),
    )


def _checks(frame: DataFrame, checks: list[tuple[str, Column, Column]]) -> DataFrame:
    """Several (invariant, failed, detail) checks over one frame in a single pass.

    A row yields one violation per check it fails. Spark then scans (and joins) ``frame`` once
    rather than once per check, which is what costs time: each scan adds jobs and stages.
    """
    from pyspark.sql import functions as F

    failed = F.array(
        *[
            F.when(F.coalesce(condition, F.lit(False)), F.struct(F.lit(name).alias("i"), detail.alias("d")))
            for name, condition, detail in checks
        ]
    )
    exploded = frame.withColumn("_failed", F.explode(F.filter(failed, lambda v: v.isNotNull())))
    return _violation(exploded, F.col("_failed.i"), F.col("_failed.d"))


def _with_epochs(events: DataFrame) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    deleted = (F.col("kind") == "purged") & (F.col("reason") == "delete")
    if events.filter(deleted).limit(1).count() == 0:
        return events.withColumn("epoch", F.lit(0))
    newest_first = Window.partitionBy("queue").orderBy(F.col("id").desc())
    epoch = F.sum(F.when(deleted, 1).otherwise(0)).over(
        newest_first.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return events.withColumn("epoch", epoch.cast("int"))


def replay(tables: dict[str, DataFrame], selection: Selection | None = None) -> AuditResult:
    """Replay and check; nothing is written. ``tables`` come from :func:`source.read_tables`."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    selection = selection or Selection()
    started = time.monotonic()
    col, lit = F.col, F.lit
    kind = col("kind")

    queues = tables["queues"].select(
        col("name").alias("queue"),
        col("mode"),
        F.get_json_object("policy", "$.max_attempts").cast("int").alias("max_attempts"),
        (F.get_json_object("policy", "$.visibility_timeout_s").cast("double") * 1000)
        .cast("bigint")
        .alias("visibility_ms"),
        col("next_offset"),
    )
    events = _with_epochs(tables["queue_events"])
    # A queue's mode: the live row for the newest incarnation; older ones are streams if they commit.
    # Its policy (max attempts, visibility timeout) is known only for the newest: older incarnations
    # are checked without one, as a queue with no row would be.
    streams = (
        events.filter(kind == "committed").select("queue", "epoch").distinct().withColumn("commits", lit(1))
    )
    events = (
        events.join(F.broadcast(queues.drop("next_offset")), "queue", "left")
        .join(F.broadcast(streams), ["queue", "epoch"], "left")
        .withColumn(
            "mode",
            F.when((col("epoch") == 0) & col("mode").isNotNull(), col("mode"))
            .when(col("commits").isNotNull(), lit("stream"))
            .otherwise(lit("work")),
        )
        .drop("commits")
        .withColumn("max_attempts", F.when(col("epoch") == 0, col("max_attempts")))
        .withColumn("visibility_ms", F.when(col("epoch") == 0, col("visibility_ms")))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )

    published = events.filter((kind == "published") & col("offset").isNotNull()).select(
        "queue", "epoch", "offset", col("id").alias("pub_id"), col("time").alias("pub_time"), "mode"
    )
    if selection.since_ms is not None:
        published = published.filter(col("pub_time") >= selection.since_ms)
    if selection.until_ms is not None:
        published = published.filter(col("pub_time") < selection.until_ms)
    messages = published.groupBy("queue", "epoch", "offset").agg(
        F.count(lit(1)).alias("publishes"),
        F.min("pub_id").alias("pub_id"),
        F.min("pub_time").alias("pub_time"),
        F.first("mode").alias("mode"),
    )
    messages = messages.persist(StorageLevel.MEMORY_AND_DISK)

    # -- each group's history of each message, in event order -------------------------------------
    group_events = events.filter(
        col("group").isNotNull()
        & col("offset").isNotNull()
        & kind.isin(GROUP_KINDS)
        & (col("mode") == "work")
    )
    if selection.windowed:
        group_events = group_events.join(
            messages.select("queue", "epoch", "offset"), ["queue", "epoch", "offset"], "left_semi"
        )
    in_order = Window.partitionBy(*KEY).orderBy("id")
    before = in_order.rowsBetween(Window.unboundedPreceding, -1)
    delivered = kind == "delivered"
    history = group_events.select(
        "*",
        F.lag("kind").over(in_order).alias("prev_kind"),
        F.lag("attempt").over(in_order).alias("prev_attempt"),
        F.lag("reason").over(in_order).alias("prev_reason"),
        F.lag("time").over(in_order).alias("prev_time"),
        F.coalesce(F.sum(F.when(delivered, 1).otherwise(0)).over(before), lit(0)).alias("deliveries_before"),
        F.last(F.when(delivered, col("attempt")), ignorenulls=True).over(before).alias("last_attempt"),
        F.last(F.when(delivered, col("time")), ignorenulls=True).over(before).alias("last_delivery_time"),
    ).persist(StorageLevel.MEMORY_AND_DISK)

    violations: list[DataFrame] = []

    settles = kind.isin("acked", "nacked", "rejected", "released")
    history_checks: list[tuple[str, Column, Column]] = []
    history_checks.append(
        (
            "settled_after_delivery",
            settles & (col("last_attempt").isNull() | (col("last_attempt") != col("attempt"))),
            F.concat_ws(
                " ",
                kind,
                F.concat(lit("attempt "), F.coalesce(col("attempt").cast("string"), lit("?"))),
                F.when(col("last_attempt").isNull(), lit("with no delivery before it")).otherwise(
                    F.concat(lit("but the last delivery was attempt "), col("last_attempt").cast("string"))
                ),
            ),
        )
    )
    history_checks.append(
        (
            "attempts",
            delivered & (F.coalesce(col("attempt"), lit(-1)) != col("deliveries_before") + 1),
            F.format_string(
                "delivery numbered attempt %s is delivery %d of this group",
                F.coalesce(col("attempt").cast("string"), lit("?")),
                col("deliveries_before") + 1,
            ),
        )
    )
    at_max = col("prev_attempt") >= F.coalesce(col("max_attempts"), lit(1))
    explained_dead = (
        (col("prev_kind") == "rejected")
        | ((col("prev_kind") == "nacked") & (col("prev_reason") == "max_attempts") & at_max)
        | ((col("prev_kind") == "released") & at_max)
    )
    history_checks.append(
        (
            "dead_letter_explained",
            kind.isin("dead_lettered", "dropped") & ~F.coalesce(explained_dead, lit(False)),
            F.format_string(
                "%s (%s) after %s, attempt %s of max %s",
                kind,
                F.coalesce(col("reason"), lit("no reason")),
                F.coalesce(col("prev_kind"), lit("nothing")),
                F.coalesce(col("prev_attempt").cast("string"), lit("?")),
                F.coalesce(col("max_attempts").cast("string"), lit("?")),
            ),
        )
    )
    timed_out = (
        (col("prev_reason") != "timeout")
        | col("visibility_ms").isNull()
        | (col("prev_time") >= col("last_delivery_time") + col("visibility_ms"))
    )
    explained_redelivery = (
        (
            (col("prev_kind") == "nacked")
            & (col("reason") == "nack")
            & (F.coalesce(col("prev_reason"), lit("")) != "max_attempts")
        )
        | ((col("prev_kind") == "released") & (col("reason") == col("prev_reason")) & timed_out)
        | ((col("reason") == "lease_expired") & (col("prev_kind") == "delivered"))  # a node died
    )
    history_checks.append(
        (
            "redelivery_explained",
            delivered & (col("deliveries_before") > 0) & ~F.coalesce(explained_redelivery, lit(False)),
            F.format_string(
                "attempt %s delivered for reason %s after %s (%s)",
                F.coalesce(col("attempt").cast("string"), lit("?")),
                F.coalesce(col("reason"), lit("none")),
                F.coalesce(col("prev_kind"), lit("nothing")),
                F.coalesce(col("prev_reason"), lit("no reason")),
            ),
        )
    )
    violations.append(_checks(history, history_checks))

    # -- each (group, message): its final state ---------------------------------------------------
    lives = history.groupBy(*KEY).agg(
        F.max_by("kind", "id").alias("last_kind"),
        F.max_by("reason", "id").alias("last_reason"),
        F.max(F.when(delivered, col("attempt"))).alias("attempts"),
        F.max_by("consumer", F.when(delivered, col("id"))).alias("holder"),
        F.sum(F.when(delivered, 1).otherwise(0)).alias("deliveries"),
        F.sum(F.when(kind == "acked", 1).otherwise(0)).alias("acks"),
        F.min(F.when(delivered, col("time"))).alias("first_delivered_at"),
        F.max(F.when(kind == "acked", col("time"))).alias("acked_at"),
        F.max(F.when(kind.isin("dead_lettered", "dropped"), col("time"))).alias("dead_lettered_at"),
        F.max("id").alias("last_id"),
    )
    last_kind = col("last_kind")
    lives = lives.withColumn(
        "status",
        F.when(last_kind == "delivered", lit("held"))
        .when(last_kind == "released", lit("wait"))
        .when(
            (last_kind == "nacked") & (F.coalesce(col("last_reason"), lit("")) != "max_attempts"), lit("wait")
        )
        .otherwise(lit(FINISHED)),
    ).persist(StorageLevel.MEMORY_AND_DISK)

    violations.append(
        _violation(
            lives.filter(col("acks") > 1),
            "acked_once",
            F.format_string("acked %d times", col("acks")),
        )
    )

    # -- stream commits ---------------------------------------------------------------------------
    commits = events.filter((kind == "committed") & col("group").isNotNull() & col("offset").isNotNull())
    commit_order = Window.partitionBy("queue", "epoch", "group").orderBy("id")
    commits = commits.withColumn(
        "highest_before", F.max("offset").over(commit_order.rowsBetween(Window.unboundedPreceding, -1))
    )
    violations.append(
        _violation(
            commits.filter(col("offset") < col("highest_before")),
            "commits_monotonic",
            F.format_string(
                "commit of offset %d after offset %d was committed", col("offset"), col("highest_before")
            ),
        )
    )

    # -- everything accounted for, and the live tables (newest incarnation only) -------------------
    current = events.filter(col("epoch") == 0)
    removed_one = (
        # Queue-level removals: TTL, overflow, and dead letters moved back by the admin API (redrive).
        current.filter(
            kind.isin("expired", "dropped", "redriven") & col("group").isNull() & col("offset").isNotNull()
        )
        .groupBy("queue", "offset")
        .agg(F.min("id").alias("removed_id"), F.min_by("kind", "id").alias("removed_by"))
    )
    purges = (
        current.filter((kind == "purged") & F.coalesce(col("reason") != "delete", lit(True)))
        .groupBy("queue")
        .agg(F.max("id").alias("purge_id"))
    )
    live_messages = (
        tables["queue_messages"].select("queue", "offset").distinct().withColumn("live", lit(True))
    )
    live_groups = tables["queue_groups"].select("queue", "group", "cursor", "committed")
    current_lives = lives.filter(col("epoch") == 0).drop("epoch")
    event_groups = current_lives.select("queue", "group").distinct()
    groups = live_groups.join(event_groups, ["queue", "group"], "full_outer")

    msgs = (
        messages.filter(col("epoch") == 0)
        .join(removed_one, ["queue", "offset"], "left")
        .join(F.broadcast(purges), "queue", "left")
        .join(live_messages, ["queue", "offset"], "left")
        .withColumn("live", F.coalesce(col("live"), lit(False)))
        .withColumn(
            "removed",
            col("removed_id").isNotNull() | (col("purge_id").isNotNull() & (col("pub_id") < col("purge_id"))),
        )
    )
    per_group = (
        msgs.filter((col("mode") == "work") & ~col("removed"))
        .select("queue", "offset")
        .join(groups, "queue")
        .join(
            current_lives.select("queue", "group", "offset", "status"), ["queue", "group", "offset"], "left"
        )
        .withColumn(
            "done",
            (col("status") == FINISHED)
            | (col("status").isNull() & col("cursor").isNotNull() & (col("offset") < col("cursor"))),
        )
        .groupBy("queue", "offset")
        .agg(
            F.count(lit(1)).alias("groups"),
            F.sum(F.when(col("done"), 1).otherwise(0)).alias("groups_done"),
            F.concat_ws(
                ",",
                F.sort_array(
                    F.collect_list(
                        F.when(
                            ~col("done"),
                            F.concat(col("group"), lit("="), F.coalesce(col("status"), lit("undelivered"))),
                        )
                    )
                ),
            ).alias("open_groups"),
        )
    )
    msgs = msgs.join(per_group, ["queue", "offset"], "left").persist(StorageLevel.MEMORY_AND_DISK)
    all_done = (col("groups") > 0) & (col("groups_done") == col("groups"))

    next_offsets = queues.select("queue", "next_offset")
    message_checks: list[tuple[str, Column, Column]] = []
    message_checks.append(
        (
            "accounted",
            ~col("live") & ~col("removed") & ((col("mode") == "stream") | ~F.coalesce(all_done, lit(False))),
            F.when(
                col("mode") == "stream",
                lit("stream message gone from queue_messages without a drop, expiry or purge"),
            )
            .when(
                F.coalesce(col("groups"), lit(0)) == 0, lit("gone from queue_messages; no group finished it")
            )
            .otherwise(
                F.concat(
                    lit("gone from queue_messages while groups had not finished it: "), col("open_groups")
                )
            ),
        )
    )
    message_checks.append(
        (
            "accounted",
            col("publishes") > 1,
            F.format_string("published %d times under one offset", col("publishes")),
        )
    )
    if not selection.windowed:  # a history without its publication
        orphans = lives.join(messages, ["queue", "epoch", "offset"], "left_anti")
        violations.append(
            _violation(
                orphans,
                "accounted",
                F.concat(lit("group history ("), last_kind, lit(") but no published event")),
            )
        )

    message_checks.append(
        (
            "live_state",
            col("live") & (col("removed") | ((col("mode") == "work") & F.coalesce(all_done, lit(False)))),
            F.when(
                col("removed"),
                F.concat(
                    lit("still in queue_messages after "), F.coalesce(col("removed_by"), lit("a purge"))
                ),
            ).otherwise(lit("still in queue_messages though every group finished it")),
        )
    )
    message_checks.append(
        (
            "live_state",
            col("next_offset").isNotNull() & (col("offset") >= col("next_offset")),
            F.format_string("offset at or past the queue's next_offset %d", col("next_offset")),
        )
    )
    violations.append(_checks(msgs.join(F.broadcast(next_offsets), "queue", "left"), message_checks))
    if not selection.windowed:
        unlogged = live_messages.join(messages.filter(col("epoch") == 0), ["queue", "offset"], "left_anti")
        violations.append(_violation(unlogged, "live_state", lit("in queue_messages but never published")))

    # Pending entries: replayed open entries against queue_pending.
    pending = tables["queue_pending"].select(
        "queue", "group", "offset",
        col("state").alias("live_state"),
        col("attempts").alias("live_attempts"),
        col("consumer").alias("live_consumer"),
    )  # fmt: skip
    if selection.windowed:
        pending = pending.join(msgs.select("queue", "offset"), ["queue", "offset"], "left_semi")
    entries = (
        current_lives.select("queue", "group", "offset", "status", "attempts", "holder")
        .join(pending, ["queue", "group", "offset"], "full_outer")
        .join(msgs.select("queue", "offset", "live", "removed"), ["queue", "offset"], "left")
        .join(live_groups.select("queue", "group", "cursor"), ["queue", "group"], "left")
    )
    is_open = col("status").isin("held", "wait") & ~F.coalesce(col("removed"), lit(False))
    live_open = col("live_state").isin("held", "wait")
    replayed = F.coalesce(col("status"), lit("never delivered"))
    mismatch = (
        F.when(is_open & col("live_state").isNull() & F.coalesce(col("live"), lit(False)),
               F.format_string("replay: %s attempt %d; no pending row", col("status"), col("attempts")))
        .when(live_open & ~F.coalesce(is_open, lit(False)),
              F.format_string("pending row %s but replay: %s", col("live_state"), replayed))
        .when(is_open & live_open & (col("status") != col("live_state")),
              F.format_string("pending row %s but replay: %s", col("live_state"), col("status")))
        .when(is_open & live_open & (col("attempts") != col("live_attempts")),
              F.format_string("pending row attempts %d but replay: %d",
                              col("live_attempts"), col("attempts")))
        .when(is_open & (col("status") == "held") & (col("live_state") == "held")
              & ~F.coalesce(col("holder") == col("live_consumer"), lit(True)),
              F.format_string("held by %s but replay: %s", col("live_consumer"), col("holder")))
        .when((col("live_state") == "done") & ~F.coalesce(col("status") == FINISHED, lit(False)),
              F.format_string("pending row done but replay: %s", replayed))
        .when((col("status") == FINISHED) & col("live_state").isNull() & F.coalesce(col("live"), lit(False))
              & ~F.coalesce(col("removed"), lit(False)) & col("cursor").isNotNull()
              & (col("offset") >= col("cursor")),
              lit("finished ahead of the cursor but no done row"))
    )  # fmt: skip
    entries = entries.withColumn("mismatch", mismatch)
    violations.append(_violation(entries.filter(col("mismatch").isNotNull()), "live_state", col("mismatch")))

    # Group rows: stream committed offsets, work cursors past every delivery.
    commit_high = (
        commits.filter(col("epoch") == 0)
        .groupBy("queue", "group")
        .agg((F.max("offset") + 1).alias("expect_committed"))
    )
    delivered_high = (
        events.filter((col("epoch") == 0) & delivered & (col("mode") == "work"))
        .groupBy("queue", "group")
        .agg(F.max("offset").alias("max_delivered"))
    )
    group_check = (
        live_groups.join(commit_high, ["queue", "group"], "full_outer")
        .join(delivered_high, ["queue", "group"], "full_outer")
        .withColumn("offset", F.coalesce(col("committed"), col("expect_committed"), col("max_delivered")))
    )
    group_problem = (
        F.when(col("cursor").isNull(), lit("events for a group with no queue_groups row"))
        .when(col("expect_committed").isNotNull() & (col("committed") != col("expect_committed")),
              F.format_string("committed %d but the commits replay to %d",
                              col("committed"), col("expect_committed")))
        .when(col("max_delivered").isNotNull() & (col("cursor") > 0)
              & (col("max_delivered") >= col("cursor")),
              F.format_string("cursor %d but offset %d was delivered", col("cursor"), col("max_delivered")))
    )  # fmt: skip
    group_check = group_check.withColumn("problem", group_problem)
    violations.append(
        _violation(group_check.filter(col("problem").isNotNull()), "live_state", col("problem"))
    )

    # -- collect ---------------------------------------------------------------------------------
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
            {
                "message_id": r["message_id"],
                "group": r["group"],
                "event_id": r["event_id"],
                "detail": r["detail"],
            }
        )
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
    kinds = {r["kind"]: int(r["n"]) for r in events.groupBy("kind").agg(F.count(lit(1)).alias("n")).collect()}
    totals = msgs.agg(
        F.count(lit(1)).alias("messages"),
        F.sum(F.when(col("live"), 1).otherwise(0)).alias("live"),
        F.sum(F.when(col("removed"), 1).otherwise(0)).alias("removed"),
    ).first()
    counts: dict[str, Any] = {
        "events": sum(kinds.values()),
        "events_by_kind": dict(sorted(kinds.items())),
        "messages": int(totals["messages"] or 0) if totals else 0,
        "messages_live": int(totals["live"] or 0) if totals else 0,
        "messages_removed": int(totals["removed"] or 0) if totals else 0,
        "group_message_pairs": lives.count(),
    }
    frames = {"events": events, "lives": lives, "messages": msgs, "commits": commits}
    return AuditResult(
        ok=all(v["ok"] for v in invariants.values()),
        invariants=invariants,
        counts=counts,
        violations=every,
        lives=lives,
        frames=frames,
        seconds=time.monotonic() - started,
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
        help="audit this queue (repeatable; default all)",
    )
    parser.add_argument("--output", "-o", default="audit-report", metavar="DIR", help="report directory")
    parser.add_argument(
        "--master", default=master_default, help=f"Spark master (default: {master_default or 'spark-submit'})"
    )
    parser.add_argument(
        "--jars",
        default=None,
        metavar="JAR[,JAR]",
        help="JDBC driver jars (default: " + ", ".join(DEBIAN_JARS) + ")",
    )
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts and HTML page")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        metavar="N",
        help="spark.sql.shuffle.partitions (default: the local cores in local mode, else Spark's)",
    )


def local_cores(master: str | None) -> int:
    """Cores a ``local[N]`` / ``local[*]`` master runs on: one shuffle partition each is enough here."""
    import os

    inner = (master or "").partition("[")[2].partition("]")[0].split(",")[0]
    if inner.isdigit():
        return max(1, int(inner))
    return max(1, len(os.sched_getaffinity(0)))


def run_audit(
    args: argparse.Namespace,
    storage_url: str | None,
    *,
    default_jars: bool = True,
    spark: SparkSession | None = None,
) -> int:
    """Run, write the report, print a summary; 0 when every invariant holds, 1 otherwise."""
    from trimaran.analytics import report

    selection = Selection(
        tuple(args.queues) if args.queues else None, parse_time(args.since), parse_time(args.until)
    )
    jars = args.jars.split(",") if args.jars else (list(DEBIAN_JARS) if default_jars else None)
    local = args.master is not None and args.master.startswith("local")
    if spark is None:
        cores = local_cores(args.master) if local else None
        partitions = getattr(args, "shuffle_partitions", None) or cores
        spark = spark_session(args.master, jars, shuffle_partitions=partitions)
    if args.parquet:
        tables = read_tables(spark, selection, parquet=args.parquet)
        source = f"parquet:{args.parquet}"
    else:
        assert storage_url is not None
        tables = read_tables(spark, selection, storage_url=storage_url)
        source = storage_url.split("@")[-1]  # never print a password
    result = replay(tables, selection)
    summary = report.write(
        result, Path(args.output), source=source, selection=selection, charts=not args.no_charts
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
