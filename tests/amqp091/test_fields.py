import contextlib
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimaran.amqp091.fields import (
    MAX_NESTING,
    Float32,
    Int8,
    Int16,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
    decode_array,
    decode_table,
    decode_table_contents,
    encode_array,
    encode_table_contents,
    table_bytes,
)
from trimaran.amqp091.spec import SYNTAX_ERROR, EncodeError, ProtocolError

# (python value, bytes of the field value: type tag then data). Tags per RabbitMQ's errata.
VALUE_VECTORS: list[tuple[Any, bytes]] = [
    (True, b"t\x01"),
    (False, b"t\x00"),
    (Int8(-1), b"b\xff"),
    (UInt8(255), b"B\xff"),
    (Int16(-2), b"s\xff\xfe"),  # 's' is a signed short, not a short string
    (UInt16(65535), b"u\xff\xff"),
    (1, b"I\x00\x00\x00\x01"),  # plain int fitting 32 bits: signed 32
    (-(2**31), b"I\x80\x00\x00\x00"),
    (UInt32(2**32 - 1), b"i\xff\xff\xff\xff"),
    (Int64(-1), b"l" + b"\xff" * 8),
    (Float32(1.5), b"f\x3f\xc0\x00\x00"),
    (1.5, b"d\x3f\xf8\x00\x00\x00\x00\x00\x00"),
    (Decimal("1.23"), b"D\x02\x00\x00\x00\x7b"),  # scale 2, value 123
    (Decimal("-5"), b"D\x00\xff\xff\xff\xfb"),
    ("h\u00e9", b"S\x00\x00\x00\x03h\xc3\xa9"),
    (b"\x00\xff", b"x\x00\x00\x00\x02\x00\xff"),
    ([1, None], b"A\x00\x00\x00\x06I\x00\x00\x00\x01V"),
    (Timestamp(1), b"T\x00\x00\x00\x00\x00\x00\x00\x01"),
    ({}, b"F\x00\x00\x00\x00"),
    ({"a": "b"}, b"F\x00\x00\x00\x08\x01aS\x00\x00\x00\x01b"),
    (None, b"V"),
]


def _table_with(value_bytes: bytes) -> bytes:
    entry = b"\x01k" + value_bytes
    return struct.pack(">I", len(entry)) + entry


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type, recursively."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize(
    ("value", "wire"), VALUE_VECTORS, ids=[w[:1].decode() + repr(v)[:20] for v, w in VALUE_VECTORS]
)
def test_value_vectors_both_ways(value: Any, wire: bytes) -> None:
    data = _table_with(wire)
    assert table_bytes({"k": value}) == data
    decoded, off = decode_table(data + b"trailing", 0)
    assert off == len(data)
    assert same(decoded, {"k": value})


def test_empty_and_none_table() -> None:
    assert table_bytes({}) == table_bytes(None) == b"\x00\x00\x00\x00"
    assert decode_table(b"\x00\x00\x00\x00", 0) == ({}, 4)


def test_int_widths_chosen_for_plain_ints() -> None:
    assert table_bytes({"k": 2**31}) == _table_with(b"l" + struct.pack(">q", 2**31))
    decoded, _ = decode_table(table_bytes({"k": 2**31}), 0)
    assert same(decoded["k"], Int64(2**31))


def test_undecodable_long_string_survives_byte_exact() -> None:
    data = _table_with(b"S\x00\x00\x00\x02\xff\xfe")
    decoded, _ = decode_table(data, 0)
    assert isinstance(decoded["k"], str)
    assert table_bytes(decoded) == data


def test_unsigned_64_bit_is_read_as_rabbitmq_reads_it() -> None:
    """'L' is not in RabbitMQ's errata table, but RabbitMQ reads it and py-amqp (kombu, Celery) writes
    large integers with it: it comes back with the same tag and value."""
    data = _table_with(b"L" + struct.pack(">Q", 2**40))
    decoded, _ = decode_table(data, 0)
    assert decoded["k"] == 2**40 and type(decoded["k"]).__name__ == "UInt64"
    assert table_bytes(decoded) == data


