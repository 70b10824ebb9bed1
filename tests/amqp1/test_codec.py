"""AMQP 1.0 primitive codec: annotated vectors both ways, hypothesis round trips, hostile bytes."""

from __future__ import annotations

import contextlib
import datetime
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimaran.amqp1.codec import decode, decode_value, encode
from trimaran.amqp1.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    DecodeError,
    Described,
    EncodeError,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    T,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

U = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")

# (wire bytes, value): the encoder produces exactly these bytes and the decoder gives the value back.
VECTORS: list[tuple[str, Any]] = [
    ("40", None),  # null
    ("41", True),  # boolean true
    ("42", False),  # boolean false
    ("50ff", UByte(255)),  # ubyte
    ("600102", UShort(0x0102)),  # ushort
    ("43", UInt(0)),  # uint0
    ("5207", UInt(7)),  # smalluint
    ("7000000100", UInt(256)),  # uint
    ("44", ULong(0)),  # ulong0
    ("53ff", ULong(255)),  # smallulong
    ("800000000000000100", ULong(256)),  # ulong
    ("5180", Byte(-128)),  # byte
    ("61ff00", Short(-256)),  # short
    ("54ff", Int(-1)),  # smallint
    ("7100000080", Int(128)),  # int
    ("557f", Long(127)),  # smalllong
    ("81ffffffffffffff7f", Long(-129)),  # long
    ("723fc00000", Float(1.5)),  # float
    ("82400c000000000000", 3.5),  # double
    ("7401020304", Decimal32(b"\x01\x02\x03\x04")),  # decimal32
    ("840102030405060708", Decimal64(bytes(range(1, 9)))),  # decimal64
    ("94" + "00" * 16, Decimal128(bytes(16))),  # decimal128
    ("730001f600", Char("\U0001f600")),  # char (UTF-32BE)
    ("830000017f3d3ecc00", Timestamp(1646000000000)),  # timestamp (ms)
    ("98" + U.hex, U),  # uuid
    ("a003616263", b"abc"),  # vbin8
    ("b000000100" + "78" * 256, b"x" * 256),  # vbin32
    ("a102c3a9", "é"),  # str8-utf8
    ("b100000100" + "61" * 256, "a" * 256),  # str32-utf8
    ("a303616263", Symbol("abc")),  # sym8
    ("b300000100" + "73" * 256, Symbol("s" * 256)),  # sym32
    ("45", []),  # list0
    ("c00302" + "4041", [None, True]),  # list8: size 3, count 2
    ("d000000105" + "00000001" + "a0ff" + "00" * 255, [bytes(255)]),  # list32: content > 254 bytes
    ("c10502a1016b41", {"k": True}),  # map8: size 5, count 2 (key and value)
    ("d1000001080000000" + "2a1016ba0ff" + "00" * 255, {"k": bytes(255)}),  # map32: content 260 bytes
    ("f00000013500000001b00000012c" + "00" * 300, Array(T.BINARY, [bytes(300)])),  # array32 of vbin32
    ("e00503560001" + "00", Array(T.BOOLEAN, [False, True, False])),  # array8 of boolean (0x56)
    ("e00a027000000001000000ff", Array(T.UINT, [UInt(1), UInt(255)])),  # array8 of uint, full width
    ("e00602a3016101" + "62", Array(T.SYMBOL, [Symbol("a"), Symbol("b")])),  # array8 of sym8
    ("0053105207", Described(ULong(0x10), UInt(7))),  # described: smallulong descriptor
    ("00a303666f6f40", Described(Symbol("foo"), None)),  # described: symbol descriptor
]


@pytest.mark.parametrize(("hexstr", "value"), VECTORS, ids=[h[:24] for h, _ in VECTORS])
def test_vector_both_ways(hexstr: str, value: Any) -> None:
    wire = bytes.fromhex(hexstr)
    assert encode(value).hex() == wire.hex()
    got = decode(wire)
    assert same(got, value)
    # the same bytes from a memoryview, and inside a bigger buffer with trailing bytes untouched
    assert same(decode(memoryview(wire)), value)
    v, end = decode_value(b"\xee" + wire + b"\x99\x98", 1)
    assert same(v, value) and end == 1 + len(wire)


