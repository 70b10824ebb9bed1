"""MQTT 3.1 / 3.1.1 / 5.0 wire codec, sans-IO.

`Decoder` buffers bytes and yields whole packets; `encode()` turns a packet into bytes for a protocol
level. Bad input raises `ProtocolError` carrying the MQTT 5.0 reason code to answer with (0x81
Malformed Packet, 0x82 Protocol Error, 0x95 Packet too large, ...). After a `ProtocolError` the decoder
is unusable: the connection must be closed.

Standard library only (plus `trimaran.runtime.machine`'s pure base class, see `Decoder`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import Enum
from typing import Final, Literal

from trimaran.mqtt import reason_codes as rc
from trimaran.mqtt.packets import (
    MQTT_3_1,
    MQTT_5,
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
    PublishRun,
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
    PropertyDef,
    properties_for,
)
from trimaran.runtime.machine import Machine

__all__ = [
    "MAX_PACKET_SIZE",
    "MAX_VARINT",
    "NEED_DATA",
    "Decoder",
    "NeedData",
    "ProtocolError",
    "check_utf8",
    "decode_properties",
    "decode_varint",
    "encode",
    "encode_properties",
    "encode_run",
    "encode_varint",
    "run_acks",
    "run_packets",
    "run_stretches",
]

MAX_VARINT: Final = 268_435_455
# Largest possible packet: 1 byte header, 4 bytes remaining length, MAX_VARINT body.
MAX_PACKET_SIZE: Final = 1 + 4 + MAX_VARINT
TOPIC_NAMES: Final = 256  # a decoder's cache of the topics its runs change to, past which it starts again

MALFORMED: Final = rc.ReasonCode.MALFORMED_PACKET
PROTOCOL: Final = rc.ReasonCode.PROTOCOL_ERROR


class NeedData(Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


class ProtocolError(Exception):
    """Bad input from the peer. `reason_code` is the MQTT 5.0 reason code to answer with."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = rc.ReasonCode(reason_code)
        self.message = message

    def __repr__(self) -> str:
        return f"ProtocolError(0x{self.reason_code:02X}, {self.message!r})"


_U16: Final = struct.Struct("!H")
_U32: Final = struct.Struct("!I")
_u16_from = _U16.unpack_from
_u32_from = _U32.unpack_from


# ---------------------------------------------------------------------------------------------- helpers


