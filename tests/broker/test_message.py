"""Message: defaults, validation, expiry helpers."""

from __future__ import annotations

import dataclasses

import pytest

from trimaran.broker.message import PROTOCOLS, Message, now_ms


def test_defaults_are_independent_per_message() -> None:
    a = Message("t", b"x")
    b = Message("t", b"y")
    a.user_properties.append(("k", "v"))
    a.extra["priority"] = 5
    assert b.user_properties == []
    assert b.extra == {}
    assert a.qos == 0 and a.retain is False and a.protocol == "internal"
    assert a.protocol in PROTOCOLS


def test_created_at_is_now() -> None:
    before = now_ms()
    m = Message("t", b"")
    assert before <= m.created_at_ms <= now_ms()


def test_every_field_in_order_by_position_and_by_name() -> None:
    # The __init__ is written out (mypyc compiles it): it must take what the dataclass declares.
    values = ("t", b"p", 1, True, "text/plain", b"c", "r", 1, 99, [("k", "v")], "pub", "mqtt", 5, {"x": 1})
    names = [f.name for f in dataclasses.fields(Message) if f.init]
    by_position = Message(*values)  # type: ignore[arg-type]
    assert [getattr(by_position, n) for n in names] == list(values)
    assert by_position == Message(**dict(zip(names, values, strict=True)))  # type: ignore[arg-type]
    assert by_position.encoded_properties is None


def test_slots() -> None:
    m = Message("t", b"")
    with pytest.raises(AttributeError):
        m.not_a_field = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("qos", [-1, 3])
def test_bad_qos_in_a_copy(qos: int) -> None:
    # A QoS from outside is checked where it comes in (tests/mqtt/test_codec_vectors.py "PUBLISH
    # QoS 3", tests/admin/test_api.py's publish with qos 7); a changed copy is checked here.
    with pytest.raises(ValueError):
        Message("t", b"").copy_with(qos=qos)


def test_user_properties_keep_order_and_duplicates() -> None:
    props = [("b", "1"), ("a", "2"), ("b", "3")]
    assert Message("t", b"", user_properties=props).user_properties == props


def test_no_expiry() -> None:
    m = Message("t", b"")
    assert not m.is_expired(10**15)
    assert m.remaining_expiry_s(10**15) is None
    assert Message.expiry_from_interval(None, 123) is None


def test_expiry() -> None:
    m = Message("t", b"", expires_at_ms=Message.expiry_from_interval(10, 1_000))
    assert m.expires_at_ms == 11_000
    assert not m.is_expired(10_999)
    assert m.is_expired(11_000)
    assert m.remaining_expiry_s(1_000) == 10
    assert m.remaining_expiry_s(1_001) == 10  # rounded up: never 0 while still alive
    assert m.remaining_expiry_s(10_999) == 1
    assert m.remaining_expiry_s(11_000) == 0
    assert m.remaining_expiry_s(20_000) == 0


def test_copy_with() -> None:
    m = Message("t", b"p", qos=1, retain=True, publisher_id="c1", protocol="mqtt")
    c = m.copy_with(retain=False)
    assert c.retain is False and m.retain is True
    assert (c.topic, c.payload, c.qos, c.publisher_id, c.created_at_ms) == (
        "t",
        b"p",
        1,
        "c1",
        m.created_at_ms,
    )
    with pytest.raises(ValueError):
        m.copy_with(qos=7)