@pytest.mark.parametrize("tag", [b"U", b"c", b"\x00", b"Z"])
def test_tags_outside_rabbitmq_errata_are_syntax_errors(tag: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_table(_table_with(tag + b"\x00" * 8), 0)
    assert info.value.reply_code == SYNTAX_ERROR


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00\x00",  # length truncated
        b"\x00\x00\x00\x05\x01k",  # table longer than the buffer
        b"\x00\x00\x00\x03\x01kS",  # value truncated inside the table
        b"\x00\x00\x00\x04\x05kkk",  # key longer than the table
        _table_with(b"S\x00\x00\x00\x09abc"),  # long string past the end
        b"\x00\x00\x00\x03\x01kI\x00\x00\x00\x01",  # value overruns the table length
    ],
)
def test_malformed_tables(data: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_table(data, 0)
    assert info.value.reply_code == SYNTAX_ERROR


@pytest.mark.parametrize(
    "table",
    [
        {"k" * 256: 1},
        {"k": 2**64},
        {"k": Int8(200)},
        {"k": UInt16(-1)},
        {"k": Timestamp(-1)},
        {"k": object()},
        {"k": Decimal("NaN")},
        {"k": Decimal(2**40)},
        {1: 1},
    ],
)
def test_unencodable_values(table: Any) -> None:
    with pytest.raises(EncodeError):
        table_bytes(table)


def test_table_contents_without_prefix() -> None:
    raw = encode_table_contents({"LOGIN": "guest", "PASSWORD": "pw"})
    assert raw.startswith(b"\x05LOGINS\x00\x00\x00\x05guest")
    assert decode_table_contents(raw) == {"LOGIN": "guest", "PASSWORD": "pw"}


def test_deep_nesting_is_a_syntax_error_not_a_crash() -> None:
    data = b""
    for _ in range(5000):
        data = b"\x01kF" + struct.pack(">I", len(data)) + data
    data = struct.pack(">I", len(data)) + data
    with pytest.raises(ProtocolError):
        decode_table(data, 0)


def _nested(levels: int, tag: bytes) -> bytes:
    """A table whose key "k" holds ``levels`` nested tables (tag F) or arrays (tag A)."""
    inner = b""
    for _ in range(levels - 1):
        inner = (b"\x01kF" if tag == b"F" else b"A") + struct.pack(">I", len(inner)) + inner
    pairs = b"\x01k" + tag + struct.pack(">I", len(inner)) + inner
    return struct.pack(">I", len(pairs)) + pairs


@pytest.mark.parametrize("tag", [b"F", b"A"])
def test_nesting_is_bounded_the_same_interpreted_and_compiled(tag: bytes) -> None:
    # Compiled, Python's recursion limit no longer stops the decoder: MAX_NESTING does.
    data = _nested(MAX_NESTING, tag)
    table, end = decode_table(data, 0)
    assert end == len(data)
    depth, value = 0, table
    while value:
        value = value["k"] if isinstance(value, dict) else value[0]
        depth += 1
    assert depth == MAX_NESTING
    with pytest.raises(ProtocolError) as refused:
        decode_table(_nested(MAX_NESTING + 1, tag), 0)
    assert refused.value.reply_code == SYNTAX_ERROR


# --------------------------------------------------------------------------------------------
# Hypothesis

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
_keys = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-128, 127).map(Int8),
    st.integers(0, 255).map(UInt8),
    st.integers(-(2**15), 2**15 - 1).map(Int16),
    st.integers(0, 2**16 - 1).map(UInt16),
    st.integers(0, 2**32 - 1).map(UInt32),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(allow_nan=False, width=32).map(Float32),
    st.floats(allow_nan=False),
    st.builds(lambda s, v: Decimal(v).scaleb(-s), st.integers(0, 255), st.integers(-(2**31), 2**31 - 1)),
    _text,
    st.binary(max_size=30),
    st.none(),
    st.integers(0, 2**64 - 1).map(Timestamp),
)
field_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=8,
)
field_tables = st.dictionaries(_keys, field_values, max_size=6)


@settings(max_examples=60, deadline=None)
@given(field_tables)
def test_table_round_trip(table: dict[str, Any]) -> None:
    data = table_bytes(table)
    decoded, off = decode_table(data, 0)
    assert off == len(data)
    assert same(decoded, table)
    assert table_bytes(decoded) == data


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    for decode in (lambda: decode_table(data, 0), lambda: decode_table_contents(data)):
        with contextlib.suppress(ProtocolError):
            decode()


@settings(max_examples=50, deadline=None)
@given(field_tables, st.data())
def test_mutated_tables_raise_only_protocol_error(table: dict[str, Any], data: st.DataObject) -> None:
    raw = bytearray(table_bytes(table))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        decoded, _ = decode_table(bytes(raw), 0)
    except ProtocolError:
        return
    # Whatever decodes must encode again.
    table_bytes(decoded)


@settings(max_examples=50, deadline=None)
@given(st.lists(field_values, max_size=6))
def test_array_round_trip(items: list[Any]) -> None:
    out = bytearray()
    encode_array(items, out)
    decoded, off = decode_array(bytes(out), 0)
    assert off == len(out)
    assert same(decoded, items)


@pytest.mark.parametrize("data", [b"", b"\x00\x00\x00\x05I\x00", b"\x00\x00\x00\x01Q"])
def test_malformed_arrays(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_array(data, 0)
