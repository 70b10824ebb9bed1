"""AMQP 1.0 addresses and the message mapping onto the broker's Message."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.amqp1.test_performatives import messages
from trimaran.amqp1.addresses import Address, AddressError, resolve
from trimaran.amqp1.codec import encode
from trimaran.amqp1.mapping import EXTRA_KEY, address_to_topic, from_amqp1, from_wire, to_amqp1
from trimaran.amqp1.messages import (
    AmqpSequence,
    AmqpValue,
    Data,
    Header,
    Properties,
    decode_message,
    encode_message,
)
from trimaran.amqp1.messages import Message as A1Message
from trimaran.amqp1.performatives import Composite
from trimaran.amqp1.types import Described, Long, Symbol, UInt, ULong
from trimaran.broker.message import PROTOCOL_AMQP1, PROTOCOL_MQTT, Message


def raw_extra(m: Message) -> bytes:
    """The AMQP 1.0 message bytes the broker Message carries for AMQP 1.0 consumers."""
    raw = m.extra[EXTRA_KEY]
    assert isinstance(raw, bytes), raw
    return raw


# -- addresses ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "caps", "bare", "receive", "expected"),
    [
        ("orders", None, "queue", False, Address("queue", "orders")),
        ("orders", None, "topic", False, Address("topic", "orders")),
        ("a/b", [Symbol("topic")], "queue", False, Address("topic", "a/b")),
        ("orders", [Symbol("queue")], "topic", False, Address("queue", "orders")),
        ("$queue/orders", None, "topic", False, Address("queue", "orders")),
        ("$queue/orders/eu/paris", None, "queue", False, Address("queue", "orders", "eu/paris")),
        ("$queue/orders/eu/+", None, "queue", True, Address("queue", "orders", "eu/+")),
        ("queue://orders", None, "topic", False, Address("queue", "orders")),
        ("$queue/$dlq/orders", None, "queue", True, Address("queue", "$dlq/orders")),
        ("topic://a/b", None, "queue", False, Address("topic", "a/b")),
        ("topic://a/+/#", None, "queue", True, Address("topic", "a/+/#")),
    ],
)
def test_resolve(address: str, caps: object, bare: str, receive: bool, expected: Address) -> None:
    assert resolve(address, caps, bare=bare, for_receive=receive) == expected


@pytest.mark.parametrize(
    ("address", "receive"),
    [
        (None, True),
        ("", False),
        ("a/b", False),  # a bare queue name cannot hold '/'
        ("queue://", True),
        ("topic://a/+", False),  # no wildcards to publish
        ("topic://a/#/b", True),
        ("topic://$queue/x", True),
        ("$queue/q/$ack", False),
        ("$queue/q/a+", False),
        (42, False),
    ],
)
def test_resolve_refuses(address: object, receive: bool) -> None:
    with pytest.raises(AddressError) as info:
        resolve(address, None, for_receive=receive)
    assert info.value.condition == "amqp:invalid-field"


def test_address_topic() -> None:
    assert Address("queue", "orders", "eu").topic == "$queue/orders/eu"
    assert Address("queue", "orders").topic == "$queue/orders"
    assert Address("topic", "a/b").topic == "a/b"
    assert address_to_topic("queue://q") == "$queue/q"
    assert address_to_topic("topic://a/b") == "a/b"
    assert address_to_topic("plain") == "plain"


# -- messages -----------------------------------------------------------------------------------------


def test_from_amqp1_maps_the_table() -> None:
    msg = A1Message(
        header=Header(ttl=UInt(5000)),
        properties=Properties(
            content_type=Symbol("text/plain"),
            correlation_id="c-1",
            reply_to="topic://r/s",
            absolute_expiry_time=10_000_000,
        ),
        application_properties={"k": "v", "n": Long(5), "ok": True},
        body=[Data(b"hello ")],
    )
    wire = encode_message(msg)
    m = from_amqp1(decode_message(wire), "a/b", "c1", settled=False, now=1_000_000)
    assert m.topic == "a/b"
    assert m.payload == b"hello "
    assert m.qos == 1
    assert m.content_type == "text/plain"
    assert m.correlation_data == b"c-1"
    assert m.response_topic == "r/s"
    assert m.expires_at_ms == 1_005_000  # ttl earlier than the absolute expiry
    assert m.user_properties == [("k", "v"), ("n", "5"), ("ok", "true")]
    assert m.protocol == PROTOCOL_AMQP1
    # Byte-exact when forwarded to another AMQP 1.0 peer.
    assert to_amqp1(m) == wire


def test_from_amqp1_bodies() -> None:
    text = from_amqp1(A1Message.from_value("héllo"), "t", None, settled=True)
    assert (text.payload, text.payload_format, text.qos) == ("héllo".encode(), 1, 0)
    binary = from_amqp1(A1Message.from_value(b"\x00\x01"), "t", None, settled=True)
    assert binary.payload == b"\x00\x01"
    multi = from_amqp1(A1Message(body=[Data(b"ab"), Data(b"cd")]), "t", None, settled=True)
    assert multi.payload == b"abcd"
    seq = A1Message(body=[AmqpSequence([1, 2])])
    other = from_amqp1(seq, "t", None, settled=True)
    assert decode_message(other.payload).body == seq.body


def test_delivery_annotations_are_not_forwarded() -> None:
    msg = A1Message(delivery_annotations={Symbol("x-opt-hop"): 1}, body=[Data(b"x")])
    m = from_amqp1(decode_message(encode_message(msg)), "t", None, settled=True)
    assert decode_message(raw_extra(m)).delivery_annotations is None


def test_redelivery_sets_the_header_delivery_count_and_keeps_the_bare_message() -> None:
    wire = encode_message(A1Message(properties=Properties(message_id="id-1"), body=[Data(b"x")]))
    m = from_amqp1(decode_message(wire), "$queue/q", None, settled=False)
    again = to_amqp1(m, delivery_count=2)
    decoded = decode_message(again)
    assert decoded.header is not None and decoded.header.delivery_count == 2
    assert decoded.bare == decode_message(wire).bare


def test_redelivery_replaces_only_the_header_of_a_kept_message() -> None:
    wire = encode_message(
        A1Message(
            header=Header(durable=True, priority=7, ttl=60_000, first_acquirer=True),
            message_annotations={Symbol("x-opt-a"): 1},
            properties=Properties(message_id="id-1"),
            body=[Data(b"x" * 300)],
            footer={Symbol("f"): 2},
        )
    )
    m = from_amqp1(decode_message(wire), "$queue/q", None, settled=False, raw=wire)
    again = decode_message(to_amqp1(m, delivery_count=1))
    expected = Header(durable=True, priority=7, ttl=60_000, first_acquirer=False, delivery_count=1)
    assert again.header == expected
    first = decode_message(wire)
    assert (again.message_annotations, again.bare, again.footer) == (
        first.message_annotations,
        first.bare,
        first.footer,
    )


def test_to_amqp1_from_mqtt() -> None:
    m = Message(
        "a/b",
        b"payload",
        qos=1,
        content_type="application/json",
        correlation_data=b"\xff\x00",  # not UTF-8: stays binary
        response_topic="$queue/replies",
        expires_at_ms=2_000,
        user_properties=[("k", "1"), ("k", "2")],
        protocol=PROTOCOL_MQTT,
        created_at_ms=1_000,
    )
    decoded = decode_message(to_amqp1(m, now=1_500))
    assert decoded.header is not None and decoded.header.durable and decoded.header.ttl == 500
    props = decoded.properties
    assert props is not None
    assert props.to == "topic://a/b"
    assert props.content_type == "application/json"
    assert props.correlation_id == b"\xff\x00"
    assert props.reply_to == "$queue/replies"
    assert decoded.application_properties == {"k": "2"}
    assert decoded.body == [Data(b"payload")]


def test_raw_payload_is_kept_unless_delivery_annotations_must_go() -> None:
    plain = encode_message(A1Message(header=Header(durable=True), body=[Data(b"x")]))
    m = from_amqp1(decode_message(plain), "t", None, settled=True, raw=plain)
    assert m.extra[EXTRA_KEY] == plain
    annotated = encode_message(A1Message(delivery_annotations={Symbol("a"): 1}, body=[Data(b"x")]))
    m = from_amqp1(decode_message(annotated), "t", None, settled=True, raw=annotated)
    assert decode_message(raw_extra(m)).delivery_annotations is None


@given(messages, st.booleans())
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_from_wire_maps_as_from_amqp1_does(msg: A1Message, settled: bool) -> None:
    raw = encode_message(msg)
    fast = from_wire(raw, "$queue/q", "c1", settled=settled, now=1000)
    props = msg.properties
    described_id = props is not None and any(
        isinstance(v, (Composite, Described)) for v in (props.reply_to, props.correlation_id)
    )
    # Delivery annotations are dropped on the way and a described id is the composite decoder's
    # to read: those go the long way, everything else does not.
    assert (fast is None) == (msg.delivery_annotations is not None or described_id)
    if fast is None:
        return
    slow = from_amqp1(decode_message(raw), "$queue/q", "c1", settled=settled, now=1000, raw=raw)
    assert fast == slow
    assert raw_extra(fast) is raw


@given(st.binary(max_size=80))
@settings(max_examples=300)
def test_from_wire_never_raises_on_random_bytes(data: bytes) -> None:
    from_wire(b"\x00\x53\x75" + data, "t", None, settled=True, now=0)
    from_wire(b"\x00\x53\x73" + data, "t", None, settled=True, now=0)
    from_wire(data, "t", None, settled=True, now=0)


def test_from_wire_of_what_proton_sends() -> None:
    # proton's C send example: a message id and an amqp-value map body.
    msg = A1Message(
        header=Header(durable=True, ttl=5000),
        properties=Properties(message_id=ULong(7), content_type=Symbol("application/json")),
        application_properties={"colour": "red", "n": Long(3)},
        body=[AmqpValue({"sequence": 7})],
    )
    raw = encode_message(msg)
    got = from_wire(raw, "t", "c", settled=False, now=1000)
    assert got is not None
    assert got.payload == encode_message(A1Message(body=[AmqpValue({"sequence": 7})]))
    assert got.payload_format is None and got.expires_at_ms == 6000
    assert got.content_type == "application/json" and got.user_properties == [("colour", "red"), ("n", "3")]
    assert got.qos == 1 and raw_extra(got) is raw


@pytest.mark.parametrize(
    "raw",
    [
        encode_message(A1Message(body=[AmqpValue("t\u00e9")])),
        encode_message(A1Message(body=[AmqpValue(b"\x00\x01")])),
        encode_message(A1Message(body=[AmqpValue(None)])),
        encode_message(A1Message(body=[Data(b"a"), Data(b"b")])),
        encode_message(A1Message(body=[])),
        # headers as clients spell them: durable as 0x56 0x01 or true, a priority, a ttl (list8, list32)
        b"\x00\x53\x70\xc0\x0a\x03\x56\x01\x50\x07\x70\x00\x00\x01\xf4\x00\x53\x75\xa0\x01a",
        b"\x00\x53\x70\xc0\x04\x03\x41\x40\x43\x00\x53\x75\xa0\x01a",
        b"\x00\x53\x70\xd0\x00\x00\x00\x09\x00\x00\x00\x03\x42\x50\x04\x52\x09\x00\x53\x75\xa0\x01a",
    ],
)
def test_from_wire_payloads(raw: bytes) -> None:
    fast = from_wire(raw, "t", "c", settled=True, now=1)
    assert fast == from_amqp1(decode_message(raw), "t", "c", settled=True, now=1, raw=raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x53\x77\xa1\x01\xff",  # a string that is not UTF-8
        b"\x00\x53\x75\xa0\x05abc",  # shorter than it says
        encode_message(A1Message(body=[Data(b"a")])) + b"\x00",  # trailing byte
        encode(Described(ULong(0x77), 1)) + b"\x00\x53\x75\xa0\x01a",  # amqp-value then data
        b"\x00\x80" + b"\x00" * 7 + b"\x75\xa0\x01a",  # a long descriptor: the long way
    ],
)
def test_from_wire_leaves_the_rest_to_decode_message(raw: bytes) -> None:
    assert from_wire(raw, "t", "c", settled=True, now=1) is None
