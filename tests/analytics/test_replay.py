"""The audit on tables the real broker wrote: clean first, then one injected fault at a time."""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession

from trimaran.analytics import export
from trimaran.analytics.replay import INVARIANTS, AuditResult, Progress, _commits_beyond, replay, run_audit
from trimaran.analytics.source import Selection, read_tables, replayed_columns


def test_broker_tables_audit_clean(
    spark: SparkSession, broker_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(
        parquet=None,
        since=None,
        until=None,
        queues=None,
        output=str(tmp_path / "report"),
        master="local[2]",
        jars=None,
        no_charts=False,
    )
    code = run_audit(args, broker_db, spark=spark)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    failed = {k: v["examples"] for k, v in summary["invariants"].items() if not v["ok"]}
    assert failed == {}
    assert code == 0
    assert set(summary["invariants"]) == set(INVARIANTS)

    # One progress line per phase on stderr, with its counts and seconds (the session was given:
    # no "spark" line); the verdict stays on stdout.
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert [line.split()[1] for line in lines] == ["read", "replay", "report"], err
    assert all(re.fullmatch(r"audit: \w+ +.+ \(\d+\.\d s\)", line) for line in lines), err
    counts = summary["counts"]
    queues = len({row["queue"] for row in summary["outcomes"]})
    assert f"read   {counts['events']:,} events of {queues} queues (" in lines[0]
    assert f"replay {counts['messages']:,} messages ({counts['group_message_pairs']:,} lives" in lines[1]
    assert re.search(r", 0 violations \(\d+\.\d s\)$", lines[1]), lines[1]
    charts = len(list((tmp_path / "report" / "charts").glob("*.png")))
    assert f"report {tmp_path / 'report'}/index.html, {charts} charts, " in lines[2] and charts > 0
    assert "audit:" not in out and "replayed in" in out


def test_progress_says_each_phase_with_its_own_seconds() -> None:
    now = iter([10.0, 12.5, 12.6, 20.0])
    stream = io.StringIO()
    progress = Progress(stream, clock=lambda: next(now))
    progress.done("spark", "started on local[2], 2 shuffle partitions")
    progress.done("read", "1,204 events of 3 queues")
    progress.done("replay", "1 message (1 lives in consumer groups), 1 violation")
    assert stream.getvalue().splitlines() == [
        "audit: spark  started on local[2], 2 shuffle partitions (2.5 s)",
        "audit: read   1,204 events of 3 queues (0.1 s)",
        "audit: replay 1 message (1 lives in consumer groups), 1 violation (7.4 s)",
    ]


# -- issue 42, as the server at bb9c970 recorded it (tests/analytics/q42/README.md) ------------------

Q42 = Path(__file__).parent / "q42"


@pytest.mark.parametrize("source", ["jdbc", "parquet"])
@pytest.mark.parametrize(
    ("recorded", "rules"),
    [
        # zoo:1 and zoo:2 acked behind grasshopper, left stored when the cursor passed them
        ("before-restart.db", {"finished_removed"}),
        # ... then released at the restart, delivered again and acked a second time
        ("after-restart.db", {"acked_stays_acked", "acked_once"}),
    ],
    ids=["before-restart", "after-restart"],
)
def test_issue_42_as_recorded_at_bb9c970_fails_the_audit(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], recorded: str,
    rules: set[str], source: str,
) -> None:  # fmt: skip
    """Exit status 1, each rule naming the queue and both offsets; the same from the database over
    JDBC and from its Parquet export."""
    database = tmp_path / recorded
    shutil.copy(Q42 / recorded, database)  # the audit only reads, but the fixture stays untouched
    url = f"sqlite:///{database}"
    parquet = None
    if source == "parquet":
        parquet = str(tmp_path / "export")
        export.export(url, Path(parquet))
    args = argparse.Namespace(
        parquet=parquet, since=None, until=None, queues=None, output=str(tmp_path / "report"),
        master="local[2]", jars=None, no_charts=True,
    )  # fmt: skip
    code = run_audit(args, url, spark=spark)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    failed = {name: outcome for name, outcome in summary["invariants"].items() if not outcome["ok"]}
    assert set(failed) == rules, {name: outcome["examples"] for name, outcome in failed.items()}
    for name in rules:
        assert failed[name]["message_ids"] == ["zoo:1", "zoo:2"]
        assert sorted((e["queue"], e["offset"]) for e in failed[name]["examples"]) == [("zoo", 1), ("zoo", 2)]
    assert code == 1
    out = capsys.readouterr().out
    for name in rules:
        assert f"FAIL {name}: 2 violation(s) e.g. zoo:1, zoo:2" in out


