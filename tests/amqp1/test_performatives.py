"""Composite types (performatives, states, termini, SASL) and messages: vectors and round trips."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimaran.amqp1.codec import decode, encode
from trimaran.amqp1.messages import (
    AmqpSequence,
    AmqpValue,
    Data,
    Header,
    Message,
    Properties,
    decode_message,
    encode_message,
)
from trimaran.amqp1.performatives import (
    ALL_COMPOSITES,
    DELIVERY_STATES,
    Accepted,
    Attach,
    Begin,
    Composite,
    Error,
    FieldSpec,
    Flow,
    Modified,
    Open,
    Rejected,
    Source,
    Target,
    Transfer,
    composite,
    decode_composite,
    from_described,
)
from trimaran.amqp1.types import DecodeError, Described, Symbol, Timestamp, ULong

# ---- vectors --------------------------------------------------------------------------

PERF_VECTORS: list[tuple[str, Composite]] = [
    # open: descriptor 0x10, list8 of one field (container-id "c")
    ("005310c00401a10163", Open(container_id="c")),
    # open with max-frame-size 512 and idle-time-out: hostname null, channel-max null (default)
    (
        "005310c01005a1016340700000020040" + "7000007530",
        Open(container_id="c", max_frame_size=512, idle_time_out=30000),
    ),
    # begin: remote-channel ushort 1, next-outgoing-id 0, windows 10/10
    (
        "005311c009046000014352" + "0a520a",
        Begin(remote_channel=1, next_outgoing_id=0, incoming_window=10, outgoing_window=10),
    ),
    # accepted: an empty list
    ("005324" + "45", Accepted()),
    # transfer: handle 0, delivery-id 1, tag "t", format 0, settled true
    (
        "005314c00905435201a00174" + "4341",
        Transfer(handle=0, delivery_id=1, delivery_tag=b"t", message_format=0, settled=True),
    ),
    # flow: handle null inside, drain/echo (false) omitted at the end
    (
        "005313c00a074352ff4343" + "4043" + "5205",
        Flow(
            next_incoming_id=0,
            incoming_window=255,
            next_outgoing_id=0,
            outgoing_window=0,
            delivery_count=0,
            link_credit=5,
        ),
    ),
    # error with condition symbol
    ("00531dc00d01a30a616d71703a6572726f72", Error(condition="amqp:error")),
]


@pytest.mark.parametrize(("hexstr", "perf"), PERF_VECTORS, ids=[type(p).__name__ for _, p in PERF_VECTORS])
def test_perf_vector(hexstr: str, perf: Composite) -> None:
    wire = bytes.fromhex(hexstr)
    assert encode(perf).hex() == wire.hex()
    got, end = decode_composite(wire)
    assert got == perf and end == len(wire)


def test_symbolic_descriptor_and_list0_and_extra_fields() -> None:
    # descriptor by name, list0 body
    assert decode_composite(encode(Described(Symbol("amqp:accepted:list"), [])))[0] == Accepted()
    # extra trailing fields are ignored (forward compatibility)
    wire = encode(Described(ULong(0x18), [None, "future"]))
    assert decode_composite(wire)[0].error is None  # type: ignore[attr-defined]


def test_multiple_field_accepts_single_value_and_array() -> None:
    single = Described(ULong(0x10), ["c", None, None, None, None, None, None, Symbol("cap")])
    o = decode_composite(encode(single))[0]
    assert isinstance(o, Open) and o.offered_capabilities == ["cap"]
    o2 = decode_composite(encode(Open(container_id="c", offered_capabilities=["a", "b"])))[0]
    assert isinstance(o2, Open) and o2.offered_capabilities == ["a", "b"]


@pytest.mark.parametrize(
    ("described", "condition"),
    [
        (Described(ULong(0x10), []), "amqp:invalid-field"),  # open without container-id
        (Described(ULong(0x10), [5]), "amqp:invalid-field"),  # container-id of the wrong type
        (Described(ULong(0x13), [None, 1, 1, 1, "h"]), "amqp:invalid-field"),  # handle as string
        (Described(ULong(0x11), [70000, 0, 0, 0]), "amqp:invalid-field"),  # ushort out of range
        (Described(ULong(0x15), [True, 0, None, None, Described(ULong(0x28), [])]), "amqp:invalid-field"),
        (Described(ULong(0x99), []), "amqp:decode-error"),  # unknown descriptor
        (Described(ULong(0x10), "x"), "amqp:decode-error"),  # body not a list
    ],
)
def test_invalid_composites(described: Described, condition: str) -> None:
    with pytest.raises(DecodeError) as info:
        from_described(described)
    assert info.value.condition == condition


def test_plain_values_are_coerced_on_encode() -> None:
    # plain ints become uint, plain str become symbol where the table says so
    wire = encode(Error(condition="amqp:not-found", info={"k": 1}))
    assert decode(wire) == Described(ULong(0x1D), [Symbol("amqp:not-found"), None, {Symbol("k"): 1}])
    assert type(decode(wire).value[0]) is Symbol


def test_a_composites_types_name_its_fields_in_order() -> None:
    @dataclasses.dataclass(kw_only=True, slots=True)
    class Probe(Composite):
        a: int
        b: str | None = None

    with pytest.raises(TypeError, match="Probe"):
        composite(Probe, 0x7FFF_0001, "test:probe:list", (), {"b": "string", "a": "uint"})
    with pytest.raises(DecodeError, match="unknown descriptor"):  # and nothing was registered
        from_described(Described(ULong(0x7FFF_0001), []))


# ---- hypothesis over every composite --------------------------------------------------

ascii_symbols = st.text(st.characters(max_codepoint=127), max_size=20).map(Symbol)
simple_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20))

SCALAR: dict[str, st.SearchStrategy[Any]] = {
    "ubyte": st.integers(0, 0xFF),
    "ushort": st.integers(0, 0xFFFF),
    "uint": st.integers(0, 0xFFFF_FFFF),
    "ulong": st.integers(0, 0xFFFF_FFFF_FFFF_FFFF),
    "boolean": st.booleans(),
    "symbol": ascii_symbols,
    "string": st.text(max_size=30),
    "binary": st.binary(max_size=30),
    "timestamp": st.integers(-(2**63), 2**63 - 1).map(Timestamp),
    "fields": st.dictionaries(ascii_symbols, simple_values, max_size=3),
    "map": st.dictionaries(st.text(max_size=5), simple_values, max_size=3),
}


def composite_strategy(cls: type[Composite], depth: int = 0) -> st.SearchStrategy[Composite]:
    kwargs = {spec.attr: field_strategy(spec, depth) for spec in cls.FIELDS}
    return st.fixed_dictionaries(kwargs).map(lambda kw: cls(**kw))


def field_strategy(spec: FieldSpec, depth: int) -> st.SearchStrategy[Any]:
    t = spec.type
    if t in SCALAR:
        base = SCALAR[t]
    elif t == "*":
        base = st.one_of(st.text(max_size=10), st.integers(0, 2**64 - 1).map(ULong), st.builds(Accepted))
    elif t == "error":
        base = composite_strategy(Error, depth + 1)
    elif t == "delivery-state":
        base = st.one_of(*(composite_strategy(c, depth + 1) for c in DELIVERY_STATES))
    else:
        raise AssertionError(t)
    if spec.multiple:
        base = st.lists(base, max_size=3)
    if spec.mandatory:
        return base
    return st.none() | base if spec.default is None else st.just(spec.default) | base


@pytest.mark.parametrize("cls", ALL_COMPOSITES, ids=[c.__name__ for c in ALL_COMPOSITES])
@given(data=st.data())
@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_composite_round_trip(cls: type[Composite], data: st.DataObject) -> None:
    obj = data.draw(composite_strategy(cls))
    wire = encode(obj)
    got, end = decode_composite(wire)
    assert got == obj and end == len(wire)
    # trailing nulls are never sent
    body = decode(wire).value
    assert not body or body[-1] is not None


@given(st.binary(max_size=120))
@settings(max_examples=300)
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_composite(b"\x00\x53\x12" + data)
    with contextlib.suppress(DecodeError):
        decode_message(data)


# ---- messages -------------------------------------------------------------------------


def test_message_sections_in_order_and_bare_bytes_kept() -> None:
    msg = Message(
        header=Header(durable=True, ttl=1000),
        delivery_annotations={Symbol("x-opt-d"): 1},
        message_annotations={Symbol("x-opt-m"): "v"},
        properties=Properties(
            message_id=ULong(7), to="q", content_type="text/plain", creation_time=Timestamp(5)
        ),
        application_properties={"colour": "red"},
        body=[Data(b"a"), Data(b"b")],
        footer={Symbol("sig"): b"\x01"},
    )
    wire = encode_message(msg)
    descriptors = []
    pos = 0
    from trimaran.amqp1.codec import decode_value

    while pos < len(wire):
        v, pos = decode_value(wire, pos)
        descriptors.append(int(v.descriptor))
    assert descriptors == [0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x75, 0x78]
    got = decode_message(wire)
    assert got == msg and got.data == b"ab"
    assert type(got.properties.message_id) is ULong  # type: ignore[union-attr]
    # the broker edits the header: the bare message still goes out byte for byte
    got.header = Header(delivery_count=1)
    got.delivery_annotations = None
    wire2 = encode_message(got)
    assert got.bare is not None and got.bare in wire2
    # a bare message from another encoder (list32 where we would use list8) is kept as is
    foreign = bytes.fromhex("0053 73 d0 00000007 00000001 a1 01 6d".replace(" ", ""))
    foreign += encode(Described(ULong(0x77), "v"))
    m = decode_message(foreign)
    assert m.properties == Properties(message_id="m") and m.body == [AmqpValue("v")]
    assert encode_message(m) == foreign
    m.bare = None
    assert encode_message(m) != foreign and decode_message(encode_message(m)) == m


@pytest.mark.parametrize(
    "sections",
    [
        [Described(ULong(0x73), []), Described(ULong(0x70), [])],  # properties before header
        [Described(ULong(0x70), []), Described(ULong(0x70), [])],  # repeated header
        [Described(ULong(0x75), b"a"), Described(ULong(0x77), 1)],  # data then amqp-value
        [Described(ULong(0x77), 1), Described(ULong(0x77), 2)],  # two amqp-values
        [Described(ULong(0x75), "not binary")],
        [Described(ULong(0x74), [])],  # application-properties not a map
        [Described(ULong(0x23), [0, 0])],  # not a section
        ["bare value"],
    ],
)
def test_malformed_messages(sections: list[Any]) -> None:
    with pytest.raises(DecodeError):
        decode_message(b"".join(encode(s) for s in sections))


bodies = st.one_of(
    st.lists(st.binary(max_size=50).map(Data), min_size=1, max_size=3),
    st.lists(st.lists(simple_values, max_size=3).map(AmqpSequence), min_size=1, max_size=3),
    simple_values.map(lambda v: [AmqpValue(v)]),
)
annotation_maps = st.none() | st.dictionaries(ascii_symbols, simple_values, max_size=3)
messages = st.builds(
    Message,
    header=st.none() | composite_strategy(Header),
    delivery_annotations=annotation_maps,
    message_annotations=annotation_maps,
    properties=st.none() | composite_strategy(Properties),
    application_properties=st.none() | st.dictionaries(st.text(max_size=8), simple_values, max_size=3),
    body=bodies,
    footer=annotation_maps,
)


@given(messages)
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_message_round_trip(msg: Message) -> None:
    wire = encode_message(msg)
    got = decode_message(wire)
    assert got == msg
    assert encode_message(got) == wire


def test_termini_and_outcomes() -> None:
    src = Source(
        address="topic://a/b",
        dynamic=False,
        filter={Symbol("jms-selector"): Described(Symbol("apache.org:selector-filter:string"), "a = 1")},
        default_outcome=Modified(delivery_failed=True),
        outcomes=["amqp:accepted:list", "amqp:rejected:list"],
        capabilities=["topic"],
    )
    a = Attach(name="n", handle=0, role=True, source=src, target=Target(address=None))
    got = decode_composite(encode(a))[0]
    assert got == a
    assert isinstance(got, Attach) and isinstance(got.source, Source)
    assert isinstance(got.source.default_outcome, Modified)
    r = Rejected(error=Error(condition="amqp:not-found", description="gone"))
    assert decode_composite(encode(r))[0] == r
