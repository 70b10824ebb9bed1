"""MQTT 3.1.1 and 5.0 onto durable queues (``$queue/<q>``) with paho-mqtt 2.x against the real server.

Each test uses its own queue name, so the tests share one server without interfering; the restart
and crash tests run their own server on their own working directory.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import topic_matches_sub

from tests.interop.conftest import BOTH_STORAGES, endpoints_of, start_server, storage_env
from tests.support.names import unique
from tests.support.paho import (
    V5,
    V311,
    Client,
    Endpoints,
    PacketTypes,
    Received,
    close_all,
    connect,
    props,
    user_props,
    watch_pubacks,
)
from tests.support.server import RunningServer, serving
from trimaran.mqtt.codec import NEED_DATA, Decoder, encode
from trimaran.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionOptions,
)
from trimaran.mqtt.properties import Properties

# Nack backoff short enough for a test to see the retry.
QUEUE_ENV = {
    "TRIMARAN_QUEUES__DEFAULTS__BACKOFF_INITIAL_S": "0.1",
    "TRIMARAN_QUEUES__DEFAULTS__BACKOFF_MAX_S": "0.5",
}


@pytest.fixture(scope="module")
def qserver(
    tmp_path_factory: pytest.TempPathFactory,
    tls_files: dict[str, str],
    request: pytest.FixtureRequest,
    server_storage: str,
) -> Iterator[RunningServer]:
    env = {**QUEUE_ENV, **storage_env(request, server_storage)}
    with serving(start_server(tmp_path_factory.mktemp("queues"), tls_files, env)) as server:
        yield server


@pytest.fixture(scope="module")
def qmqtt(qserver: RunningServer, tls_files: dict[str, str]) -> Endpoints:
    return endpoints_of(qserver, tls_files)


def drain_all(clients: list[Client], count: int, timeout: float = 10.0) -> list[list[Received]]:
    """Collect ``count`` messages spread over several clients."""
    got: list[list[Received]] = [[] for _ in clients]
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < count:
        assert time.monotonic() < deadline, f"only {sum(map(len, got))} of {count} arrived"
        for i, c in enumerate(clients):
            with contextlib.suppress(queue.Empty):
                got[i].append(c.messages.get(timeout=0.02))
    return got


def control(client: Client, topic: str, message_id: str, **extra: str) -> None:
    """Settle a delivery through ``$queue/<q>/$ack|$nack|$reject``; PUBACK 0 means it was done."""
    client.publish(
        topic,
        b"",
        qos=1,
        properties=props(PacketTypes.PUBLISH, UserProperty=[("message-id", message_id), *extra.items()]),
    )


# -- publish and consume ------------------------------------------------------------------------


@BOTH_STORAGES
@pytest.mark.parametrize("version", [V311, V5])
def test_publish_acked_and_consumed(qmqtt: Endpoints, version: int) -> None:
    q = f"$queue/basic-{version}"
    pub = connect(qmqtt, version=version)  # type: ignore[arg-type]
    sub = connect(qmqtt, version=version)  # type: ignore[arg-type]
    try:
        for i in range(3):  # stored before anyone consumes: publish() waits for the PUBACK
            pub.publish(q, f"m{i}".encode(), qos=1)
        sub.subscribe(q, qos=1)
        for i in range(3, 5):
            pub.publish(q, f"m{i}".encode(), qos=1)
        got = sub.drain(5, timeout=5)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5)]
        assert {m.topic for m in got} == {q}
        assert {m.qos for m in got} == {1}
        if version == V5:
            headers = user_props(got[0])
            assert headers["x-queue"] == f"basic-{version}"
            assert headers["x-queue-redelivered"] == "false"
            assert headers["x-queue-message-id"]
        sub.expect_none(0.3)
    finally:
        close_all(pub, sub)


@BOTH_STORAGES
@pytest.mark.parametrize("version", [V311, V5])
def test_competing_consumers_split_without_duplicates(qmqtt: Endpoints, version: int) -> None:
    q = f"$queue/compete-{version}"
    a = connect(qmqtt, version=version)  # type: ignore[arg-type]
    b = connect(qmqtt, version=version)  # type: ignore[arg-type]
    pub = connect(qmqtt, version=version)  # type: ignore[arg-type]
    try:
        a.subscribe(q, qos=1)
        b.subscribe(q, qos=1)
        for i in range(40):
            pub.publish(q, f"m{i}".encode(), qos=1)
        got_a, got_b = drain_all([a, b], 40)
        payloads = [m.payload for m in got_a + got_b]
        assert sorted(payloads) == sorted(f"m{i}".encode() for i in range(40))  # none lost, none twice
        assert got_a and got_b, f"not split: a={len(got_a)} b={len(got_b)}"
        a.expect_none(0.2)
        b.expect_none(0.2)
    finally:
        close_all(a, b, pub)


@BOTH_STORAGES
def test_named_groups_each_receive_everything(qmqtt: Endpoints) -> None:
    q = "$queue/groups"
    g1 = connect(qmqtt, version=V5)
    g2 = connect(qmqtt, version=V5)
    pub = connect(qmqtt, version=V5)
    try:
        g1.subscribe(f"$share/g1/{q}", qos=1)
        g2.subscribe(f"$share/g2/{q}", qos=1)
        for i in range(10):
            pub.publish(q, f"m{i}".encode(), qos=1)
        expected = [f"m{i}".encode() for i in range(10)]
        got1 = g1.drain(10)
        got2 = g2.drain(10)
        assert [m.payload for m in got1] == expected
        assert [m.payload for m in got2] == expected
        assert {user_props(m)["x-queue-group"] for m in got1} == {"g1"}
        assert {user_props(m)["x-queue-group"] for m in got2} == {"g2"}
    finally:
        close_all(g1, g2, pub)


@BOTH_STORAGES
def test_a_filtered_consumer_gets_its_keys_and_leaves_the_rest(qmqtt: Endpoints) -> None:
    """``$queue/<q>/<filter>``: a consumer of one routing-key filter gets only what matches it, in
    order; what it passes over stays for a plain consumer of the same group."""
    q = "$queue/keyed"
    pub = connect(qmqtt, version=V5)
    europe = connect(qmqtt, version=V5)
    plain = connect(qmqtt, version=V5)
    try:
        europe.subscribe(f"{q}/eu/#", qos=1)
        keys = ["eu/paris", "us/nyc", "eu/rome", "us/sf", "eu/oslo"]
        for key in keys:
            pub.publish(f"{q}/{key}", key.encode(), qos=1).wait_for_publish(5)
        got = europe.drain(3)
        assert [m.payload for m in got] == [b"eu/paris", b"eu/rome", b"eu/oslo"]
        assert all(m.topic.startswith(f"{q}/eu/") for m in got)  # it matches the filter it came for
        plain.subscribe(q, qos=1)
        assert sorted(m.payload for m in plain.drain(2)) == [b"us/nyc", b"us/sf"]
        europe.expect_none(0.2)
        plain.expect_none(0.2)
    finally:
        close_all(pub, europe, plain)


# -- settling: PUBACK, nack, reject ---------------------------------------------------------------


@pytest.mark.parametrize("version", [V311, V5])
def test_puback_acks_no_redelivery_after_reconnect(qmqtt: Endpoints, version: int) -> None:
    q = f"$queue/acked-{version}"
    pub = connect(qmqtt, version=version)  # type: ignore[arg-type]
    sub = connect(qmqtt, version=version)  # type: ignore[arg-type]
    try:
        sub.subscribe(q, qos=1)
        for i in range(3):
            pub.publish(q, f"m{i}".encode(), qos=1)
        assert [m.payload for m in sub.drain(3)] == [b"m0", b"m1", b"m2"]  # paho PUBACKs each
        time.sleep(0.2)  # let the PUBACKs reach the server before the connection goes
        sub.disconnect()
        sub = connect(qmqtt, version=version)  # type: ignore[arg-type]
        sub.subscribe(q, qos=1)
        sub.expect_none(0.5)
        pub.publish(q, b"m3", qos=1)
        assert sub.expect().payload == b"m3"
    finally:
        close_all(pub, sub)


@BOTH_STORAGES
def test_nack_redelivers_v5(qmqtt: Endpoints) -> None:
    # paho 2.x cannot put a reason code on a PUBACK (Client.ack(mid, qos) sends plain success), so
    # the nack goes through the control topic, naming the delivery by x-queue-message-id.
    q = "$queue/nacked"
    pub = connect(qmqtt, version=V5)
    sub = connect(qmqtt, version=V5, manual_ack=True)
    try:
        sub.subscribe(q, qos=1)
        pub.publish(q, b"again", qos=1)
        first = sub.expect()
        headers = user_props(first)
        assert headers["x-queue-attempt"] == "1" and headers["x-queue-redelivered"] == "false"
        control(sub, f"{q}/$nack", headers["x-queue-message-id"])
        second = sub.expect(5)
        assert second.payload == b"again"
        again = user_props(second)
        assert again["x-queue-message-id"] == headers["x-queue-message-id"]
        assert again["x-queue-redelivered"] == "true"
        assert again["x-queue-attempt"] == "2"
        sub.client.ack(second.mid, 1)
        time.sleep(0.2)
        sub.disconnect()
        other = connect(qmqtt, version=V5)
        try:
            other.subscribe(q, qos=1)
            other.expect_none(0.5)  # the ack after the nack settled it for good
        finally:
            other.disconnect()
    finally:
        close_all(pub, sub)


def test_control_nack_returns_credit_and_late_puback_settles_nothing_v5(qmqtt: Endpoints) -> None:
    """$nack through the control topic gives the credit back at once; the PUBACK of that first copy,
    arriving after the redelivery, must not ack the redelivery (nor take its credit)."""
    q = "$queue/control-credit"
    pub = connect(qmqtt, version=V5)
    sub = connect(qmqtt, version=V5, manual_ack=True, properties=props(PacketTypes.CONNECT, ReceiveMaximum=2))
    try:
        codes = watch_pubacks(sub)
        sub.subscribe(q, qos=1)
        pub.publish(q, b"a", qos=1)
        first = sub.expect()
        message_id = user_props(first)["x-queue-message-id"]
        control(sub, f"{q}/$nack", message_id)
        second = sub.expect(5)  # after the 0.1 s backoff
        assert user_props(second)["x-queue-attempt"] == "2"
        sub.client.ack(first.mid, 1)  # the late PUBACK of the nacked copy: MQTT bookkeeping only
        info = sub.publish(
            f"{q}/$nack", b"", qos=1, properties=props(UserProperty=[("message-id", message_id)])
        )
        assert codes[info.mid] == 0, "the redelivery was settled by the earlier copy's PUBACK"
        third = sub.expect(5)
        assert user_props(third)["x-queue-attempt"] == "3"
        sub.client.ack(second.mid, 1)
        sub.client.ack(third.mid, 1)  # this one acks for real
        # Every credit is back: a window of two new messages arrives without further PUBACKs.
        pub.publish(q, b"b", qos=1)
        pub.publish(q, b"c", qos=1)
        assert sorted(m.payload for m in sub.drain(2)) == [b"b", b"c"]
        sub.expect_none(0.3)  # "a" stays acked
    finally:
        close_all(pub, sub)


@pytest.mark.parametrize("action", ["ack", "reject"])
def test_control_settle_then_puback_keeps_the_control_meaning(qmqtt: Endpoints, action: str) -> None:
    """A PUBACK right behind a $ack/$reject on the same connection completes the MQTT exchange only."""
    q = f"$queue/control-then-puback-{action}"
    pub = connect(qmqtt, version=V5)
    sub = connect(qmqtt, version=V5, manual_ack=True, properties=props(PacketTypes.CONNECT, ReceiveMaximum=1))
    dlq = connect(qmqtt, version=V5)
    try:
        codes = watch_pubacks(sub)
        sub.subscribe(q, qos=1)
        for payload in (b"m0", b"m1", b"m2"):
            pub.publish(q, payload, qos=1)
        got = []
        for _ in range(3):
            m = sub.expect()
            got.append(m.payload)
            message_id = user_props(m)["x-queue-message-id"]
            info = sub.publish(
                f"{q}/${action}",
                b"",
                qos=1,
                properties=props(UserProperty=[("message-id", message_id), ("reason", "bad")]),
                wait=False,
            )
            sub.client.ack(m.mid, 1)  # sent right behind the control PUBLISH
            info.wait_for_publish(5)
            assert codes[info.mid] == 0
        assert got == [b"m0", b"m1", b"m2"]  # the window of one moved on each time
        sub.expect_none(0.3)
        dlq.subscribe(f"$queue/$dlq/control-then-puback-{action}", qos=1)
        if action == "reject":
            dead = dlq.drain(3)
            assert [m.payload for m in dead] == [b"m0", b"m1", b"m2"]
            assert {user_props(m)["x-dead-letter-reason"] for m in dead} == {"bad"}
        else:
            dlq.expect_none(0.3)
    finally:
        close_all(pub, sub, dlq)


def test_control_ack_by_payload_v311(qmqtt: Endpoints) -> None:
    """3.1.1 has no user properties: the message id is the payload of the control PUBLISH. Only
    the connection holding the delivery may settle it (tests/security cover the refusals)."""
    q = "$queue/control-311"
    pub = connect(qmqtt, version=V311)
    sub = connect(qmqtt, version=V5, manual_ack=True)  # reads the message id from its headers
    settler = connect(qmqtt, version=V311)
    try:
        sub.subscribe(q, qos=1)
        pub.publish(q, b"x", qos=1)
        got = sub.expect()
        sub.publish(f"{q}/$ack", user_props(got)["x-queue-message-id"].encode(), qos=1)
        sub.client.ack(got.mid, 1)
        sub.disconnect()
        again = connect(qmqtt, version=V311)
        try:
            again.subscribe(q, qos=1)
            again.expect_none(0.5)
        finally:
            again.disconnect()
    finally:
        close_all(pub, settler)


@BOTH_STORAGES
def test_reject_goes_to_dead_letter_queue(qmqtt: Endpoints) -> None:
    q = "$queue/rejected"
    pub = connect(qmqtt, version=V5)
    sub = connect(qmqtt, version=V5, manual_ack=True)
    dlq = connect(qmqtt, version=V5)
    try:
        sub.subscribe(q, qos=1)
        pub.publish(q, b"poison", qos=1, properties=props(PacketTypes.PUBLISH, UserProperty=[("k", "v")]))
        got = sub.expect()
        message_id = user_props(got)["x-queue-message-id"]
        control(sub, f"{q}/$reject", message_id, reason="cannot parse")
        dlq.subscribe("$queue/$dlq/rejected", qos=1)
        dead = dlq.expect()
        assert dead.payload == b"poison"
        # MQTT 5 4.7: the topic sent matches the subscription, so per-filter callbacks fire
        assert dead.topic == "$queue/$dlq/rejected"
        assert topic_matches_sub("$queue/$dlq/rejected", dead.topic)
        history = user_props(dead)
        assert history["k"] == "v"
        assert history["x-dead-letter-queue"] == "rejected"
        assert history["x-dead-letter-reason"] == "cannot parse"
        assert history["x-dead-letter-group"]
        assert history["x-dead-letter-attempts"] == "1"
        assert history["x-dead-letter-topic"] == q
        assert history["x-dead-letter-time"]
        sub.expect_none(0.3)  # not redelivered to the consumer
    finally:
        close_all(pub, sub, dlq)


@BOTH_STORAGES
def test_disconnect_redelivers_to_another_consumer(qmqtt: Endpoints) -> None:
    q = "$queue/dropped"
    pub = connect(qmqtt, version=V5)
    first = connect(qmqtt, version=V5, manual_ack=True)
    second = connect(qmqtt, version=V5)
    try:
        first.subscribe(q, qos=1)
        pub.publish(q, b"held", qos=1)
        held = first.expect()
        assert user_props(held)["x-queue-redelivered"] == "false"
        second.subscribe(q, qos=1)
        second.expect_none(0.3)  # still held by the first consumer
        first.drop()  # no PUBACK, no DISCONNECT
        got = second.expect(5)
        assert got.payload == b"held"
        headers = user_props(got)
        assert headers["x-queue-redelivered"] == "true"
        assert headers["x-queue-message-id"] == user_props(held)["x-queue-message-id"]
    finally:
        close_all(pub, second)


@pytest.mark.parametrize("version", [V311, V5])
def test_redelivery_carries_dup_first_delivery_does_not(qmqtt: Endpoints, version: int) -> None:
    """MQTT's own redelivery flag, the only one a 3.1.1 consumer sees (RabbitMQ's MQTT plugin sets
    DUP from the queue's redelivered flag too); found by the crash series after restarts."""
    q = f"$queue/dup-{version}"
    pub = connect(qmqtt, version=V5)
    first = connect(qmqtt, version=version, manual_ack=True)  # type: ignore[arg-type]
    second = connect(qmqtt, version=version)  # type: ignore[arg-type]
    try:
        first.subscribe(q, qos=1)
        pub.publish(q, b"held", qos=1)
        assert first.expect().dup is False
        second.subscribe(q, qos=1)
        first.drop()
        got = second.expect(5)
        assert (got.payload, got.dup) == (b"held", True)
        pub.publish(q, b"fresh", qos=1)
        fresh = second.expect(5)
        assert (fresh.payload, fresh.dup) == (b"fresh", False)
    finally:
        close_all(pub, second)


