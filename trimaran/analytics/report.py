"""The audit's report: ``summary.json``, Parquet details, PNG charts and an ``index.html`` showing them.

Figures, per queue and group: throughput over time, publish -> ack latency percentiles, redelivery
and dead-letter rates with their reasons, each consumer's share of deliveries, and lag over time.
The aggregation runs in Spark; only the small per-bucket tables come to the driver for plotting.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trimaran.analytics.source import Selection

if TYPE_CHECKING:
    import pandas as pd

    from trimaran.analytics.replay import AuditResult

MAX_SERIES = 8  # lines or bars per chart; the busiest queues and groups are shown
BUCKETS = 120  # time buckets across the audited span


def figure_tables(result: AuditResult) -> dict[str, pd.DataFrame]:
    """The numbers behind each chart, as small pandas frames.

    Three Spark jobs: one aggregate over the events by queue, group, kind and time bucket (with the
    reason where a chart splits by it), one of deliveries per consumer, and the latency percentiles
    over the lives. The charts' tables are cut from the first in pandas.
    """
    from pyspark.sql import functions as F

    col, lit = F.col, F.lit
    events = result.frames["events"]
    lives = result.frames["lives"].filter(col("epoch") == 0)
    lo, hi = result.counts.get("first_event_at") or 0, result.counts.get("last_event_at") or 0
    bucket_ms = max(1000, math.ceil((hi - lo + 1) / BUCKETS))
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
    tables["throughput"] = flow.groupby(["queue", "kind", "bucket"], **keys)["n"].sum()
    tables["throughput"]["rate_per_s"] = tables["throughput"]["n"] * 1000.0 / bucket_ms
    latency = lives.filter(col("acked_at").isNotNull() & col("pub_time").isNotNull())
    tables["latency"] = (
        latency.withColumn("ms", col("acked_at") - col("pub_time"))
        .groupBy("queue", "group")
        .agg(
            F.count(lit(1)).alias("acked"),
            F.percentile_approx("ms", [0.5, 0.9, 0.99], 1000).alias("p"),
            F.max("ms").alias("max_ms"),
        )
        .toPandas()
    )
    if len(tables["latency"]):
        for i, name in enumerate(("p50_ms", "p90_ms", "p99_ms")):
            tables["latency"][name] = tables["latency"]["p"].map(lambda p, i=i: p[i])
        tables["latency"] = tables["latency"].drop(columns=["p"])
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
    tables["lag"] = _lag(tables["progress"])
    return tables


def _lag(progress: pd.DataFrame) -> pd.DataFrame:
    """Per group and bucket: messages published and not yet finished (work) or committed (stream)."""
    import pandas as pd

    rows = []
    if progress.empty:
        return pd.DataFrame(columns=["queue", "group", "bucket", "lag"])
    for queue, q in progress.groupby("queue"):
        buckets = sorted(q["bucket"].unique())
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
                lag = (high - done).clip(lower=0)
            else:
                done = g.groupby("bucket")["n"].sum().reindex(buckets, fill_value=0).cumsum()
                lag = (pub - done - gone).clip(lower=0)
            rows += [{"queue": queue, "group": group, "bucket": b, "lag": int(v)} for b, v in lag.items()]
    return pd.DataFrame(rows, columns=["queue", "group", "bucket", "lag"])


def _charts(tables: dict[str, pd.DataFrame], directory: Path) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    directory.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, str]] = []

    def save(fig: Any, name: str, title: str) -> None:
        fig.tight_layout()
        fig.savefig(directory / name, dpi=90)
        plt.close(fig)
        made.append((name, title))

    def over_time(
        frame: pd.DataFrame, series: list[str], rank: pd.Series, value: str, sep: str, ylabel: str
    ) -> Any:
        """One line per ``series`` key (the MAX_SERIES highest by ``rank``) of ``value`` per bucket."""
        fig, ax = plt.subplots(figsize=(9, 4))
        for key in rank.sort_values(ascending=False).index[:MAX_SERIES]:
            s = frame[(frame[series[0]] == key[0]) & (frame[series[1]] == key[1])].sort_values("bucket")
            ax.plot(pd.to_datetime(s["bucket"], unit="ms", utc=True), s[value], label=sep.join(map(str, key)))
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        return fig

    t = tables["throughput"]
    if not t.empty:
        busiest = t.groupby(["queue", "kind"])["n"].sum()
        fig = over_time(t, ["queue", "kind"], busiest, "rate_per_s", " ", "events/s")
        save(fig, "throughput.png", "Throughput over time")

    lat = tables["latency"]
    if not lat.empty:
        lat = lat.sort_values("acked", ascending=False).head(MAX_SERIES)
        fig, ax = plt.subplots(figsize=(9, 4))
        labels = [f"{q}/{g}" for q, g in zip(lat["queue"], lat["group"], strict=True)]
        x = range(len(labels))
        for i, p in enumerate(("p50_ms", "p90_ms", "p99_ms")):
            ax.bar([v + (i - 1) * 0.27 for v in x], lat[p], width=0.27, label=p[:3])
        ax.set_xticks(list(x), labels, rotation=20, fontsize=7)
        ax.set_ylabel("publish -> ack, ms")
        ax.legend()
        save(fig, "latency.png", "Publish to ack latency percentiles")

    red = tables["redeliveries"]
    if not red.empty:
        pivot = red.pivot_table(
            index=["queue", "group"], columns="reason", values="n", aggfunc="sum", fill_value=0
        )
        pivot = pivot.loc[pivot.sum(axis=1).sort_values(ascending=False).index[:MAX_SERIES]]
        share = pivot.div(pivot.sum(axis=1), axis=0) * 100
        fig, ax = plt.subplots(figsize=(9, 4))
        share.plot.bar(stacked=True, ax=ax)
        ax.set_ylabel("% of deliveries")
        ax.set_xticklabels(["/".join(map(str, i)) for i in share.index], rotation=20, fontsize=7)
        save(fig, "redeliveries.png", "Deliveries by reason (first, nack, timeout, disconnect, restart)")

    dead = tables["dead_letters"]
    if not dead.empty:
        fig, ax = plt.subplots(figsize=(9, 4))
        d = (
            dead.groupby(["queue", "kind", "reason"])["n"]
            .sum()
            .sort_values(ascending=False)
            .head(MAX_SERIES * 2)
        )
        ax.barh([" ".join(map(str, i)) for i in d.index], d.values)
        ax.set_xlabel("messages")
        save(fig, "dead_letters.png", "Dead letters, drops and expiries by reason")

    cons = tables["consumers"]
    if not cons.empty:
        fig, ax = plt.subplots(figsize=(9, 4))
        c = cons.sort_values("deliveries", ascending=False).head(MAX_SERIES * 2)
        totals = cons.groupby(["queue", "group"])["deliveries"].transform("sum")
        cons = cons.assign(share=cons["deliveries"] / totals * 100)
        c = cons.loc[c.index]
        ax.barh(
            [f"{q}/{g} {n}" for q, g, n in zip(c["queue"], c["group"], c["consumer"], strict=True)],
            c["share"],
        )
        ax.set_xlabel("% of the group's deliveries")
        save(fig, "consumers.png", "Consumer share")

    lag = tables["lag"]
    if not lag.empty:
        top = lag.groupby(["queue", "group"])["lag"].max()
        fig = over_time(lag, ["queue", "group"], top, "lag", "/", "messages not finished")
        save(fig, "lag.png", "Lag over time")
    return made


def _html(summary: dict[str, Any], charts: list[tuple[str, str]]) -> str:
    e = html.escape
    rows = []
    for name, inv in summary["invariants"].items():
        status = "ok" if inv["ok"] else "FAIL"
        ids = ", ".join(inv["message_ids"][:20])
        rows.append(
            f"<tr class='{status}'><td>{status}</td><td>{e(name)}</td><td>{e(inv['description'])}</td>"
            f"<td>{inv['violations']}</td><td>{e(ids)}</td></tr>"
        )
    details = []
    for name, inv in summary["invariants"].items():
        for ex in inv["examples"][:20]:
            details.append(
                f"<tr><td>{e(name)}</td><td>{e(str(ex['message_id']))}</td><td>{e(str(ex['group']))}</td>"
                f"<td>{'' if ex['event_id'] is None else ex['event_id']}</td>"
                f"<td>{e(str(ex['detail']))}</td></tr>"
            )
    images = "".join(
        f"<figure><img src='charts/{e(n)}' alt='{e(t)}'><figcaption>{e(t)}</figcaption></figure>"
        for n, t in charts
    )
    counts = e(json.dumps(summary["counts"], indent=1))
    verdict = "every invariant holds" if summary["ok"] else "INVARIANTS FAILED"
    detail_table = (
        "<h2>Offending messages (first 20 per invariant; all in details/violations.parquet)</h2>"
        "<table><tr><th>invariant</th><th>message</th><th>group</th><th>event</th><th>detail</th></tr>"
        + "".join(details)
        + "</table>"
        if details
        else ""
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Trimaran queue audit</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}}
tr.FAIL td:first-child{{color:#b00;font-weight:bold}} tr.ok td:first-child{{color:#070}}
figure{{display:inline-block;margin:1em}} img{{max-width:820px}}</style></head><body>
<h1>Trimaran queue audit: {e(verdict)}</h1>
<p>Source {e(summary["source"])}; window {e(str(summary["window"]))}; generated {e(summary["generated_at"])};
replay {summary["seconds"]:.1f} s.</p>
<table><tr><th></th><th>invariant</th><th>rule</th><th>violations</th><th>message ids</th></tr>
{"".join(rows)}</table>
{detail_table}
<h2>Counts</h2><pre>{counts}</pre>
<h2>Figures</h2>{images}
</body></html>
"""


def write(
    result: AuditResult, directory: Path, *, source: str, selection: Selection, charts: bool = True
) -> dict[str, Any]:
    """Write the report into ``directory``; returns the summary (also in ``summary.json``)."""
    from datetime import UTC, datetime

    directory.mkdir(parents=True, exist_ok=True)
    details = directory / "details"
    result.violations.coalesce(1).write.mode("overwrite").parquet(str(details / "violations.parquet"))
    from pyspark.sql import functions as F

    from trimaran.analytics.replay import _message_id

    lives = result.lives.withColumn(
        "message_id", _message_id(F.col("queue"), F.col("offset"), F.col("epoch"))
    )
    lives.write.mode("overwrite").parquet(str(details / "messages.parquet"))
    summary: dict[str, Any] = {
        "ok": result.ok,
        "source": source,
        "window": {"queues": list(selection.queues) if selection.queues else None,
                   "since_ms": selection.since_ms, "until_ms": selection.until_ms},
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(result.seconds, 2),
        "counts": result.counts,
        "invariants": result.invariants,
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
        made = _charts(tables, directory / "charts")
    (directory / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (directory / "index.html").write_text(_html(summary, made))
    return summary
