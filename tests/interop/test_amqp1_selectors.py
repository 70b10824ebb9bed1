"""JMS message selectors on AMQP 1.0 receivers (proton's ``Selector`` option) against a real
server: on topics only the selected messages arrive; on queues a receiver with a selector gets
only the matching messages and the others stay for other receivers; the filter is recognised by
its descriptor under any key and echoed; a selector that does not parse ends the link with
``amqp:invalid-field`` and says where; MQTT and AMQP 0.9.1 publishers' messages are selectable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

proton = pytest.importorskip("proton")
pika = pytest.importorskip("pika")

from proton import Described, Message, symbol, ulong  # noqa: E402
from proton.reactor import Copy, LinkOption, Selector  # noqa: E402
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached  # noqa: E402

from tests.interop.conftest import AMQP1_ENV, BOTH_STORAGES, amqp1_server_args  # noqa: E402
from tests.support.amqp1 import body_bytes, body_str, close_link  # noqa: E402
from tests.support.names import unique  # noqa: E402
from tests.support.paho import V5, V311, Endpoints, PacketTypes, connect, props  # noqa: E402
from tests.support.server import RunningServer  # noqa: E402

SELECTOR_FILTER = "apache.org:selector-filter:string"


@pytest.fixture
def conn(amqp1_url: str) -> Iterator[BlockingConnection]:
    c = BlockingConnection(amqp1_url, timeout=10)
    try:
        yield c
    finally:
        c.close()


class FilterUnder(LinkOption):
    """A selector under another key of the filter set, with the numeric descriptor (Qpid JMS's way)."""

    def __init__(self, key: str, text: str) -> None:
        self.key, self.text = key, text

    def apply(self, link: Any) -> None:
        link.source.filter.put_dict({symbol(self.key): Described(ulong(0x0000468C00000004), self.text)})


def filters_of(link: Any) -> Any:
    """The filter set of the source in the server's attach answer."""
    data = link.remote_source.filter
    data.rewind()
    return data.get_dict() if data.next() else None


def send(conn: BlockingConnection, address: str, messages: list[Message]) -> None:
    sender = conn.create_sender(address)
    for message in messages:
        sender.send(message)
    close_link(sender)


def drain(receiver: BlockingReceiver, wait: float = 0.5) -> list[str]:
    got = []
    while True:
        try:
            message = receiver.receive(timeout=wait)
        except proton.Timeout:
            return got
        body: object = message.body  # text from AMQP 1.0, binary from MQTT and AMQP 0.9.1
        got.append(body_str(message) if isinstance(body, str) else body_bytes(message).decode())
        receiver.accept()


def coloured(colour: str, weight: int, body: str) -> Message:
    return Message(body=body, properties={"colour": colour, "weight": weight})


def test_topic_receiver_gets_only_what_its_selector_selects(conn: BlockingConnection) -> None:
    topic = f"topic://{unique('sel')}/items"
    red = conn.create_receiver(topic, credit=10, options=Selector("colour = 'red' AND weight > 10"))
    assert filters_of(red.link) == {
        symbol("selector"): Described(symbol(SELECTOR_FILTER), "colour = 'red' AND weight > 10")
    }
    everything = conn.create_receiver(topic, credit=10, name="everything")
    send(
        conn,
        topic,
        [
            coloured("red", 12, "r12"),
            coloured("red", 5, "r5"),
            coloured("blue", 20, "b20"),
            Message(body="none"),
        ],
    )
    assert drain(red) == ["r12"]
    assert drain(everything) == ["r12", "r5", "b20", "none"]


@BOTH_STORAGES
def test_queue_receiver_with_a_selector_leaves_the_others_for_others(conn: BlockingConnection) -> None:
    queue = f"$queue/{unique('selq')}"
    send(
        conn,
        queue,
        [
            coloured("red", 1, "r1"),
            coloured("blue", 2, "b2"),
            coloured("red", 3, "r3"),
            coloured("green", 4, "g4"),
        ],
    )
    blue = conn.create_receiver(queue, credit=10, options=Selector("colour IN ('blue', 'green')"))
    assert drain(blue) == ["b2", "g4"]
    close_link(blue)
    rest = conn.create_receiver(queue, credit=10)
    assert drain(rest) == ["r1", "r3"]  # the red ones stayed, in order
    close_link(rest)


def test_jms_headers_read_from_header_and_properties(conn: BlockingConnection) -> None:
    queue = f"$queue/{unique('hdr')}"
    send(
        conn,
        queue,
        [
            Message(body="urgent", priority=9, subject="order", durable=True, correlation_id="c-1"),
            Message(body="plain", priority=4, subject="note"),
        ],
    )
    rx = conn.create_receiver(
        queue,
        credit=10,
        options=Selector(
            "JMSPriority > 6 AND JMSType = 'order' AND JMSDeliveryMode = 'PERSISTENT'"
            " AND JMSCorrelationID LIKE 'c-%'"
        ),
    )
    assert drain(rx) == ["urgent"]
    close_link(rx)
    rx = conn.create_receiver(
        queue, credit=10, options=Selector("JMSDeliveryMode = 'NON_PERSISTENT' AND JMSExpiration = 0")
    )
    assert drain(rx) == ["plain"]
    close_link(rx)


def test_selector_under_another_key_with_the_numeric_descriptor(conn: BlockingConnection) -> None:
    topic = f"topic://{unique('code')}"
    rx = conn.create_receiver(topic, credit=10, options=FilterUnder("jms-selector", "weight BETWEEN 2 AND 3"))
    echoed = filters_of(rx.link)
    assert list(echoed) == [symbol("jms-selector")]
    assert echoed[symbol("jms-selector")].value == "weight BETWEEN 2 AND 3"
    send(conn, topic, [coloured("red", w, f"w{w}") for w in range(5)])
    assert drain(rx) == ["w2", "w3"]


@pytest.mark.parametrize(
    ("selector", "where"),
    [
        ("colour = ", "column 10: expected a field, a literal or '('"),
        ("colour == 'red'", "column 9"),
        ("weight >", "column 9"),
    ],
)
def test_a_selector_that_does_not_parse_ends_the_link(
    conn: BlockingConnection, selector: str, where: str
) -> None:
    with pytest.raises(LinkDetached) as caught:
        conn.create_receiver(f"topic://{unique('bad')}", credit=10, options=Selector(selector))
    condition = caught.value.link.remote_condition
    assert condition.name == "amqp:invalid-field"
    assert where in condition.description and selector in condition.description
    # the connection stays: a good selector on it still works
    queue = f"$queue/{unique('after')}"
    send(conn, queue, [coloured("red", 1, "r")])
    rx = conn.create_receiver(queue, credit=10, options=Selector("colour = 'red'"))
    assert drain(rx) == ["r"]


def test_acks_behind_an_untaken_message_leave_the_queue_empty(tmp_path: Path) -> None:
    """Issue 42: a receiver with a selector takes and accepts the two messages behind one nobody
    has taken yet; a plain receiver then takes that one and accepts it. A browser (distribution
    mode copy) sees nothing, live and after a clean restart on the same data, when a plain receiver
    is given nothing again either."""
    address = f"$queue/{unique('zoo')}"
    server = RunningServer(amqp1_server_args(), cwd=tmp_path, env=AMQP1_ENV).start()
    try:
        conn = BlockingConnection(f"127.0.0.1:{server.ports['amqp']}", timeout=10)
        try:
            animals = [("grasshopper", "green"), ("panda", "red"), ("squirrel", "red")]
            send(conn, address, [Message(body=body, properties={"colour": c}) for body, c in animals])
            red = conn.create_receiver(address, credit=10, options=Selector("colour = 'red'"))
            assert drain(red) == ["panda", "squirrel"]  # each accepted
            close_link(red)
            plain = conn.create_receiver(address, credit=10)
            assert drain(plain) == ["grasshopper"]
            close_link(plain)
            browser = conn.create_receiver(address, credit=10, options=Copy())
            assert drain(browser) == []
            close_link(browser)
        finally:
            conn.close()
    finally:
        assert server.stop() == 0, server.output()
    server = RunningServer(amqp1_server_args(), cwd=tmp_path, env=AMQP1_ENV).start()
    try:
        conn = BlockingConnection(f"127.0.0.1:{server.ports['amqp']}", timeout=10)
        try:
            browser = conn.create_receiver(address, credit=10, options=Copy())
            assert drain(browser) == []
            close_link(browser)
            plain = conn.create_receiver(address, credit=10)
            assert drain(plain, 1.0) == []
            close_link(plain)
        finally:
            conn.close()
    finally:
        assert server.stop() == 0, server.output()


@pytest.fixture
def channel(amqp1_server: RunningServer) -> Iterator[Any]:
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp1_server.ports["amqp"]))
    try:
        yield c.channel()
    finally:
        c.close()


