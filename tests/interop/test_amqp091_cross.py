"""AMQP 0.9.1 <-> MQTT through the shared router and the queue manager; aio-pika; a crash test."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.interop.conftest import amqp_server_args
from tests.support.server import RunningServer


@pytest.fixture
def mqtt_client(amqp_server: RunningServer) -> Iterator[tuple[mqtt.Client, queue.Queue[mqtt.MQTTMessage]]]:
    inbox: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, message: inbox.put(message)
    client.connect("127.0.0.1", amqp_server.ports["mqtt"])
    client.loop_start()
    yield client, inbox
    client.disconnect()
    client.loop_stop()


def amqp(server: RunningServer) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))


def subscribe(client: mqtt.Client, topic: str, qos: int = 1) -> None:
    result, _mid = client.subscribe(topic, qos)
    assert result == mqtt.MQTT_ERR_SUCCESS


def test_amq_topic_publish_reaches_mqtt_subscriber(amqp_server: RunningServer, mqtt_client) -> None:  # type: ignore[no-untyped-def]
    client, inbox = mqtt_client
    subscribe(client, "home/+/temp")
    time.sleep(0.3)  # the SUBACK
    conn = amqp(amqp_server)
    ch = conn.channel()
    props = pika.BasicProperties(
        content_type="text/plain", correlation_id="c-1", reply_to="replies", headers={"k": "v"}
    )
    ch.basic_publish("amq.topic", "home.kitchen.temp", b"22.5", props)
    message = inbox.get(timeout=5)
    assert (message.topic, message.payload) == ("home/kitchen/temp", b"22.5")
    assert message.properties.ContentType == "text/plain"
    assert message.properties.CorrelationData == b"c-1"
    assert message.properties.ResponseTopic == "replies"
    assert ("k", "v") in message.properties.UserProperty
    conn.close()


def test_mqtt_publish_reaches_queue_bound_to_amq_topic(amqp_server: RunningServer, mqtt_client) -> None:  # type: ignore[no-untyped-def]
    client, _ = mqtt_client
    conn = amqp(amqp_server)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "plant.*.alarm")
    client.publish("plant/line1/alarm", b"overheat", qos=1).wait_for_publish(5)
    client.publish("plant/line1/other", b"ignored", qos=1).wait_for_publish(5)
    method, _props, body = next(ch.consume(q, auto_ack=True, inactivity_timeout=5))
    assert body == b"overheat"
    assert (method.exchange, method.routing_key) == ("amq.topic", "plant.line1.alarm")
    ch.cancel()
    conn.close()


def test_queue_both_ways(amqp_server: RunningServer, mqtt_client) -> None:  # type: ignore[no-untyped-def]
    client, inbox = mqtt_client
    conn = amqp(amqp_server)
    ch = conn.channel()
    ch.queue_declare("orders", durable=True)
    ch.queue_declare("invoices", durable=True)
    # MQTT -> AMQP: a $queue/ publish lands in the AMQP queue.
    client.publish("$queue/orders", b"from mqtt", qos=1).wait_for_publish(5)
    method, _props, body = next(ch.consume("orders", inactivity_timeout=5))
    assert body == b"from mqtt" and method.routing_key == "orders"
    ch.basic_ack(method.delivery_tag)
    ch.cancel()
    # AMQP -> MQTT: the default exchange into the queue an MQTT client consumes as $queue/invoices.
    subscribe(client, "$queue/invoices")
    ch.confirm_delivery()
    ch.basic_publish("", "invoices", b"from amqp", pika.BasicProperties(delivery_mode=2))
    message = inbox.get(timeout=5)
    assert (message.topic, message.payload) == ("$queue/invoices", b"from amqp")
    conn.close()


def test_auto_deleted_exchange_leaves_no_router_subscription(amqp_server: RunningServer) -> None:
    conn = amqp(amqp_server)
    ch = conn.channel()
    ch.exchange_declare("leak-x", "fanout", auto_delete=True)
    ch.exchange_bind("leak-x", "amq.topic", "leak.test")
    q1 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, "leak-x")
    # Deleting the queue auto-deletes leak-x (its last binding as a source), and with it the
    # amq.topic -> leak-x binding: a new leak-x must not get what amq.topic routes for the old one.
    ch.queue_delete(q1)
    ch.exchange_declare("leak-x", "fanout")
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q2, "leak-x")
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "leak.test", b"not for q2")
    ch.basic_publish("leak-x", "", b"direct")
    method, _props, body = ch.basic_get(q2, auto_ack=True)
    assert method is not None and body == b"direct"
    ch.exchange_delete("leak-x")
    conn.close()


def test_unbinding_one_of_two_amq_topic_bindings_keeps_the_other(amqp_server: RunningServer) -> None:
    conn = amqp(amqp_server)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    # Two bindings that differ only in arguments: one router subscription (filter twin/key) serves both.
    ch.queue_bind(q, "amq.topic", "twin.key")
    ch.queue_bind(q, "amq.topic", "twin.key", arguments={"tag": "second"})
    ch.queue_unbind(q, "amq.topic", "twin.key")
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "twin.key", b"still bound")
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert method is not None and body == b"still bound"
    conn.close()


async def test_aio_pika_confirms_consume_and_ack(amqp_server: RunningServer) -> None:
    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_server.ports['amqp']}/")
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=10)
        q = await channel.declare_queue("aio-q", durable=True)
        exchange = await channel.declare_exchange("aio-direct", aio_pika.ExchangeType.DIRECT, durable=True)
        await q.bind(exchange, "k")
        for i in range(20):
            await exchange.publish(
                aio_pika.Message(b"%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "k"
            )
        got = []
        async with q.iterator() as it:
            async for message in it:
                async with message.process():
                    got.append(int(message.body))
                if len(got) == 20:
                    break
        assert got == list(range(20))
        headers_x = await channel.declare_exchange("aio-headers", aio_pika.ExchangeType.HEADERS)
        hq = await channel.declare_queue("", exclusive=True)
        await hq.bind(headers_x, arguments={"x-match": "all", "kind": "a"})
        await headers_x.publish(aio_pika.Message(b"yes", headers={"kind": "a"}), "")
        await headers_x.publish(aio_pika.Message(b"no", headers={"kind": "b"}), "")
        first = await hq.get(timeout=5)
        assert first is not None and first.body == b"yes"
        await first.ack()
        assert await hq.get(fail=False) is None


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


pytestmark = pytest.mark.anyio


def test_crash_after_confirms_keeps_every_confirmed_message(tmp_path: Path) -> None:
    server = RunningServer(amqp_server_args(), cwd=tmp_path).start()
    try:
        conn = amqp(server)
        ch = conn.channel()
        ch.queue_declare("crash-q", durable=True)
        ch.confirm_delivery()
        confirmed = []
        for i in range(200):
            ch.basic_publish("", "crash-q", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
            confirmed.append(b"m%d" % i)  # basic_publish returned: the broker confirmed it
        server.kill()
    finally:
        server.kill()
    again = RunningServer(amqp_server_args(), cwd=tmp_path).start()
    try:
        conn = amqp(again)
        ch = conn.channel()
        got = []
        for method, _props, body in ch.consume("crash-q", inactivity_timeout=5):
            if method is None:
                break
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == len(confirmed):
                break
        assert got == confirmed
        conn.close()
    finally:
        assert again.stop() == 0, again.output()
