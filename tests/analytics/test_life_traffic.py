"""The ledger on the broker's own tables, written by real clients of all three protocols: a group
that joins late and one started past messages another group holds (MQTT), expiry, rejection and
overflow through a dead-letter exchange (pika: causes that name no copy offset), reject, release
and accept (AMQP 1.0). The plain-Python audit (``tests/analytics/plain.py``) must find it clean and
the books balanced, and so must Spark."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pandas as pd
import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.analytics.conftest import BROKER_ENV
from tests.interop.conftest import amqp_server_args
from tests.support.paho import V5, close_all, connect, props
from tests.support.server import RunningServer
from trimaran.analytics.life import FATES
from trimaran.analytics.replay import replay
from trimaran.analytics.source import Selection, read_tables
from trimaran.storage.queue_store import expand_event

pika = pytest.importorskip("pika")
proton_utils = pytest.importorskip("proton.utils")
from proton import Message  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from tests.support.paho import Endpoints  # noqa: E402


def _mqtt_late_group(mqtt: Endpoints) -> None:
    pub = connect(mqtt, version=V5)
    early = connect(mqtt, version=V5)
    early.subscribe("$share/early/$queue/late", qos=1)
    for i in range(3):
        pub.publish("$queue/late", f"l{i}".encode(), qos=1)
    early.drain(3)
    time.sleep(0.3)
    late = connect(mqtt, version=V5)  # joins with every earlier message acked and gone
    late.subscribe("$share/late/$queue/late", qos=1)
    for i in range(3, 5):
        pub.publish("$queue/late", f"l{i}".encode(), qos=1)
    early.drain(2)
    late.drain(2)
    # A group started past messages another group still holds ("stream-offset": "next").
    holder = connect(mqtt, version=V5, manual_ack=True)
    holder.subscribe("$share/holder/$queue/skip", qos=1)
    for i in range(2):
        pub.publish("$queue/skip", f"s{i}".encode(), qos=1)
    held = holder.drain(2)
    time.sleep(0.2)
    ahead = connect(mqtt, version=V5)
    start = props(PacketTypes.SUBSCRIBE, UserProperty=[("stream-offset", "next")])
    ahead.subscribe("$share/ahead/$queue/skip", qos=1, properties=start)
    pub.publish("$queue/skip", b"s2", qos=1)
    assert [m.payload for m in ahead.drain(1)] == [b"s2"]
    for message in [*held, *holder.drain(1)]:
        holder.client.ack(message.mid, 1)
    time.sleep(0.3)
    close_all(pub, early, late, holder, ahead)


def _amqp091_dead_letter_exchange(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.exchange_declare("p.dlx", "fanout", durable=True)
    ch.queue_declare("p.dead", durable=True)
    ch.queue_bind("p.dead", "p.dlx")
    routed = {"x-dead-letter-exchange": "p.dlx"}
    ch.queue_declare("p.ttl", durable=True, arguments={**routed, "x-message-ttl": 100})
    ch.queue_declare("p.work", durable=True, arguments=routed)
    ch.queue_declare("p.cap", durable=True, arguments={**routed, "x-max-length": 2})
    ch.basic_publish("", "p.ttl", b"stale")
    for body in (b"poison", b"fine"):
        ch.basic_publish("", "p.work", body)
    for i in range(3):  # the oldest is dropped for the third, through the exchange
        ch.basic_publish("", "p.cap", f"c{i}".encode())
    for body, settle in (("poison", "reject"), ("fine", "ack")):
        method, _props, got = next(ch.consume("p.work", inactivity_timeout=5))
        assert got == body.encode()
        if settle == "reject":
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)
    ch.cancel()
    conn.sleep(0.5)  # the ttl passes
    assert ch.basic_get("p.ttl", auto_ack=True)[0] is None  # expired, not delivered
    end = time.monotonic() + 5
    dead: list[bytes] = []
    while len(dead) < 3 and time.monotonic() < end:
        method, _props, got = ch.basic_get("p.dead", auto_ack=False)
        if method is None:
            conn.sleep(0.05)
            continue
        dead.append(got)
        ch.basic_ack(method.delivery_tag)
    assert sorted(dead) == [b"c0", b"poison", b"stale"]
    conn.close()


def _amqp1_settlements(port: int) -> None:
    conn = proton_utils.BlockingConnection(f"127.0.0.1:{port}", timeout=10)
    try:
        sender = conn.create_sender("$queue/a1")
        sender.send(Message(body="poison"))
        sender.send(Message(body="again"))
        receiver = conn.create_receiver("$queue/a1", credit=1)
        assert receiver.receive(timeout=5).body == "poison"
        receiver.reject()
        assert receiver.receive(timeout=5).body == "again"
        receiver.release(delivered=False)
        assert receiver.receive(timeout=5).body == "again"
        receiver.accept()
        dlq = conn.create_receiver("$queue/$dlq/a1", credit=1)
        assert dlq.receive(timeout=5).body == "poison"
        dlq.accept()
        time.sleep(0.3)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def traffic_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("ledger-traffic")
    path = workdir / "trimaran.db"
    env = {**BROKER_ENV, "TRIMARAN_STORAGE__URL": f"sqlite:///{path}"}
    server = RunningServer(amqp_server_args(), cwd=workdir, env=env).start()
    try:
        _mqtt_late_group(Endpoints("127.0.0.1", server.ports["mqtt"]))
        _amqp091_dead_letter_exchange(server.ports["amqp"])
        _amqp1_settlements(server.ports["amqp"])
    finally:
        assert server.stop() == 0, server.output()
    return path


def _tables(path: Path) -> dict[str, pd.DataFrame]:
    """The queue tables as ``source.read_tables`` hands them over: events one per offset."""
    with sqlite3.connect(path) as db:
        tables = {
            name: pd.read_sql_query(f"SELECT * FROM {name}", db)
            for name in ("queues", "queue_messages", "queue_groups", "queue_pending", "queue_events")
        }
    events = tables["queue_events"].astype(object).where(tables["queue_events"].notna(), None)
    tables["queue_events"] = pd.DataFrame(
        [e for row in events.to_dict("records") for e in expand_event(row)]
    ).sort_values("id", kind="stable")
    return tables


def test_three_protocols_traffic_is_clean_and_balances(traffic_db: Path) -> None:
    from tests.analytics.plain import audit

    tables = _tables(traffic_db)
    kinds = set(tables["queue_events"]["kind"])
    assert {"expired", "dropped", "dead_lettered", "rejected", "released", "acked"} <= kinds
    reasons = set(tables["queue_events"]["reason"].dropna())
    assert {"ttl -> p.dead", "overflow -> p.dead"} <= reasons  # causes that name no copy offset
    found, outcomes = audit(tables)
    assert found == []
    for (queue, group), by in outcomes.items():
        if group is not None:
            assert by["published"] == sum(by.get(f, 0) for f in FATES), (queue, group, by)
            assert not by.get("lost")
    # The late group's line covers only what was published while it was there.
    assert outcomes[("late", "early")]["published"] == 5 and outcomes[("late", "late")]["published"] == 2
    assert outcomes[("skip", "holder")]["acked"] == 3 and outcomes[("skip", "ahead")] == {
        "published": 1,
        "acked": 1,
    }
    assert outcomes[("p.ttl", None)]["expired"] == 1 and outcomes[("p.cap", None)]["dropped"] == 1


def test_three_protocols_traffic_audits_clean_on_spark(spark: SparkSession, traffic_db: Path) -> None:
    tables = read_tables(spark, Selection(), storage_url=f"sqlite:///{traffic_db}")
    result = replay(tables)
    assert result.ok, {name: rule["examples"] for name, rule in result.invariants.items() if not rule["ok"]}
    assert result.outcomes[("late", "late")]["published"] == 2
