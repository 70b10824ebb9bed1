"""A node killed with SIGKILL: the others find it dead after the time-out and release what it held."""

from __future__ import annotations

import time

import pika
import psycopg
import pytest

from tests.cluster.conftest import NODE_TIMEOUT_S, Nodes, wait_route, wait_until
from tests.support.paho import V5, Endpoints, PacketTypes, connect, props

pytestmark = pytest.mark.postgres


def held_sessions(nodes: Nodes, node: str) -> set[str]:
    with psycopg.connect(nodes.url) as connection:
        rows = connection.execute("SELECT client_id FROM cluster_sessions WHERE node = %s", (node,))
        return {str(row[0]) for row in rows}


def test_a_killed_node_is_released_and_its_queue_consumers_get_everything_unacked_elsewhere(
    nodes: Nodes,
) -> None:
    a = nodes.start("a")
    b = nodes.start("b")
    on_a, on_b = Endpoints("127.0.0.1", a.ports["mqtt"]), Endpoints("127.0.0.1", b.ports["mqtt"])

    # On a: a durable-queue consumer that never acknowledges, and a persistent session with a route.
    consumer = connect(on_a, "worker", manual_ack=True)
    consumer.subscribe("$queue/jobs", qos=1)
    device = connect(
        on_a,
        "device",
        version=V5,
        clean=False,
        properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300),
    )
    device.subscribe("alerts/#", qos=1)
    wait_route(nodes, "a", "alerts/#")
    assert "device" in held_sessions(nodes, "a")

    # And an AMQP 0.9.1 consumer on a that takes five tasks and acknowledges none.
    amqp_a = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", a.ports["amqp"]))
    amqp_channel = amqp_a.channel()
    amqp_channel.queue_declare("tasks", durable=True)
    # Published on b by an AMQP 0.9.1 client with confirms: every confirm after the commit.
    amqp_b = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.ports["amqp"]))
    producer = amqp_b.channel()
    producer.queue_declare("tasks", durable=True)  # b learns the queue a declared
    producer.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    for i in range(5):
        producer.basic_publish("", "tasks", f"task{i}".encode(), persistent, mandatory=True)
    amqp_b.close()
    taken = take(amqp_channel, "tasks", 5)
    assert sorted(taken) == [f"task{i}".encode() for i in range(5)]

    publisher = connect(on_b)
    for i in range(10):
        publisher.publish("$queue/jobs", f"job{i}".encode(), qos=1)
    delivered = consumer.drain(10)  # a claimed and delivered all ten; none is acknowledged
    assert sorted(m.payload for m in delivered) == sorted(f"job{i}".encode() for i in range(10))

    time.sleep(0.8)  # sessions are written behind every 0.5 s: a crash loses at most the last changes
    a.kill()
    consumer.client.loop_stop()
    device.client.loop_stop()
    wait_until(lambda: "a" not in nodes.alive(), timeout=NODE_TIMEOUT_S + 5, what="a to be found dead")
    assert nodes.routes("a") == set()
    assert held_sessions(nodes, "a") == set()
    assert b.wait_for_log("node a missed its heartbeat")

    # The consumer reconnects to b and gets every unacknowledged job at once (no lease wait).
    again = connect(on_b, "worker")
    try:
        again.subscribe("$queue/jobs", qos=1)
        redelivered = again.drain(10, timeout=10)
        assert sorted(m.payload for m in redelivered) == sorted(f"job{i}".encode() for i in range(10))
    finally:
        again.disconnect()

    amqp_b = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.ports["amqp"]))
    try:
        again_taken = take(amqp_b.channel(), "tasks", 5, ack=True)
        assert sorted(again_taken) == [f"task{i}".encode() for i in range(5)]
    finally:
        amqp_b.close()

    # The persistent session was released with a: its client resumes it on b.
    resumed = connect(
        on_b,
        "device",
        version=V5,
        clean=False,
        properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300),
    )
    try:
        flags, _reason, _props = resumed.connack.get(timeout=5)
        assert flags.session_present
        wait_route(nodes, "b", "alerts/#")
        publisher.publish("alerts/fire", b"!", qos=1)
        assert resumed.expect().payload == b"!"
    finally:
        resumed.disconnect()
        publisher.disconnect()


def take(channel, queue: str, count: int, *, ack: bool = False) -> list[bytes]:  # type: ignore[no-untyped-def]
    """``count`` deliveries from ``queue`` (acknowledged when ``ack``), within ten seconds."""
    bodies: list[bytes] = []
    for method, _props, body in channel.consume(queue, inactivity_timeout=10):
        assert method is not None, f"only {len(bodies)} of {count} arrived"
        bodies.append(bytes(body))
        if ack:
            channel.basic_ack(method.delivery_tag)
        if len(bodies) == count:
            break
    return bodies