def test_described_array() -> None:
    arr = Array(T.STRING, ["bc"], ULong(123))
    wire = encode(arr)
    assert wire.hex() == "e00801" + "00537b" + "a1" + "026263"
    assert same(decode(wire), arr)


ALTERNATIVE_ENCODINGS: list[tuple[str, Any]] = [
    ("5600", False),  # boolean with a value byte
    ("5601", True),
    ("7000000005", UInt(5)),  # wide uint for a small value
    ("800000000000000000", ULong(0)),
    ("7100000005", Int(5)),
    ("810000000000000005", Long(5)),
    ("b000000000", b""),
    ("b10000000161", "a"),
    ("b30000000161", Symbol("a")),
    ("c00100", []),  # list8 with zero items
    ("d00000000400000000", []),  # list32 with zero items
    ("d10000000400000000", {}),
    ("c10100", {}),
    ("f000000005000000024" + "3", Array(T.UINT, [UInt(0), UInt(0)])),  # zero-width uint0 elements
    ("e0020241", Array(T.BOOLEAN, [True, True])),  # zero-width true elements
    ("00800000000000000010" + "45", Described(ULong(0x10), [])),  # wide ulong descriptor
]


@pytest.mark.parametrize(("hexstr", "value"), ALTERNATIVE_ENCODINGS)
def test_decoder_accepts_every_encoding(hexstr: str, value: Any) -> None:
    assert same(decode(bytes.fromhex(hexstr)), value)


def test_plain_python_values() -> None:
    assert encode(5) == encode(Long(5))
    assert encode(2**63) == encode(ULong(2**63))
    assert encode(2.5) == bytes.fromhex("824004000000000000")
    assert encode(("a", 1)) == encode(["a", 1])
    assert encode(bytearray(b"ab")) == encode(b"ab")
    assert encode(memoryview(b"ab")) == encode(b"ab")
    dt = datetime.datetime(2022, 2, 27, 22, 13, 20, tzinfo=datetime.UTC)
    assert decode(encode(dt)) == Timestamp(1646000000000)
    assert decode(encode(dt.replace(tzinfo=None))) == Timestamp(1646000000000)
    assert type(decode(encode(7))) is Long and decode(encode(7)) == 7


@pytest.mark.parametrize(
    "bad",
    [
        2**64,
        -(2**63) - 1,
        object(),
        Symbol("é"),
        Array(T.UINT, ["x"]),
        Array(T.BOOLEAN, [1]),
        Array(T.NULL, [1]),
        Array(T.UBYTE, [300]),
        {1: object()},
    ],
)
def test_unencodable(bad: Any) -> None:
    with pytest.raises(EncodeError):
        encode(bad)


@pytest.mark.parametrize("wrapper", [UByte, UShort, UInt, ULong, Byte, Short, Int, Long])
def test_wrapper_ranges(wrapper: Any) -> None:
    with pytest.raises(EncodeError):
        wrapper(wrapper._hi + 1)
    with pytest.raises(EncodeError):
        wrapper(wrapper._lo - 1)


@pytest.mark.parametrize(
    "hexstr",
    [
        "",  # nothing
        "ff",  # unknown format code
        "01",  # reserved
        "50",  # ubyte without its byte
        "7000",  # short uint
        "a005616263",  # vbin8 longer than the buffer
        "b0ffffffff",  # vbin32 claiming 4 GiB
        "a102c328",  # invalid UTF-8
        "a30180",  # non-ASCII symbol
        "5602",  # boolean byte 2
        "7300110000",  # char beyond U+10FFFF
        "c0020240",  # list8 count 2 with one element inside the size
        "c00302404040",  # list8 whose elements overrun its size
        "c0050140404040",  # list8 with bytes left over after its count
        "c1020140",  # map with one element
        "c1030140" + "40",  # map with odd count
        "c10502c00140" + "40",  # map with a list key (unhashable)
        "c00001",  # list8 size smaller than its count field
        "e0020100",  # array with described constructor cut short
        "e00101",  # array without element constructor
        "e0030200ff",  # array with invalid element constructor
        "e0ffffffffff",  # array size beyond the buffer
        "f0000000050fffffff40",  # zero-width array with an implausible count
        "e00302e0e0",  # nested array constructors, cut short
        "00",  # described without descriptor
        "0053",  # described without value
        "4040",  # trailing bytes after one value (decode wants exactly one)
    ],
)
def test_malformed_raises_decode_error(hexstr: str) -> None:
    with pytest.raises(DecodeError):
        decode(bytes.fromhex(hexstr))


