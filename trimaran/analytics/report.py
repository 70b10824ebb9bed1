"""The audit's report: ``summary.json``, Parquet details, PNG charts and HTML pages a person reads.

``index.html`` opens with a summary in words (the window as dates, the totals, which rules hold),
then every violation with the offending message's events inline, a table of what became of each
queue's messages per group, and the charts. ``messages/`` holds one page per message with a
violation and per sampled message (a few of each outcome per queue): its life across groups, with
times, consumers and reasons; ``messages/index.html`` lists them with a search box.

Figures, per queue and group: throughput over time, publish -> ack latency (one chart per queue),
deliveries by reason, dead letters by reason, each consumer's share of deliveries, and lag over
time. The aggregation runs in Spark; only small tables come to the driver.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import re
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trimaran.analytics.life import OUTCOMES
from trimaran.analytics.source import Selection
from trimaran.analytics.tenants import outcomes_by_vhost, shown_id, vhost_column, vhost_summary
from trimaran.vhosts import DEFAULT_VHOST, split_key

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from trimaran.analytics.result import AuditResult

MAX_SERIES = 8  # lines or bars per chart; the busiest queues and groups are shown
BUCKETS = 120  # time buckets across the audited span
SPARSE = 12  # a series with at most this many non-zero buckets is drawn with markers
SHOWN_PER_INVARIANT = 20  # violations shown with their timeline per rule (all are in the Parquet)
PAGES_PER_OUTCOME = 2  # sampled message pages per queue and outcome
# The latency chart's quantiles (1.0 is the maximum).
QUANTILES = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)
# The outcome table's columns: (outcome, heading); a group's "published" splits into the columns
# after "redelivered" exactly once (life.OUTCOMES).
COLUMNS = (
    ("published", "published"),
    ("acked", "acked"),
    ("redelivered", "redelivered"),
    ("dead_lettered", "dead-lettered"),
    ("dropped", "dropped"),
    ("expired", "expired"),
    ("purged", "purged"),
    ("redriven", "redriven"),
    ("pending", "still pending"),
    ("ahead", "not yet delivered"),
    ("lost", "unaccounted"),
)
assert {c for c, _ in COLUMNS} <= set(OUTCOMES)
OUTCOME_WORDS = {
    "acked": "acked",
    "redelivered": "redelivered",
    "dead_lettered": "dead-lettered",
    "dropped": "dropped",
    "expired": "expired",
    "purged": "purged",
    "redriven": "redriven",
    "pending": "still pending",
    "ahead": "not yet delivered",
    "lost": "unaccounted for",
}
# The queue's own row: what became of each message as a whole, under the group columns it matches.
QUEUE_CELLS = {"published": "published", "acked": "finished", "dropped": "dropped", "expired": "expired",
               "purged": "purged", "redriven": "redriven", "pending": "stored", "lost": "lost"}  # fmt: skip


# -- words and times --------------------------------------------------------------------------------


def when(ms: int | None, *, precise: bool = True) -> str:
    """Epoch milliseconds as a UTC date and time a person reads."""
    if ms is None:
        return "unknown"
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    if precise:
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"
    return moment.strftime("%-d %b %Y %H:%M:%S UTC")


def duration(ms: int | float) -> str:
    """A span in words: "850 ms", "12 seconds", "10 minutes 5 seconds", "3 hours 20 minutes"."""
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms // 1000
    parts = []
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        if seconds >= size:
            n, seconds = divmod(seconds, size)
            parts.append(f"{n} {unit}{'s' if n != 1 else ''}")
    return " ".join(parts[:2])


def elapsed(ms: int) -> str:
    """Time since publication in a timeline: exact when short."""
    if abs(ms) < 10_000:
        return f"{ms:,} ms"
    if abs(ms) < 60_000:
        return f"{ms / 1000:.1f} s"
    return duration(ms)


def _ms_label(value: float, _position: object = None) -> str:
    """A latency axis tick: 10 ms, 1 s, 2 min."""
    if value < 1000:
        return f"{value:g} ms"
    if value < 60_000:
        return f"{value / 1000:g} s"
    return f"{value / 60_000:g} min"


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def slug(message_id: str) -> str:
    """A file name for a message id (``$dlq/orders:3`` has characters no URL should carry)."""
    clean = re.sub(r"[^A-Za-z0-9]+", "_", message_id).strip("_")[:60]
    return f"{clean}-{hashlib.sha1(message_id.encode()).hexdigest()[:8]}"


# -- the numbers behind the charts ------------------------------------------------------------------


def _grid(lo: int, hi: int) -> tuple[int, list[int]]:
    """The bucket width and every bucket's start across [lo, hi]."""
    bucket_ms = max(1000, math.ceil((hi - lo + 1) / BUCKETS))
    return bucket_ms, list(range(lo, hi + 1, bucket_ms))


