"""The audit across a queue's life: deleted and declared again, purged, redriven, expired; and the
selections (``--queue``, ``--since``/``--until``).

One broker run (paho and the admin API over real sockets) writes a SQLite database for the whole
module; each test replays it, and one test breaks copies of its tables in a few new ways.
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from paho.mqtt.packettypes import PacketTypes
from pyspark.sql import SparkSession

from tests.analytics.conftest import BROKER_ENV
from tests.analytics.test_replay import _frame
from tests.interop.conftest import endpoints_of, start_server
from tests.support.paho import V5, Client, Endpoints, connect, props, user_props
from tests.support.server import ALL_OFF
from trimaran.analytics.replay import add_arguments, replay, run_audit
from trimaran.analytics.source import Selection, read_tables

TOKEN = "audit-token"


class Admin:
    """The admin API's queue calls over HTTP, with the bearer token."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                         headers=headers)  # fmt: skip
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()


def _settle(seconds: float = 0.3) -> None:
    """Let PUBACKs, control messages and the group commit land before the next step."""
    time.sleep(seconds)


def _wait_for(admin: Admin, queue: str, field: str, value: int, timeout: float = 10.0) -> None:
    """Poll the admin API until the queue's ``field`` (depth, dlq_depth, ...) is ``value``."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        status, body = admin.call("GET", f"/api/v1/queues/{queue}")
        seen = body.get(field) if status == 200 else body
        if seen == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"queue {queue}: {field} is {seen!r}, not {value} after {timeout} s")


def _mark() -> int:
    """A point in time (epoch ms) with nothing published in the 50 ms either side of it."""
    time.sleep(0.05)
    mark = time.time_ns() // 1_000_000
    time.sleep(0.05)
    return mark


def _settle_by_id(client: Client, queue: str, action: str, message: Any, **extra: str) -> None:
    """``$ack``/``$nack``/``$reject`` a delivery by its message id (the control topics)."""
    user = [("message-id", user_props(message)["x-queue-message-id"]), *extra.items()]
    client.publish(
        f"$queue/{queue}/{action}", b"", qos=1, properties=props(PacketTypes.PUBLISH, UserProperty=user)
    )


def _cycle(mqtt: Endpoints, admin: Admin, pub: Client) -> int:
    """``cycle`` (max 3 attempts): 3 consumed; one nacked 3 times to its DLQ; 2 held by a consumer
    when the queue is deleted; declared again with max 5 attempts, 3 more. Returns a time mark
    taken after the first 3."""
    c = connect(mqtt, version=V5)
    c.subscribe("$queue/cycle", qos=1)
    for i in range(3):
        pub.publish("$queue/cycle", f"old{i}".encode(), qos=1)
    c.drain(3)
    _settle()
    c.disconnect()
    mark = _mark()
    nacker = connect(mqtt, version=V5, manual_ack=True)
    nacker.subscribe("$queue/cycle", qos=1)
    pub.publish("$queue/cycle", b"flaky", qos=1)
    for attempt in range(1, 4):
        m = nacker.expect()
        assert user_props(m)["x-queue-attempt"] == str(attempt)
        _settle_by_id(nacker, "cycle", "$nack", m)
    _wait_for(admin, "cycle", "dlq_depth", 1)
    nacker.disconnect()
    holder = connect(mqtt, version=V5, manual_ack=True)
    holder.subscribe("$queue/cycle", qos=1)
    for i in range(4, 6):
        pub.publish("$queue/cycle", f"old{i}".encode(), qos=1)
    holder.drain(2)
    assert admin.call("DELETE", "/api/v1/queues/cycle")[0] == 200
    holder.disconnect()  # its held deliveries belonged to the deleted queue
    status, body = admin.call("POST", "/api/v1/queues", {"name": "cycle", "max_attempts": 5})
    assert status == 201, body
    again = connect(mqtt, version=V5)
    again.subscribe("$queue/cycle", qos=1)
    for i in range(3):
        pub.publish("$queue/cycle", f"new{i}".encode(), qos=1)
    got = again.drain(3)
    assert [user_props(m)["x-queue-offset"] for m in got] == ["0", "1", "2"]  # offsets start over
    _settle()
    again.disconnect()
    return mark


def _purge(mqtt: Endpoints, admin: Admin, pub: Client) -> None:
    """``purgeme``: 1 acked, 2 held, 1 waiting when purged; the holder acks its 2 after; 2 more after."""
    for i in range(4):
        pub.publish("$queue/purgeme", f"p{i}".encode(), qos=1)
    h = connect(mqtt, version=V5, manual_ack=True, properties=props(PacketTypes.CONNECT, ReceiveMaximum=2))
    h.subscribe("$queue/purgeme", qos=1)
    first = h.expect()
    second = h.expect()
    h.client.ack(first.mid, 1)
    third = h.expect()
    assert [m.payload for m in (first, second, third)] == [b"p0", b"p1", b"p2"]
    _settle()
    status, body = admin.call("POST", "/api/v1/queues/purgeme/purge")
    assert (status, body) == (200, {"count": 3})
    h.client.ack(second.mid, 1)  # settling what the purge removed: nothing to ack any more
    _settle()
    h.client.ack(third.mid, 1)
    for i in range(4, 6):
        pub.publish("$queue/purgeme", f"p{i}".encode(), qos=1)
    for m in h.drain(2):
        h.client.ack(m.mid, 1)
    _settle()
    h.disconnect()


def _redrive(mqtt: Endpoints, admin: Admin, pub: Client) -> None:
    """``redo``: one rejected to ``$dlq/redo``, moved back with redrive, then acked."""
    r = connect(mqtt, version=V5, manual_ack=True)
    r.subscribe("$queue/redo", qos=1)
    pub.publish("$queue/redo", b"d0", qos=1)
    pub.publish("$queue/redo", b"d1", qos=1)
    bad, good = r.drain(2)
    _settle_by_id(r, "redo", "$reject", bad, reason="not now")
    r.client.ack(good.mid, 1)
    _wait_for(admin, "redo", "dlq_depth", 1)
    status, body = admin.call("POST", "/api/v1/queues/redo/redrive", {})
    assert (status, body) == (200, {"count": 1})
    back = r.expect()
    assert back.payload == b"d0"
    assert user_props(back)["x-queue-offset"] == "2"  # a new message at the tail
    r.client.ack(back.mid, 1)
    _settle()
    r.disconnect()


def _expire(admin: Admin, pub: Client) -> None:
    """``brief``: a 0.2 s TTL and no consumer; the manager's sweep (every second) expires both."""
    status, body = admin.call("POST", "/api/v1/queues", {"name": "brief", "ttl_s": 0.2})
    assert status == 201, body
    pub.publish("$queue/brief", b"e0", qos=1)
    pub.publish("$queue/brief", b"e1", qos=1)
    _wait_for(admin, "brief", "depth", 0)


