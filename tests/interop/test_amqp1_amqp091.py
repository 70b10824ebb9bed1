"""AMQP 1.0 (proton) <-> AMQP 0.9.1 (pika) on the one AMQP port: topics and queues both ways."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

proton = pytest.importorskip("proton")
pika = pytest.importorskip("pika")

from proton import Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from tests.support.amqp1 import body_bytes  # noqa: E402
from tests.support.server import RunningServer  # noqa: E402


@pytest.fixture
def amqp1(amqp1_url: str) -> Iterator[BlockingConnection]:
    c = BlockingConnection(amqp1_url, timeout=10)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def channel(amqp1_server: RunningServer) -> Iterator[object]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp1_server.ports["amqp"]))
    try:
        yield conn.channel()
    finally:
        conn.close()


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def test_amq_topic_publish_reaches_an_amqp1_receiver(amqp1: BlockingConnection, channel: object) -> None:
    root = unique("p2a")
    receiver = amqp1.create_receiver(f"topic://{root}/+", credit=5)
    props = pika.BasicProperties(
        content_type="text/plain", correlation_id="c-1", reply_to="replies", headers={"k": "v"}
    )
    channel.basic_publish("amq.topic", f"{root}.kitchen", b"from pika", props)  # type: ignore[attr-defined]
    got = receiver.receive(timeout=5)
    receiver.accept()
    assert body_bytes(got) == b"from pika"
    assert got.content_type == "text/plain"
    assert got.correlation_id == "c-1"
    assert got.properties == {"k": "v"}
    assert got.address == f"topic://{root}/kitchen"


def test_amqp1_topic_send_reaches_a_queue_bound_to_amq_topic(
    amqp1: BlockingConnection, channel: object
) -> None:
    root = unique("a2p")
    ch = channel
    q = ch.queue_declare("", exclusive=True).method.queue  # type: ignore[attr-defined]
    ch.queue_bind(q, "amq.topic", f"{root}.*")  # type: ignore[attr-defined]
    amqp1.create_sender(f"topic://{root}/x").send(
        Message(body="from proton", content_type="text/plain", correlation_id="c-2", properties={"k": "v"})
    )
    method, props, body = next(ch.consume(q, auto_ack=True, inactivity_timeout=5))  # type: ignore[attr-defined]
    assert body == b"from proton"
    assert (method.exchange, method.routing_key) == ("amq.topic", f"{root}.x")
    assert props.content_type == "text/plain"
    assert props.correlation_id == "c-2"
    assert props.headers == {"k": "v"}
    ch.cancel()  # type: ignore[attr-defined]


def test_pika_queue_publish_consumed_over_amqp1(amqp1: BlockingConnection, channel: object) -> None:
    q = unique("pq")
    channel.queue_declare(q, durable=True)  # type: ignore[attr-defined]
    for i in range(3):
        channel.basic_publish("", q, f"job {i}".encode())  # type: ignore[attr-defined]
    receiver = amqp1.create_receiver(q, credit=10)
    messages = [receiver.receive(timeout=5) for _ in range(3)]  # keep them: proton's bodies are views
    receiver.accept()
    assert [body_bytes(m) for m in messages] == [b"job 0", b"job 1", b"job 2"]


def test_amqp1_queue_send_consumed_over_pika(amqp1: BlockingConnection, channel: object) -> None:
    q = unique("aq")
    sender = amqp1.create_sender(q)
    for i in range(3):
        sender.send(Message(body=f"task {i}"))
    channel.queue_declare(q, durable=True, passive=True)  # type: ignore[attr-defined]
    got = []
    for method, _props, body in channel.consume(q, inactivity_timeout=5):  # type: ignore[attr-defined]
        assert method is not None, "timed out"
        got.append(body)
        channel.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
        if len(got) == 3:
            break
    channel.cancel()  # type: ignore[attr-defined]
    assert got == [b"task 0", b"task 1", b"task 2"]