def zero_filled(frame: pd.DataFrame, keys: list[str], value: str, grid: list[int]) -> pd.DataFrame:
    """Every series (``keys``) with a row per bucket of ``grid``: idle buckets count 0, so a line
    drops to zero across a gap instead of sloping over it."""
    import pandas as pd

    if frame.empty:
        return frame
    parts = []
    for key, series in frame.groupby(keys, dropna=False):
        values = series.groupby("bucket")[value].sum().reindex(grid, fill_value=0)
        part = pd.DataFrame({"bucket": grid, value: values.to_numpy()})
        for name, v in zip(keys, key if isinstance(key, tuple) else (key,), strict=True):
            part[name] = v
        parts.append(part)
    return pd.concat(parts, ignore_index=True)[[*keys, "bucket", value]]


def figure_tables(result: AuditResult) -> dict[str, pd.DataFrame]:
    """The numbers behind each chart, as small pandas frames.

    Three Spark jobs: one aggregate over the events by queue, group, kind and time bucket (with the
    reason where a chart splits by it), one of deliveries per consumer, and the latency quantiles
    over the lives. The charts' tables are cut from the first in pandas.
    """
    from pyspark.sql import functions as F

    col, lit = F.col, F.lit
    events = result.frames["events"]
    lives = result.frames["lives"].filter(col("epoch") == 0)
    lo, hi = result.counts.get("first_event_at") or 0, result.counts.get("last_event_at") or 0
    bucket_ms, grid = _grid(lo, hi)
    bucket = (F.floor((col("time") - lo) / bucket_ms) * bucket_ms + lo).cast("bigint").alias("bucket")
    kind = col("kind")
    delivered = kind == "delivered"
    gone = kind.isin("dead_lettered", "dropped", "expired")
    detail = F.when(delivered, F.coalesce(col("reason"), lit("first"))).when(
        gone, F.coalesce(F.split(col("reason"), " -> ").getItem(0), lit("none"))
    )
    counted: pd.DataFrame = (
        events.groupBy("queue", "group", "kind", "epoch", "mode", bucket, detail.alias("detail"))
        .agg(F.count(lit(1)).alias("n"), F.max("offset").alias("max_offset"))
        .toPandas()
    )
    keys = {"dropna": False, "as_index": False}

    tables: dict[str, pd.DataFrame] = {}
    flow = counted[counted["kind"].isin(["published", "acked", "dead_lettered", "committed"])]
    throughput = zero_filled(flow, ["queue", "kind"], "n", grid)
    if not throughput.empty:
        throughput["rate_per_s"] = throughput["n"] * 1000.0 / bucket_ms
    tables["throughput"] = throughput
    latency = lives.filter(col("acked_at").isNotNull() & col("pub_time").isNotNull())
    quantiles = (
        latency.withColumn("ms", col("acked_at") - col("pub_time"))
        .groupBy("queue", "group")
        .agg(F.count(lit(1)).alias("acked"), F.percentile_approx("ms", list(QUANTILES), 1000).alias("p"))
        .toPandas()
    )
    tables["latency_quantiles"] = _latency_quantiles(quantiles)
    tables["latency"] = _latency_summary(tables["latency_quantiles"])
    deliveries = counted[counted["kind"] == "delivered"].rename(columns={"detail": "reason"})
    tables["redeliveries"] = deliveries.groupby(["queue", "group", "reason"], **keys)["n"].sum()
    dead = counted[counted["kind"].isin(["dead_lettered", "dropped", "expired"])]
    dead = dead.assign(group=dead["group"].fillna("(all)")).rename(columns={"detail": "reason"})
    tables["dead_letters"] = dead.groupby(["queue", "group", "kind", "reason"], **keys)["n"].sum()
    tables["consumers"] = (
        events.filter(delivered)
        .groupBy("queue", "group", F.coalesce(col("consumer"), lit("?")).alias("consumer"))
        .agg(F.count(lit(1)).alias("deliveries"))
        .toPandas()
    )
    current = counted[counted["epoch"] == 0]
    finished = current["kind"].isin(["acked", "dead_lettered", "committed"]) | (
        (current["kind"] == "dropped") & current["group"].notna()
    )
    progress = current[finished | current["kind"].isin(["published", "expired", "dropped", "purged"])]
    finished = finished[progress.index]
    progress = progress.assign(
        group=progress["group"].where(finished, None), kind=progress["kind"].where(~finished, "finished")
    )
    tables["progress"] = progress.groupby(["queue", "group", "kind", "mode", "bucket"], **keys).agg(
        n=("n", "sum"), max_offset=("max_offset", "max")
    )
    tables["lag"] = lag(tables["progress"], grid)
    return tables


def _latency_quantiles(quantiles: pd.DataFrame) -> pd.DataFrame:
    """One row per (queue, group, quantile): the publish -> ack latency at that quantile."""
    import pandas as pd

    rows = [
        {"queue": r.queue, "group": r.group, "acked": int(r.acked), "quantile": q, "ms": float(v)}
        for r in quantiles.itertuples(index=False)
        for q, v in zip(QUANTILES, r.p, strict=True)
    ]
    return pd.DataFrame(rows, columns=["queue", "group", "acked", "quantile", "ms"])


