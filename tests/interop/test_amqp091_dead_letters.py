"""Dead-lettering as RabbitMQ does it (issue 22), the same pika test against us and RabbitMQ.

- A message that expires (x-message-ttl, or its own expiration) on a queue with
  x-dead-letter-exchange is dead-lettered with reason ``expired``.
- The dead-letter exchange is routed when the message dies, with its headers: a binding made
  after the source queue was declared counts, a fanout reaches every bound queue, a headers
  exchange matches.
- The dead letter comes with exchange = the DLX, routing key = x-dead-letter-routing-key or its
  own, and x-death (queue, reason, count, exchange, routing-keys, time), counted up per cycle,
  plus x-first-death-*.
- Dead letters that reach ``$queue/`` dead-letter queues, from any protocol, carry x-death too.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.names import unique
from tests.support.server import RunningServer


@pytest.fixture
def channel(amqp_port: int) -> Iterator[BlockingChannel]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def get(channel: BlockingChannel, queue: str, timeout: float = 6.0) -> tuple[Any, Any, bytes]:
    """basic.get until a message comes (expiry runs on a timer on both brokers)."""
    deadline = time.monotonic() + timeout
    while True:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, props, body
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing arrived on {queue}")
        time.sleep(0.05)


def deaths(props: Any) -> list[dict[str, Any]]:
    table = props.headers["x-death"]
    return [{k: (v.decode() if isinstance(v, bytes) else v) for k, v in d.items()} for d in table]


def test_expired_messages_are_dead_lettered_through_a_fanout_bound_later(channel: BlockingChannel) -> None:
    dlx, source = unique("dlx"), unique("ttl")
    letters = [unique("letters"), unique("letters")]
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(
        source, auto_delete=True, arguments={"x-message-ttl": 100, "x-dead-letter-exchange": dlx}
    )
    for name in letters:  # bound after the source queue was declared
        channel.queue_declare(name, exclusive=True)
        channel.queue_bind(name, dlx)
    channel.basic_publish("", source, b"late", pika.BasicProperties(headers={"n": 1}))
    for name in letters:
        method, props, body = get(channel, name)
        assert body == b"late"
        assert (method.exchange, method.routing_key) == (dlx, source)
        assert props.headers["n"] == 1
        [death] = deaths(props)
        assert death["queue"] == source and death["reason"] == "expired" and death["count"] == 1
        assert death["exchange"] == "" and death["routing-keys"] == [source]
        assert isinstance(death["time"], datetime.datetime)
        assert props.headers["x-first-death-queue"] == source
        assert props.headers["x-first-death-reason"] == "expired"
        assert props.headers["x-first-death-exchange"] == ""
    channel.queue_delete(source)


def test_per_message_expiration_keeps_the_original(channel: BlockingChannel) -> None:
    dlx, source, letters = unique("dlx"), unique("src"), unique("letters")
    channel.exchange_declare(dlx, "direct", auto_delete=True)
    channel.queue_declare(
        source,
        auto_delete=True,
        arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "timeouts"},
    )
    channel.queue_declare(letters, exclusive=True)
    channel.queue_bind(letters, dlx, "timeouts")
    channel.basic_publish("", source, b"rpc", pika.BasicProperties(expiration="80"))
    method, props, body = get(channel, letters)
    assert (body, method.exchange, method.routing_key) == (b"rpc", dlx, "timeouts")
    assert props.expiration is None  # a dead letter does not carry its old TTL
    [death] = deaths(props)
    assert death["reason"] == "expired" and death["original-expiration"] == "80"
    channel.queue_delete(source)


def test_headers_exchange_dead_letters_match_the_message_headers(channel: BlockingChannel) -> None:
    dlx, source, timeouts, others = unique("dlx"), unique("src"), unique("timeouts"), unique("others")
    channel.exchange_declare(dlx, "headers", auto_delete=True)
    channel.queue_declare(source, auto_delete=True, arguments={"x-dead-letter-exchange": dlx})
    channel.queue_declare(timeouts, exclusive=True)
    channel.queue_declare(others, exclusive=True)
    channel.queue_bind(timeouts, dlx, arguments={"x-match": "any", "kind": "timeout"})
    channel.queue_bind(others, dlx, arguments={"x-match": "all", "kind": "other"})
    channel.basic_publish("", source, b"late", pika.BasicProperties(headers={"kind": "timeout"}))
    deadline = time.monotonic() + 5
    method = None
    while method is None and time.monotonic() < deadline:
        method, _props, _body = channel.basic_get(source, auto_ack=False)
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)
    _m, props, body = get(channel, timeouts)
    assert body == b"late" and deaths(props)[0]["reason"] == "rejected"
    assert channel.basic_get(others, auto_ack=True)[0] is None
    channel.queue_delete(source)


def test_x_death_counts_each_cycle(channel: BlockingChannel) -> None:
    """work rejects -> retry (TTL) expires -> work again: one x-death entry per queue and reason,
    newest first, each count raised on every cycle."""
    retry_x, work, retry = unique("retry-x"), unique("work"), unique("retry")
    channel.exchange_declare(retry_x, "direct", auto_delete=True)
    channel.queue_declare(
        work,
        auto_delete=True,
        arguments={"x-dead-letter-exchange": retry_x, "x-dead-letter-routing-key": "later"},
    )
    channel.queue_declare(
        retry,
        auto_delete=True,
        arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work},
    )
    channel.queue_bind(retry, retry_x, "later")
    channel.basic_publish("", work, b"job")
    for cycle in (1, 2):
        deadline = time.monotonic() + 6
        method = None
        while method is None and time.monotonic() < deadline:
            method, props, _body = channel.basic_get(work, auto_ack=False)
            if method is None:
                time.sleep(0.05)
        assert method is not None, f"cycle {cycle}: the job did not come back"
        if cycle == 2:
            assert (method.exchange, method.routing_key) == ("", work)
            found = [(d["queue"], d["reason"], d["count"]) for d in deaths(props)]
            assert found == [(retry, "expired", 1), (work, "rejected", 1)]
        channel.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _b = get(channel, work)
    found = [(d["queue"], d["reason"], d["count"]) for d in deaths(props)]
    assert found == [(retry, "expired", 2), (work, "rejected", 2)]
    assert props.headers["x-first-death-queue"] == work
    assert props.headers["x-first-death-reason"] == "rejected"
    channel.queue_delete(work)
    channel.queue_delete(retry)


def test_dead_letters_of_a_queue_made_over_mqtt_carry_x_death(amqp_server: RunningServer) -> None:
    """A ``$queue/`` queue created by an MQTT publisher dead-letters into ``$dlq/<name>``; an AMQP
    0.9.1 consumer of the dead letters sees the same x-death as for an AMQP queue."""
    name = unique("mq")
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.connect("127.0.0.1", amqp_server.ports["mqtt"])
    client.loop_start()
    try:
        client.publish(f"$queue/{name}", b"from mqtt", qos=1).wait_for_publish(5)
    finally:
        client.loop_stop()
        client.disconnect()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"]))
    try:
        channel = conn.channel()
        method, _props, body = channel.basic_get(name, auto_ack=False)
        assert method is not None and body == b"from mqtt"
        channel.basic_reject(method.delivery_tag, requeue=False)
        _m, props, body = get(channel, f"$dlq/{name}")
        assert body == b"from mqtt"
        [death] = deaths(props)
        assert (death["queue"], death["reason"], death["count"]) == (name, "rejected", 1)
        assert props.headers["x-first-death-queue"] == name
    finally:
        conn.close()


def test_messages_dropped_by_max_length_are_dead_lettered(channel: BlockingChannel) -> None:
    dlx, source, letters = unique("dlx"), unique("short"), unique("letters")
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(letters, exclusive=True)
    channel.queue_bind(letters, dlx)
    channel.queue_declare(
        source, auto_delete=True, arguments={"x-max-length": 2, "x-dead-letter-exchange": dlx}
    )
    channel.confirm_delivery()
    for i in range(4):  # the default overflow drops the head
        channel.basic_publish("", source, b"%d" % i)
    kept = [channel.basic_get(source, auto_ack=True)[2] for _ in range(2)]
    assert kept == [b"2", b"3"]
    dropped = [get(channel, letters) for _ in range(2)]
    assert [body for _m, _p, body in dropped] == [b"0", b"1"]
    for _m, props, _b in dropped:
        [death] = deaths(props)
        assert (death["queue"], death["reason"], death["count"]) == (source, "maxlen", 1)
    channel.queue_delete(source)


def test_reject_publish_dlx_refuses_and_dead_letters(channel: BlockingChannel) -> None:
    dlx, source, letters = unique("dlx"), unique("full"), unique("letters")
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    channel.queue_declare(letters, exclusive=True)
    channel.queue_bind(letters, dlx)
    channel.queue_declare(
        source,
        auto_delete=True,
        arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlx},
    )
    channel.confirm_delivery()
    channel.basic_publish("", source, b"in")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", source, b"over")
    _m, props, body = get(channel, letters)
    assert body == b"over"
    [death] = deaths(props)
    assert (death["queue"], death["reason"], death["count"]) == (source, "maxlen", 1)
    assert channel.basic_get(source, auto_ack=True)[2] == b"in"
    channel.queue_delete(source)
