"""Limits per vhost and per user with real clients (trimaran/tenant_limits.py, the runtime's rate).

Each limit bites the protocol's way and loses nothing: a vhost or user over its connection limit is
refused at CONNECT (MQTT 5 CONNACK 0x97 Quota exceeded, 3.1.1 return code 3) or connection.open
(AMQP 0.9.1 530 NOT_ALLOWED, as RabbitMQ's ``set_vhost_limits`` does) or open (AMQP 1.0
``amqp:resource-limit-exceeded``); a publisher over its user's rate is slowed to about that rate by
its socket not being read, and every QoS 1 message it sent is delivered.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from proton import ConnectionException, Disposition, Message
from proton.utils import BlockingConnection, LinkDetached, SendException

from tests.support.paho import Endpoints, close_all, connect, watch_pubacks
from tests.support.server import RunningServer, serving

V311 = MQTTProtocolVersion.MQTTv311
V5 = MQTTProtocolVersion.MQTTv5
ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"]


def _server(tmp: Path, limits: dict[str, object]) -> RunningServer:
    env = {"TRIMARAN_AUTH__ALLOW_ANONYMOUS": "true"}
    env.update({f"TRIMARAN_LIMITS__{key.upper()}": json.dumps(value) for key, value in limits.items()})
    return RunningServer(ARGS, cwd=tmp, env=env).start()


@pytest.fixture(scope="module")
def two_per_vhost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    limits = {"vhosts": {"/": {"max_connections": 2}}}
    with serving(_server(tmp_path_factory.mktemp("vhost"), limits)) as server:
        yield server


@pytest.fixture(scope="module")
def rated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    limits = {"default_user": {"max_messages_per_s": 100, "max_bytes_per_s": 100_000, "max_connections": 3}}
    with serving(_server(tmp_path_factory.mktemp("rated"), limits)) as server:
        yield server


@pytest.fixture(scope="module")
def two_queues(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    limits = {"vhosts": {"/": {"max_queues": 2}}}
    with serving(_server(tmp_path_factory.mktemp("queues"), limits)) as server:
        yield server


@pytest.fixture(scope="module")
def quota(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    limits = {"vhosts": {"/": {"max_stored_bytes": 1000}}}
    with serving(_server(tmp_path_factory.mktemp("quota"), limits)) as server:
        yield server


def _endpoints(server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", server.ports["mqtt"])


def _connack(port: int, version: MQTTProtocolVersion) -> int:
    """The CONNACK's reason code (5.0) or return code (3.1.1) a fresh paho client gets."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=version, reconnect_on_failure=False)
    got: list[int] = []
    client.on_connect = lambda _c, _u, _f, reason, _p: got.append(reason.value)
    client.connect("127.0.0.1", port)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        client.loop(0.1)
    client.disconnect()
    assert got, "no CONNACK"
    return got[0]


def _refused_by_every_protocol(server: RunningServer, amqp_refusal: str) -> None:
    mqtt_port, amqp_port = server.ports["mqtt"], server.ports["amqp"]
    assert _connack(mqtt_port, V5) == 0x97  # Quota exceeded
    # 3.1.1 has no quota code: return code 3, Server unavailable (paho shows it as 5.0's 0x88).
    assert _connack(mqtt_port, V311) == 0x88
    params = pika.ConnectionParameters("127.0.0.1", amqp_port, connection_attempts=1)
    # pika reports a close at connection.open as a probable access denial, RabbitMQ's too.
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        pika.BlockingConnection(params)
    assert "(530)" in str(refused.value)
    assert amqp_refusal in str(refused.value)
    with pytest.raises(ConnectionException) as amqp1:
        BlockingConnection(f"amqp://127.0.0.1:{amqp_port}", timeout=5).close()
    assert "resource-limit-exceeded" in str(amqp1.value)


def _let_in_again(server: RunningServer) -> None:
    """A freed place is taken as soon as the server has seen the close."""
    deadline = time.monotonic() + 5
    while _connack(server.ports["mqtt"], V5) != 0:
        assert time.monotonic() < deadline, "the freed place was not given back"
        time.sleep(0.05)