def encode_varint(value: int) -> bytes:
    """Encode a Variable Byte Integer (section 1.5.5)."""
    if value < 128:
        if value < 0:
            raise ValueError("variable byte integer must not be negative")
        return bytes((value,))
    if value > MAX_VARINT:
        raise ValueError(f"variable byte integer too large: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer at `pos`; return (value, new position). Raises ProtocolError."""
    value = 0
    shift = 0
    for i in range(4):
        if pos >= end:
            raise ProtocolError(MALFORMED, "truncated variable byte integer")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and i:
                raise ProtocolError(MALFORMED, "variable byte integer not in its shortest form")
            return value, pos
        shift += 7
    raise ProtocolError(MALFORMED, "variable byte integer longer than 4 bytes")


def check_utf8(text: str) -> None:
    """Raise ValueError if `text` cannot be sent as an MQTT UTF-8 string (U+0000, surrogates)."""
    if "\x00" in text:
        raise ValueError("MQTT strings must not contain U+0000")
    text.encode("utf-8")  # raises UnicodeEncodeError (a ValueError) on surrogates


# The properties of every received packet that has none (PUBLISH, 3.1.1 CONNECT): one shared
# instance, since building 28 fields per message is a good part of the decode. Never mutated: whoever
# changes properties works on a copy (the topic alias, resolved only when a PUBLISH has properties).
NO_PROPERTIES = Properties()


def _malformed(message: str) -> ProtocolError:
    return ProtocolError(MALFORMED, message)


def _read_u16(mv: memoryview, pos: int, end: int) -> int:
    if pos + 2 > end:
        raise _malformed("truncated two byte integer")
    value: int = _u16_from(mv, pos)[0]
    return value


def _read_str(mv: memoryview, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise _malformed("truncated string length")
    stop = pos + 2 + _u16_from(mv, pos)[0]
    if stop > end:
        raise _malformed("string runs past the end of the packet")
    try:
        text = str(mv[pos + 2 : stop], "utf-8")
    except UnicodeDecodeError:
        raise _malformed("string is not well-formed UTF-8") from None
    if "\x00" in text:
        raise _malformed("string contains U+0000")
    return text, stop


def _read_bin(mv: memoryview, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise _malformed("truncated binary data length")
    stop = pos + 2 + _u16_from(mv, pos)[0]
    if stop > end:
        raise _malformed("binary data runs past the end of the packet")
    return bytes(mv[pos + 2 : stop]), stop


def _str(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError("MQTT string longer than 65535 bytes")
    if b"\x00" in data:
        raise ValueError("MQTT strings must not contain U+0000")
    return _U16.pack(len(data)) + data


def _bin(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("MQTT binary data longer than 65535 bytes")
    return _U16.pack(len(data)) + data


# ------------------------------------------------------------------------------------------- properties

_ALLOWED: dict[int, dict[int, PropertyDef]] = {
    t: {p.identifier: p for p in properties_for(t)} for t in (WILL, *(int(t) for t in PacketType))
}
_PACKET_NAMES: dict[int, str] = {WILL: "Will", **{int(t): t.name for t in PacketType}}


def decode_properties(mv: memoryview, pos: int, end: int, packet_type: int) -> tuple[Properties, int]:
    """Decode a property block (length + properties) at `pos` for `packet_type` (or `WILL`)."""
    length, pos = decode_varint(mv, pos, end)
    stop = pos + length
    if stop > end:
        raise _malformed("properties run past the end of the packet")
    props = Properties()
    if not length:
        return props, pos
    allowed = _ALLOWED[packet_type]
    while pos < stop:
        ident = mv[pos]
        pos += 1
        pdef = allowed.get(ident)
        if pdef is None:
            raise _malformed(f"property 0x{ident:02X} is not allowed in {_PACKET_NAMES[packet_type]}")
        dtype = pdef.data_type
        value: object
        if dtype is DataType.BYTE:
            if pos >= stop:
                raise _malformed("truncated property")
            value = mv[pos]
            pos += 1
        elif dtype is DataType.TWO_BYTE_INT:
            value = _read_u16(mv, pos, stop)
            pos += 2
        elif dtype is DataType.FOUR_BYTE_INT:
            if pos + 4 > stop:
                raise _malformed("truncated property")
            value = _u32_from(mv, pos)[0]
            pos += 4
        elif dtype is DataType.VARINT:
            value, pos = decode_varint(mv, pos, stop)
        elif dtype is DataType.UTF8:
            value, pos = _read_str(mv, pos, stop)
        elif dtype is DataType.BINARY:
            value, pos = _read_bin(mv, pos, stop)
        else:  # UTF8_PAIR
            key, pos = _read_str(mv, pos, stop)
            val, pos = _read_str(mv, pos, stop)
            value = (key, val)
        if pdef.multiple:
            getattr(props, pdef.name).append(value)
        elif getattr(props, pdef.name) is not None:
            raise ProtocolError(PROTOCOL, f"property {pdef.name} appears more than once")
        else:
            setattr(props, pdef.name, value)
    _validate_properties(props, packet_type)
    return props, pos


def _validate_properties(props: Properties, packet_type: int) -> None:
    for name in BOOLEAN_BYTE_PROPERTIES:
        value = getattr(props, name)
        if value is not None and value > 1:
            raise ProtocolError(PROTOCOL, f"property {name} must be 0 or 1, got {value}")
    if props.receive_maximum == 0:
        raise ProtocolError(PROTOCOL, "receive_maximum must not be 0")
    if props.maximum_packet_size == 0:
        raise ProtocolError(PROTOCOL, "maximum_packet_size must not be 0")
    if props.topic_alias == 0:
        raise ProtocolError(rc.ReasonCode.TOPIC_ALIAS_INVALID, "topic alias 0 is not permitted")
    if props.subscription_identifiers:
        if 0 in props.subscription_identifiers:
            raise ProtocolError(PROTOCOL, "subscription identifier 0 is not permitted")
        if packet_type == PacketType.SUBSCRIBE and len(props.subscription_identifiers) > 1:
            raise ProtocolError(PROTOCOL, "SUBSCRIBE carries more than one subscription identifier")
    if props.authentication_data is not None and props.authentication_method is None:
        raise ProtocolError(PROTOCOL, "authentication data without an authentication method")


_EMPTY_PROPERTIES: Final = b"\x00"


def encode_properties(props: Properties, packet_type: int) -> bytes:
    """Encode a property block (length + properties). Properties not allowed on the packet are skipped."""
    out = bytearray()
    for pdef in properties_for(packet_type):
        value = getattr(props, pdef.name)
        if value is None:
            continue
        ident = pdef.identifier
        dtype = pdef.data_type
        if pdef.multiple:
            for item in value:
                out.append(ident)
                if dtype is DataType.VARINT:
                    out += encode_varint(item)
                else:  # UTF8_PAIR: _str() written out, as a queue delivery carries several
                    name = item[0].encode("utf-8")
                    text = item[1].encode("utf-8")
                    name_size = len(name)
                    text_size = len(text)
                    if name_size > 0xFFFF or text_size > 0xFFFF:
                        raise ValueError("MQTT string longer than 65535 bytes")
                    if b"\x00" in name or b"\x00" in text:
                        raise ValueError("MQTT strings must not contain U+0000")
                    out += _U16.pack(name_size)
                    out += name
                    out += _U16.pack(text_size)
                    out += text
            continue
        out.append(ident)
        if dtype is DataType.BYTE:
            out.append(value)
        elif dtype is DataType.TWO_BYTE_INT:
            out += _U16.pack(value)
        elif dtype is DataType.FOUR_BYTE_INT:
            out += _U32.pack(value)
        elif dtype is DataType.UTF8:
            out += _str(value)
        else:  # BINARY
            out += _bin(value)
    if not out:
        return _EMPTY_PROPERTIES
    return encode_varint(len(out)) + out


# ------------------------------------------------------------------------------------------------ decode

# Required fixed-header flags for every packet type but PUBLISH.
# PacketType.PUBLISH as a plain int: the decoder compares it once per packet, and an enum member's
# lookup costs five times the comparison.
_PUBLISH: Final = int(PacketType.PUBLISH)
# An idle connection's one packet, and its answer: one shared PINGREQ (it has no fields), and the
# PINGRESP's two bytes, the same at every level.
PINGREQ: Final = PingReq()
PINGRESP_BYTES: Final = b"\xd0\x00"
# Every drained decoder's buffer (bytes are never written to: the empty one is shared).
_DRAINED: Final = b""
# A packet still not whole after a read is joined with the next read's bytes; one larger than this
# is gathered in a bytearray instead, until it is whole.
SPLIT_FROM: Final = 64 * 1024
_FLAGS: Final = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}


def _decode_connect(flags: int, mv: memoryview, pos: int, end: int, level: int) -> Connect:
    name, pos = _read_str(mv, pos, end)
    if pos + 4 > end:
        raise _malformed("truncated CONNECT variable header")
    level = mv[pos]
    cflags = mv[pos + 1]
    keep_alive = _u16_from(mv, pos + 2)[0]
    pos += 4
    if not ((name == "MQTT" and level in (4, 5)) or (name == "MQIsdp" and level == MQTT_3_1)):
        raise ProtocolError(
            rc.ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported protocol {name!r} level {level}",
        )
    if cflags & 0x01:
        raise _malformed("CONNECT reserved flag is set")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    has_password = cflags & 0x40
    has_username = cflags & 0x80
    if will_qos == 3:
        raise _malformed("will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise _malformed("will QoS or retain set without the will flag")
    if level < MQTT_5 and has_password and not has_username:
        raise _malformed("password flag set without the user name flag")
    props = NO_PROPERTIES  # kept for the connection's life: no copy of 28 empty fields
    if level == MQTT_5:
        props, pos = decode_properties(mv, pos, end, PacketType.CONNECT)
    client_id, pos = _read_str(mv, pos, end)
    will = None
    if will_flag:
        will_props = NO_PROPERTIES
        if level == MQTT_5:
            will_props, pos = decode_properties(mv, pos, end, WILL)
        will_topic, pos = _read_str(mv, pos, end)
        will_payload, pos = _read_bin(mv, pos, end)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if has_username:
        username, pos = _read_str(mv, pos, end)
    if has_password:
        password, pos = _read_bin(mv, pos, end)
    if pos != end:
        raise _malformed("trailing bytes after CONNECT payload")
    return Connect(name, level, bool(cflags & 0x02), keep_alive, client_id, will, username, password, props)


def _decode_connack(flags: int, mv: memoryview, pos: int, end: int, level: int) -> ConnAck:
    if pos + 2 > end:
        raise _malformed("truncated CONNACK")
    ack_flags = mv[pos]
    code = mv[pos + 1]
    pos += 2
    if ack_flags & 0xFE:
        raise _malformed("CONNACK reserved flags are set")
    if code not in (rc.CONNACK_CODES if level == MQTT_5 else rc.CONNACK_CODES_V311):
        raise ProtocolError(PROTOCOL, f"invalid CONNACK reason code 0x{code:02X}")
    if code and ack_flags:
        raise ProtocolError(PROTOCOL, "session present set on a refused CONNACK")
    props = Properties()
    if level == MQTT_5 and pos < end:
        props, pos = decode_properties(mv, pos, end, PacketType.CONNACK)
    if pos != end:
        raise _malformed("trailing bytes in CONNACK")
    return ConnAck(bool(ack_flags), code, props)


def _decode_ack(
    cls: type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp], ptype: int, codes: frozenset[int]
) -> Callable[[int, memoryview, int, int, int], PubAck | PubRec | PubRel | PubComp]:
    def decode(
        flags: int, mv: memoryview, pos: int, end: int, level: int
    ) -> PubAck | PubRec | PubRel | PubComp:
        if pos + 2 > end:
            raise _malformed("truncated two byte integer")
        packet_id: int = _u16_from(mv, pos)[0]
        if not packet_id:
            raise _malformed("packet identifier 0")
        pos += 2
        code = 0
        props = NO_PROPERTIES
        if level == MQTT_5 and pos < end:
            code = mv[pos]
            pos += 1
            if code not in codes:
                raise ProtocolError(PROTOCOL, f"invalid {cls.__name__} reason code 0x{code:02X}")
            if pos < end:
                props, pos = decode_properties(mv, pos, end, ptype)
        if pos != end:
            raise _malformed(f"trailing bytes in {cls.__name__}")
        return cls(packet_id, code, props)

    return decode


def _decode_subscribe(flags: int, mv: memoryview, pos: int, end: int, level: int) -> Subscribe:
    packet_id = _read_u16(mv, pos, end)
    if not packet_id:
        raise _malformed("packet identifier 0")
    pos += 2
    props = Properties()
    if level == MQTT_5:
        props, pos = decode_properties(mv, pos, end, PacketType.SUBSCRIBE)
    subs: list[tuple[str, SubscriptionOptions]] = []
    while pos < end:
        topic_filter, pos = _read_str(mv, pos, end)
        if pos >= end:
            raise _malformed("missing subscription options")
        opts = mv[pos]
        pos += 1
        qos = opts & 0x03
        if qos == 3:
            raise _malformed("subscription with QoS 3")
        if level == MQTT_5:
            if opts & 0xC0:
                raise _malformed("subscription options reserved bits are set")
            retain_handling = (opts >> 4) & 0x03
            if retain_handling == 3:
                raise ProtocolError(PROTOCOL, "retain handling 3")
            options = SubscriptionOptions(qos, bool(opts & 0x04), bool(opts & 0x08), retain_handling)
        else:
            if opts & 0xFC:
                raise _malformed("subscription options reserved bits are set")
            options = SubscriptionOptions(qos)
        subs.append((topic_filter, options))
    if not subs:
        raise ProtocolError(PROTOCOL, "SUBSCRIBE without any topic filter")
    return Subscribe(packet_id, subs, props)


def _decode_suback(flags: int, mv: memoryview, pos: int, end: int, level: int) -> SubAck:
    packet_id = _read_u16(mv, pos, end)
    pos += 2
    if not packet_id:
        raise _malformed("packet identifier 0")
    props = Properties()
    if level == MQTT_5:
        props, pos = decode_properties(mv, pos, end, PacketType.SUBACK)
    codes = list(mv[pos:end])
    if not codes:
        raise ProtocolError(PROTOCOL, "SUBACK without any reason code")
    allowed = rc.SUBACK_CODES if level == MQTT_5 else rc.SUBACK_CODES_V311
    for code in codes:
        if code not in allowed:
            raise ProtocolError(PROTOCOL, f"invalid SUBACK reason code 0x{code:02X}")
    return SubAck(packet_id, codes, props)


def _decode_unsubscribe(flags: int, mv: memoryview, pos: int, end: int, level: int) -> Unsubscribe:
    packet_id = _read_u16(mv, pos, end)
    pos += 2
    if not packet_id:
        raise _malformed("packet identifier 0")
    props = Properties()
    if level == MQTT_5:
        props, pos = decode_properties(mv, pos, end, PacketType.UNSUBSCRIBE)
    filters: list[str] = []
    while pos < end:
        topic_filter, pos = _read_str(mv, pos, end)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolError(PROTOCOL, "UNSUBSCRIBE without any topic filter")
    return Unsubscribe(packet_id, filters, props)


def _decode_unsuback(flags: int, mv: memoryview, pos: int, end: int, level: int) -> UnsubAck:
    packet_id = _read_u16(mv, pos, end)
    pos += 2
    if not packet_id:
        raise _malformed("packet identifier 0")
    if level != MQTT_5:
        if pos != end:
            raise _malformed("trailing bytes in UNSUBACK")
        return UnsubAck(packet_id)
    props, pos = decode_properties(mv, pos, end, PacketType.UNSUBACK)
    codes = list(mv[pos:end])
    if not codes:
        raise ProtocolError(PROTOCOL, "UNSUBACK without any reason code")
    for code in codes:
        if code not in rc.UNSUBACK_CODES:
            raise ProtocolError(PROTOCOL, f"invalid UNSUBACK reason code 0x{code:02X}")
    return UnsubAck(packet_id, codes, props)


def _decode_pingreq(flags: int, mv: memoryview, pos: int, end: int, level: int) -> PingReq:
    if pos != end:
        raise _malformed("PINGREQ with a body")
    return PingReq()


def _decode_pingresp(flags: int, mv: memoryview, pos: int, end: int, level: int) -> PingResp:
    if pos != end:
        raise _malformed("PINGRESP with a body")
    return PingResp()


def _decode_disconnect(flags: int, mv: memoryview, pos: int, end: int, level: int) -> Disconnect:
    code = 0
    props = Properties()
    if level == MQTT_5 and pos < end:
        code = mv[pos]
        pos += 1
        if code not in rc.DISCONNECT_CODES:
            raise ProtocolError(PROTOCOL, f"invalid DISCONNECT reason code 0x{code:02X}")
        if pos < end:
            props, pos = decode_properties(mv, pos, end, PacketType.DISCONNECT)
    if pos != end:
        raise _malformed("trailing bytes in DISCONNECT")
    return Disconnect(code, props)


def _decode_auth(flags: int, mv: memoryview, pos: int, end: int, level: int) -> Auth:
    if level != MQTT_5:
        raise _malformed("AUTH (packet type 15) is reserved before MQTT 5.0")
    code = 0
    props = Properties()
    if pos < end:
        code = mv[pos]
        pos += 1
        if code not in rc.AUTH_CODES:
            raise ProtocolError(PROTOCOL, f"invalid AUTH reason code 0x{code:02X}")
        if pos < end:
            props, pos = decode_properties(mv, pos, end, PacketType.AUTH)
    if pos != end:
        raise _malformed("trailing bytes in AUTH")
    return Auth(code, props)


_Decode = Callable[[int, memoryview, int, int, int], Packet]
_DECODERS: Final[dict[int, _Decode]] = {
    1: _decode_connect,
    2: _decode_connack,
    4: _decode_ack(PubAck, PacketType.PUBACK, rc.PUBACK_CODES),
    5: _decode_ack(PubRec, PacketType.PUBREC, rc.PUBREC_CODES),
    6: _decode_ack(PubRel, PacketType.PUBREL, rc.PUBREL_CODES),
    7: _decode_ack(PubComp, PacketType.PUBCOMP, rc.PUBCOMP_CODES),
    8: _decode_subscribe,
    9: _decode_suback,
    10: _decode_unsubscribe,
    11: _decode_unsuback,
    12: _decode_pingreq,
    13: _decode_pingresp,
    14: _decode_disconnect,
    15: _decode_auth,
}


def _long_remaining(buf: bytes, end: int, size: int) -> tuple[int, int]:
    """A run's next packet's remaining length of two bytes or more (the packet at ``end``) and
    where its body starts; -1 where it is not whole in ``buf`` or not in its shortest form (which
    next_packet then refuses)."""
    remaining = buf[end + 1] & 0x7F
    start = end + 2
    shift = 7
    while start < size and start - end <= 4:
        byte = buf[start]
        start += 1
        remaining |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (remaining, start) if byte else (-1, 0)
        shift += 7
    return -1, 0


def _packet_size(buf: bytes | bytearray, pos: int) -> int:
    """The whole size of the packet at ``pos`` as its fixed header says, or -1 while that header is not
    whole (or not a remaining length at all, which next_packet refuses)."""
    start = pos + 1
    remaining = 0
    shift = 0
    while start < len(buf) and shift <= 21:
        byte = buf[start]
        start += 1
        remaining |= (byte & 0x7F) << shift
        if byte < 0x80:
            return start - pos + remaining
        shift += 7
    return -1


class Decoder(Machine):
    """Incremental packet decoder over its own buffer.

    The buffer is ``bytes``: compiled, a bytes object is indexed and sliced natively (a bytearray
    through the generic protocol, ten times as slow an index). A read decoded whole is decoded in the
    read's own bytes; one that ends inside a packet is joined with the next, and a large packet that
    takes many reads is gathered in a bytearray until it is whole (joining each read to all before it
    would copy it again and again).

    `protocol_level` is 0 until a CONNECT is decoded (a server-side decoder refuses anything else
    first); the CONNECT sets it and later packets are decoded for that level. A client-side decoder is
    constructed with the level it sent. (An int, not an optional one: compiled, a field in place
    rather than a pointer to a boxed int.) `max_packet_size` bounds the whole packet (fixed header
    included) and is checked as soon as the remaining length is known, before the body is awaited.

    The server's machine (`ServerConnection`) is a Decoder, so that a connection is one object, not
    two (issue 47); the client's machine and the tests hold one. A `Machine` only for that: compiled,
    a class has one native base, so the decoder stands between the machine and the machines' base.
    Its names must not clash with the machine's (hence `_fault`, not `_fail`).
    """

    __slots__ = (
        "_buf",
        "_failed",
        "_mv",
        "_pos",
        "_split",
        "_topic",
        "_topic_raw",
        "_topics",
        "max_packet_size",
        "protocol_level",
        "runs",
    )

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE, protocol_level: int | None = None) -> None:
        if protocol_level not in (None, 3, 4, 5):
            raise ValueError(f"unknown protocol level {protocol_level}")
        # Packets are decoded in place from ``_pos``; the consumed front is dropped when more bytes
        # arrive, not per packet, and one memoryview serves every packet of a chunk. Drained, it is
        # the shared _DRAINED again: an idle connection holds no buffer of its own.
        self._buf = _DRAINED
        self._pos = 0
        self._split: bytearray | None = None  # a large packet's bytes until it is whole
        self._mv: memoryview | None = None
        self._failed: ProtocolError | None = None
        # The last PUBLISH's topic, as received and decoded: a publisher mostly repeats its topic.
        # b"" (shared) until the first.
        self._topic_raw = b""
        self._topic = ""
        # The other topics of runs that change topic, as received -> decoded (bounded; made on
        # first use: a connection that keeps to one topic holds none).
        self._topics: dict[bytes, str] | None = None
        self.max_packet_size = max_packet_size
        self.protocol_level = protocol_level or 0  # 0 (None given): a server's, set by the CONNECT
        # Hand out consecutive plain QoS 0 PUBLISHes to one topic as one PublishRun (a server that
        # routes them once turns this on); off, every PUBLISH is its own packet.
        self.runs = False

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._mv is not None:  # a view of the buffer this read replaces
            self._mv.release()
            self._mv = None
        chunk = data if isinstance(data, bytes) else bytes(data)
        split = self._split
        if split is not None:
            split += chunk
            if len(split) >= _packet_size(split, 0):
                self._buf = bytes(split)
                self._split = None
            return
        buf = self._buf
        if buf is _DRAINED:
            self._buf = chunk  # decoded where it was read: nothing copied
            return
        pos = self._pos
        self._pos = 0
        size = _packet_size(buf, pos)
        if len(buf) - pos + len(chunk) < size <= self.max_packet_size and size > SPLIT_FROM:
            split = self._split = bytearray(buf[pos:])
            split += chunk
            self._buf = _DRAINED
            return
        self._buf = buf[pos:] + chunk

    @property
    def buffered(self) -> int:
        """Number of bytes received but not yet decoded."""
        split = self._split
        return len(self._buf) - self._pos + (0 if split is None else len(split))

    def next_pubacks(self) -> list[int]:
        """The packet identifiers of the run of plain PUBACKs (success, no properties: the four
        bytes ``40 02 id id``, the same at every level) at the head of the buffer, consumed: a
        subscriber acknowledging QoS 1 sends little else, and neither a packet object nor a call is
        needed for each. Empty when the next packet is anything else; it is left to
        :meth:`next_packet`."""
        ids: list[int] = []
        if self._failed is not None:
            return ids
        buf = self._buf
        pos = self._pos
        size = len(buf)
        while size - pos >= 4 and buf[pos] == 0x40 and buf[pos + 1] == 2:
            packet_id = buf[pos + 2] << 8 | buf[pos + 3]
            if not packet_id:
                break  # malformed: next_packet says so
            ids.append(packet_id)
            pos += 4
        if not ids:
            return ids
        if pos == size:
            if self._mv is not None:
                self._mv.release()
                self._mv = None
            self._buf = _DRAINED
            self._pos = 0
        else:
            self._pos = pos
        return ids

    def next_packet(self) -> Packet | PublishRun | Literal[NeedData.NEED_DATA]:
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        base = self._pos
        size = len(buf)
        if size - base < 2:
            return NEED_DATA
        # Remaining length: a variable byte integer starting at offset 1.
        byte = buf[base + 1]
        start = base + 2
        if byte < 0x80:
            remaining = byte
        else:
            remaining = byte & 0x7F
            shift = 7
            while True:
                if start >= size:
                    return NEED_DATA
                byte = buf[start]
                start += 1
                remaining |= (byte & 0x7F) << shift
                if byte < 0x80:
                    if byte == 0:
                        raise self._fault(_malformed("remaining length not in its shortest form"))
                    break
                if start - base >= 5:
                    raise self._fault(_malformed("remaining length longer than 4 bytes"))
                shift += 7
        total = start + remaining
        if total - base > self.max_packet_size:
            raise self._fault(
                ProtocolError(
                    rc.ReasonCode.PACKET_TOO_LARGE,
                    f"packet of {total - base} bytes exceeds the maximum packet size {self.max_packet_size}",
                )
            )
        first = buf[base]
        ptype = first >> 4
        level = self.protocol_level
        if not level and ptype != PacketType.CONNECT:
            raise self._fault(ProtocolError(PROTOCOL, "the first packet must be CONNECT"))
        if size < total:
            return NEED_DATA
        flags = first & 0x0F
        if ptype == _PUBLISH:  # most packets: read from the buffer, no view, no lookup
            try:
                packet: Packet | PublishRun
                if (flags == 0 or flags == 2) and self.runs:  # QoS 0 or 1, no retain, no DUP
                    packet, total = self._run(flags, base, start, total, level)
                else:
                    packet = self._publish(flags, base, start, total, level)
            except ProtocolError as exc:
                self._failed = exc
                raise
        elif first == 0xC0 and total == start:  # PINGREQ: no view, no lookup, no packet made
            packet = PINGREQ
        else:
            decode = _DECODERS.get(ptype)
            if decode is None:
                raise self._fault(_malformed("reserved packet type 0"))
            if flags != _FLAGS[ptype]:
                raise self._fault(
                    _malformed(f"invalid fixed header flags 0x{flags:X} for packet type {ptype}")
                )
            mv = self._mv
            if mv is None:
                mv = self._mv = memoryview(buf)
            try:
                packet = decode(flags, mv, start, total, level)
            except ProtocolError as exc:
                self._failed = exc
                raise
        if total == size:  # all decoded: an idle connection keeps no buffer
            if self._mv is not None:
                self._mv.release()
                self._mv = None
            self._buf = _DRAINED
            self._pos = 0
        else:
            self._pos = total
        if not level and isinstance(packet, Connect):
            self.protocol_level = packet.protocol_level
        return packet

    def _publish(self, flags: int, base: int, pos: int, end: int, level: int) -> Publish:
        """The PUBLISH whose packet starts at ``base`` and whose body is ``pos``..``end``. Read from
        the buffer itself: its slices and indexing cost a third of a memoryview's."""
        buf = self._buf
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise _malformed("PUBLISH with QoS 3")
        dup = bool(flags & 0x08)
        if dup and not qos:
            raise _malformed("DUP flag set on a QoS 0 PUBLISH")
        if pos + 2 > end:
            raise _malformed("truncated string length")
        stop = pos + 2 + (buf[pos] << 8 | buf[pos + 1])
        if stop > end:
            raise _malformed("string runs past the end of the packet")
        raw = buf[pos + 2 : stop]
        if raw == self._topic_raw:
            # The same bytes are the same valid name: its str is kept, and with it its hash (the
            # router's lookup) and the identity the connection's and the ACL's checks compare first.
            topic = self._topic
        else:
            try:
                topic = str(raw, "utf-8")
            except UnicodeDecodeError:
                raise _malformed("string is not well-formed UTF-8") from None
            if "\x00" in topic:
                raise _malformed("string contains U+0000")
            self._topic_raw = raw
            self._topic = topic
        pos = stop
        packet_id = None
        if qos:
            if pos + 2 > end:
                raise _malformed("truncated two byte integer")
            packet_id = buf[pos] << 8 | buf[pos + 1]
            pos += 2
            if not packet_id:
                raise _malformed("packet identifier 0")
        props = NO_PROPERTIES
        if level == MQTT_5:
            if pos < end and buf[pos] == 0:  # the common case: no properties
                pos += 1
            else:
                mv = self._mv
                if mv is None:
                    mv = self._mv = memoryview(buf)
                props, pos = decode_properties(mv, pos, end, PacketType.PUBLISH)
        if not flags & 0x09 and props is NO_PROPERTIES:
            # No retain, no DUP, no properties: these bytes (another packet id put in at QoS 1/2)
            # are what a subscriber of the same protocol family and QoS gets. The payload is cut
            # from them: one copy out of the buffer, not two.
            wire = buf if base == 0 and end == len(buf) else buf[base:end]  # (no copy of a whole read)
            return Publish(topic, wire[pos - base :], qos, False, False, packet_id, props, wire)
        return Publish(topic, buf[pos:end], qos, bool(flags & 0x01), dup, packet_id, props)

    def _run(self, flags: int, base: int, pos: int, end: int, level: int) -> tuple[Publish | PublishRun, int]:
        """The PUBLISH at ``base`` (body ``pos``..``end``), QoS 0 or 1 (``flags``) without retain
        or DUP, and every whole packet after it with the same fixed header, topic and (5.0) no
        properties, as one PublishRun, and where it ends. A packet unlike them (at QoS 1 one with
        packet identifier 0 too) ends the run and is read on its own (by :meth:`next_packet`, which
        refuses it if it is bad); so does a first packet with properties, no topic or a bad packet
        identifier, which is returned as a Publish (or refused)."""
        buf = self._buf
        if pos + 2 > end:
            return self._publish(flags, base, pos, end, level), end  # (raises: malformed)
        stop = pos + 2 + (buf[pos] << 8 | buf[pos + 1])
        # The topic field, then at QoS 1 the packet id, then at 5.0 the empty properties' one byte.
        qos = flags >> 1
        at = stop + 2 if qos else stop
        head = at + 1 if level == MQTT_5 else at
        if (
            stop == pos + 2
            or head > end
            or (head > at and buf[at])
            or (qos and not (buf[stop] or buf[stop + 1]))
        ):
            return self._publish(flags, base, pos, end, level), end
        raw = buf[pos + 2 : stop]
        if raw == self._topic_raw:
            topic = self._topic
        else:
            try:
                topic = str(raw, "utf-8")
            except UnicodeDecodeError:
                raise _malformed("string is not well-formed UTF-8") from None
            if "\x00" in topic:
                raise _malformed("string contains U+0000")
            self._topic_raw = raw
            self._topic = topic
        # What every packet of the run repeats: at QoS 0 all of ``head``, at QoS 1 the topic field
        # (its packet id and 5.0 properties byte are checked apart).
        field = buf[pos:stop] if qos else buf[pos:head]
        size_of_field = len(field)
        width = head - pos
        largest = end - base
        limit = self.max_packet_size
        size = len(buf)
        first = buf[base]
        v5 = level == MQTT_5
        count = 1
        # At QoS 1 each packet's id as read, two bytes each: the PUBACKs are made of them (run_acks).
        ids = bytearray(buf[stop : stop + 2]) if qos else None
        # Each next packet: the same first byte, its remaining length, then the same topic field.
        # Read in place (no packet object, no call), as many as the buffer holds whole.
        while end + 2 <= size and buf[end] == first:
            byte = buf[end + 1]
            start = end + 2
            if byte < 0x80:
                remaining = byte
            else:
                remaining, start = _long_remaining(buf, end, size)
                if remaining < 0:
                    break
            total = start + remaining
            if total > size or total - end > limit:
                break
            if remaining < width or buf[start : start + size_of_field] != field:
                # Another topic (a fleet's devices report several readings): read on below.
                return self._fleet_run(topic, base, end, count, largest, width, v5, qos, ids)
            if ids is not None:
                at = start + size_of_field
                if not (buf[at] or buf[at + 1]) or (v5 and buf[at + 2]):
                    break  # packet id 0 (next_packet refuses it), or properties
                ids += buf[at : at + 2]
            if total - end > largest:
                largest = total - end
            end = total
            count += 1
        # A read of this run alone (most reads): the read's own bytes, not a copy (compiled, a slice
        # of the whole is one).
        packets = buf if base == 0 and end == size else buf[base:end]
        return PublishRun(topic, packets, count, largest, width, v5, qos, None, ids), end

    def _fleet_run(
        self,
        topic: str,
        base: int,
        end: int,
        count: int,
        largest: int,
        width: int,
        v5: bool,
        qos: int,
        ids: bytearray | None,
    ) -> tuple[PublishRun, int]:
        """The rest of a run from ``end``, where a packet's topic differs from the run's first
        (``topic``, ``count`` packets so far): each packet's topic read and kept, as long as the
        packet is as plain as the first."""
        buf = self._buf
        size = len(buf)
        limit = self.max_packet_size
        first = buf[base]
        names = self._topics
        if names is None:
            names = self._topics = {}
        topics = [topic] * count
        append = topics.append
        while end + 2 <= size and buf[end] == first:
            byte = buf[end + 1]
            start = end + 2
            if byte < 0x80:
                remaining = byte
            else:
                remaining, start = _long_remaining(buf, end, size)
                if remaining < 0:
                    break
            total = start + remaining
            if total > size or total - end > limit or remaining < 3:
                break  # (no room for a topic: read alone, refused there)
            stop = start + 2 + (buf[start] << 8 | buf[start + 1])
            at = stop + 2 if qos else stop
            if (
                stop == start + 2
                or (at + 1 if v5 else at) > total
                or (v5 and buf[at])
                or (qos and not (buf[stop] or buf[stop + 1]))
            ):
                break  # no topic, properties or packet id 0: read alone, refused there if bad
            name = buf[start + 2 : stop]
            other = names.get(name)
            if other is None:
                try:
                    other = str(name, "utf-8")
                except UnicodeDecodeError:
                    break
                if "\x00" in other:
                    break
                if len(names) >= TOPIC_NAMES:
                    names.clear()
                names[name] = other
            append(other)
            if ids is not None:
                ids += buf[stop : stop + 2]
            if total - end > largest:
                largest = total - end
            end = total
            count += 1
        packets = buf if base == 0 and end == size else buf[base:end]
        return PublishRun(topic, packets, count, largest, width, v5, qos, topics, ids), end

    def _fault(self, exc: ProtocolError) -> ProtocolError:
        self._failed = exc
        return exc


# ------------------------------------------------------------------------------------------------ encode


def _frame(first: int, body: bytes | bytearray) -> bytes:
    size = len(body)
    if size < 128:
        return bytes((first, size)) + body
    return bytes((first,)) + encode_varint(size) + body


def _encode_connect(p: Connect, level: int) -> bytes:
    level = p.protocol_level
    flags = 0
    if p.clean_start:
        flags |= 0x02
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3)
        if will.retain:
            flags |= 0x20
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    body = bytearray(_str(p.protocol_name))
    body.append(level)
    body.append(flags)
    body += _U16.pack(p.keep_alive)
    if level == MQTT_5:
        body += encode_properties(p.properties, PacketType.CONNECT)
    body += _str(p.client_id)
    if will is not None:
        if level == MQTT_5:
            body += encode_properties(will.properties, WILL)
        body += _str(will.topic)
        body += _bin(will.payload)
    if p.username is not None:
        body += _str(p.username)
    if p.password is not None:
        body += _bin(p.password)
    return _frame(0x10, body)


def _encode_connack(p: ConnAck, level: int) -> bytes:
    body = bytes((1 if p.session_present else 0, p.reason_code))
    if level == MQTT_5:
        body += encode_properties(p.properties, PacketType.CONNACK)
    return _frame(0x20, body)


def _encode_publish(p: Publish, level: int) -> bytes:
    first = 0x30 | (p.qos << 1)
    if p.retain:
        first |= 0x01
    if p.dup:
        first |= 0x08
    topic = p.topic.encode("utf-8")
    if len(topic) > 0xFFFF or b"\x00" in topic:
        raise ValueError("topic longer than 65535 bytes or containing U+0000")
    parts = [_U16.pack(len(topic)), topic]
    if p.qos:
        if not p.packet_id:
            raise ValueError("a QoS 1/2 PUBLISH needs a non-zero packet identifier")
        parts.append(_U16.pack(p.packet_id))
    if level == MQTT_5:
        parts.append(encode_properties(p.properties, PacketType.PUBLISH))
    parts.append(p.payload)
    size = sum(map(len, parts))
    header = bytes((first, size)) if size < 128 else bytes((first,)) + encode_varint(size)
    return b"".join((header, *parts))


def encode_plain_publish(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None, level: int
) -> bytes:
    """The bytes `encode` gives for a PUBLISH without properties (most deliveries), built without a
    `Publish` object: one join instead of a packet and a parts list per message."""
    name = topic.encode("utf-8")
    if len(name) > 0xFFFF or b"\x00" in name:
        raise ValueError("topic longer than 65535 bytes or containing U+0000")
    first = 0x30 | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0)
    if qos:
        if not packet_id:
            raise ValueError("a QoS 1/2 PUBLISH needs a non-zero packet identifier")
        variable = _U16.pack(len(name)) + name + _U16.pack(packet_id)
    else:
        variable = _U16.pack(len(name)) + name
    if level == MQTT_5:
        variable += _EMPTY_PROPERTIES
    size = len(variable) + len(payload)
    header = bytes((first, size)) if size < 128 else bytes((first,)) + encode_varint(size)
    return b"".join((header, variable, payload))


def run_packets(run: PublishRun) -> list[tuple[bytes, bytes]]:
    """Each PUBLISH of a run: (its bytes, its payload). Cut at the first call and kept on the run
    for the others (every subscriber that takes it with its own ids); not to be changed."""
    packets = run.packets
    if packets is None:
        packets = run.packets = _cut_packets(run)
    return packets


def _cut_packets(run: PublishRun) -> list[tuple[bytes, bytes]]:
    wire = run.wire
    head = run.head
    # A run that changes topic: each packet's head is its own topic field and what follows it.
    rest = -1 if run.topics is None else (2 if run.qos else 0) + (1 if run.v5 else 0)
    out: list[tuple[bytes, bytes]] = []
    pos = 0
    size = len(wire)
    while pos < size:
        start = pos + 1
        remaining = 0
        shift = 0
        while True:  # the decoder checked the remaining length's form
            byte = wire[start]
            start += 1
            remaining |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        end = start + remaining
        if rest >= 0:
            head = 2 + (wire[start] << 8 | wire[start + 1]) + rest
        out.append((wire[pos:end], wire[start + head : end]))
        pos = end
    return out


def run_stretches(run: PublishRun) -> list[PublishRun]:
    """A run that changes topic (``topics``) as runs of one topic each, in order."""
    topics = run.topics
    if topics is None:
        return [run]
    rest = (2 if run.qos else 0) + (1 if run.v5 else 0)  # the packet id, the empty properties
    out: list[PublishRun] = []
    parts: list[bytes] = []
    largest = 0
    topic = run.topic
    for i, (wire, _) in enumerate(run_packets(run)):
        if topics[i] != topic:
            head = 2 + len(topic.encode("utf-8")) + rest
            out.append(PublishRun(topic, b"".join(parts), len(parts), largest, head, run.v5, run.qos))
            parts = []
            largest = 0
            topic = topics[i]
        parts.append(wire)
        if len(wire) > largest:
            largest = len(wire)
    head = 2 + len(topic.encode("utf-8")) + rest
    out.append(PublishRun(topic, b"".join(parts), len(parts), largest, head, run.v5, run.qos))
    return out


def run_acks(run: PublishRun) -> bytes:
    """The plain PUBACK of each PUBLISH of a QoS 1 run the decoder read, back to back."""
    ids = run.ids
    assert ids is not None, "a QoS 1 run of the decoder's"
    count = len(ids) // 2
    acks = bytearray(b"\x40\x02\x00\x00" * count)
    acks[2::4] = ids[0::2]  # (each a slice assignment in C, not a step of a loop a packet)
    acks[3::4] = ids[1::2]
    return bytes(acks)


def encode_run(run: PublishRun, v5: bool, subscription_ids: tuple[int, ...]) -> tuple[bytes, int]:
    """A run's PUBLISHes as a QoS 0 subscriber of the other protocol family (``v5``), or of a QoS 1
    run, or one at 5.0 with subscription identifiers, gets them: back to back, and the size of the
    largest."""
    props = (
        encode_properties(Properties(subscription_identifiers=list(subscription_ids)), PacketType.PUBLISH)
        if v5
        else b""
    )
    topics = run.topics
    fields: dict[str, bytes] = {}  # each topic's field, made once
    parts: list[bytes] = []
    largest = 0
    for i, (_, payload) in enumerate(run_packets(run)):
        topic = run.topic if topics is None else topics[i]
        field = fields.get(topic)
        if field is None:
            name = topic.encode("utf-8")
            field = fields[topic] = _U16.pack(len(name)) + name + props
        size = len(field) + len(payload)
        header = bytes((0x30, size)) if size < 128 else b"\x30" + encode_varint(size)
        parts.append(header)
        parts.append(field)
        parts.append(payload)
        if len(header) + size > largest:
            largest = len(header) + size
    return b"".join(parts), largest


def around_packet_id(data: bytes) -> tuple[bytes, bytes]:
    """A QoS 1/2 PUBLISH's bytes cut around its packet identifier: what comes before it (fixed
    header, topic) and after it (properties, payload). Any id joined between them makes the same
    packet with that id, so a fan-out encodes once and each subscriber's id is put in."""
    pos = 1
    while data[pos] & 0x80:  # the Remaining Length's continuation bytes
        pos += 1
    pos += 3 + ((data[pos + 1] << 8) | data[pos + 2])  # its last byte, the topic's length, the topic
    return data[:pos], data[pos + 2 :]


def _ack_encoder(first: int, ptype: int) -> Callable[[PubAck | PubRec | PubRel | PubComp, int], bytes]:
    def encode(p: PubAck | PubRec | PubRel | PubComp, level: int) -> bytes:
        pid = _U16.pack(p.packet_id)
        if level != MQTT_5:
            return bytes((first, 2)) + pid
        props = encode_properties(p.properties, ptype)
        if props == _EMPTY_PROPERTIES:
            if p.reason_code == 0:
                return bytes((first, 2)) + pid
            return bytes((first, 3)) + pid + bytes((p.reason_code,))
        return _frame(first, pid + bytes((p.reason_code,)) + props)

    return encode


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    body = bytearray(_U16.pack(p.packet_id))
    if level == MQTT_5:
        body += encode_properties(p.properties, PacketType.SUBSCRIBE)
    for topic_filter, opts in p.subscriptions:
        body += _str(topic_filter)
        byte = opts.qos
        if level == MQTT_5:
            byte |= (
                (0x04 if opts.no_local else 0)
                | (0x08 if opts.retain_as_published else 0)
                | (opts.retain_handling << 4)
            )
        body.append(byte)
    return _frame(0x82, body)


def _encode_suback(p: SubAck, level: int) -> bytes:
    body = bytearray(_U16.pack(p.packet_id))
    if level == MQTT_5:
        body += encode_properties(p.properties, PacketType.SUBACK)
    body += bytes(p.reason_codes)
    return _frame(0x90, body)


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    body = bytearray(_U16.pack(p.packet_id))
    if level == MQTT_5:
        body += encode_properties(p.properties, PacketType.UNSUBSCRIBE)
    for topic_filter in p.topic_filters:
        body += _str(topic_filter)
    return _frame(0xA2, body)


def _encode_unsuback(p: UnsubAck, level: int) -> bytes:
    body = bytearray(_U16.pack(p.packet_id))
    if level == MQTT_5:
        body += encode_properties(p.properties, PacketType.UNSUBACK)
        body += bytes(p.reason_codes)
    return _frame(0xB0, body)


def _encode_pingreq(p: PingReq, level: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(p: PingResp, level: int) -> bytes:
    return PINGRESP_BYTES


def _encode_disconnect(p: Disconnect, level: int) -> bytes:
    if level != MQTT_5:
        return b"\xe0\x00"
    props = encode_properties(p.properties, PacketType.DISCONNECT)
    if props == _EMPTY_PROPERTIES:
        if p.reason_code == 0:
            return b"\xe0\x00"
        return bytes((0xE0, 1, p.reason_code))
    return _frame(0xE0, bytes((p.reason_code,)) + props)


def _encode_auth(p: Auth, level: int) -> bytes:
    if level != MQTT_5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    props = encode_properties(p.properties, PacketType.AUTH)
    if props == _EMPTY_PROPERTIES and p.reason_code == 0:
        return b"\xf0\x00"
    return _frame(0xF0, bytes((p.reason_code,)) + props)


_ENCODERS: Final[dict[type, Callable[..., bytes]]] = {
    Connect: _encode_connect,
    ConnAck: _encode_connack,
    Publish: _encode_publish,
    PubAck: _ack_encoder(0x40, PacketType.PUBACK),
    PubRec: _ack_encoder(0x50, PacketType.PUBREC),
    PubRel: _ack_encoder(0x62, PacketType.PUBREL),
    PubComp: _ack_encoder(0x70, PacketType.PUBCOMP),
    Subscribe: _encode_subscribe,
    SubAck: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    UnsubAck: _encode_unsuback,
    PingReq: _encode_pingreq,
    PingResp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode `packet` for `protocol_level` (3, 4 or 5). A CONNECT is encoded for its own level.

    Properties are dropped below level 5, as are reason codes that level cannot carry. Raises
    ValueError for a packet that cannot be encoded (string too long, missing packet identifier...).
    """
    return _ENCODERS[type(packet)](packet, protocol_level)