def _window(mqtt: Endpoints, pub: Client) -> int:
    """``win``: 3 messages, then a time mark, then 4 more; all consumed. Returns the mark (ms)."""
    w = connect(mqtt, version=V5)
    w.subscribe("$queue/win", qos=1)
    for i in range(3):
        pub.publish("$queue/win", f"w{i}".encode(), qos=1)
    w.drain(3)
    mark = _mark()
    for i in range(3, 7):
        pub.publish("$queue/win", f"w{i}".encode(), qos=1)
    w.drain(4)
    _settle()
    w.disconnect()
    return mark


@pytest.fixture(scope="module")
def lifecycle_db(
    tmp_path_factory: pytest.TempPathFactory, tls_files: dict[str, str]
) -> tuple[str, tuple[int, int]]:
    """(SQLite URL, (the ``cycle`` mark, the ``win`` mark)): one broker run through every step above."""
    workdir = tmp_path_factory.mktemp("audit-lifecycle")
    url = f"sqlite:///{workdir / 'trimaran.db'}"
    env = {**BROKER_ENV, "TRIMARAN_STORAGE__URL": url, "TRIMARAN_HTTP__TOKENS": json.dumps([TOKEN])}
    args = [*ALL_OFF, "--mqtt", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    server = start_server(workdir, tls_files, env, args)
    try:
        mqtt = endpoints_of(server, tls_files)
        admin = Admin(server.ports["http"])
        pub = connect(mqtt, version=V5)
        try:
            first = _cycle(mqtt, admin, pub)
            _purge(mqtt, admin, pub)
            _redrive(mqtt, admin, pub)
            _expire(admin, pub)
            last = _window(mqtt, pub)
        finally:
            pub.disconnect()
    finally:
        assert server.stop() == 0, server.output()
    return url, (first, last)


def _audit(spark: SparkSession, url: str, output: Path, *options: str) -> tuple[int, dict[str, Any]]:
    """``trimaran audit --storage URL OPTIONS --no-charts`` in this process's Spark session."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, master_default="local[2]")
    args = parser.parse_args([*options, "--output", str(output), "--no-charts"])
    code = run_audit(args, url, spark=spark)
    summary: dict[str, Any] = json.loads((output / "summary.json").read_text())
    return code, summary


def _failed(summary: dict[str, Any]) -> dict[str, Any]:
    return {name: v["examples"] for name, v in summary["invariants"].items() if not v["ok"]}


def test_lifecycle_audits_clean(
    spark: SparkSession, lifecycle_db: tuple[str, tuple[int, int]], tmp_path: Path
) -> None:
    code, summary = _audit(spark, lifecycle_db[0], tmp_path)
    assert _failed(summary) == {}
    assert code == 0
    kinds = summary["counts"]["events_by_kind"]
    # two purges (one of them the delete), one redrive, two expiries
    assert (kinds["purged"], kinds["redriven"], kinds["expired"]) == (2, 1, 2)
    # The newest incarnations: cycle 3, $dlq/cycle 1, purgeme 6, redo 3, $dlq/redo 1, brief 2, win 7.
    assert summary["counts"]["messages"] == 23
    # Gone without a group finishing them: purgeme 0-3 (purged), $dlq/redo:0 (redriven), brief 0-1.
    assert summary["counts"]["messages_removed"] == 7

    lives = pd.read_parquet(tmp_path / "details" / "messages.parquet")
    cycle = lives[lives["queue"] == "cycle"].set_index("message_id")
    old = [f"cycle:{i}@epoch1" for i in range(6)]
    assert set(cycle.index) == {*old, *(f"cycle:{i}" for i in range(3))}
    # The old incarnation: 3 acked, one dead-lettered at its (old) max attempts, and the last two
    # held when the queue was deleted, which is their end.
    assert cycle.loc[old, "last_kind"].tolist() == ["acked"] * 3 + ["dead_lettered"] + ["delivered"] * 2
    assert cycle.loc[old, "status"].tolist() == ["finished"] * 4 + ["held"] * 2
    assert (cycle.loc[[f"cycle:{i}" for i in range(3)], "last_kind"] == "acked").all()
    # The messages the purge removed while held were never acked (the late acks were ignored).
    purged = lives[lives["queue"] == "purgeme"].set_index("offset")
    assert purged.loc[[1, 2], "last_kind"].tolist() == ["delivered", "delivered"]
    assert purged.loc[[0, 4, 5], "last_kind"].tolist() == ["acked"] * 3


def test_queue_selection_audits_only_that_queue(
    spark: SparkSession, lifecycle_db: tuple[str, tuple[int, int]], tmp_path: Path
) -> None:
    code, summary = _audit(spark, lifecycle_db[0], tmp_path, "--queue", "cycle")
    assert _failed(summary) == {}
    assert code == 0
    assert summary["window"]["queues"] == ["cycle"]
    assert summary["counts"]["messages"] == 3  # the newest incarnation's
    lives = pd.read_parquet(tmp_path / "details" / "messages.parquet")
    assert set(lives["queue"]) == {"cycle"}
    assert len(lives) == 9  # both incarnations' (group, message) lives


def test_time_window_audits_clean(
    spark: SparkSession, lifecycle_db: tuple[str, tuple[int, int]], tmp_path: Path
) -> None:
    """From the mark inside ``cycle`` (after its first 3 messages; ISO 8601) to the mark inside
    ``win`` (after its first 3; epoch ms): the delete, the new incarnation, the purge, the redrive
    and the expiries are all inside; the cut-off messages on either side are not audited."""
    url, (since, until) = lifecycle_db
    iso = datetime.fromtimestamp(since / 1000, UTC).isoformat(timespec="milliseconds")
    code, summary = _audit(spark, url, tmp_path, "--since", iso, "--until", str(until))
    assert _failed(summary) == {}
    assert code == 0
    assert (summary["window"]["since_ms"], summary["window"]["until_ms"]) == (since, until)
    # cycle 3 (the newest incarnation), $dlq/cycle 1, purgeme 6, redo 3, $dlq/redo 1, brief 2, win 3
    assert summary["counts"]["messages"] == 19
    lives = pd.read_parquet(tmp_path / "details" / "messages.parquet")
    assert set(lives["message_id"]) >= {"cycle:3@epoch1", "cycle:5@epoch1", "win:2"}
    assert not set(lives["message_id"]) & {"cycle:0@epoch1", "win:3"}


# -- faults of the new kinds, injected into copies of the tables --------------------------------------


def _event(ev: pd.DataFrame, queue: str, kind: str, offset: int) -> int:
    """The index of the first ``kind`` event of ``queue:offset`` (the oldest incarnation's first)."""
    rows = ev[(ev["queue"] == queue) & (ev["kind"] == kind) & (ev["offset"] == offset)]
    assert len(rows), f"the broker run should have written a {kind} event for {queue}:{offset}"
    return int(rows.sort_values("id").index[0])


def test_lifecycle_faults_flag_their_invariant_and_message(
    spark: SparkSession, lifecycle_db: tuple[str, tuple[int, int]]
) -> None:
    """Six faults in one copy, each in its own message; every flagged id must be one of them (or, for
    a deleted redrive, its copy), under the invariant its fault breaks, and nothing else may fail."""
    read = read_tables(spark, Selection(), storage_url=lifecycle_db[0])
    tables: dict[str, pd.DataFrame] = {name: frame.toPandas() for name, frame in read.items()}
    ev = tables["queue_events"]
    drop = [
        _event(ev, "cycle", "delivered", 0),  # the deleted incarnation's delivery of an acked message
        _event(ev, "brief", "expired", 0),  # an expiry without its event
        _event(ev, "$dlq/redo", "redriven", 0),  # a dead letter moved back without its event
    ]
    tables["queue_events"] = ev.drop(drop)
    messages = tables["queue_messages"]
    start = int(ev["time"].min())
    leftovers = [  # a row left after its purge, and one left after its expiry
        {"queue": "purgeme", "offset": 3, "published_at": start, "expires_at": None, "publisher": "p",
         "protocol": "mqtt"},
        {"queue": "brief", "offset": 1, "published_at": start, "expires_at": start + 200, "publisher": "p",
         "protocol": "mqtt"},
    ]  # fmt: skip
    tables["queue_messages"] = pd.concat([messages, pd.DataFrame(leftovers)], ignore_index=True)
    # What the writer once left behind: a pending row of the deleted incarnation (cycle:4 was held
    # there; the newest incarnation ends at offset 2).
    stale = {"queue": "cycle", "group": "$default", "offset": 4, "state": "held", "consumer": "gone",
             "node": "trimaran", "delivered_at": start, "attempts": 1,
             "available_at": None, "reason": None}  # fmt: skip
    tables["queue_pending"] = pd.concat([tables["queue_pending"], pd.DataFrame([stale])], ignore_index=True)

    result = replay({name: _frame(spark, name, frame) for name, frame in tables.items()})
    flagged = {
        name: (outcome["violations"], set(outcome["message_ids"]))
        for name, outcome in result.invariants.items()
        if not outcome["ok"]
    }
    assert flagged == {
        "settled_after_delivery": (1, {"cycle:0@epoch1"}),
        "accounted": (2, {"brief:0", "$dlq/redo:0"}),
        # the copy redo:2 the redrive made, whose cause went with the event
        "copies_traced": (1, {"redo:2"}),
        "live_state": (3, {"purgeme:3", "brief:1", "cycle:4"}),
    }, {n: result.invariants[n]["examples"] for n in flagged}
    assert not result.ok
