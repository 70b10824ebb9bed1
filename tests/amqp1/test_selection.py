"""trimaran/amqp1/selection.py: the selector filter found by its descriptor, and what a selector
reads of each protocol's message (JMS headers as Qpid JMS maps them, typed properties)."""

from __future__ import annotations

import uuid

from trimaran.amqp091.mapping import message_from_content
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp1.mapping import from_amqp1
from trimaran.amqp1.messages import AmqpValue, Header, Properties, decode_message, encode_message
from trimaran.amqp1.messages import Message as A1Message
from trimaran.amqp1.selection import SELECTOR_FILTER, find_selector, message_fields, parse_selector, selecting
from trimaran.amqp1.types import Described, Symbol, Timestamp, ULong
from trimaran.broker.message import PROTOCOL_MQTT, Message
from trimaran.selector import Text


def test_found_by_descriptor_under_any_key() -> None:
    by_name = Described(SELECTOR_FILTER, "a = 1")
    by_code = Described(ULong(0x0000468C00000004), "a = 2")
    other = Described(Symbol("apache.org:legacy-amqp-direct-binding:string"), "key")
    assert find_selector({Symbol("selector"): by_name}) == (Symbol("selector"), by_name)
    assert find_selector({Symbol("x"): other, Symbol("jms-selector"): by_code}) == (
        Symbol("jms-selector"),
        by_code,
    )
    assert find_selector({Symbol("x"): other}) is None
    assert find_selector(None) is None and find_selector({}) is None


def amqp1_message(**kw: object) -> Message:
    header = Header(durable=True, priority=7)
    props = Properties(
        message_id=kw.get("message_id", "m-1"),
        correlation_id=kw.get("correlation_id"),
        subject="order",
        creation_time=Timestamp(1_000),
        absolute_expiry_time=Timestamp(9_000),
    )
    app = {"colour": "red", "weight": ULong(12), "ok": True, "blob": b"x"}
    raw = encode_message(
        A1Message(header=header, properties=props, application_properties=app, body=[AmqpValue("b")])
    )
    return from_amqp1(decode_message(raw), "t", "c", settled=False, raw=raw, now=500)


def test_amqp1_fields() -> None:
    fields = message_fields(amqp1_message())
    assert fields["colour"] == "red" and fields["weight"] == 12 and type(fields["weight"]) is int
    assert fields["ok"] is True and fields["blob"] is None  # binary is no selector type
    assert fields["JMSMessageID"] == "m-1" and fields["JMSType"] == "order"
    assert fields["JMSPriority"] == 7 and fields["JMSDeliveryMode"] == "PERSISTENT"
    assert fields["JMSTimestamp"] == 1_000 and fields["JMSExpiration"] == 9_000
    assert fields["JMSCorrelationID"] is None
    ids = message_fields(amqp1_message(message_id=ULong(5), correlation_id=uuid.UUID(int=1)))
    assert ids["JMSMessageID"] == "ID:AMQP_ULONG:5"
    assert ids["JMSCorrelationID"] == "ID:AMQP_UUID:00000000-0000-0000-0000-000000000001"
    assert selecting(parse_selector("weight > 10 AND JMSPriority = 7"))(amqp1_message())


def test_amqp091_fields_keep_the_header_types() -> None:
    props = BasicProperties(
        headers={"weight": 12, "colour": "red"},
        priority=2,
        type="car",
        message_id="id-9",
        correlation_id="c-9",
        timestamp=1_700_000_000,
        delivery_mode=2,
    )
    message = message_from_content(
        props, b"x", "$queue/q", exchange="", routing_key="q", publisher_id=None, now=5
    )
    fields = message_fields(message)
    assert fields["weight"] == 12 and fields["colour"] == "red"
    assert fields["JMSType"] == "car" and fields["JMSPriority"] == 2 and fields["JMSMessageID"] == "id-9"
    assert fields["JMSCorrelationID"] == "c-9" and fields["JMSTimestamp"] == 1_700_000_000_000
    assert fields["JMSDeliveryMode"] == "PERSISTENT" and fields["JMSExpiration"] == 0


def test_mqtt_user_properties_are_text() -> None:
    message = Message(
        "t",
        b"",
        qos=0,
        user_properties=[("weight", "12")],
        protocol=PROTOCOL_MQTT,
        created_at_ms=3,
        expires_at_ms=10,
    )
    fields = message_fields(message)
    assert fields["weight"] == "12" and isinstance(fields["weight"], Text)
    assert fields["JMSPriority"] == 4 and fields["JMSDeliveryMode"] == "NON_PERSISTENT"
    assert fields["JMSTimestamp"] == 3 and fields["JMSExpiration"] == 10 and fields["JMSMessageID"] is None
    assert selecting(parse_selector("weight > 10"))(message)


def test_a_queue_consumer_remembers_its_verdicts() -> None:
    calls: list[object] = []
    selector = parse_selector("weight > 10")

    def counting(fields: object) -> bool:
        calls.append(fields)
        return selector(fields)  # type: ignore[arg-type]

    selects = selecting(counting, remember=2)  # type: ignore[arg-type]
    a, b, c = (
        Message("t", b"", user_properties=[("weight", str(w))], protocol=PROTOCOL_MQTT) for w in (5, 20, 30)
    )
    assert [selects(a), selects(b), selects(a), selects(b)] == [False, True, False, True]
    assert len(calls) == 2  # each decided once
    selects(c)  # the oldest verdict (a's) is forgotten
    selects(a)
    assert len(calls) == 4
