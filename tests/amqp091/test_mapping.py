"""basic properties <-> Message, both ways, and the (exchange, routing key) a delivery names."""

from __future__ import annotations

from decimal import Decimal

import pytest

from trimaran.amqp091.fields import FieldValue, Float32, Int8, Timestamp
from trimaran.amqp091.mapping import (
    MappingError,
    delivery_address,
    delivery_form,
    delivery_properties,
    message_from_content,
    properties_from_message,
)
from trimaran.amqp091.properties import BasicProperties, encode_properties
from trimaran.broker.message import PROTOCOL_MQTT, Message
from trimaran.storage.serialize import message_from, properties_json


def test_every_property_round_trips_through_the_queue_tables() -> None:
    props = BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers={"n": 7, "s": "text", "flag": True},
        delivery_mode=2,
        priority=5,
        correlation_id="corr",
        reply_to="amq.gen-reply",
        expiration="60000",
        message_id="m-1",
        timestamp=1_700_000_000,
        type="order.created",
        user_id="alice",
        app_id="shop",
    )
    message = message_from_content(
        props, b"{}", "$queue/orders", exchange="", routing_key="orders", publisher_id="p", now=1000
    )
    assert message.qos == 1 and message.expires_at_ms == 61000
    assert message.correlation_data == b"corr" and message.response_topic == "amq.gen-reply"
    assert ("n", "7") in message.user_properties  # what MQTT and AMQP 1.0 consumers see
    stored = message_from(message.topic, message.payload, message.qos, False, properties_json(message))
    back = properties_from_message(stored, now=31000)
    assert back.headers == {"n": 7, "s": "text", "flag": True}  # typed again for AMQP consumers
    assert back.expiration == "60000"  # as published, not the time left: a republish keeps the TTL
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id"):
        assert getattr(back, name) == getattr(props, name)
    for name in ("reply_to", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(back, name) == getattr(props, name)
    assert delivery_address(stored) == ("", "orders")


def test_mqtt_message_maps_to_amqp_properties_and_address() -> None:
    message = Message(
        "home/kitchen/temp",
        b"21",
        qos=1,
        content_type="text/plain",
        correlation_data=b"c",
        response_topic="replies",
        user_properties=[("unit", "C")],
        protocol=PROTOCOL_MQTT,
    )
    props = properties_from_message(message)
    assert (props.content_type, props.correlation_id, props.reply_to) == ("text/plain", "c", "replies")
    assert props.headers == {"unit": "C"} and props.delivery_mode == 2
    assert delivery_address(message) == ("amq.topic", "home.kitchen.temp")
    assert delivery_address(Message("$queue/jobs", b"", protocol=PROTOCOL_MQTT)) == ("", "jobs")
    assert delivery_address(Message("$queue/jobs/a/b", b"", protocol=PROTOCOL_MQTT)) == ("", "jobs")
    # a dead-letter queue's name has a slash in it
    assert delivery_address(Message("$queue/$dlq/jobs", b"", protocol=PROTOCOL_MQTT)) == ("", "$dlq/jobs")


def test_typed_headers_become_plain_text_user_properties() -> None:
    headers: dict[str, FieldValue] = {
        "i": Int8(-3),
        "f": Float32(1.5),
        "t": Timestamp(7),
        "b": b"raw",
        "no": False,
        "d": Decimal("1.25"),
    }
    message = message_from_content(
        BasicProperties(headers=headers), b"", "$queue/q", exchange="", routing_key="q", publisher_id=None
    )
    assert message.user_properties == [
        ("i", "-3"),
        ("f", "1.5"),
        ("t", "7"),
        ("b", "raw"),
        ("no", "false"),
        ("d", "1.25"),
    ]


def test_properties_are_delivered_as_published() -> None:
    message = message_from_content(
        BasicProperties(expiration="5000"),
        b"",
        "$queue/q",
        exchange="",
        routing_key="q",
        publisher_id=None,
        now=0,
    )
    props = properties_from_message(message, now=4000)
    assert props.expiration == "5000" and props.delivery_mode is None  # unset stays unset


def test_bad_expiration_is_refused() -> None:
    with pytest.raises(MappingError):
        message_from_content(
            BasicProperties(expiration="soon"), b"", "t", exchange="", routing_key="t", publisher_id=None
        )


def test_a_consumer_gets_the_publishers_property_bytes_until_the_message_changes() -> None:
    """The bytes an AMQP 0.9.1 publisher sent go to its consumers as they are; a copy (a dead
    letter, another topic) does not keep them and is mapped afresh, as is a message from MQTT."""
    props = BasicProperties(content_type="text/plain", delivery_mode=2, headers={"n": 1})
    message = message_from_content(props, b"x", "$queue/q", exchange="", routing_key="q", publisher_id="p")
    encoded = bytearray()
    encode_properties(props, encoded)
    message.encoded_properties = bytes(encoded)
    assert delivery_properties(message) == bytes(encoded)
    assert delivery_properties(message.copy_with(topic="$queue/other")) == properties_from_message(message)
    mqtt = Message("t", b"x", qos=1)
    mqtt.encoded_properties = b"\x00\x00"  # not ours: never sent as AMQP 0.9.1 properties
    assert delivery_properties(mqtt) == properties_from_message(mqtt)


def test_delivery_form_is_the_address_and_the_properties_in_one_call() -> None:
    props = BasicProperties(content_type="text/plain", headers={"n": 1})
    own = message_from_content(props, b"x", "$queue/q", exchange="ex", routing_key="k", publisher_id="p")
    encoded = bytearray()
    encode_properties(props, encoded)
    own.encoded_properties = bytes(encoded)
    dead = own.copy_with(topic="$queue/$dlq/q")
    dead.extra = {**dead.extra, "deaths": [{"queue": "q"}], "exchange": "dlx", "routing_key": "dk"}
    mqtt = Message("$queue/jobs/a", b"x", qos=1, protocol=PROTOCOL_MQTT)
    for message in (own, dead, mqtt, own.copy_with(topic="$queue/other")):
        assert delivery_form(message) == (*delivery_address(message), delivery_properties(message))
    assert delivery_form(own) == ("ex", "k", bytes(encoded))