def test_a_vhost_over_its_connection_limit_is_refused_by_every_protocol(two_per_vhost: RunningServer) -> None:
    endpoints = _endpoints(two_per_vhost)
    first = connect(endpoints, "first")
    second = connect(endpoints, "second")
    try:
        _refused_by_every_protocol(two_per_vhost, "connection limit (2) is reached")
        # The two inside still work, and a place freed is a place taken.
        second.subscribe("limits/t", 1)
        first.publish("limits/t", b"still here", qos=1)
        assert second.expect().payload == b"still here"
    finally:
        close_all(second)
    _let_in_again(two_per_vhost)
    close_all(first)
    assert "limits: vhost '/': connection limit (2) is reached" in two_per_vhost.output()
    said = "limits: vhost '/': connection limit (2) is reached; counted from now on"
    assert two_per_vhost.output().count(said) == 1  # once, however often it bit


def test_a_user_over_its_connection_limit_is_refused(rated: RunningServer) -> None:
    endpoints = _endpoints(rated)
    clients = [connect(endpoints, f"c{n}") for n in range(3)]
    try:
        _refused_by_every_protocol(rated, "user connection limit (3) is reached")
    finally:
        close_all(*clients)
    _let_in_again(rated)


def test_a_publisher_over_its_rate_is_slowed_and_loses_nothing(rated: RunningServer) -> None:
    endpoints = _endpoints(rated)
    subscriber = connect(endpoints, "reader", version=V5)
    publisher = connect(endpoints, "writer", version=V5)
    try:
        subscriber.subscribe("limits/rate", 1)
        count = 300  # 100 a second, a second's worth at once: the rest takes about 2 s
        started = time.monotonic()
        for n in range(count):
            publisher.publish("limits/rate", str(n).encode(), qos=1)
        got = subscriber.drain(count, timeout=20)
        elapsed = time.monotonic() - started
    finally:
        close_all(subscriber, publisher)
    assert [int(m.payload) for m in got] == list(range(count))
    assert elapsed > 1.5, f"{count} messages at 100/s took only {elapsed:.2f}s"
    assert elapsed < 6, f"{count} messages at 100/s took {elapsed:.2f}s"
    assert "limits: user '' (vhost '/'): over its publish rate" in rated.output()


def _pika(server: RunningServer) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))


def test_a_queue_declare_over_the_vhost_limit_is_refused_as_rabbitmq_does(two_queues: RunningServer) -> None:
    connection = _pika(two_queues)
    try:
        channel = connection.channel()
        channel.queue_declare("q1", durable=True)
        channel.queue_declare("q2", durable=True)
        channel.queue_declare("q1", durable=True)  # declaring one that exists adds nothing
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("q3", durable=True)
        assert refused.value.reply_code == 406  # PRECONDITION_FAILED
        assert refused.value.reply_text == (
            "PRECONDITION_FAILED - cannot declare queue 'q3' in vhost '/': vhost queue limit (2) is reached"
        )
        channel = connection.channel()
        channel.queue_delete("q1")
        channel.queue_declare("q3", durable=True)
    finally:
        connection.close()
    endpoints = _endpoints(two_queues)
    client = connect(endpoints, "queuer", version=V5)
    try:
        codes = client.subscribe("$queue/q4", 1)
    finally:
        close_all(client)
    assert [code.value for code in codes] == [0x97]  # SUBACK Quota exceeded
    amqp1 = BlockingConnection(f"amqp://127.0.0.1:{two_queues.ports['amqp']}", timeout=5)
    try:
        with pytest.raises(LinkDetached) as detached:
            amqp1.create_receiver("$queue/q5")
        assert "amqp:resource-limit-exceeded" in str(detached.value)
    finally:
        amqp1.close()


