"""decode_message's data-section shortcut agrees with the generic path and refuses what it refuses."""

from __future__ import annotations

import pytest

from trimaran.amqp1.codec import encode
from trimaran.amqp1.messages import (
    AmqpValue,
    Data,
    Message,
    Properties,
    decode_message,
    encode_message,
)
from trimaran.amqp1.types import DecodeError, Described, ULong


@pytest.mark.parametrize("size", [0, 1, 255, 256, 70_000])
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_data_sections_of_any_width_and_buffer(size: int, kind: type) -> None:
    msg = Message(properties=Properties(to="q"), body=[Data(b"x" * size), Data(b"yz")])
    wire = encode_message(msg)
    got = decode_message(kind(wire))
    assert got == msg and got.data == b"x" * size + b"yz"
    assert type(got.body[0].value) is bytes and type(got.bare) is bytes
    assert got.bare == wire  # properties and body: the whole payload is the bare message


def test_a_lone_data_section_is_its_payload_and_bare_message() -> None:
    wire = encode_message(Message(body=[Data(b"hello")]))
    assert wire[:5] == b"\x00\x53\x75\xa0\x05"
    got = decode_message(wire)
    assert got.body == [Data(b"hello")] and got.bare is wire


def test_data_section_spelled_with_a_vbin32_or_a_long_descriptor() -> None:
    vbin32 = b"\x00\x53\x75\xb0\x00\x00\x00\x02ab"
    assert decode_message(vbin32).body == [Data(b"ab")]
    long_descriptor = encode(Described(ULong(0x75), b"cd"))
    assert decode_message(b"\x00\x80" + b"\x00" * 7 + b"\x75\xa0\x02cd").body == [Data(b"cd")]
    assert decode_message(long_descriptor).body == [Data(b"cd")]


@pytest.mark.parametrize(
    "wire",
    [
        b"\x00\x53\x75\xa0\x05abc",  # shorter than it says
        b"\x00\x53\x75\xb0\x00\x00\x01\x00ab",
        b"\x00\x53\x75\xa1\x02ab",  # a string, not binary
        encode(Described(ULong(0x77), 1)) + b"\x00\x53\x75\xa0\x01a",  # amqp-value then data
        encode(Described(ULong(0x78), {})) + b"\x00\x53\x75\xa0\x01a",  # footer then data
    ],
)
def test_malformed_data_sections(wire: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_message(wire)


def test_other_sections_still_decode() -> None:
    msg = Message(properties=Properties(subject="s"), body=[AmqpValue("v")])
    assert decode_message(encode_message(msg)) == msg