def _latency_summary(quantiles: pd.DataFrame) -> pd.DataFrame:
    """p50, p90, p99 and the maximum per (queue, group)."""
    import pandas as pd

    names = {0.5: "p50_ms", 0.9: "p90_ms", 0.99: "p99_ms", 1.0: "max_ms"}
    columns = ["queue", "group", "acked", *names.values()]
    if quantiles.empty:
        return pd.DataFrame(columns=columns)
    picked = quantiles[quantiles["quantile"].isin(list(names))]
    wide = picked.pivot_table(
        index=["queue", "group", "acked"], columns="quantile", values="ms"
    ).reset_index()
    return wide.rename(columns=names)[columns]


def lag(progress: pd.DataFrame, grid: list[int]) -> pd.DataFrame:
    """Per group and bucket of ``grid``: messages published and not yet finished (work) or
    committed (stream). Idle buckets carry the lag on."""
    import pandas as pd

    rows = []
    if progress.empty:
        return pd.DataFrame(columns=["queue", "group", "bucket", "lag"])
    for queue, q in progress.groupby("queue"):
        buckets = sorted(set(grid) | set(q["bucket"].unique()))
        pub = q[q["kind"] == "published"].groupby("bucket")["n"].sum().reindex(buckets, fill_value=0).cumsum()
        gone = (
            q[q["kind"].isin(["expired", "dropped", "purged"])]
            .groupby("bucket")["n"]
            .sum()
            .reindex(buckets, fill_value=0)
            .cumsum()
        )
        stream = (q["mode"] == "stream").any()
        for group, g in q[q["kind"] == "finished"].groupby("group"):
            if stream:  # the committed position against everything published
                done = g.groupby("bucket")["max_offset"].max().reindex(buckets).ffill().fillna(-1) + 1
                high = q[q["kind"] == "published"].groupby("bucket")["max_offset"].max()
                high = high.reindex(buckets).ffill().fillna(-1).cummax() + 1
                behind = (high - done).clip(lower=0)
            else:
                done = g.groupby("bucket")["n"].sum().reindex(buckets, fill_value=0).cumsum()
                behind = (pub - done - gone).clip(lower=0)
            rows += [{"queue": queue, "group": group, "bucket": b, "lag": int(v)} for b, v in behind.items()]
    return pd.DataFrame(rows, columns=["queue", "group", "bucket", "lag"])


# -- charts -----------------------------------------------------------------------------------------


