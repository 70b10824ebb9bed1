"""The audit's plain-Python half on pandas tables, without Spark: the facts (``replay.facts_of``),
the one-pass replay (``life.py``), the group rules and the copy trace (``copies.py``), as
``replay.replay`` runs them on Spark. Tables from one incarnation (no deleted queue); the one rule
left out is commits_monotonic, a Spark window."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from trimaran.analytics import copies
from trimaran.analytics.life import INPUT, OUTPUT, VIOLATION, replay_partition
from trimaran.analytics.replay import _group_violations, facts_of
from trimaran.analytics.source import Selection


def _value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _value(v) for k, v in row.items()} for row in frame.to_dict("records")]


def audit(
    tables: dict[str, pd.DataFrame],
) -> tuple[list[dict[str, Any]], dict[tuple[str, Any], dict[str, int]]]:
    """Violations (``life.VIOLATION``'s columns) and the outcome counts per (queue, group)."""
    events = tables["queue_events"].assign(epoch=0)
    assert not ((events["kind"] == "purged") & (events["reason"] == "delete")).any()
    keys = ["queue", "epoch", "group", "kind"]
    summary = []
    for key, rows in events.groupby(keys, dropna=False):
        purge = rows[rows["reason"] != "delete"]["id"]
        summary.append({
            **dict(zip(keys, (_value(k) for k in key), strict=True)),
            "n": len(rows), "first": _value(rows["time"].min()), "last": _value(rows["time"].max()),
            "max_offset": _value(rows["offset"].max()), "first_id": _value(rows["id"].min()),
            "min_offset": _value(rows["offset"].min()),
            "purge_id": _value(purge.max()) if len(purge) else None,
        })  # fmt: skip
    spans = _records(tables["queue_spans"]) if "queue_spans" in tables else []
    facts = facts_of(
        summary, _records(tables["queues"]), _records(tables["queue_groups"]), Selection(), spans
    )
    rows: list[tuple[Any, ...]] = []
    for e in _records(events[events["offset"].notna()]):
        rows.append(tuple({**e, "src": "e", "state": None}.get(name) for name in INPUT))
    for m in _records(tables["queue_messages"]):
        rows.append((m["queue"], m["offset"], 0, None, "m", *(None,) * 7))
    for p in _records(tables["queue_pending"]):
        rows.append((p["queue"], p["offset"], 0, None, "p", None, p["group"], p["consumer"], None,
                     p["attempts"], None, p["state"]))  # fmt: skip
    rows.sort(key=lambda r: (r[0], r[1], r[2], -1 if r[3] is None else r[3]))  # Spark: nulls first
    found: list[dict[str, Any]] = []
    outcomes: dict[tuple[str, Any], dict[str, int]] = {}
    causes: list[tuple[Any, ...]] = []
    made: list[tuple[Any, ...]] = []
    for out in replay_partition(facts.context, rows):
        for row in out.rows:
            r = dict(zip(OUTPUT, row, strict=True))
            if r["record"] == "violation":
                found.append({k: r[k] for k in VIOLATION})
            elif r["record"] == "outcome":
                by = outcomes.setdefault((r["queue"], r["group"]), {})
                by[r["outcome"]] = by.get(r["outcome"], 0) + r["n"]
            elif r["record"] == "cause":
                causes.append((r["queue"], r["offset"], r["epoch"], r["event_id"], r["invariant"], r["group"],
                               r["detail"]))  # fmt: skip
            elif r["record"] == "copy":
                made.append((r["queue"], r["offset"], r["epoch"], r["event_id"], r["detail"]))
    audited = set(facts.context.next_offset)
    extra = _group_violations(facts) + copies.trace(causes, made, audited)
    found += [dict(zip(VIOLATION, v, strict=True)) for v in extra]
    return found, outcomes
