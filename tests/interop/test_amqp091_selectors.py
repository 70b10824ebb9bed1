"""The ``x-selector`` consume argument of AMQP 0.9.1 (pika against a real server): a JMS message
selector, read as AMQP 1.0 receivers' are (trimaran/amqp1/selection.py). A consumer with one gets
only the messages it selects; the others stay on the queue for other consumers. A selector that
does not parse closes the channel with 406 PRECONDITION_FAILED and says where. MQTT 5 and AMQP 1.0
publishers' messages are selectable by their user and application properties."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pika = pytest.importorskip("pika")
proton = pytest.importorskip("proton")

from pika.exceptions import ChannelClosedByBroker  # noqa: E402
from proton import Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from tests.interop.conftest import BOTH_STORAGES, amqp_server_args  # noqa: E402
from tests.support.amqp1 import close_link  # noqa: E402
from tests.support.names import unique  # noqa: E402
from tests.support.paho import V5, Endpoints, PacketTypes, connect, props  # noqa: E402
from tests.support.server import ALICE, RunningServer  # noqa: E402


@pytest.fixture
def connection(amqp1_server: RunningServer) -> Iterator[Any]:
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp1_server.ports["amqp"]))
    try:
        yield c
    finally:
        if c.is_open:
            c.close()


def consume(channel: Any, queue: str, selector: object, wait: float = 0.5) -> list[bytes]:
    """What a no-ack consumer with ``x-selector`` gets until the queue has nothing more for it."""
    got = []
    for method, _, body in channel.consume(
        queue, auto_ack=True, arguments={"x-selector": selector}, inactivity_timeout=wait
    ):
        if method is None:
            break
        got.append(body)
    channel.cancel()
    return got


def left(channel: Any, queue: str) -> list[bytes]:
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


@BOTH_STORAGES
@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_a_consumer_gets_what_it_selects_and_the_rest_stay(connection: Any, durable: bool) -> None:
    channel = connection.channel()
    queue = unique("xsel")
    channel.queue_declare(queue, durable=durable)
    mode = 2 if durable else 1
    for colour, weight in (("red", 12), ("red", 3), ("blue", 40), ("red", 11)):
        properties = pika.BasicProperties(headers={"colour": colour, "weight": weight}, delivery_mode=mode)
        channel.basic_publish("", queue, f"{colour}{weight}".encode(), properties)
    assert consume(channel, queue, "colour = 'red' AND weight > 10") == [b"red12", b"red11"]
    assert left(channel, queue) == [b"red3", b"blue40"]


def test_jms_headers_read_from_the_basic_properties(connection: Any) -> None:
    channel = connection.channel()
    queue = unique("xsel")
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"car", pika.BasicProperties(type="car", priority=7, message_id="m1"))
    channel.basic_publish("", queue, b"bike", pika.BasicProperties(type="bike"))
    selector = "JMSType = 'car' AND JMSPriority > 4 AND JMSMessageID = 'm1'"
    assert consume(channel, queue, selector.encode()) == [b"car"]  # a long string arrives as bytes
    assert left(channel, queue) == [b"bike"]


@pytest.mark.parametrize(
    ("selector", "said"),
    [
        ("colour = = 'red'", "invalid arg 'x-selector': selector error at column 10"),
        (42, "invalid arg 'x-selector' for consumer: 42"),
    ],
    ids=["does-not-parse", "not-a-string"],
)
def test_a_bad_selector_closes_the_channel_with_406(connection: Any, selector: object, said: str) -> None:
    channel = connection.channel()
    queue = unique("xsel")
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"kept")
    with pytest.raises(ChannelClosedByBroker) as closed:
        channel.basic_consume(queue, lambda *a: None, arguments={"x-selector": selector})
    assert closed.value.reply_code == 406
    assert said in closed.value.reply_text
    # the message waits for a good consumer; the connection serves on
    assert left(connection.channel(), queue) == [b"kept"]


def test_mqtt_and_amqp1_publishers_feed_a_selecting_consumer(
    connection: Any, amqp1_server: RunningServer
) -> None:
    channel = connection.channel()
    root, queue = unique("xs"), unique("xsel")
    channel.queue_declare(queue)
    channel.queue_bind(queue, "amq.topic", f"{root}.*")
    client = connect(Endpoints("127.0.0.1", amqp1_server.ports["mqtt"]), version=V5)
    try:
        for colour, weight in (("red", "12"), ("red", "3"), ("blue", "20")):
            user = props(PacketTypes.PUBLISH, UserProperty=[("colour", colour), ("weight", weight)])
            client.publish(
                f"{root}/m", f"m-{colour}{weight}".encode(), qos=1, properties=user
            ).wait_for_publish(5)
    finally:
        client.disconnect()
    amqp1 = BlockingConnection(f"127.0.0.1:{amqp1_server.ports['amqp']}", timeout=10)
    try:
        sender = amqp1.create_sender(f"topic://{root}/a")
        for colour, weight in (("red", 30), ("green", 30)):
            sender.send(Message(body=f"a-{colour}{weight}", properties={"colour": colour, "weight": weight}))
        close_link(sender)
    finally:
        amqp1.close()
    # MQTT user properties are text, compared with a number as one; an AMQP 1.0 text body is its text
    assert consume(channel, queue, "colour = 'red' AND weight > 10") == [b"m-red12", b"a-red30"]
    assert left(channel, queue) == [b"m-red3", b"m-blue20", b"a-green30"]


def taken(
    channel: Any, queue: str, arguments: dict[str, Any] | None = None, wait: float = 0.5
) -> list[bytes]:
    """What a consumer (acking each delivery) gets until the queue has nothing more for it."""
    got = []
    for method, _, body in channel.consume(queue, arguments=arguments, inactivity_timeout=wait):
        if method is None:
            break
        got.append(body)
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    return got


def test_acks_behind_an_untaken_message_leave_the_queue_empty(tmp_path: Path) -> None:
    """Issue 42: an ``x-selector`` consumer takes and acks the two messages behind one nobody has
    taken yet; a plain consumer then takes that one and acks it. The queue is empty (depth 0 in
    a passive declare, basic.get-empty), live and after a clean restart on the same data, when
    nothing is delivered again."""
    queue = unique("zoo")
    env = {"TRIMARAN_AUTH__USERS": ALICE}
    server = RunningServer(amqp_server_args(), cwd=tmp_path, env=env).start()
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare(queue, durable=True)
            for body, colour in ((b"grasshopper", "green"), (b"panda", "red"), (b"squirrel", "red")):
                properties = pika.BasicProperties(headers={"colour": colour}, delivery_mode=2)
                channel.basic_publish("", queue, body, properties)
            assert taken(channel, queue, {"x-selector": "colour = 'red'"}) == [b"panda", b"squirrel"]
            assert taken(channel, queue) == [b"grasshopper"]
            assert channel.queue_declare(queue, passive=True).method.message_count == 0
            assert channel.basic_get(queue)[0] is None
        finally:
            connection.close()
    finally:
        assert server.stop() == 0, server.output()
    server = RunningServer(amqp_server_args(), cwd=tmp_path, env=env).start()
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
        try:
            channel = connection.channel()
            assert channel.queue_declare(queue, passive=True).method.message_count == 0
            assert channel.basic_get(queue)[0] is None
            assert taken(channel, queue, wait=1.0) == []
        finally:
            connection.close()
    finally:
        assert server.stop() == 0, server.output()