def _legend_outside(ax: Any, **kwargs: Any) -> None:
    """The legend right of the axes, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7, **kwargs)


def _figure(width: float = 10, height: float = 4) -> tuple[Figure, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)  # no pyplot: nothing global, nothing to close
    return fig, fig.add_subplot()


def over_time(frame: pd.DataFrame, series: list[str], value: str, sep: str, ylabel: str) -> Figure:
    """One line per ``series`` key (the MAX_SERIES with the largest total ``value``) per bucket;
    a series with few non-zero buckets gets a marker on each of them, so a one-bucket burst shows."""
    import pandas as pd

    fig, ax = _figure()
    rank = frame.groupby(series, dropna=False)[value].sum().sort_values(ascending=False)
    for key in rank.index[:MAX_SERIES]:
        s = frame[(frame[series[0]] == key[0]) & (frame[series[1]] == key[1])].sort_values("bucket")
        sparse = int((s[value] != 0).sum()) <= SPARSE
        (line,) = ax.plot(
            pd.to_datetime(s["bucket"], unit="ms", utc=True),
            s[value],
            label=sep.join(map(str, key)),
            drawstyle="steps-post" if value == "lag" else "default",
        )
        if sparse:
            busy = s[s[value] != 0]
            ax.plot(
                pd.to_datetime(busy["bucket"], unit="ms", utc=True), busy[value], linestyle="none",
                marker="o", markersize=5, color=line.get_color(),
            )  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("time (UTC)")
    _legend_outside(ax)
    return fig


def latency_figure(queue: str, quantiles: pd.DataFrame) -> Figure:
    """Publish -> ack latency of one queue: per group, the share of acked messages acked within
    each time (read p50 at 50 %), log time axis."""
    fig, ax = _figure(9, 4)
    for group, g in quantiles.groupby("group"):
        g = g.sort_values("quantile")
        p50 = float(g.loc[g["quantile"] == 0.5, "ms"].iloc[0])
        p99 = float(g.loc[g["quantile"] == 0.99, "ms"].iloc[0])
        label = (
            f"{group}: p50 {duration(p50)}, p99 {duration(p99)} ({plural(int(g['acked'].iloc[0]), 'ack')})"
        )
        ax.plot(g["ms"].clip(lower=1), g["quantile"] * 100, marker="o", markersize=3, label=label)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_ms_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0, 101)
    ax.set_xlabel("publish -> ack (log scale; under 1 ms drawn at 1 ms)")
    ax.set_ylabel("% of acked messages")
    ax.set_title(f"{queue}: publish -> ack latency", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    _legend_outside(ax)
    return fig


def draw_charts(tables: dict[str, pd.DataFrame], directory: Path) -> list[tuple[str, str]]:
    """PNG charts into ``directory``; returns (file name, caption) pairs. Labels are literal text:
    queue names such as ``$dlq/jobs`` are never read as mathematics."""
    directory.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, str]] = []
    with literal_text():
        for name, title, fig in figures(tables):
            fig.savefig(directory / name, dpi=90, bbox_inches="tight")
            made.append((name, title))
    return made


def literal_text() -> AbstractContextManager[Any]:
    """Matplotlib settings under which every label is plain text: a ``$`` is a dollar sign, not
    the start of mathematics. Figures are made and saved under it."""
    import matplotlib

    return matplotlib.rc_context({"text.parse_math": False})


def figures(tables: dict[str, pd.DataFrame]) -> Iterable[tuple[str, str, Figure]]:
    """(file name, caption, figure) for each chart the tables allow."""
    t = tables["throughput"]
    if not t.empty:
        yield (
            "throughput.png",
            "Throughput over time",
            over_time(t, ["queue", "kind"], "rate_per_s", " ", "events/s"),
        )

    lat = tables["latency_quantiles"]
    for queue, q in sorted(lat.groupby("queue"), key=lambda item: str(item[0])):
        top = q.groupby("group")["acked"].max().sort_values(ascending=False).index[:MAX_SERIES]
        yield (
            f"latency-{slug(str(queue))}.png",
            f"{queue}: publish to ack latency",
            latency_figure(str(queue), q[q["group"].isin(top)]),
        )

    red = tables["redeliveries"]
    if not red.empty:
        pivot = red.pivot_table(
            index=["queue", "group"], columns="reason", values="n", aggfunc="sum", fill_value=0
        )
        pivot = pivot.loc[pivot.sum(axis=1).sort_values(ascending=False).index[:MAX_SERIES]]
        share = pivot.div(pivot.sum(axis=1), axis=0) * 100
        fig, ax = _figure()
        share.plot.bar(stacked=True, ax=ax)
        ax.set_ylabel("% of deliveries")
        ax.set_xlabel("")
        ax.set_xticklabels(["/".join(map(str, i)) for i in share.index], rotation=20, fontsize=7)
        _legend_outside(ax, title="reason")
        yield "redeliveries.png", "Deliveries by reason (first, nack, timeout, disconnect, restart)", fig

    dead = tables["dead_letters"]
    if not dead.empty:
        fig, ax = _figure()
        d = dead.groupby(["queue", "kind", "reason"])["n"].sum().sort_values(ascending=False)
        d = d.head(MAX_SERIES * 2)
        ax.barh([" ".join(map(str, i)) for i in d.index], d.values)
        ax.set_xlabel("messages")
        yield "dead_letters.png", "Dead letters, drops and expiries by reason", fig

    cons = tables["consumers"]
    if not cons.empty:
        fig, ax = _figure()
        totals = cons.groupby(["queue", "group"])["deliveries"].transform("sum")
        cons = cons.assign(share=cons["deliveries"] / totals * 100)
        c = cons.sort_values("deliveries", ascending=False).head(MAX_SERIES * 2)
        ax.barh(
            [f"{q}/{g} {n}" for q, g, n in zip(c["queue"], c["group"], c["consumer"], strict=True)],
            c["share"],
        )
        ax.set_xlabel("% of the group's deliveries")
        yield "consumers.png", "Consumer share", fig

    lagging = tables["lag"]
    if not lagging.empty:
        yield (
            "lag.png",
            "Lag over time",
            over_time(lagging, ["queue", "group"], "lag", "/", "messages not finished"),
        )


# -- message timelines ------------------------------------------------------------------------------


@dataclass
class Message:
    """One message's story for the report: its events in order, and each group's end state."""

    message_id: str
    queue: str
    offset: int
    epoch: int
    events: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    why: list[str]  # what it is shown for: outcomes it was sampled for, or "violation"

    @property
    def page(self) -> str:
        return f"{slug(self.message_id)}.html"


def gather_messages(result: AuditResult) -> dict[tuple[str, int, int], Message]:
    """The messages the report shows: every violation example with a message, and a few samples
    of each outcome per queue. Two small Spark jobs fetch their events and lives."""
    from pyspark.sql import functions as F

    from trimaran.analytics.life import message_id

    wanted: dict[tuple[str, int, int], list[str]] = {}
    for rule in result.invariants.values():
        for ex in rule["examples"][:SHOWN_PER_INVARIANT]:
            if ex.get("offset") is not None:
                wanted.setdefault((ex["queue"], int(ex["offset"]), int(ex["epoch"] or 0)), []).append(
                    "violation"
                )
    taken: dict[tuple[str, str], int] = {}
    for queue, offset, epoch, outcome in sorted(result.samples):
        if taken.get((queue, outcome), 0) < PAGES_PER_OUTCOME:
            taken[(queue, outcome)] = taken.get((queue, outcome), 0) + 1
            wanted.setdefault((queue, offset, epoch), []).append(outcome)
    if not wanted:
        return {}
    events = result.frames["events"]
    spark = events.sparkSession
    keys = F.broadcast(spark.createDataFrame(sorted(wanted), schema="queue string, offset bigint, epoch int"))
    columns = [
        "id",
        "time",
        "queue",
        "offset",
        "epoch",
        "group",
        "consumer",
        "node",
        "kind",
        "attempt",
        "reason",
    ]
    found: dict[tuple[str, int, int], Message] = {
        key: Message(message_id(*key), *key, events=[], groups=[], why=why) for key, why in wanted.items()
    }
    for r in events.join(keys, ["queue", "offset", "epoch"]).select(*columns).collect():
        found[(r["queue"], r["offset"], r["epoch"])].events.append(r.asDict())
    life_columns = ["queue", "offset", "epoch", "group", "status", "last_kind", "deliveries", "attempts",
                    "holder", "acked_at", "fate", "copy"]  # fmt: skip
    ledger = result.frames.get("ledger", result.lives)
    for r in ledger.join(keys, ["queue", "offset", "epoch"]).select(*life_columns).collect():
        found[(r["queue"], r["offset"], r["epoch"])].groups.append(r.asDict())
    for message in found.values():
        message.events.sort(key=lambda e: e["id"])
        message.groups.sort(key=lambda g: (g["group"] is not None, g["group"] or ""))
    return found


# -- HTML -------------------------------------------------------------------------------------------

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1300px}
h1{font-size:1.6em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.queue td{background:#f8f8f8;font-weight:bold} td.zero{color:#aaa}
tr.vhost td{background:#e8eef8;font-weight:bold}
.ok{color:#070;font-weight:bold} .fail{color:#b00;font-weight:bold} .bad td{background:#fde8e8}
.summary{font-size:1.1em;line-height:1.6;background:#f6f8fa;padding:.8em 1.2em;border-radius:6px}
.violation{border-left:4px solid #b00;padding:.2em 1em;margin:1em 0}
figure{display:inline-block;margin:1em;vertical-align:top} img{max-width:900px}
code{background:#f3f3f3;padding:0 3px}
"""


