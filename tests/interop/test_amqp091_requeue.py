"""What a consumer held when it went is back on the queue at once, for the next basic.get (pika
against a real server, on SQLite and on PostgreSQL with ``queues.shared`` on: issue 46).

RabbitMQ requeues a closed channel's or connection's unacknowledged deliveries, and a cancelled
consumer's once its channel closes, before it answers anything else; pika's acceptance suite
(``TestCloseConnectionFromBasicConsumeCallback``, ``TestCloseChannelFromBasicConsumeCallback``)
closes from inside the consume callback and gets both messages back in order. A shared node holds
only what it claimed, so its get waits for a claim (it found nothing before). Each case runs against
RabbitMQ 3.10 too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pika = pytest.importorskip("pika")

from tests.interop.conftest import BOTH_STORAGES  # noqa: E402
from tests.support.names import unique  # noqa: E402
from tests.support.server import RunningServer  # noqa: E402

CLOSES: dict[str, Callable[[Any, Any], None]] = {
    "connection": lambda connection, channel: connection.close(),
    "channel": lambda connection, channel: channel.close(),
}


def connect(port: int) -> Any:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def two_held(port: int, durable: bool, close: Callable[[Any, Any], None]) -> str:
    """A queue with two messages, consumed with acks by a consumer that ``close(connection,
    channel)`` from its callback at the first delivery, leaving both unacknowledged."""
    connection = connect(port)
    channel = connection.channel()
    channel.confirm_delivery()  # each publish confirmed before the next: both are in
    queue = unique("requeue")
    channel.queue_declare(queue, durable=durable, auto_delete=False)
    for body in (b"first", b"second"):
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)

    def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        close(connection, ch)

    channel.basic_consume(queue, on_message, auto_ack=False)
    channel.start_consuming()
    assert channel.is_closed
    if connection.is_open:
        connection.close()
    return queue


def gets(port: int, queue: str, n: int = 3) -> list[tuple[bytes, bool] | None]:
    connection = connect(port)
    try:
        channel = connection.channel()
        got: list[tuple[bytes, bool] | None] = []
        for _ in range(n):
            method, _, body = channel.basic_get(queue, auto_ack=True)
            got.append(None if method is None else (body, method.redelivered))
        channel.queue_delete(queue)
        return got
    finally:
        connection.close()


def closing_from_the_callback_requeues_at_once(port: int, durable: bool, closed: str) -> None:
    queue = two_held(port, durable, CLOSES[closed])
    assert gets(port, queue) == [(b"first", True), (b"second", True), None]


def a_cancelled_consumer_hands_back_what_it_held_when_its_channel_closes(port: int) -> None:
    """basic.cancel leaves the deliveries with the channel, to be acked still (RabbitMQ's rule);
    closing the channel requeues them, and another channel's get sees them at once."""
    connection = connect(port)
    try:
        channel = connection.channel()
        queue = unique("cancelled")
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"held", pika.BasicProperties(delivery_mode=2), mandatory=True)
        method, _, body = next(channel.consume(queue, auto_ack=False, inactivity_timeout=5))
        assert body == b"held"
        channel.cancel()
        other = connection.channel()
        assert other.basic_get(queue, auto_ack=True)[0] is None  # still held by the first channel
        channel.close()
        method, _, body = other.basic_get(queue, auto_ack=True)
        assert (body, method.redelivered) == (b"held", True)
        other.queue_delete(queue)
    finally:
        connection.close()


DURABLE = pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
CLOSED = pytest.mark.parametrize("closed", list(CLOSES))


@BOTH_STORAGES
@DURABLE
@CLOSED
def test_closing_from_the_consume_callback_requeues_at_once(
    amqp_server: RunningServer, durable: bool, closed: str
) -> None:
    closing_from_the_callback_requeues_at_once(amqp_server.ports["amqp"], durable, closed)


@BOTH_STORAGES
def test_a_cancelled_consumer_hands_back_what_it_held_when_its_channel_closes(
    amqp_server: RunningServer,
) -> None:
    a_cancelled_consumer_hands_back_what_it_held_when_its_channel_closes(amqp_server.ports["amqp"])


@DURABLE
@CLOSED
def test_rabbitmq_requeues_at_once_too(rabbitmq_port: int, durable: bool, closed: str) -> None:
    closing_from_the_callback_requeues_at_once(rabbitmq_port, durable, closed)


def test_rabbitmq_hands_back_a_cancelled_consumers_deliveries_the_same_way(rabbitmq_port: int) -> None:
    a_cancelled_consumer_hands_back_what_it_held_when_its_channel_closes(rabbitmq_port)