# -- refusals and QoS 0 ---------------------------------------------------------------------------


def test_retained_publish_refused_v5(qmqtt: Endpoints) -> None:
    q = "$queue/retained"
    pub = connect(qmqtt, version=V5)
    sub = connect(qmqtt, version=V5)
    try:
        codes = watch_pubacks(pub)
        info = pub.publish(q, b"kept", qos=1, retain=True, wait=False)
        info.wait_for_publish(5)
        assert codes.get(info.mid, 0) >= 0x80, codes
        pub.publish(q, b"plain", qos=1)  # the connection survives a refusal
        sub.subscribe(q, qos=1)
        assert sub.expect().payload == b"plain"
        sub.expect_none(0.3)
    finally:
        close_all(pub, sub)


def test_retained_publish_refused_v311_closes(qmqtt: Endpoints) -> None:
    pub = connect(qmqtt, version=V311)
    try:
        pub.publish("$queue/retained-311", b"kept", qos=1, retain=True, wait=False)
        pub.disconnects.get(timeout=5)  # 3.1.1 has no negative PUBACK: the server closes
    finally:
        pub.client.loop_stop()
    sub = connect(qmqtt, version=V311)
    try:
        sub.subscribe("$queue/retained-311", qos=1)
        sub.expect_none(0.3)
    finally:
        sub.disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_qos0_subscription_consumes_at_most_once(qmqtt: Endpoints, version: int) -> None:
    q = f"$queue/qos0-{version}"
    pub = connect(qmqtt, version=version)  # type: ignore[arg-type]
    sub = connect(qmqtt, version=version)  # type: ignore[arg-type]
    try:
        sub.subscribe(q, qos=0)
        for i in range(5):
            pub.publish(q, f"m{i}".encode(), qos=1)
        got = sub.drain(5)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5)]
        assert {m.qos for m in got} == {0}
        sub.drop()  # no acks were owed: nothing comes back
        again = connect(qmqtt, version=version)  # type: ignore[arg-type]
        try:
            again.subscribe(q, qos=1)
            again.expect_none(0.5)
        finally:
            again.disconnect()
    finally:
        close_all(pub)


