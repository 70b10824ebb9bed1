"""Queue tables made by the real broker (paho over real sockets); the one SparkSession every test
shares is the ``spark`` fixture of tests/conftest.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import endpoints_of, start_server, tls_files
from tests.support.paho import V5, Client, Endpoints, connect, props
from tests.support.server import ALL_OFF

pyspark = pytest.importorskip("pyspark")

from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

__all__ = ["tls_files"]  # the interop suite's certificates fixture, shared

BROKER_ENV = {
    "TRIMARAN_QUEUES__DEFAULTS__BACKOFF_INITIAL_S": "0.05",
    "TRIMARAN_QUEUES__DEFAULTS__BACKOFF_MAX_S": "0.1",
    "TRIMARAN_QUEUES__DEFAULTS__MAX_ATTEMPTS": "3",
    "TRIMARAN_QUEUES__DEFAULTS__VISIBILITY_TIMEOUT_S": "0.6",
    "TRIMARAN_QUEUES__DECLARE": json.dumps([{"name": "ticks", "mode": "stream"}]),
}


def _headers(message: Any) -> dict[str, str]:
    return dict(getattr(message.properties, "UserProperty", None) or [])


def _control(client: Client, topic: str, message_id: str, **extra: str) -> None:
    user = [("message-id", message_id), *extra.items()]
    client.publish(topic, b"", qos=1, properties=props(PacketTypes.PUBLISH, UserProperty=user))


def _first_run(mqtt: Endpoints) -> None:
    pub = connect(mqtt, version=V5)
    try:
        # Competing consumers and a second group see 20 messages; QoS 1 PUBACKs ack them.
        a, b = connect(mqtt, version=V5), connect(mqtt, version=V5)
        audit_group = connect(mqtt, version=V5)
        a.subscribe("$queue/orders", qos=1)
        b.subscribe("$queue/orders", qos=1)
        audit_group.subscribe("$share/audit/$queue/orders", qos=1)
        for i in range(20):
            pub.publish("$queue/orders", f"o{i}".encode(), qos=1)
        got = 0
        deadline = time.monotonic() + 10
        while got < 20 and time.monotonic() < deadline:
            for c in (a, b):
                while not c.messages.empty():
                    c.messages.get()
                    got += 1
            time.sleep(0.02)
        assert got == 20
        audit_group.drain(20)

        # QoS 0 consumer: auto-ack.
        q0 = connect(mqtt, version=V5)
        q0.subscribe("$queue/fire", qos=0)
        for i in range(5):
            pub.publish("$queue/fire", f"f{i}".encode(), qos=1)
        q0.drain(5)

        # Nack then ack; reject to the DLQ; nack at max attempts to the DLQ.
        manual = connect(mqtt, version=V5, manual_ack=True)
        manual.subscribe("$queue/retry", qos=1)
        pub.publish("$queue/retry", b"again", qos=1)
        first = manual.expect()
        _control(manual, "$queue/retry/$nack", _headers(first)["x-queue-message-id"])
        second = manual.expect()
        manual.client.ack(second.mid, 1)
        pub.publish("$queue/retry", b"poison", qos=1)
        poison = manual.expect()
        _control(
            manual, "$queue/retry/$reject", _headers(poison)["x-queue-message-id"], reason="cannot parse"
        )
        pub.publish("$queue/retry", b"flaky", qos=1)
        for _ in range(3):
            flaky = manual.expect()
            _control(manual, "$queue/retry/$nack", _headers(flaky)["x-queue-message-id"])

        # Visibility timeout: held past 0.6 s, redelivered, then acked.
        slow = connect(mqtt, version=V5, manual_ack=True)
        slow.subscribe("$queue/slow", qos=1)
        pub.publish("$queue/slow", b"late", qos=1)
        slow.expect()
        late = slow.expect(5)
        assert _headers(late)["x-queue-attempt"] == "2"
        slow.client.ack(late.mid, 1)

        # Disconnect: a consumer drops while holding; another gets it.
        dropper = connect(mqtt, version=V5, manual_ack=True)
        dropper.subscribe("$queue/jobs", qos=1)
        pub.publish("$queue/jobs", b"held", qos=1)
        dropper.expect()
        dropper.drop()
        taker = connect(mqtt, version=V5)
        taker.subscribe("$queue/jobs", qos=1)
        assert _headers(taker.expect(5))["x-queue-redelivered"] == "true"

        # A stream read and committed (PUBACK commits), and a backlog nobody reads.
        reader = connect(mqtt, version=V5)
        for i in range(10):
            pub.publish("$queue/ticks", f"t{i}".encode(), qos=1)
        reader.subscribe("$share/readers/$queue/ticks", qos=1)
        for i in range(10, 15):
            pub.publish("$queue/ticks", f"t{i}".encode(), qos=1)
        reader.drain(5)
        for i in range(5):
            pub.publish("$queue/backlog", f"b{i}".encode(), qos=1)

        # Held when the server stops: released at the next start (restart).
        holder = connect(mqtt, version=V5, manual_ack=True)
        holder.subscribe("$queue/restart", qos=1)
        pub.publish("$queue/restart", b"r", qos=1)
        holder.expect()
        time.sleep(0.3)  # let every PUBACK and control message land
        for c in (a, b, audit_group, q0, manual, slow, taker, reader):
            c.disconnect()
        holder.drop()
    finally:
        pub.disconnect()


def _second_run(mqtt: Endpoints) -> None:
    sub = connect(mqtt, version=V5)
    try:
        sub.subscribe("$queue/restart", qos=1)
        got = sub.expect(5)
        assert _headers(got)["x-queue-redelivered"] == "true"
        time.sleep(0.3)
    finally:
        sub.disconnect()


def write_broker_tables(workdir: Path, url: str, tls_files: dict[str, str]) -> None:
    """Two broker runs (stop, restart) on the database at ``url``, with every kind of event."""
    env = {**BROKER_ENV, "TRIMARAN_STORAGE__URL": url}
    args = [*ALL_OFF, "--mqtt", "127.0.0.1:0"]
    for run in (_first_run, _second_run):
        server = start_server(workdir, tls_files, env, args)
        try:
            run(endpoints_of(server, tls_files))
        finally:
            assert server.stop() == 0, server.output()


@pytest.fixture(scope="session")
def broker_db(tmp_path_factory: pytest.TempPathFactory, tls_files: dict[str, str]) -> str:
    """A SQLite database written by :func:`write_broker_tables`."""
    workdir = tmp_path_factory.mktemp("audit-broker")
    url = f"sqlite:///{workdir / 'trimaran.db'}"
    write_broker_tables(workdir, url, tls_files)
    return url


# -- generated tables with one fault per message ----------------------------------------------------


def _frame(spark: SparkSession, table: str, frame: Any) -> Any:
    """A pandas table as a Spark frame of the audit's schema (``source.TABLES``)."""
    import math

    from trimaran.analytics.source import replayed_columns

    types = replayed_columns(table)  # as read_tables hands them over

    def value(v: object, t: str) -> object:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        return int(v) if t in ("int", "bigint") else v  # type: ignore[call-overload]

    rows = [
        tuple(value(v, t) for v, t in zip(r, types.values(), strict=True))
        for r in frame[list(types)].itertuples(index=False)
    ]
    return spark.createDataFrame(rows, schema=", ".join(f"`{c}` {t}" for c, t in types.items()))