def _page(title: str, body: str) -> str:
    e = html.escape
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."


def _n(value: int | None) -> str:
    if not value:
        return "<td class='n zero'>0</td>"
    return f"<td class='n'>{value:,}</td>"


def timeline_table(
    message: Message, *, published_at: int | None = None, mark: Iterable[int | None] = ()
) -> str:
    """The message's events as a table: time, time since publication, group, consumer, event,
    attempt, reason; the events in ``mark`` (those that broke a rule) highlighted."""
    marked = set(mark)
    e = html.escape
    start = published_at
    if start is None:
        start = next((ev["time"] for ev in message.events if ev["kind"] == "published"), None)
    rows = []
    for ev in message.events:
        since = ""
        if start is not None and ev["time"] is not None:
            gap = ev["time"] - start
            since = f"+{elapsed(gap)}" if gap >= 0 else f"-{elapsed(-gap)}"
        attempt = "" if ev["attempt"] is None else str(ev["attempt"])
        rows.append(
            f"<tr class='{'bad' if ev['id'] in marked else ''}'><td>{e(when(ev['time']))}</td>"
            f"<td>{e(since)}</td>"
            f"<td>{e(ev['group'] or '(queue)')}</td><td>{e(ev['consumer'] or '')}</td>"
            f"<td>{e(ev['kind'])}</td><td class='n'>{attempt}</td><td>{e(ev['reason'] or '')}</td>"
            f"<td class='n'>{ev['id']}</td></tr>"
        )
    if not rows:
        return "<p>No events of this message were audited.</p>"
    return (
        "<table class='timeline'><tr><th>time</th><th>since published</th><th>group</th><th>consumer</th>"
        "<th>event</th><th>attempt</th><th>reason</th><th>event id</th></tr>" + "".join(rows) + "</table>"
    )