# -- restart and crash ----------------------------------------------------------------------------


def queue_depth(server: RunningServer, name: str, token: str) -> int:
    """What the admin API says the queue holds (``depth``: its stored messages)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        path = "/api/v1/queues/" + urllib.parse.quote(name, safe="")
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, body
        return int(json.loads(body)["depth"])
    finally:
        conn.close()


def test_acks_behind_an_untaken_message_leave_the_queue_empty(
    tmp_path: Path, tls_files: dict[str, str]
) -> None:
    """Issue 42: a filtered consumer (``$queue/<q>/red``) takes and acks the two messages behind
    one nobody has taken yet; a plain consumer then takes that one and acks it. Nothing is left
    stored, live, and after a clean restart on the same data nothing is delivered again."""
    name = unique("zoo")
    q = f"$queue/{name}"
    token = "q42"
    env = {**QUEUE_ENV, "TRIMARAN_HTTP__TOKENS": json.dumps([token])}
    server = start_server(tmp_path, tls_files, env)
    try:
        mqtt = endpoints_of(server, tls_files)
        pub = connect(mqtt, version=V5)
        for payload, key in ((b"grasshopper", "green"), (b"panda", "red"), (b"squirrel", "red")):
            pub.publish(f"{q}/{key}", payload, qos=1)
        pub.disconnect()
        red = connect(mqtt, version=V5)
        try:
            red.subscribe(f"{q}/red", qos=1)
            assert [m.payload for m in red.drain(2)] == [b"panda", b"squirrel"]  # PUBACKed by paho
            red.expect_none(0.3)
        finally:
            red.disconnect()
        plain = connect(mqtt, version=V5)
        try:
            plain.subscribe(q, qos=1)
            assert plain.expect().payload == b"grasshopper"
            plain.expect_none(0.3)
        finally:
            plain.disconnect()
        deadline = time.monotonic() + 5
        while (depth := queue_depth(server, name, token)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the last PUBACK's commit
        assert depth == 0
    finally:
        assert server.stop() == 0, server.output()
    server = start_server(tmp_path, tls_files, env)
    try:
        assert queue_depth(server, name, token) == 0
        again = connect(endpoints_of(server, tls_files), version=V5)
        try:
            again.subscribe(q, qos=1)
            again.expect_none(1.0)
        finally:
            again.disconnect()
    finally:
        assert server.stop() == 0, server.output()


def test_restart_loses_nothing(tmp_path: Path, tls_files: dict[str, str]) -> None:
    q = "$queue/restart"
    server = start_server(tmp_path, tls_files, QUEUE_ENV)
    try:
        pub = connect(endpoints_of(server, tls_files), version=V5)
        for i in range(20):
            pub.publish(q, f"m{i}".encode(), qos=1)
        pub.disconnect()
    finally:
        assert server.stop() == 0, server.output()
    server = start_server(tmp_path, tls_files, QUEUE_ENV)
    try:
        sub = connect(endpoints_of(server, tls_files), version=V5)
        try:
            sub.subscribe(q, qos=1)
            got = sub.drain(20)
            assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
            sub.expect_none(0.3)
        finally:
            sub.disconnect()
    finally:
        assert server.stop() == 0, server.output()


def test_crash_keeps_every_acknowledged_publish(
    tmp_path: Path, tls_files: dict[str, str], storage_url: str
) -> None:
    """SIGKILL under load, on SQLite and on PostgreSQL (``storage_url`` runs the test on each)."""
    q = "$queue/crash"
    total = 3000
    env = {**QUEUE_ENV, "TRIMARAN_STORAGE__URL": storage_url}
    server = start_server(tmp_path, tls_files, env)
    acked_mids: list[int] = []  # appended by paho's thread; mapped to payloads afterwards
    mids: dict[int, int] = {}  # mid -> payload index (mids do not wrap below 65535 publishes)
    enough = threading.Event()
    try:
        pub = connect(endpoints_of(server, tls_files), version=V5)

        def on_publish(_c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
            if not getattr(reason, "is_failure", False):
                acked_mids.append(mid)
            if len(acked_mids) >= total // 3:
                enough.set()

        pub.client.on_publish = on_publish
        for i in range(total):
            mids[pub.client.publish(q, f"m{i}".encode(), qos=1).mid] = i
        assert enough.wait(15), f"only {len(acked_mids)} PUBACKs"
        server.kill()  # SIGKILL with publishes still in flight
        pub.client.loop_stop()
    finally:
        server.kill()
    confirmed = {mids[mid] for mid in list(acked_mids)}
    assert 0 < len(confirmed) < total, "the kill should land mid-stream"

    server = start_server(tmp_path, tls_files, env)
    try:
        sub = connect(endpoints_of(server, tls_files), version=V5)
        try:
            sub.subscribe(q, qos=1)
            seen: set[int] = set()
            deadline = time.monotonic() + 15
            while not confirmed <= seen and time.monotonic() < deadline:
                try:
                    seen.add(int(sub.expect(0.5).payload[1:]))
                except queue.Empty:
                    continue  # a loaded machine can pause longer than one poll; the deadline decides
            missing = sorted(confirmed - seen)
            assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:10]}"
        finally:
            sub.disconnect()
    finally:
        assert server.stop() == 0, server.output()


class RawClient:
    """Our own codec over a socket: paho cannot send a PUBACK with a reason code."""

    def __init__(self, endpoints: Endpoints, client_id: str, expiry: int | None = None) -> None:
        self.sock = socket.create_connection((endpoints.host, endpoints.tcp), timeout=5)
        self.decoder = Decoder(protocol_level=MQTT_5)
        keep = Properties(session_expiry_interval=expiry)  # a session that outlives the connection
        connect = Connect(protocol_level=MQTT_5, client_id=client_id)
        if expiry is not None:
            connect = Connect(protocol_level=MQTT_5, clean_start=False, client_id=client_id, properties=keep)
        self.send(connect)
        self.connack = self.next()
        assert isinstance(self.connack, ConnAck)

    def send(self, *packets: Any) -> None:
        self.sock.sendall(b"".join(encode(packet, MQTT_5) for packet in packets))  # one write

    def next(self, timeout: float = 5.0) -> Any:
        self.sock.settimeout(timeout)
        while (packet := self.decoder.next_packet()) is NEED_DATA:
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed"
            self.decoder.feed(chunk)
        return packet

    def close(self) -> None:
        self.sock.close()


def test_puback_reason_codes_nack_then_reject_v5(qmqtt: Endpoints) -> None:
    q = "$queue/puback-codes"
    raw = RawClient(qmqtt, "raw-puback-codes")
    pub = connect(qmqtt, version=V5)
    dlq = connect(qmqtt, version=V5)
    try:
        raw.send(Subscribe(1, [(q, SubscriptionOptions(1))]))
        assert isinstance(suback := raw.next(), SubAck) and suback.reason_codes == [1]
        pub.publish(q, b"twice", qos=1)
        first = raw.next()
        assert isinstance(first, Publish) and first.payload == b"twice" and first.packet_id is not None
        raw.send(PubAck(first.packet_id, 0x80))  # Unspecified error: nack, retry after backoff
        second = raw.next()
        assert isinstance(second, Publish) and second.payload == b"twice" and second.packet_id is not None
        headers = dict(second.properties.user_properties)
        assert headers["x-queue-redelivered"] == "true" and headers["x-queue-attempt"] == "2"
        raw.send(PubAck(second.packet_id, 0x83))  # Implementation specific error: reject
        dlq.subscribe("$queue/$dlq/puback-codes", qos=1)
        dead = dlq.expect()
        assert dead.payload == b"twice"
        history = user_props(dead)
        assert history["x-dead-letter-reason"] == "client reason code 0x83"
        assert history["x-dead-letter-attempts"] == "2"
        with pytest.raises(TimeoutError):
            raw.next(0.3)  # not redelivered after the reject
    finally:
        raw.close()
        close_all(pub, dlq)


def test_pubacks_in_the_read_that_disconnects_are_settled_v5(qmqtt: Endpoints) -> None:
    """PUBACKs are settled once per read; the DISCONNECT in the same write must not turn them into
    releases (redelivered to the next consumer)."""
    q = "$queue/puback-then-bye"
    raw = RawClient(qmqtt, "raw-puback-bye")
    pub = connect(qmqtt, version=V5)
    after = connect(qmqtt, version=V5)
    try:
        raw.send(Subscribe(1, [(q, SubscriptionOptions(1))]))
        assert isinstance(raw.next(), SubAck)
        for i in range(3):
            pub.publish(q, b"%d" % i, qos=1)
        got = [raw.next() for _ in range(3)]
        assert all(isinstance(p, Publish) and p.packet_id is not None for p in got)
        raw.send(*(PubAck(p.packet_id) for p in got), Disconnect())
        pub.publish(q, b"last", qos=1)
        after.subscribe(q, qos=1)
        assert after.expect().payload == b"last"  # the three acked ones are not redelivered
        after.expect_none(0.3)
    finally:
        raw.close()
        close_all(pub, after)


@pytest.mark.parametrize("back", ["after-the-commit", "at-once"])
def test_qos2_queue_publish_cut_off_before_its_pubrec_is_appended_once_v5(
    qmqtt: Endpoints, back: str
) -> None:
    """A QoS 2 queue publish whose connection ends in the same write, before the commit: its PUBREC
    cannot be sent, but its packet id is remembered once committed, so the PUBLISH the client sends
    again on its next connection is answered, not appended a second time; a resend that comes before
    the commit is held and answered after it."""
    q = f"$queue/qos2-cut-off-{back}"
    client_id = f"raw-qos2-cut-off-{back}"
    sub = connect(qmqtt, version=V5)
    pub = connect(qmqtt, version=V5)
    raw = RawClient(qmqtt, client_id, expiry=60)
    try:
        sub.subscribe(q, qos=1)
        raw.send(Publish(q, b"once", 2, packet_id=7))
        raw.close()  # the PUBLISH and the end of the connection in one read, as a client that dies
        if back == "after-the-commit":
            assert sub.expect().payload == b"once"
            # Commits complete in order: once a later publish is acknowledged, so is the cut-off one.
            pub.publish(q, b"later", qos=1)  # waits for its PUBACK
            assert sub.expect().payload == b"later"
        raw = RawClient(qmqtt, client_id, expiry=60)
        assert raw.connack.session_present
        raw.send(Publish(q, b"once", 2, dup=True, packet_id=7))
        assert raw.next() == PubRec(7)
        raw.send(PubRel(7))
        assert raw.next() == PubComp(7)
        if back == "at-once":
            assert sub.expect().payload == b"once"
        sub.expect_none(0.5)  # appended once
    finally:
        raw.close()
        close_all(sub, pub)


def test_persistent_session_resumes_queue_subscription_without_duplicates(qmqtt: Endpoints) -> None:
    q = "$queue/resumed"
    pub = connect(qmqtt, version=V311)
    sub = connect(qmqtt, "queue-resume-1", version=V311, clean=False, manual_ack=True)
    try:
        sub.subscribe(q, qos=1)
        pub.publish(q, b"held", qos=1)
        assert sub.expect().payload == b"held"
        sub.drop()  # unacked: the queue takes it back
        sub = connect(qmqtt, "queue-resume-1", version=V311, clean=False)
        got = sub.expect(5)  # the resumed session consumes again, no new SUBSCRIBE
        assert got.payload == b"held"
        sub.expect_none(0.5)  # once: the session does not resend what the queue redelivers
        pub.publish(q, b"next", qos=1)
        assert sub.expect().payload == b"next"
    finally:
        close_all(pub, sub)
