"""The basic class's content properties and the content-header payload.

A content header payload is: class-id (short), weight (short, always 0), body size (longlong),
then one or more 16-bit property-flag words and the present properties in declaration order. Bit 15
of the first word flags the first property, bit 14 the second and so on; bit 0 of every word says
another flag word follows. Basic has 14 properties, so one word suffices when we encode; when we
decode we accept continuation words as long as they flag nothing (nothing exists to flag).

``None`` means "absent". String types follow :mod:`trimaran.amqp091.spec`: shortstr is ``str``
(UTF-8 with ``surrogateescape``), the timestamp is an ``int`` of seconds, headers a field table.
"""

import struct
from dataclasses import dataclass, fields
from typing import Any

from trimaran.amqp091.fields import FieldTable, decode_table, encode_table
from trimaran.amqp091.spec import FRAME_ERROR, SYNTAX_ERROR, ProtocolError

_H = struct.Struct(">H")
_Q = struct.Struct(">Q")
_HEADER = struct.Struct(">HHQ")

BASIC_CLASS_ID = 60


@dataclass(slots=True)
class BasicProperties:
    content_type: str | None = None
    content_encoding: str | None = None
    headers: FieldTable | None = None
    delivery_mode: int | None = None  # 1 transient, 2 persistent
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None  # milliseconds, as a decimal string
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None  # reserved, RabbitMQ ignores it


#: (attribute, domain, flag bit) in wire order; the domain drives encoding and decoding.
PROPERTY_TABLE: tuple[tuple[str, str, int], ...] = tuple(
    (f.name, dom, 1 << (15 - i))
    for i, (f, dom) in enumerate(
        zip(
            fields(BasicProperties),
            (
                "shortstr",
                "shortstr",
                "table",
                "octet",
                "octet",
                "shortstr",
                "shortstr",
                "shortstr",
                "shortstr",
                "timestamp",
                "shortstr",
                "shortstr",
                "shortstr",
                "shortstr",
            ),
            strict=True,
        )
    )
)
_KNOWN_FLAGS = sum(bit for _a, _d, bit in PROPERTY_TABLE)
_COUNT = len(PROPERTY_TABLE)


def _present(byte: int, first: int, count: int) -> tuple[tuple[int, str], ...]:
    """(index, domain) of the properties flagged in ``byte``, whose bit 7 flags property ``first``."""
    return tuple((first + j, PROPERTY_TABLE[first + j][1]) for j in range(count) if byte & (1 << (7 - j)))


# Flags bits 15..8 are properties 0..7; bits 7..2 properties 8..13 (looked up as (flags >> 2) & 63).
_PRESENT_HIGH = tuple(_present(b, 0, 8) for b in range(256))
_PRESENT_LOW = tuple(_present(b << 2, 8, 6) for b in range(64))
_EMPTY_HEADER_TAIL = b"\x00\x00"


class _Truncated(Exception):
    pass


def encode_properties(props: BasicProperties | None, out: bytearray) -> None:
    """Append the flag word and the present properties to ``out``."""
    if props is None:
        out += _EMPTY_HEADER_TAIL
        return
    flag_pos = len(out)
    out += _EMPTY_HEADER_TAIL
    flags = 0
    for attr, dom, bit in PROPERTY_TABLE:
        value = getattr(props, attr)
        if value is None:
            continue
        flags |= bit
        if dom == "shortstr":
            s = value.encode("utf-8", "surrogateescape")
            out.append(len(s))
            out += s
        elif dom == "octet":
            out.append(value)
        elif dom == "timestamp":
            out += _Q.pack(value)
        else:
            encode_table(value, out)
    _H.pack_into(out, flag_pos, flags)


def decode_properties(buf: bytes, off: int) -> tuple[BasicProperties, int]:
    """Decode flag word(s) and properties at ``buf[off:]``; raise ``ProtocolError`` (502) if bad."""
    try:
        (flags,) = _H.unpack_from(buf, off)
        off += 2
        more = flags & 1
        while more:
            (extra,) = _H.unpack_from(buf, off)
            off += 2
            if extra & 0xFFFE:
                raise ProtocolError(SYNTAX_ERROR, "content header flags unknown properties")
            more = extra & 1
        if flags & ~_KNOWN_FLAGS & 0xFFFE:
            raise ProtocolError(SYNTAX_ERROR, "content header flags unknown properties")
        if not flags & 0xFFFE:
            return BasicProperties(), off
        values: list[Any] = [None] * _COUNT
        # Visit only the flagged properties (usually two or three of the fourteen).
        for i, dom in _PRESENT_HIGH[flags >> 8] + _PRESENT_LOW[(flags >> 2) & 0x3F]:
            value: Any
            if dom == "shortstr":
                n = buf[off]
                off += 1
                value = buf[off : off + n].decode("utf-8", "surrogateescape")
                off += n
                if off > len(buf):
                    raise _Truncated
            elif dom == "octet":
                value = buf[off]
                off += 1
            elif dom == "timestamp":
                value = _Q.unpack_from(buf, off)[0]
                off += 8
            else:
                value, off = decode_table(buf, off)
            values[i] = value
    except (_Truncated, IndexError, struct.error):
        raise ProtocolError(SYNTAX_ERROR, "content header properties truncated") from None
    return BasicProperties(*values), off


def decode_header_payload(payload: bytes) -> tuple[int, int, BasicProperties]:
    """Return ``(class_id, body_size, properties)`` of a whole content-header payload."""
    if len(payload) < 14:
        raise ProtocolError(FRAME_ERROR, "content header frame too short")
    class_id, _weight, body_size = _HEADER.unpack_from(payload, 0)
    props, off = decode_properties(payload, 12)
    if off != len(payload):
        raise ProtocolError(SYNTAX_ERROR, "bytes after the content header properties")
    return class_id, body_size, props
