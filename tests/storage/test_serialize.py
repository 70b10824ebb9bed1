from __future__ import annotations

from trimaran.broker.message import Message
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
