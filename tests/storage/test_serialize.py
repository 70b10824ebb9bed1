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