def _summary_text(summary: dict[str, Any], result: AuditResult) -> str:
    e = html.escape
    counts = summary["counts"]
    selection = summary["window"]
    queues = {q for q, _ in result.outcomes} or set(selection.get("queues") or [])
    lo, hi = counts.get("first_event_at"), counts.get("last_event_at")
    span = (
        f"from {when(lo, precise=False)} to {when(hi, precise=False)} ({duration(hi - lo)})"
        if lo is not None and hi is not None
        else "no events"
    )
    picked = "the queues " + ", ".join(selection["queues"]) if selection.get("queues") else "every queue"
    if selection.get("vhost"):
        picked += f" of the vhost {selection['vhost']}"
    tenants = sorted(summary.get("vhosts") or {})
    if set(tenants) - {DEFAULT_VHOST}:
        picked += f", in {plural(len(tenants), 'vhost')}: " + ", ".join(tenants)
    window = ""
    if selection.get("since_ms") is not None or selection.get("until_ms") is not None:
        since = when(selection.get("since_ms"), precise=False) if selection.get("since_ms") else "the start"
        until = when(selection.get("until_ms"), precise=False) if selection.get("until_ms") else "the end"
        window = f" Only messages published from {since} until {until} are judged."
    broken = [name for name, inv in summary["invariants"].items() if not inv["ok"]]
    violations = sum(inv["violations"] for inv in summary["invariants"].values())
    total_rules = len(summary["invariants"])
    if broken:
        verdict = (
            f"<span class='fail'>{plural(len(broken), 'rule')} of {total_rules} broken</span>, by "
            f"{plural(violations, 'violation')}: {e(', '.join(broken))}. Each is listed below with the "
            "message's events."
        )
    else:
        verdict = f"<span class='ok'>All {total_rules} rules hold</span> for every message."
    totals: dict[str, int] = {}
    for (_, group), by in result.outcomes.items():
        if group is not None:
            for outcome, n in by.items():
                totals[outcome] = totals.get(outcome, 0) + n
    ends = ", ".join(
        f"{totals[o]:,} {OUTCOME_WORDS[o]}" for o in OUTCOME_WORDS if o != "redelivered" and totals.get(o)
    )
    redelivered = totals.get("redelivered", 0)
    fates = (
        f"<br>Across groups, of {totals.get('published', 0):,} messages to read: {ends}"
        + (f"; {redelivered:,} of them were redelivered" if redelivered else "")
        + "."
        if totals
        else ""
    )
    return (
        f"<p class='summary'>{verdict}<br>Audited {plural(counts['events'], 'event')} about "
        f"{plural(counts['messages'], 'message')} in {plural(len(queues), 'queue')} ({e(picked)}), "
        f"{e(span)}.{e(window)}{fates}<br><small>Source {e(summary['source'])}; replayed in "
        f"{summary['seconds']:.1f} s; report made {e(summary['generated_at'])}.</small></p>"
    )