def inject_faults(tables: dict[str, Any]) -> dict[str, set[str]]:
    """Break generated tables (``bench/audit_bench.py``) the way a bug or tampering would, one
    message per fault; returns the message ids each invariant must flag, and only those."""
    import pandas as pd

    ev = tables["queue_events"].copy()
    ev["id"] = ev["id"] * 2  # room for an event written right after another (a retried write)
    extra: list[dict[str, Any]] = []
    used: set[tuple[str, int]] = set()

    def story(queue: str, kinds: list[str], group: str = "$default") -> pd.DataFrame:
        """The events of the first unused message of ``queue`` whose group life is ``kinds``."""
        mine = ev[(ev["queue"] == queue) & (ev["group"] == group)].sort_values("id")
        lives = mine.groupby("offset")["kind"].agg(list)
        for offset, life in lives.items():
            if life == kinds and (queue, int(offset)) not in used:
                used.add((queue, int(offset)))
                return ev[(ev["queue"] == queue) & (ev["offset"] == offset)].sort_values("id")
        raise AssertionError(f"no {queue} message lived {kinds}")

    def after(row: pd.Series, **changes: Any) -> None:
        """A copy of ``row`` written right after it, with ``changes``."""
        extra.append({**row.to_dict(), "id": int(row["id"]) + 1, **changes})

    acked = ["delivered", "acked"]
    expected: dict[str, set[str]] = {}

    # A published message that vanishes: its rows deleted with no event saying why.
    held = story("jobs", ["delivered"])
    offset = int(held["offset"].iloc[0])
    for table in ("queue_messages", "queue_pending"):
        rows = tables[table]
        tables[table] = rows[~((rows["queue"] == "jobs") & (rows["offset"] == offset))]
    expected["accounted"] = {f"jobs:{offset}"}
    # An ack of an attempt that was never delivered.
    s = story("emails", acked)
    ev.loc[s[s["kind"] == "acked"].index, "attempt"] = 2
    expected["settled_after_delivery"] = {f"emails:{s['offset'].iloc[0]}"}
    # A double ack: the ack's write retried.
    s = story("emails", acked)
    after(s[s["kind"] == "acked"].iloc[0])
    expected["acked_once"] = {f"emails:{s['offset'].iloc[0]}"}
    # A dead letter with no reject, at attempt 1 of 3.
    s = story("orders", ["delivered", "rejected", "dead_lettered"])
    ev = ev.drop(s[(s["kind"] == "rejected") & (s["group"] == "$default")].index)
    expected["dead_letter_explained"] = {f"orders:{s['offset'].iloc[0]}"}
    # A delivery after the ack.
    s = story("jobs", acked)
    ack = s[s["kind"] == "acked"].iloc[0]
    after(ack, kind="delivered", attempt=2, reason="nack", time=int(ack["time"]) + 5, consumer="$default-c9")
    expected["acked_stays_acked"] = {f"jobs:{s['offset'].iloc[0]}"}
    # A delivery after the dead letter.
    s = story("emails", ["delivered", "rejected", "dead_lettered"])
    dead = s[s["kind"] == "dead_lettered"].iloc[0]
    after(dead, kind="delivered", attempt=2, reason="nack", time=int(dead["time"]) + 5,
          consumer="$default-c8")  # fmt: skip
    expected["final"] = {f"emails:{s['offset'].iloc[0]}"}
    # An acked message still stored (issue 42): its queue_messages row back.
    s = story("jobs", acked)
    offset = int(s["offset"].iloc[0])
    rows = tables["queue_messages"]
    kept = rows[rows["queue"] == "jobs"].iloc[[0]].assign(offset=offset, published_at=int(s["time"].min()))
    tables["queue_messages"] = pd.concat([rows, kept], ignore_index=True)
    expected["finished_removed"] = {f"jobs:{offset}"}
    # Attempt counters that skip: the second delivery (and its ack) numbered 3.
    s = story("emails", ["delivered", "nacked", "delivered", "acked"])
    ev.loc[s.index[-2:], "attempt"] = 3
    expected["attempts"] = {f"emails:{s['offset'].iloc[0]}"}
    # A stream group committing past the last published offset, in its event and its row.
    ticks = ev[ev["queue"] == "ticks"]
    beyond = int(ticks["offset"].max()) + 5
    commit = ticks[ticks["kind"] == "committed"].sort_values("id").iloc[-1]
    extra.append({**commit.to_dict(), "id": int(ev["id"].max()) + 2, "offset": beyond,
                  "time": int(ev["time"].max()) + 1})  # fmt: skip
    groups = tables["queue_groups"].copy()
    groups.loc[(groups["queue"] == "ticks") & (groups["group"] == "readers"), "committed"] = beyond + 1
    tables["queue_groups"] = groups
    expected["commits_published"] = {f"ticks:{beyond}"}
    # A pending row the events say was acked.
    s = story("orders", ["delivered", "acked"], group="billing")
    delivery = s[(s["kind"] == "delivered") & (s["group"] == "billing")].iloc[0]
    stale = {"queue": "orders", "group": "billing", "offset": int(delivery["offset"]), "state": "held",
             "consumer": delivery["consumer"], "node": "local", "delivered_at": int(delivery["time"]),
             "attempts": 1, "available_at": None, "reason": None}  # fmt: skip
    tables["queue_pending"] = pd.concat([tables["queue_pending"], pd.DataFrame([stale])], ignore_index=True)
    expected["live_state"] = {f"orders:{delivery['offset']}"}
    # An ack stamped a minute before its message was published.
    s = story("jobs", acked)
    ev.loc[s[s["kind"] == "acked"].index, "time"] = int(s["time"].min()) - 60_000
    expected["time_ordered"] = {f"jobs:{s['offset'].iloc[0]}"}
    # A duplicated publish event: the publication's write retried.
    s = story("emails", acked)
    after(s[s["kind"] == "published"].iloc[0])
    expected["published_once"] = {f"emails:{s['offset'].iloc[0]}"}

    ledger_faults(tables, ev, extra, story, after, expected)
    tables["queue_events"] = pd.concat([ev, pd.DataFrame(extra)], ignore_index=True).sort_values("id")
    return expected