def test_deep_nesting_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode(b"\x00\x40" * 5000 + b"\x40")


# ---- strict equality ------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equality that also compares AMQP types (UInt(1) is not Long(1)) and treats NaN == NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        bitems = list(b.items())
        return all(same(k, bk) and same(v, bv) for (k, v), (bk, bv) in zip(a.items(), bitems, strict=True))
    if isinstance(a, Array):
        return a.type is b.type and same(a.descriptor, b.descriptor) and same(a.items, b.items)
    if isinstance(a, Described):
        return same(a.descriptor, b.descriptor) and same(a.value, b.value)
    return bool(a == b)


# ---- hypothesis -----------------------------------------------------------------------


def ranged(wrapper: Any) -> st.SearchStrategy[Any]:
    return st.integers(wrapper._lo, wrapper._hi).map(wrapper)


symbols = st.text(st.characters(max_codepoint=127), max_size=300).map(Symbol)
chars = st.characters(exclude_categories=["Cs"]).map(Char)

SCALARS: dict[T, st.SearchStrategy[Any]] = {
    T.NULL: st.none(),
    T.BOOLEAN: st.booleans(),
    T.UBYTE: ranged(UByte),
    T.USHORT: ranged(UShort),
    T.UINT: ranged(UInt),
    T.ULONG: ranged(ULong),
    T.BYTE: ranged(Byte),
    T.SHORT: ranged(Short),
    T.INT: ranged(Int),
    T.LONG: ranged(Long),
    T.FLOAT: st.floats(width=32).map(Float),
    T.DOUBLE: st.floats(),
    T.DECIMAL32: st.binary(min_size=4, max_size=4).map(Decimal32),
    T.DECIMAL64: st.binary(min_size=8, max_size=8).map(Decimal64),
    T.DECIMAL128: st.binary(min_size=16, max_size=16).map(Decimal128),
    T.CHAR: chars,
    T.TIMESTAMP: ranged(Timestamp),
    T.UUID: st.uuids(),
    T.BINARY: st.binary(max_size=300),
    T.STRING: st.text(max_size=300),
    T.SYMBOL: symbols,
}
hashable_scalars = st.one_of(
    *(s for t, s in SCALARS.items() if t not in (T.FLOAT, T.DOUBLE)),
)
descriptors = st.one_of(ranged(ULong), symbols)


def arrays(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Array]:
    scalar_arrays = st.sampled_from(sorted(SCALARS, key=lambda t: t.value)).flatmap(
        lambda t: st.builds(Array, st.just(t), st.lists(SCALARS[t], max_size=5), st.none() | descriptors)
    )
    list_arrays = st.builds(Array, st.just(T.LIST), st.lists(st.lists(children, max_size=3), max_size=3))
    map_arrays = st.builds(
        Array, st.just(T.MAP), st.lists(st.dictionaries(hashable_scalars, children, max_size=3), max_size=3)
    )
    return st.one_of(scalar_arrays, list_arrays, map_arrays)


values = st.recursive(
    st.one_of(*SCALARS.values()),
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(hashable_scalars, children, max_size=5),
        arrays(children),
        st.builds(Array, st.just(T.ARRAY), st.lists(arrays(children), max_size=2)),
        st.builds(Described, descriptors, children),
    ),
    max_leaves=12,
)


@given(values)
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip(value: Any) -> None:
    wire = encode(value)
    assert same(decode(wire), value)
    # decoding never reads past the value
    _v, end = decode_value(wire + b"\x40", 0)
    assert end == len(wire)


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(data)


@given(values, st.data())
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_encodings_only_raise_decode_error(value: Any, data: st.DataObject) -> None:
    wire = bytearray(encode(value))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(wire)))
    for candidate in (bytes(wire), bytes(wire[:cut])):
        with contextlib.suppress(DecodeError):
            decode(candidate)


@given(values)
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
def test_every_strict_prefix_is_a_decode_error(value: Any) -> None:
    wire = encode(value)
    for i in range(len(wire)):
        with pytest.raises(DecodeError):
            decode(wire[:i])