def test_amqp091_headers_are_selectable_with_their_types(conn: BlockingConnection, channel: Any) -> None:
    name = unique("p091")
    rx = conn.create_receiver(f"$queue/{name}", credit=10, options=Selector("weight > 10 AND colour = 'red'"))
    for colour, weight in (("red", 12), ("red", 3), ("blue", 40)):
        properties = pika.BasicProperties(headers={"colour": colour, "weight": weight}, priority=1)
        channel.basic_publish("", f"$queue/{name}", f"{colour}{weight}".encode(), properties)
    topic_rx = conn.create_receiver(f"topic://{name}/t", credit=10, options=Selector("JMSType = 'car'"))
    channel.basic_publish("amq.topic", f"{name}.t", b"car", pika.BasicProperties(type="car"))
    channel.basic_publish("amq.topic", f"{name}.t", b"bike", pika.BasicProperties(type="bike"))
    assert drain(rx) == ["red12"]
    assert drain(topic_rx) == ["car"]


def test_mqtt_user_properties_are_selectable(conn: BlockingConnection, amqp1_server: RunningServer) -> None:
    root = unique("m5")
    queue = unique("mq")
    on_topic = conn.create_receiver(
        f"topic://{root}/+", credit=10, options=Selector("colour = 'red' AND weight >= 10")
    )
    on_queue = conn.create_receiver(f"$queue/{queue}", credit=10, options=Selector("weight < 10"))
    client = connect(Endpoints("127.0.0.1", amqp1_server.ports["mqtt"]), version=V5)
    try:
        for colour, weight in (("red", "12"), ("red", "3"), ("blue", "12")):
            user = props(PacketTypes.PUBLISH, UserProperty=[("colour", colour), ("weight", weight)])
            client.publish(
                f"{root}/a", f"{colour}{weight}".encode(), qos=1, properties=user
            ).wait_for_publish(5)
            client.publish(
                f"$queue/{queue}", f"{colour}{weight}".encode(), qos=1, properties=user
            ).wait_for_publish(5)
    finally:
        client.disconnect()
    assert drain(on_topic) == ["red12"]
    assert drain(on_queue) == ["red3"]
    # an MQTT 3.1.1 message has no properties: every comparison is UNKNOWN, IS NULL is true
    nulls = conn.create_receiver(
        f"topic://{root}/+", credit=10, name="nulls", options=Selector("colour IS NULL")
    )
    old = connect(Endpoints("127.0.0.1", amqp1_server.ports["mqtt"]), version=V311)
    try:
        old.publish(f"{root}/b", b"v311", qos=1).wait_for_publish(5)
    finally:
        old.disconnect()
    assert drain(nulls) == ["v311"]
    assert drain(on_topic, 0.2) == []