def test_a_publish_over_the_stored_bytes_quota_is_refused_and_nothing_accepted_is_lost(
    quota: RunningServer,
) -> None:
    endpoints = _endpoints(quota)
    body = b"x" * 300
    publisher = connect(endpoints, "filler", version=V5)
    pubacks = watch_pubacks(publisher)
    try:
        mids = [publisher.publish("$queue/full", body, qos=1).mid for _ in range(4)]
    finally:
        close_all(publisher)
    assert [pubacks[mid] for mid in mids] == [0, 0, 0, 0x97]  # the fourth would pass 1000 bytes
    connection = _pika(quota)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", "$queue/full", b"y" * 200)
        got = []
        for _ in range(3):
            method, _props, payload = channel.basic_get("full", auto_ack=True)
            assert method is not None
            got.append(payload)
        assert got == [body, body, body]  # every accepted message is there
        channel.basic_publish("", "$queue/full", b"y" * 200)  # room again: confirmed
    finally:
        connection.close()
    amqp1 = BlockingConnection(f"amqp://127.0.0.1:{quota.ports['amqp']}", timeout=5)
    try:
        sender = amqp1.create_sender("$queue/full")
        sender.send(Message(body=b"z" * 700))  # 200 + 700: fits
        with pytest.raises(SendException) as rejected:
            sender.send(Message(body=b"z" * 200))
        assert rejected.value.state == Disposition.REJECTED
    finally:
        amqp1.close()


def _admin(server: RunningServer, method: str, path: str, body: object = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        headers = {"Authorization": "Bearer limits-token", "Content-Type": "application/json"}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def test_limits_set_through_the_admin_api_outlive_a_restart(tmp_path: Path) -> None:
    args = [*ARGS[:-1], "127.0.0.1:0"]  # the admin API on too
    env = {"TRIMARAN_AUTH__ALLOW_ANONYMOUS": "true", "TRIMARAN_HTTP__TOKENS": '["limits-token"]'}
    with serving(RunningServer(args, cwd=tmp_path, env=env).start()) as first:
        status, _ = _admin(first, "PUT", "/api/v1/limits/vhosts/%2F", {"max_connections": 1})
        assert status == 200
        assert _admin(first, "PUT", "/api/v1/limits/default-user", {"max_messages_per_s": 50})[0] == 200
    with serving(RunningServer(args, cwd=tmp_path, env=env).start()) as second:
        _, limits = _admin(second, "GET", "/api/v1/limits")
        assert limits["vhosts"]["/"]["max_connections"] == 1
        assert limits["default_user"]["max_messages_per_s"] == 50
        holder = connect(_endpoints(second), "holder")
        try:
            assert _connack(second.ports["mqtt"], V5) == 0x97
        finally:
            close_all(holder)


def test_a_3_1_1_publish_over_the_quota_is_not_acknowledged_and_the_connection_closes(
    quota: RunningServer,
) -> None:
    """3.1.1 has no negative PUBACK: the server closes the connection (section 3.3.5), and the
    client still holds the message, unacknowledged, to send again."""
    endpoints = _endpoints(quota)
    connection = _pika(quota)
    try:
        # The other test's messages: start from 0 of 1000 bytes. Run alone, there is no queue yet
        # (the first publish makes it): nothing to purge.
        with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
            connection.channel().queue_purge("full")
    finally:
        connection.close()
    publisher = connect(endpoints, "old-filler", version=V311)
    try:
        publisher.publish("$queue/full", b"a" * 600, qos=1)
        refused = publisher.publish("$queue/full", b"b" * 600, qos=1, wait=False)
        publisher.disconnects.get(timeout=10)  # the server closed the connection
        assert not refused.is_published()  # no PUBACK: paho keeps it to send again
    finally:
        publisher.client.loop_stop()
    connection = _pika(quota)
    try:
        method, _props, body = connection.channel().basic_get("full", auto_ack=True)
        assert method is not None and body == b"a" * 600
        assert method.message_count == 0  # the refused one was never stored
    finally:
        connection.close()


def test_an_amqp_publisher_over_its_bytes_rate_is_slowed_and_every_confirmed_message_is_there(
    rated: RunningServer,
) -> None:
    connection = _pika(rated)
    try:
        channel = connection.channel()
        channel.queue_declare("rated", durable=True)
        channel.confirm_delivery()
        body = b"r" * 10_000
        started = time.monotonic()
        for n in range(40):  # 400 kB at 100 kB/s, a second's worth at once: about 3 s
            channel.basic_publish("", "rated", body, pika.BasicProperties(message_id=str(n)))
        elapsed = time.monotonic() - started
        got = []
        while (message := channel.basic_get("rated", auto_ack=True))[0] is not None:
            got.append(message[1].message_id)
    finally:
        connection.close()
    assert got == [str(n) for n in range(40)]
    assert 2.0 < elapsed < 8, f"400 kB at 100 kB/s took {elapsed:.2f}s"
