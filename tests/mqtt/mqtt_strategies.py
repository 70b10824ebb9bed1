"""Hypothesis strategies for valid MQTT packets of a given protocol level."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from trimaran.mqtt import reason_codes as rc
from trimaran.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    Will,
)
from trimaran.mqtt.properties import (
    BOOLEAN_BYTE_PROPERTIES,
    WILL,
    DataType,
    PacketType,
    Properties,
    properties_for,
)

texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
binaries = st.binary(max_size=24)
packet_ids = st.integers(1, 0xFFFF)
qos = st.integers(0, 2)


def _value(name: str, dtype: DataType) -> st.SearchStrategy[Any]:
    if name in BOOLEAN_BYTE_PROPERTIES:
        return st.integers(0, 1)
    if name in ("receive_maximum", "topic_alias"):
        return st.integers(1, 0xFFFF)
    if name == "maximum_packet_size":
        return st.integers(1, 0xFFFFFFFF)
    if dtype is DataType.BYTE:
        return st.integers(0, 0xFF)
    if dtype is DataType.TWO_BYTE_INT:
        return st.integers(0, 0xFFFF)
    if dtype is DataType.FOUR_BYTE_INT:
        return st.integers(0, 0xFFFFFFFF)
    if dtype is DataType.UTF8:
        return texts
    if dtype is DataType.BINARY:
        return binaries
    raise AssertionError(dtype)


def properties(packet_type: int) -> st.SearchStrategy[Properties]:
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for pdef in properties_for(packet_type):
        if pdef.name == "subscription_identifiers":
            optional[pdef.name] = st.lists(
                st.integers(1, 268_435_455), max_size=1 if packet_type == PacketType.SUBSCRIBE else 3
            )
        elif pdef.name == "user_properties":
            optional[pdef.name] = st.lists(st.tuples(texts, texts), max_size=3)
        else:
            optional[pdef.name] = _value(pdef.name, pdef.data_type)

    def build(values: dict[str, Any]) -> Properties:
        props = Properties(**values)
        if props.authentication_data is not None and props.authentication_method is None:
            props.authentication_method = "method"
        return props

    # Half of the packets carry no properties at all: the common case, and cheaper to generate.
    return st.just(Properties()) | st.fixed_dictionaries({}, optional=optional).map(build)


def _props(level: int, packet_type: int) -> st.SearchStrategy[Properties]:
    return properties(packet_type) if level == 5 else st.just(Properties())


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(draw(texts), draw(binaries), draw(qos), draw(st.booleans()), draw(_props(level, WILL)))
    username = draw(st.none() | texts)
    password = draw(st.none() | binaries)
    if level < 5 and password is not None and username is None:
        username = ""
    return Connect(
        protocol_name="MQIsdp" if level == 3 else "MQTT",
        protocol_level=level,
        clean_start=draw(st.booleans()),
        keep_alive=draw(st.integers(0, 0xFFFF)),
        client_id=draw(texts),
        will=will,
        username=username,
        password=password,
        properties=draw(_props(level, PacketType.CONNECT)),
    )


@st.composite
def connacks(draw: st.DrawFn, level: int) -> ConnAck:
    codes = rc.CONNACK_CODES if level == 5 else rc.CONNACK_CODES_V311
    code = draw(st.sampled_from(sorted(codes)))
    return ConnAck(
        session_present=draw(st.booleans()) if code == 0 else False,
        reason_code=code,
        properties=draw(_props(level, PacketType.CONNACK)),
    )


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    q = draw(qos)
    return Publish(
        topic=draw(texts),
        payload=draw(st.binary(max_size=100)),
        qos=q,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if q else False,
        packet_id=draw(packet_ids) if q else None,
        properties=draw(_props(level, PacketType.PUBLISH)),
    )


def _acks(
    cls: type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp],
    ptype: int,
    codes: frozenset[int],
    level: int,
) -> st.SearchStrategy[Packet]:
    if level < 5:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, st.sampled_from(sorted(codes)), properties(ptype))


@st.composite
def subscribes(draw: st.DrawFn, level: int) -> Subscribe:
    if level == 5:
        options = st.builds(SubscriptionOptions, qos, st.booleans(), st.booleans(), st.integers(0, 2))
    else:
        options = st.builds(SubscriptionOptions, qos)
    subs = draw(st.lists(st.tuples(texts, options), min_size=1, max_size=4))
    return Subscribe(draw(packet_ids), subs, draw(_props(level, PacketType.SUBSCRIBE)))


@st.composite
def subacks(draw: st.DrawFn, level: int) -> SubAck:
    codes = rc.SUBACK_CODES if level == 5 else rc.SUBACK_CODES_V311
    return SubAck(
        draw(packet_ids),
        draw(st.lists(st.sampled_from(sorted(codes)), min_size=1, max_size=4)),
        draw(_props(level, PacketType.SUBACK)),
    )


@st.composite
def unsubacks(draw: st.DrawFn, level: int) -> UnsubAck:
    if level < 5:
        return UnsubAck(draw(packet_ids))
    return UnsubAck(
        draw(packet_ids),
        draw(st.lists(st.sampled_from(sorted(rc.UNSUBACK_CODES)), min_size=1, max_size=4)),
        draw(properties(PacketType.UNSUBACK)),
    )


def packets(level: int) -> st.SearchStrategy[Packet]:
    """Any packet that is valid at `level` (CONNECT packets are of that level too)."""
    options: list[st.SearchStrategy[Packet]] = [
        connects(level),
        connacks(level),
        publishes(level),
        _acks(PubAck, PacketType.PUBACK, rc.PUBACK_CODES, level),
        _acks(PubRec, PacketType.PUBREC, rc.PUBREC_CODES, level),
        _acks(PubRel, PacketType.PUBREL, rc.PUBREL_CODES, level),
        _acks(PubComp, PacketType.PUBCOMP, rc.PUBCOMP_CODES, level),
        subscribes(level),
        subacks(level),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(texts, min_size=1, max_size=4),
            _props(level, PacketType.UNSUBSCRIBE),
        ),
        unsubacks(level),
        st.just(PingReq()),
        st.just(PingResp()),
    ]
    if level == 5:
        options.append(
            st.builds(
                Disconnect, st.sampled_from(sorted(rc.DISCONNECT_CODES)), properties(PacketType.DISCONNECT)
            )
        )
        options.append(st.builds(Auth, st.sampled_from(sorted(rc.AUTH_CODES)), properties(PacketType.AUTH)))
    else:
        options.append(st.just(Disconnect()))
    return st.one_of(options)


levels = st.sampled_from([3, 4, 5])


@st.composite
def level_and_packets(draw: st.DrawFn, max_size: int = 4) -> tuple[int, list[Packet]]:
    level = draw(levels)
    return level, draw(st.lists(packets(level), min_size=1, max_size=max_size))
