from __future__ import annotations

import pytest

from trimaran.broker.message import Message
from trimaran.storage import serialize
from trimaran.storage.serialize import message_from, properties_json


def test_message_round_trips_through_a_row() -> None:
    original = Message(
        topic="a/b",
        payload=b"\x00\xff",
        qos=2,
        retain=True,
        content_type="text/plain",
        correlation_data=b"\x01\x02",
        response_topic="r",
        payload_format=1,
        expires_at_ms=123,
        user_properties=[("k", "v"), ("k", "w")],
        publisher_id="c1",
        protocol="mqtt",
        created_at_ms=99,
        extra={"priority": 4, "id": b"\x07", "nested": {"x": [1, b"y"]}},
    )
    restored = message_from("a/b", b"\x00\xff", 2, True, properties_json(original))
    assert restored == original


def test_minimal_message_has_small_properties() -> None:
    assert (
        properties_json(Message(topic="t", payload=b"", created_at_ms=1))
        == '{"protocol":"internal","created_at_ms":1}'
    )


def test_the_fast_encoder_writes_what_the_plain_walk_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reused C encoder and the fallback (``_plain`` then json) agree, bytes and odd keys too."""
    message = Message(
        topic="t",
        payload=b"",
        created_at_ms=1,
        correlation_data=b"\x00",
        extra={"table": b"\x01\x02", "headers": {"n": [1, 2.5, None, True, "é"]}, 3: "int key", "t": (1, 2)},
    )
    fast = properties_json(message)
    monkeypatch.setattr(serialize, "_C_ENCODER", None)
    assert properties_json(message) == fast
    assert message_from("t", b"", 0, False, fast).extra["table"] == b"\x01\x02"


def test_a_key_the_encoder_refuses_takes_the_plain_walk() -> None:
    text = properties_json(Message(topic="t", payload=b"", extra={(1, 2): "tuple key"}))
    assert '"(1, 2)":"tuple key"' in text  # _plain's str(key), as before the fast encoder


def _amqp_message(created: int, routing_key: str = "k", publisher: str = "p1") -> Message:
    message = Message(
        topic="$queue/q",
        payload=b"x",
        qos=1,
        protocol="amqp091",
        publisher_id=publisher,
        created_at_ms=created,
        content_type="text/plain",
        extra={"exchange": "", "routing_key": routing_key, "delivery_mode": 2},
    )
    message.encoded_properties = b"\x90\x00\x0atext/plain\x02"  # as the publisher's frame carried them
    return message


def test_the_json_of_repeated_property_bytes_is_built_once_and_reads_back_alike() -> None:
    first, second = _amqp_message(1), _amqp_message(2)
    text = properties_json(first)
    assert properties_json(second) == text.replace('"created_at_ms":1}', '"created_at_ms":2}')
    assert message_from("$queue/q", b"x", 1, False, properties_json(second)) == second
    # What the property bytes do not say is part of the key: the routing key, the publisher.
    other_key, other_publisher = _amqp_message(3, routing_key="k2"), _amqp_message(3, publisher="p2")
    assert message_from("$queue/q", b"x", 1, False, properties_json(other_key)) == other_key
    assert message_from("$queue/q", b"x", 1, False, properties_json(other_publisher)) == other_publisher


def test_a_message_that_expires_is_encoded_on_its_own() -> None:
    first, second = _amqp_message(1), _amqp_message(1)
    first.expires_at_ms, second.expires_at_ms = 100, 200
    assert properties_json(first) != properties_json(second)
    assert message_from("$queue/q", b"x", 1, False, properties_json(second)) == second


def test_a_message_without_properties_shares_its_publishers_shape() -> None:
    first = Message(topic="t", payload=b"", protocol="mqtt", publisher_id="c1", created_at_ms=1)
    second = Message(topic="t", payload=b"", protocol="mqtt", publisher_id="c1", created_at_ms=2)
    other = Message(topic="t", payload=b"", protocol="mqtt", publisher_id="c2", created_at_ms=2)
    assert properties_json(first) == '{"protocol":"mqtt","publisher_id":"c1","created_at_ms":1}'
    assert message_from("t", b"", 0, False, properties_json(second)) == second
    assert message_from("t", b"", 0, False, properties_json(other)) == other