def outcome_table(outcomes: dict[tuple[str, str | None], dict[str, int]]) -> str:
    """Per queue a row of what happened to its messages, then a row per group; with tenants, the
    queues of each vhost under a row naming it, by the names its clients use (analytics/tenants.py)."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for _, h in COLUMNS)
    by_vhost = outcomes_by_vhost(outcomes)
    tenants = not set(by_vhost) <= {DEFAULT_VHOST}
    rows = []
    deleted = []
    for vhost, mine in sorted(by_vhost.items()):
        if tenants:
            rows.append(f"<tr class='vhost'><td colspan='{len(COLUMNS) + 2}'>vhost {e(vhost)}</td></tr>")
        rows += _queue_rows(mine)
        where = f" (vhost {vhost})" if tenants else ""
        deleted += [
            (q + where, by["deleted"])
            for (q, g), by in sorted(mine.items(), key=str)
            if g is None and by.get("deleted")
        ]
    note = (
        "<p>Earlier incarnations of deleted queues (replayed, not in the table): "
        + ", ".join(f"{e(q)} {plural(n, 'message')}" for q, n in deleted)
        + ".</p>"
        if deleted
        else ""
    )
    return (
        "<table id='outcomes'><tr><th>queue</th><th>group</th>" + head + "</tr>" + "".join(rows) + "</table>"
        "<p><small>The books balance from the ledger, which takes each message's fate from the events "
        "alone: a group's published messages (those published while it existed) are each counted "
        "once as acked (a stream group: committed), dead-lettered, dropped, expired, purged, "
        "redriven, still pending (delivered or waiting), not yet delivered (ahead of its cursor) or "
        "unaccounted (gone with no fate in the events); redelivered counts those delivered more than "
        "once. On a queue's own row, acked counts the messages every group finished, still pending "
        "the messages still stored, and unaccounted the messages with an unaccounted line.</small></p>" + note
    )


def _queue_rows(outcomes: dict[tuple[str, str | None], dict[str, int]]) -> list[str]:
    e = html.escape
    rows = []
    for queue in sorted({q for q, _ in outcomes}):
        mine = outcomes.get((queue, None), {})
        cells = "".join(_n(mine.get(QUEUE_CELLS[c])) if c in QUEUE_CELLS else "<td></td>" for c, _ in COLUMNS)
        bad = " bad" if mine.get("lost") else ""
        rows.append(f"<tr class='queue{bad}'><td>{e(queue)}</td><td>(queue)</td>{cells}</tr>")
        for group in sorted(g for q, g in outcomes if q == queue and g is not None):
            by = outcomes[(queue, group)]
            cells = "".join(_n(by.get(c)) for c, _ in COLUMNS)
            rows.append(
                f"<tr class='{'bad' if by.get('lost') else ''}'><td>{e(queue)}</td><td>{e(group)}</td>"
                f"{cells}</tr>"
            )
    return rows


def _violations_html(summary: dict[str, Any], messages: dict[tuple[str, int, int], Message]) -> str:
    e = html.escape
    parts = []
    for name, inv in summary["invariants"].items():
        if inv["ok"]:
            continue
        shown = inv["examples"][:SHOWN_PER_INVARIANT]
        parts.append(
            f"<h3 id='rule-{e(name)}'>{e(name)}: {plural(inv['violations'], 'violation')}</h3>"
            f"<p>The rule: {e(_sentence(inv['description']))}<br>"
            + (f"The first {len(shown)} are shown; every one" if inv["violations"] > len(shown) else "Each")
            + " is in <code>details/violations.parquet</code>.</p>"
        )
        for ex in shown:
            key = (
                None if ex.get("offset") is None else (ex["queue"], int(ex["offset"]), int(ex["epoch"] or 0))
            )
            message = messages.get(key) if key is not None else None
            where = f" in group {e(ex['group'])}" if ex.get("group") else ""
            vhost = ex.get("vhost") or DEFAULT_VHOST
            if vhost != DEFAULT_VHOST:
                where += f" in vhost {e(vhost)}"
            shown = shown_id(str(ex["message_id"]))  # as the tenant's consumers know it
            link = f"<a href='messages/{message.page}'>{e(shown)}</a>" if message is not None else e(shown)
            timeline = timeline_table(message, mark=[ex.get("event_id")]) if message is not None else ""
            parts.append(
                f"<div class='violation'><p><b>{link}</b>{where}: {e(str(ex['detail']))}</p>{timeline}</div>"
            )
    return "".join(parts)


def message_page(message: Message, summary: dict[str, Any]) -> str:
    e = html.escape
    broken = [
        (name, ex)
        for name, inv in summary["invariants"].items()
        for ex in inv["examples"]
        if ex["message_id"] == message.message_id
    ]
    published = next((ev for ev in message.events if ev["kind"] == "published"), None)
    lines = ["<p><a href='../index.html'>Audit report</a> / <a href='index.html'>messages</a></p>",
             f"<h1>Message {e(shown_id(message.message_id))}</h1>"]  # fmt: skip
    vhost, name = split_key(message.queue)
    facts = f"Queue <b>{e(name)}</b>" + (f" in vhost <b>{e(vhost)}</b>" if vhost != DEFAULT_VHOST else "")
    facts += f", offset {message.offset}"
    if message.epoch:
        facts += f", from an earlier incarnation of the queue ({message.epoch} deletes ago)"
    if published is not None:
        facts += f"; published {e(when(published['time']))}"
        if published["consumer"]:
            facts += f" by {e(published['consumer'])}"
        if published["reason"]:
            facts += f" ({e(published['reason'])})"
    lines.append(f"<p>{facts}.</p>")
    if broken:
        lines.append("<h2>Rules it breaks</h2><ul>")
        lines += [
            f"<li class='fail'>{e(name)}{' in group ' + e(ex['group']) if ex['group'] else ''}: "
            f"{e(str(ex['detail']))}</li>"
            for name, ex in broken
        ]
        lines.append("</ul>")
    else:
        shown_for = ", ".join(OUTCOME_WORDS.get(w, w) for w in message.why)
        lines.append(f"<p>Shown as an example of a message {e(shown_for)}; it breaks no rule.</p>")
    if message.groups:
        lines.append(
            "<h2>Ledger, per group</h2><table id='groups'><tr><th>group</th><th>fate</th><th>copy</th>"
            "<th>state</th><th>last event</th><th>deliveries</th><th>highest attempt</th>"
            "<th>last consumer</th><th>acked at</th></tr>"
        )
        for g in message.groups:
            acked = when(g["acked_at"]) if g["acked_at"] is not None else ""
            fate = OUTCOME_WORDS.get(g.get("fate") or "", g.get("fate") or "")
            lines.append(
                f"<tr class='{'bad' if g.get('fate') == 'lost' else ''}'>"
                f"<td>{e(g['group'] or '(queue)')}</td><td>{e(fate)}</td><td>{e(g.get('copy') or '')}</td>"
                f"<td>{e(g['status'] or '')}</td>"
                f"<td>{e(g['last_kind'] or '')}</td><td class='n'>{g['deliveries']}</td>"
                f"<td class='n'>{'' if g['attempts'] is None else g['attempts']}</td>"
                f"<td>{e(g['holder'] or '')}</td><td>{e(acked)}</td></tr>"
            )
        lines.append("</table>")
    offending = [ex["event_id"] for _, ex in broken]
    lines.append("<h2>Events</h2>" + timeline_table(message, mark=offending))
    return _page(f"Message {message.message_id}", "\n".join(lines))


def messages_index(messages: dict[tuple[str, int, int], Message]) -> str:
    e = html.escape
    items = "".join(
        f"<li data-id='{e(m.message_id)}'><a href='{m.page}'>{e(m.message_id)}</a> "
        f"<small>{e(', '.join(OUTCOME_WORDS.get(w, w) for w in m.why))}</small></li>"
        for m in sorted(messages.values(), key=lambda m: (m.queue, m.epoch, m.offset))
    )
    script = (
        "<script>const box=document.getElementById('search');box.addEventListener('input',()=>{"
        "const q=box.value.trim().toLowerCase();let shown=0;"
        "for(const li of document.querySelectorAll('#list li')){"
        "const hit=li.dataset.id.toLowerCase().includes(q);li.hidden=!hit;shown+=hit}"
        "document.getElementById('shown').textContent=shown})</script>"
    )
    body = (
        "<p><a href='../index.html'>Audit report</a></p><h1>Messages</h1>"
        "<p>Every message with a violation and a few of each outcome per queue. Find one by its id "
        "(<code>queue:offset</code>); every message's life per group is in "
        "<code>details/messages.parquet</code>.</p>"
        "<p><input id='search' type='search' placeholder='orders:12' size='40' autofocus> "
        f"<span id='shown'>{len(messages)}</span> shown</p><ul id='list'>{items}</ul>{script}"
    )
    return _page("Audit: messages", body)


def index_page(
    summary: dict[str, Any], result: AuditResult, made: list[tuple[str, str]],
    messages: dict[tuple[str, int, int], Message],
) -> str:  # fmt: skip
    e = html.escape
    verdict = "every rule holds" if summary["ok"] else "rules broken"
    rules = "".join(
        f"<tr><td class='{'ok' if inv['ok'] else 'fail'}'>{'holds' if inv['ok'] else 'BROKEN'}</td>"
        f"<td>{e(name) if inv['ok'] else f'<a href=#rule-{e(name)}>{e(name)}</a>'}</td>"
        f"<td>{e(inv['description'])}</td>{_n(inv['violations'])}</tr>"
        for name, inv in summary["invariants"].items()
    )
    images = "".join(
        f"<figure><img src='charts/{e(n)}' alt='{e(t)}'><figcaption>{e(t)}</figcaption></figure>"
        for n, t in made
    )
    by_outcome: dict[str, list[Message]] = {}
    for m in messages.values():
        for why in m.why:
            by_outcome.setdefault(why, []).append(m)
    samples = "".join(
        f"<li>{e(OUTCOME_WORDS.get(why, why))}: "
        + ", ".join(
            f"<a href='messages/{m.page}'>{e(m.message_id)}</a>"
            for m in sorted(ms, key=lambda m: m.message_id)[:12]
        )
        + "</li>"
        for why, ms in sorted(by_outcome.items())
    )  # fmt: skip
    body = f"""<h1>Trimaran queue audit: {e(verdict)}</h1>
{_summary_text(summary, result)}
<h2>Rules</h2>
<table id='rules'><tr><th></th><th>rule</th><th>what it says</th><th>violations</th></tr>{rules}</table>
{"<h2 id='violations'>Violations</h2>" + _violations_html(summary, messages) if not summary["ok"] else ""}
<h2>What happened to the messages</h2>
{outcome_table(result.outcomes)}
<h2>Messages</h2>
<p><a href='messages/index.html'>Find a message</a> by its id, or open one of these:</p><ul>{samples}</ul>
<h2>Figures</h2>{images or "<p>No charts (<code>--no-charts</code>).</p>"}
"""
    return _page("Trimaran queue audit", body)


def write(
    result: AuditResult, directory: Path, *, source: str, selection: Selection, charts: bool = True
) -> dict[str, Any]:
    """Write the report into ``directory``; returns the summary (also in ``summary.json``)."""
    directory.mkdir(parents=True, exist_ok=True)
    details = directory / "details"
    from pyspark.sql import functions as F

    violations = result.violations.withColumn("vhost", vhost_column(F.col("queue")))
    violations.coalesce(1).write.mode("overwrite").parquet(str(details / "violations.parquet"))
    from trimaran.analytics.result import _message_id

    lives = result.lives.withColumn(
        "message_id", _message_id(F.col("queue"), F.col("offset"), F.col("epoch"))
    ).withColumn("vhost", vhost_column(F.col("queue")))
    lives.write.mode("overwrite").parquet(str(details / "messages.parquet"))
    summary: dict[str, Any] = {
        "ok": result.ok,
        "source": source,
        "window": {"queues": list(selection.queues) if selection.queues else None,
                   "since_ms": selection.since_ms, "until_ms": selection.until_ms, "vhost": selection.vhost},
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "seconds": round(result.seconds, 2),
        "counts": result.counts,
        "invariants": result.invariants,
        "outcomes": [
            {"queue": queue, "vhost": split_key(queue)[0], "name": split_key(queue)[1], "group": group, **by}
            for (queue, group), by in sorted(result.outcomes.items(), key=lambda kv: str(kv[0]))
        ],
        "vhosts": vhost_summary(result.outcomes, result.violations_by_vhost),
    }  # fmt: skip
    made: list[tuple[str, str]] = []
    if charts:
        tables = figure_tables(result)
        for name, frame in tables.items():
            frame.to_parquet(details / f"{name}.parquet", index=False)
        summary["figures"] = {
            "latency": tables["latency"].to_dict(orient="records"),
            "consumers": tables["consumers"].to_dict(orient="records"),
        }
        made = draw_charts(tables, directory / "charts")
    messages = gather_messages(result)
    pages = directory / "messages"
    pages.mkdir(exist_ok=True)
    for message in messages.values():
        (pages / message.page).write_text(message_page(message, summary))
    (pages / "index.html").write_text(messages_index(messages))
    (directory / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (directory / "index.html").write_text(index_page(summary, result, made, messages))
    return summary
