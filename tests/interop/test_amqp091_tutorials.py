"""The six RabbitMQ tutorials with pika (blocking), against a real server over real sockets."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.server import RunningServer


@pytest.fixture
def connect(amqp_server: RunningServer) -> Iterator[pika.BlockingConnection]:
    opened: list[pika.BlockingConnection] = []

    def make() -> pika.BlockingConnection:
        params = pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"])
        conn = pika.BlockingConnection(params)
        opened.append(conn)
        return conn

    yield make
    for conn in opened:
        if conn.is_open:
            conn.close()


def drain(ch: BlockingChannel, queue: str, count: int, timeout: float = 5.0, ack: bool = True) -> list[bytes]:
    got: list[bytes] = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        got.append(body)
        if ack:
            ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    ch.cancel()
    return got


def test_1_hello_world(connect) -> None:  # type: ignore[no-untyped-def]
    ch = connect().channel()
    ch.queue_declare("hello")
    ch.basic_publish("", "hello", b"Hello World!")
    consumer = connect().channel()
    assert drain(consumer, "hello", 1) == [b"Hello World!"]


def test_2_work_queues_manual_acks_and_prefetch(connect) -> None:  # type: ignore[no-untyped-def]
    producer = connect().channel()
    producer.queue_declare("task_queue", durable=True)
    producer.confirm_delivery()
    for i in range(10):
        producer.basic_publish(
            "", "task_queue", b"task %d" % i, pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        )
    worker_a, worker_b = connect().channel(), connect().channel()
    for w in (worker_a, worker_b):
        w.basic_qos(prefetch_count=1)
    # With prefetch 1 a worker holds one unacked message: a second one waits for the ack.
    first_a = next(worker_a.consume("task_queue", inactivity_timeout=5))
    first_b = next(worker_b.consume("task_queue", inactivity_timeout=5))
    assert first_a[0] is not None and first_b[0] is not None
    assert next(worker_a.consume("task_queue", inactivity_timeout=0.3))[0] is None
    worker_a.basic_ack(first_a[0].delivery_tag)
    worker_b.basic_ack(first_b[0].delivery_tag)
    seen = [first_a[2], first_b[2]]
    worker_a.cancel()
    worker_b.cancel()
    seen += drain(worker_a, "task_queue", 8)
    assert sorted(seen) == sorted(b"task %d" % i for i in range(10))


def test_2b_unacked_message_is_redelivered_when_the_worker_dies(connect) -> None:  # type: ignore[no-untyped-def]
    producer = connect().channel()
    producer.queue_declare("fragile", durable=True)
    producer.basic_publish("", "fragile", b"job")
    dying = connect()
    ch = dying.channel()
    method, _props, body = next(ch.consume("fragile", inactivity_timeout=5))
    assert body == b"job" and not method.redelivered
    dying.close()
    again = connect().channel()
    method, _props, body = next(again.consume("fragile", inactivity_timeout=5))
    assert body == b"job" and method.redelivered
    again.basic_ack(method.delivery_tag)


def test_3_publish_subscribe_fanout(connect) -> None:  # type: ignore[no-untyped-def]
    pub = connect().channel()
    pub.exchange_declare("logs", exchange_type="fanout")
    subscribers = []
    for _ in range(2):
        ch = connect().channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        assert queue.startswith("amq.gen-")
        ch.queue_bind(queue, "logs")
        subscribers.append((ch, queue))
    pub.basic_publish("logs", "", b"log line")
    for ch, queue in subscribers:
        assert drain(ch, queue, 1) == [b"log line"]
    # An exclusive queue belongs to its connection: others cannot use it.
    other = connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        other.basic_consume(subscribers[0][1], lambda *a: None)
    assert err.value.reply_code == 405


def test_4_routing_direct(connect) -> None:  # type: ignore[no-untyped-def]
    ch = connect().channel()
    ch.exchange_declare("direct_logs", exchange_type="direct")
    errors = ch.queue_declare("", exclusive=True).method.queue
    everything = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(errors, "direct_logs", "error")
    for severity in ("info", "warning", "error"):
        ch.queue_bind(everything, "direct_logs", severity)
    for severity in ("info", "warning", "error", "debug"):
        ch.basic_publish("direct_logs", severity, severity.encode())
    assert drain(ch, errors, 1) == [b"error"]
    assert sorted(drain(ch, everything, 3)) == [b"error", b"info", b"warning"]


def test_5_topics(connect) -> None:  # type: ignore[no-untyped-def]
    ch = connect().channel()
    ch.exchange_declare("topic_logs", exchange_type="topic")
    kern = ch.queue_declare("", exclusive=True).method.queue
    critical = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(kern, "topic_logs", "kern.*")
    ch.queue_bind(critical, "topic_logs", "*.critical")
    for key in ("kern.critical", "kern.info", "app.critical", "app.info"):
        ch.basic_publish("topic_logs", key, key.encode())
    assert sorted(drain(ch, kern, 2)) == [b"kern.critical", b"kern.info"]
    assert sorted(drain(ch, critical, 2)) == [b"app.critical", b"kern.critical"]
    # amq.topic is the shared router: the same patterns work there.
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "sensors.#")
    ch.basic_publish("amq.topic", "sensors.room1.temp", b"21")
    ch.basic_publish("amq.topic", "other.room1", b"no")
    assert drain(ch, q, 2, timeout=1) == [b"21"]


def test_6_rpc(connect, amqp_server: RunningServer) -> None:  # type: ignore[no-untyped-def]
    ready, stop = threading.Event(), threading.Event()

    def serve() -> None:  # pika connections are not thread-safe: the server owns its own
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"]))
        server = conn.channel()
        server.queue_declare("rpc_queue")
        server.basic_qos(prefetch_count=1)
        ready.set()
        for method, props, body in server.consume("rpc_queue", inactivity_timeout=0.1):
            if stop.is_set():
                break
            if method is None:
                continue
            n = int(body)
            server.basic_publish(
                "",
                props.reply_to,
                str(n * n).encode(),
                pika.BasicProperties(correlation_id=props.correlation_id),
            )
            server.basic_ack(method.delivery_tag)
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert ready.wait(5)
        client = connect().channel()
        callback_queue = client.queue_declare("", exclusive=True).method.queue
        answers = {}
        for n in (3, 7):
            cid = str(uuid.uuid4())
            client.basic_publish(
                "",
                "rpc_queue",
                str(n).encode(),
                pika.BasicProperties(reply_to=callback_queue, correlation_id=cid),
            )
            method, props, body = next(client.consume(callback_queue, auto_ack=True, inactivity_timeout=5))
            assert method is not None and props.correlation_id == cid
            answers[n] = int(body)
        client.cancel()
        assert answers == {3: 9, 7: 49}
    finally:
        stop.set()
        thread.join(5)
