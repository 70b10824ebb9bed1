"""kombu (the transport under Celery) against a real ``trimaran serve`` and, where the behaviour is
RabbitMQ's, the same test against a private RabbitMQ (issue 18): a Producer/Consumer round trip on
a durable queue with headers of several types, ``$queue/<name>`` through the default exchange, and
basic.get's ``message_count`` as RabbitMQ counts it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

kombu = pytest.importorskip("kombu")

from kombu import Connection, Consumer, Exchange, Producer, Queue  # noqa: E402

from tests.support.names import unique  # noqa: E402
from tests.support.server import RunningServer  # noqa: E402


def connect(port: int) -> Connection:
    return Connection(f"amqp://guest:guest@127.0.0.1:{port}//", connect_timeout=5)


@pytest.fixture
def conn(amqp_port: int) -> Iterator[Connection]:
    with connect(amqp_port) as c:
        yield c


def test_producer_consumer_round_trip_keeps_headers(conn: Connection) -> None:
    """py-amqp writes 2**40 with field type 'L' (unsigned 64-bit): read, kept and sent back as such."""
    name = unique("kombu")
    queue = Queue(name, Exchange(""), routing_key=name, durable=True, auto_delete=False)
    headers = {"s": "text", "i": 42, "neg": -7, "big": 2**40, "f": 1.5, "b": True, "l": [1, "two"]}
    channel = conn.channel()
    try:
        queue(channel).declare()
        Producer(channel).publish(
            {"hello": "kombu"}, routing_key=name, serializer="json", headers=headers, delivery_mode=2
        )
        got: list[tuple[Any, Any]] = []
        with Consumer(channel, [queue], callbacks=[lambda body, m: (got.append((body, m)), m.ack())]):
            conn.drain_events(timeout=5)
        [(body, message)] = got
        assert body == {"hello": "kombu"}
        assert message.headers == headers
        assert message.properties["delivery_mode"] == 2
        assert message.content_type == "application/json"
    finally:
        queue(channel).delete()
        channel.close()


def test_basic_get_message_count_is_the_ready_messages(conn: Connection) -> None:
    name = unique("kombu-get")
    channel = conn.channel()
    queue = Queue(name, Exchange(""), routing_key=name, durable=True, auto_delete=False)(channel)
    try:
        queue.declare()
        producer = Producer(channel)
        for i in range(3):
            producer.publish(f"m{i}", routing_key=name)
        first = None
        for _ in range(50):  # publishes are asynchronous: wait until the first arrives
            first = queue.get(no_ack=False)
            if first is not None:
                break
        assert first is not None
        # RabbitMQ: the ready messages left, without the one being returned and without unacked.
        assert first.delivery_info["message_count"] == 2
        second = queue.get(no_ack=False)
        assert second is not None and second.delivery_info["message_count"] == 1
        first.ack()
        second.ack()
    finally:
        queue.delete()
        channel.close()


def test_queue_namespace_through_the_default_exchange(amqp_server: RunningServer) -> None:
    """``$queue/<name>`` is ours (RabbitMQ would find no such queue): created on first publish."""
    name = unique("kombu-ns")
    with connect(amqp_server.ports["amqp"]) as c:
        channel = c.channel()
        Producer(channel).publish("first", exchange="", routing_key=f"$queue/{name}", mandatory=True)
        queue = Queue(name, no_declare=True)(channel)
        message = None
        for _ in range(100):
            message = queue.get(no_ack=True)
            if message is not None:
                break
        assert message is not None and message.body in (b"first", "first")
        channel.close()