def ledger_faults(
    tables: dict[str, Any], ev: Any, extra: list[dict[str, Any]], story: Any, after: Any,
    expected: dict[str, set[str]],
) -> None:  # fmt: skip
    """Evidence of a message's fate removed, altered or duplicated, in work queues, dead-letter
    queues and the stream: ten ways, each in its own message, added to ``expected``."""
    import pandas as pd

    def flag(rule: str, *ids: str) -> None:
        expected.setdefault(rule, set()).update(ids)

    def drop_rows(table: str, queue: str, offset: int) -> None:
        rows = tables[table]
        tables[table] = rows[~((rows["queue"] == queue) & (rows["offset"] == offset))]

    def drop_events(index: Any) -> None:
        ev.drop(index, inplace=True)

    def copy_of(s: pd.DataFrame) -> tuple[str, int]:
        """The dead-letter queue and offset a message's dead_lettered event names."""
        reason = s[s["kind"] == "dead_lettered"]["reason"].iloc[0]
        queue, _, offset = reason.split(" -> ")[1].rpartition(":")
        return queue, int(offset)

    def copy_event(queue: str, offset: int) -> Any:
        return ev[(ev["queue"] == queue) & (ev["offset"] == offset) & (ev["kind"] == "published")]

    acked = ["delivered", "acked"]
    rejected = ["delivered", "rejected", "dead_lettered"]
    # 1. Work queue: acked, then every event of its group deleted with its rows (the cursor is past it).
    s = story("jobs", acked)
    drop_events(s[s["group"].notna()].index)
    flag("accounted", f"jobs:{s['offset'].iloc[0]}")
    # 2. Work queue with two groups: one group's whole history of a message deleted; the other's stays.
    s = story("orders", acked, group="billing")
    while list(s[s["group"] == "$default"].sort_values("id")["kind"]) != acked:
        s = story("orders", acked, group="billing")
    drop_events(s[s["group"] == "billing"].index)
    flag("accounted", f"orders:{s['offset'].iloc[0]}")
    # 3. Nacked at its last attempt, its dead_lettered event and its copy in the DLQ deleted.
    s = story(
        "emails", ["delivered", "nacked", "delivered", "nacked", "delivered", "nacked", "dead_lettered"]
    )
    dlq, at = copy_of(s)
    drop_events(s[s["kind"] == "dead_lettered"].index)
    drop_events(copy_event(dlq, at).index)
    drop_rows("queue_messages", dlq, at)
    flag("accounted", f"emails:{s['offset'].iloc[0]}")
    # 4. A dead letter whose copy never arrived: the copy's event and row deleted, the cause kept.
    s = story("jobs", rejected)
    dlq, at = copy_of(s)
    drop_events(copy_event(dlq, at).index)
    drop_rows("queue_messages", dlq, at)
    flag("copies_traced", f"jobs:{s['offset'].iloc[0]}")
    # 5. A copy in the DLQ altered to claim another (acked) source: a copy with no cause, and a
    # cause with no copy.
    s = story("orders", rejected)
    dlq, at = copy_of(s)
    other = story("orders", acked)
    ev.loc[copy_event(dlq, at).index, "reason"] = f"dead_letter from orders:{other['offset'].iloc[0]}"
    flag("copies_traced", f"{dlq}:{at}", f"orders:{s['offset'].iloc[0]}")
    # 6. A copy duplicated at the DLQ's tail (its offset reserved, so only the copy is wrong).
    s = story("emails", rejected)
    dlq, at = copy_of(s)
    queues = tables["queues"].copy()
    tail = int(queues.loc[queues["name"] == dlq, "next_offset"].iloc[0])
    queues.loc[queues["name"] == dlq, "next_offset"] = tail + 1
    tables["queues"] = queues
    published = copy_event(dlq, at).iloc[0]
    extra.append({**published.to_dict(), "id": int(ev["id"].max()) + 4, "offset": tail})
    row = tables["queue_messages"]
    twin = row[(row["queue"] == dlq) & (row["offset"] == at)].assign(offset=tail)
    tables["queue_messages"] = pd.concat([row, twin], ignore_index=True)
    flag("copies_traced", f"{dlq}:{tail}")
    # 7. Acked after it was dead-lettered: two fates in one group.
    s = story("jobs", rejected)
    after(s[s["kind"] == "dead_lettered"].iloc[0], kind="acked", reason=None)
    flag("single_fate", f"jobs:{s['offset'].iloc[0]}")
    # 8. A stream message gone from queue_messages with no event.
    ticks = ev[(ev["queue"] == "ticks") & (ev["kind"] == "published")].sort_values("offset")
    gone = int(ticks["offset"].iloc[3])
    drop_rows("queue_messages", "ticks", gone)
    flag("accounted", f"ticks:{gone}")
    # 9. A stream message dropped by retention twice (the drop's write retried), its row gone.
    twice = int(ticks["offset"].iloc[1])
    head = ticks[ticks["offset"] == twice].iloc[0]
    drop_rows("queue_messages", "ticks", twice)
    for k in (1, 3):
        drop = {
            "kind": "dropped",
            "reason": "retention_count",
            "consumer": None,
            "time": int(head["time"]) + 50,
        }
        extra.append({**head.to_dict(), "id": int(ev["id"].max()) + 4 + k, **drop})
    flag("single_fate", f"ticks:{twice}")
    # 10. A dead letter redriven with no copy back in its queue: the DLQ row deleted and a redriven
    # event naming a copy that was never published.
    s = story("emails", rejected)
    dlq, at = copy_of(s)
    copy = copy_event(dlq, at).iloc[0]
    emails_next = int(tables["queues"].loc[tables["queues"]["name"] == "emails", "next_offset"].iloc[0])
    extra.append({**copy.to_dict(), "id": int(ev["id"].max()) + 9, "kind": "redriven", "consumer": None,
                  "reason": f"-> emails:{emails_next}", "time": int(ev["time"].max()) + 1})  # fmt: skip
    drop_rows("queue_messages", dlq, at)
    flag("copies_traced", f"{dlq}:{at}")


@pytest.fixture(scope="session")
def faulty_audit(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path, dict[str, set[str]]]:
    """The audit and its report on generated tables with one fault per message: (result, report
    directory, the message ids each invariant must flag)."""
    from bench.audit_bench import _dlq_reasons, generate
    from trimaran.analytics import report
    from trimaran.analytics.replay import replay
    from trimaran.analytics.source import Selection

    tables = generate(3000)
    _dlq_reasons(tables["queue_events"])
    expected = inject_faults(tables)
    result = replay({name: _frame(spark, name, frame) for name, frame in tables.items()})
    directory = tmp_path_factory.mktemp("audit-report")
    report.write(result, directory, source="generated tables with faults", selection=Selection())
    return result, directory, expected