# -- faults injected into copies of the broker's tables ---------------------------------------------


@pytest.fixture(scope="module")
def clean(spark: SparkSession, broker_db: str) -> dict[str, pd.DataFrame]:
    """The broker's tables, read once over JDBC, as pandas frames to copy and break."""
    tables = read_tables(spark, Selection(), storage_url=broker_db)
    return {name: frame.toPandas() for name, frame in tables.items()}


def _events(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return tables["queue_events"]


def _one(frame: pd.DataFrame) -> pd.Series:
    assert len(frame), "the broker run should have produced this case"
    return frame.iloc[0]


def _acked_once_delivered(ev: pd.DataFrame) -> pd.Series:
    """An ``orders`` message of the default group delivered once and acked."""
    mine = ev[(ev["queue"] == "orders") & (ev["group"] == "$default")]
    deliveries = mine[mine["kind"] == "delivered"].groupby("offset").size()
    once = deliveries[deliveries == 1].index
    return _one(mine[(mine["kind"] == "acked") & mine["offset"].isin(once)])


def deleted_event(t: dict[str, pd.DataFrame]) -> None:
    ev = _events(t)
    t["queue_events"] = ev.drop(_acked_once_delivered(ev).name)


def duplicate_ack(t: dict[str, pd.DataFrame]) -> None:
    ev = _events(t)
    copy = _acked_once_delivered(ev).copy()
    copy["id"] = ev["id"].max() + 1
    t["queue_events"] = pd.concat([ev, pd.DataFrame([copy])], ignore_index=True)


def ack_without_delivery(t: dict[str, pd.DataFrame]) -> None:
    ev = _events(t)
    ack = _acked_once_delivered(ev)
    delivery = _one(
        ev[(ev["queue"] == ack["queue"]) & (ev["group"] == ack["group"]) & (ev["offset"] == ack["offset"])
           & (ev["kind"] == "delivered")]
    )  # fmt: skip
    t["queue_events"] = ev.drop(delivery.name)


def dead_letter_without_cause(t: dict[str, pd.DataFrame]) -> None:
    ev = _events(t)
    t["queue_events"] = ev.drop(_one(ev[(ev["queue"] == "retry") & (ev["kind"] == "rejected")]).name)


def dead_letter_copy_lost(t: dict[str, pd.DataFrame]) -> None:
    """A dead letter whose copy never reached the dead-letter queue: no trace of it there."""
    ev = _events(t)
    moved = _one(ev[(ev["queue"] == "retry") & (ev["kind"] == "dead_lettered")])
    target, _, offset = str(moved["reason"]).split(" -> ")[1].rpartition(":")
    for table in ("queue_events", "queue_messages", "queue_pending"):
        rows = t[table]
        t[table] = rows[~((rows["queue"] == target) & (rows["offset"] == int(offset)))]


def cursor_moved_back(t: dict[str, pd.DataFrame]) -> None:
    ev = _events(t)
    commits = ev[(ev["queue"] == "ticks") & (ev["kind"] == "committed")]
    assert len(commits) >= 3
    back = commits.iloc[-1].copy()
    back["offset"] = commits["offset"].max() - 2
    back["id"] = ev["id"].max() + 1
    t["queue_events"] = pd.concat([ev, pd.DataFrame([back])], ignore_index=True)


def live_row_disagrees(t: dict[str, pd.DataFrame]) -> None:
    groups = t["queue_groups"].copy()
    row = (groups["queue"] == "ticks") & (groups["group"] == "readers")
    assert row.sum() == 1
    groups.loc[row, "committed"] = groups.loc[row, "committed"] - 1
    t["queue_groups"] = groups


def _frame(spark: SparkSession, table: str, frame: pd.DataFrame) -> DataFrame:
    types = replayed_columns(table)  # as read_tables hands them over
    ddl = ", ".join(f"`{c}` {t}" for c, t in types.items())

    def value(v: object, t: str) -> object:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        return int(v) if t in ("int", "bigint") else v  # type: ignore[call-overload]

    rows = [
        tuple(value(v, t) for v, t in zip(r, types.values(), strict=True))
        for r in frame[list(types)].itertuples(index=False)
    ]
    return spark.createDataFrame(rows, schema=ddl)


FAULTS: dict[Callable[[dict[str, pd.DataFrame]], None], str] = {
    deleted_event: "accounted",
    duplicate_ack: "acked_once",
    ack_without_delivery: "settled_after_delivery",
    dead_letter_without_cause: "dead_letter_explained",
    dead_letter_copy_lost: "copies_traced",
    cursor_moved_back: "commits_monotonic",
    live_row_disagrees: "live_state",
}


@pytest.mark.parametrize("fault", list(FAULTS), ids=[f.__name__ for f in FAULTS])
def test_each_fault_flags_exactly_its_invariant(
    spark: SparkSession, clean: dict[str, pd.DataFrame], fault: Callable[[dict[str, pd.DataFrame]], None]
) -> None:
    broken = {name: frame.copy() for name, frame in clean.items()}
    fault(broken)
    frames = {name: _frame(spark, name, frame) for name, frame in broken.items()}
    result = replay(frames)
    failed = {name for name, outcome in result.invariants.items() if not outcome["ok"]}
    assert failed == {FAULTS[fault]}, {n: result.invariants[n]["examples"] for n in failed}
    assert not result.ok
    assert result.invariants[FAULTS[fault]]["message_ids"]


def test_generated_faults_flag_exactly_their_invariant_and_message(
    faulty_audit: tuple[AuditResult, Path, dict[str, set[str]]],
) -> None:
    """Twenty-two faults in one copy of generated tables (``conftest.inject_faults``), each in its own
    message, ten of them removing, altering or duplicating the evidence of a message's fate: each
    invariant flags exactly the messages its faults broke, once each; the other few hundred
    messages stay clean. The same faults, through the plain-Python half, in test_life.py."""
    result, _, expected = faulty_audit
    flagged = {
        name: (outcome["violations"], set(outcome["message_ids"]))
        for name, outcome in result.invariants.items()
        if not outcome["ok"]
    }
    assert flagged == {name: (len(ids), ids) for name, ids in expected.items()}, {
        n: result.invariants[n]["examples"] for n in flagged
    }
    assert len(expected) == 14 and not result.ok


def test_stream_commits_are_bounded_by_what_was_published() -> None:
    """Per incarnation, the highest commit against the last offset published; with a time window
    the publications may lie before it, so the live queue's next_offset bounds it instead."""
    summary = [
        {"queue": "s", "epoch": 0, "group": None, "kind": "published", "max_offset": 9},
        {"queue": "s", "epoch": 0, "group": "r", "kind": "committed", "max_offset": 9},
        {"queue": "s", "epoch": 1, "group": None, "kind": "published", "max_offset": 4},
        {"queue": "s", "epoch": 1, "group": "r", "kind": "committed", "max_offset": 6},
        {"queue": "t", "epoch": 0, "group": "r", "kind": "committed", "max_offset": 3},
    ]
    assert _commits_beyond(summary, {"s": 10, "t": 4}, windowed=False) == [
        ("s", 1, "r", 6, 4),
        ("t", 0, "r", 3, None),
    ]
    assert _commits_beyond(summary, {"s": 10, "t": 4}, windowed=True) == []
    assert _commits_beyond(summary, {"s": 9, "t": 4}, windowed=True) == [("s", 0, "r", 9, 8)]
