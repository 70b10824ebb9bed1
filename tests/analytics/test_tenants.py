"""The audit per vhost (trimaran/analytics/tenants.py): the same generated tables in two vhosts, as
the broker writes them (every queue key, and every copy a reason names, behind the vhost's prefix),
through the plain-Python audit (tests/analytics/plain.py); each vhost's books balance on their own,
and a fault in one vhost is reported in that vhost only, by the names its clients use."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from trimaran.analytics.life import FATES
from trimaran.analytics.tenants import (
    label,
    outcomes_by_vhost,
    shown_id,
    vhost_summary,
    violations_by_vhost,
)
from trimaran.vhosts import prefix

NAMED_COPY = re.compile(r"(-> |from )(\S+:\d+)")


def _in_vhost(tables: dict[str, pd.DataFrame], vhost: str, id_base: int) -> dict[str, pd.DataFrame]:
    """``tables`` as the broker writes them in ``vhost``: keys and the copies reasons name prefixed."""
    key = prefix(vhost)
    moved = {name: frame.copy() for name, frame in tables.items()}
    for name, frame in moved.items():
        column = "name" if name == "queues" else "queue"
        frame[column] = key + frame[column].astype(str)
    events = moved["queue_events"]
    events["reason"] = [
        NAMED_COPY.sub(lambda m: m.group(1) + key + m.group(2), r) if isinstance(r, str) else r
        for r in events["reason"]
    ]
    events["id"] = events["id"] + id_base
    return moved


def _two_vhosts() -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    from tests.analytics.test_life import _generated

    base = _generated()
    gap = int(base["queue_events"]["id"].max()) + 1
    one, two = _in_vhost(base, "t1", 0), _in_vhost(base, "team/eu", gap)
    both = {name: pd.concat([one[name], two[name]], ignore_index=True) for name in base}
    return both, base


def test_two_vhosts_audit_clean_and_each_balances_on_its_own() -> None:
    from tests.analytics.plain import audit

    tables, base = _two_vhosts()
    found, outcomes = audit(tables)
    assert found == []
    by_vhost = outcomes_by_vhost(outcomes)
    assert set(by_vhost) == {"t1", "team/eu"}
    _, alone = audit(base)
    for vhost, mine in by_vhost.items():
        assert mine == alone, vhost  # the names its clients use, the books of the tables alone
        for (queue, group), by in mine.items():
            if group is not None:
                assert by["published"] == sum(by.get(f, 0) for f in FATES), (vhost, queue, group)
    summary = vhost_summary(outcomes, violations_by_vhost(found))
    assert summary["t1"]["queues"] == summary["team/eu"]["queues"] == sorted({q for q, _ in alone})
    assert summary["t1"]["violations"] == {} and summary["t1"]["published"] > 0


def test_a_fault_in_one_vhost_is_reported_there_only_by_its_clients_names() -> None:
    from tests.analytics.plain import audit

    tables, _ = _two_vhosts()
    events = tables["queue_events"]
    eu = prefix("team/eu")
    acked = events[(events["kind"] == "acked") & events["queue"].str.startswith(eu)].index[0]
    queue, offset = events.loc[acked, "queue"], int(events.loc[acked, "offset"])
    tables["queue_events"] = events.drop(index=acked)  # an ack gone: that message's fate is missing
    found, outcomes = audit(tables)
    assert found, "the missing ack went unnoticed"
    assert violations_by_vhost(found).keys() == {"team/eu"}
    assert {v["message_id"] for v in found} == {f"{queue}:{offset}"}
    example = label(found[0])
    assert (example["vhost"], example["name"]) == ("team/eu", queue[len(eu) :])
    assert shown_id(found[0]["message_id"]) == f"{queue[len(eu) :]}:{offset}"
    lost = {
        v: sum(by.get("lost", 0) for (_, g), by in o.items() if g is None)
        for v, o in outcomes_by_vhost(outcomes).items()
    }
    assert lost["t1"] == 0


def test_the_spark_audit_and_its_report_per_vhost(spark: Any, tmp_path: Any) -> None:
    """One Spark run of the same two vhosts with one fault: summary.json and the page say which
    vhost each queue and failure belongs to, by the names its clients use; Parquet has the column."""
    import json

    from tests.analytics.conftest import _frame
    from trimaran.analytics import report
    from trimaran.analytics.replay import replay
    from trimaran.analytics.source import Selection

    tables, _ = _two_vhosts()
    events = tables["queue_events"]
    eu = prefix("team/eu")
    acked = events[(events["kind"] == "acked") & events["queue"].str.startswith(eu)].index[0]
    queue, offset = events.loc[acked, "queue"], int(events.loc[acked, "offset"])
    tables["queue_events"] = events.drop(index=acked)
    result = replay({name: _frame(spark, name, frame) for name, frame in tables.items()})
    assert not result.ok and set(result.violations_by_vhost) == {"team/eu"}
    summary = report.write(result, tmp_path, source="two vhosts", selection=Selection(), charts=False)
    assert json.loads((tmp_path / "summary.json").read_text())["vhosts"] == summary["vhosts"]
    assert set(summary["vhosts"]) == {"t1", "team/eu"}
    assert summary["vhosts"]["t1"]["violations"] == {}
    assert summary["vhosts"]["team/eu"]["violations"] == result.violations_by_vhost["team/eu"]
    assert {(o["vhost"], o["name"]) for o in summary["outcomes"]} >= {("t1", "orders"), ("team/eu", "orders")}
    example = next(ex for inv in summary["invariants"].values() for ex in inv["examples"])
    assert (example["vhost"], example["name"]) == ("team/eu", queue[len(eu) :])
    page = (tmp_path / "index.html").read_text()
    assert "vhost t1" in page and "vhost team/eu" in page
    name = queue[len(eu) :]
    assert f">{name}:{offset}</a>" in page and " in vhost team/eu:" in page  # the violation, labelled
    outcomes = page[page.index("<table id='outcomes'>") : page.index("</table>", page.index("id='outcomes'"))]
    assert "$vhost" not in outcomes
    violations = pd.read_parquet(tmp_path / "details" / "violations.parquet")
    assert set(violations["vhost"]) == {"team/eu"}
    lives = pd.read_parquet(tmp_path / "details" / "messages.parquet")
    assert set(lives["vhost"]) == {"t1", "team/eu"}


def test_a_vhost_selection_reads_only_that_vhosts_rows(spark: Any, tmp_path: Any) -> None:
    """``--vhost``: pushed into the SQL (JDBC) and applied to a Parquet export alike; ``/`` is every
    key without a prefix."""
    from bench.audit_bench import write_parquet, write_sqlite
    from trimaran.analytics.source import Selection, read_tables

    tables, base = _two_vhosts()
    gap = int(tables["queue_events"]["id"].max()) + 1
    root = _in_vhost(base, "/", gap)
    every = {name: pd.concat([tables[name], root[name]], ignore_index=True) for name in base}
    url = write_sqlite(every, tmp_path / "three.db")
    write_parquet(every, tmp_path / "export")
    expected = {
        "team/eu": lambda q: q.startswith(prefix("team/eu")),
        "/": lambda q: not q.startswith("$vhost/"),
    }
    for vhost, mine in expected.items():
        for where in ({"storage_url": url}, {"parquet": str(tmp_path / "export")}):
            read = read_tables(spark, Selection(vhost=vhost), **where)  # type: ignore[arg-type]
            queues = {r["queue"] for r in read["queue_events"].select("queue").distinct().collect()}
            names = {r["name"] for r in read["queues"].select("name").collect()}
            assert queues and all(mine(q) for q in queues), (vhost, where)
            assert names == {q for q in every["queues"]["name"] if mine(q)}, (vhost, where)


def test_the_command_line_names_queues_in_the_vhost_it_selects() -> None:
    import argparse

    from trimaran.analytics.replay import add_arguments, selection_of

    parser = argparse.ArgumentParser()
    add_arguments(parser, master_default=None)
    mine = selection_of(parser.parse_args(["--vhost", "team/eu", "--queue", "jobs", "--queue", "$dlq/jobs"]))
    assert (mine.vhost, mine.queues) == ("team/eu", ("$vhost/team%2Feu/jobs", "$vhost/team%2Feu/$dlq/jobs"))
    keys = selection_of(parser.parse_args(["--queue", "$vhost/t1/jobs"]))
    assert (keys.vhost, keys.queues) == (None, ("$vhost/t1/jobs",))
