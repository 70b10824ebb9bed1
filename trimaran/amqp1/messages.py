"""AMQP 1.0 message format (part 3 "messaging", section 3.2).

A message is a sequence of sections: header, delivery-annotations, message-annotations,
properties, application-properties, the body (one or more ``data``, one or more
``amqp-sequence``, or one ``amqp-value``) and footer. The first five and the footer are
optional. The *bare message* (properties, application-properties, body) is immutable in
transit, so :func:`decode_message` keeps its exact bytes in ``Message.bare`` and
:func:`encode_message` re-uses them: a message received from one AMQP 1.0 peer can be
forwarded to another byte-for-byte identical while the broker edits only the header or
annotations. Whoever edits a bare section must set ``bare`` to ``None``.

The list sections (header, properties) are composites of :mod:`.performatives`; the other
sections are declared in ``_SECTION_TABLE`` below.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .codec import decode_value, encode_into
from .performatives import Composite, composite, decode_composite, from_described
from .types import DecodeError, Described, EncodeError, ULong

__all__ = [
    "AmqpSequence",
    "AmqpValue",
    "Data",
    "Header",
    "Message",
    "Properties",
    "decode_message",
    "encode_message",
    "split_header",
]

MESSAGE_FORMAT = 0


@dataclasses.dataclass(kw_only=True, slots=True)
class Header(Composite):
    durable: bool = False
    priority: int = 4
    ttl: int | None = None
    first_acquirer: bool = False
    delivery_count: int = 0


composite(
    Header,
    0x70,
    "amqp:header:list",
    ("section",),
    {
        "durable": "boolean",
        "priority": "ubyte",
        "ttl": "uint",
        "first_acquirer": "boolean",
        "delivery_count": "uint",
    },
)


@dataclasses.dataclass(kw_only=True, slots=True)
class Properties(Composite):
    message_id: Any = None
    user_id: bytes | None = None
    to: Any = None
    subject: str | None = None
    reply_to: Any = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    absolute_expiry_time: int | None = None
    creation_time: int | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None


composite(
    Properties,
    0x73,
    "amqp:properties:list",
    ("section",),
    {
        "message_id": "*",
        "user_id": "binary",
        "to": "*",
        "subject": "string",
        "reply_to": "*",
        "correlation_id": "*",
        "content_type": "symbol",
        "content_encoding": "symbol",
        "absolute_expiry_time": "timestamp",
        "creation_time": "timestamp",
        "group_id": "string",
        "group_sequence": "uint",
        "reply_to_group_id": "string",
    },
)


@dataclasses.dataclass(frozen=True, slots=True)
class Data:
    """A ``data`` body section: opaque binary."""

    value: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class AmqpSequence:
    """An ``amqp-sequence`` body section: a list of AMQP values."""

    value: list[Any]


@dataclasses.dataclass(frozen=True, slots=True)
class AmqpValue:
    """An ``amqp-value`` body section: any single AMQP value."""

    value: Any


BodySection = Data | AmqpSequence | AmqpValue

# code -> (descriptor symbol, Message attribute or body class, python type of the value or None)
_SECTION_TABLE: dict[int, tuple[str, str | type, type | None]] = {
    0x70: ("amqp:header:list", "header", None),
    0x71: ("amqp:delivery-annotations:map", "delivery_annotations", dict),
    0x72: ("amqp:message-annotations:map", "message_annotations", dict),
    0x73: ("amqp:properties:list", "properties", None),
    0x74: ("amqp:application-properties:map", "application_properties", dict),
    0x75: ("amqp:data:binary", Data, bytes),
    0x76: ("amqp:amqp-sequence:list", AmqpSequence, list),
    0x77: ("amqp:amqp-value:*", AmqpValue, None),
    0x78: ("amqp:footer:map", "footer", dict),
}
_SECTION_BY_NAME = {name: code for code, (name, _, _) in _SECTION_TABLE.items()}
_BODY_CODE = {cls: code for code, (_, cls, _) in _SECTION_TABLE.items() if isinstance(cls, type)}
_BARE_FIRST = 0x73


@dataclasses.dataclass(slots=True)
class Message:
    header: Header | None = None
    delivery_annotations: dict[Any, Any] | None = None
    message_annotations: dict[Any, Any] | None = None
    properties: Properties | None = None
    application_properties: dict[Any, Any] | None = None
    body: list[BodySection] = dataclasses.field(default_factory=list)
    footer: dict[Any, Any] | None = None
    # Exact bytes of the bare message as received (see the module docstring).
    bare: bytes | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_value(cls, value: Any, **kw: Any) -> Message:
        """A message whose body is one ``amqp-value`` section."""
        return cls(body=[AmqpValue(value)], **kw)

    @property
    def data(self) -> bytes | None:
        """All ``data`` sections joined, or ``None`` when the body is not binary."""
        parts = [s.value for s in self.body if isinstance(s, Data)]
        if self.body and len(parts) == len(self.body):
            return b"".join(parts)
        return None


def _encode_bare(msg: Message, out: bytearray) -> None:
    if msg.properties is not None:
        encode_into(out, msg.properties)
    if msg.application_properties is not None:
        encode_into(out, Described(ULong(0x74), msg.application_properties))
    for section in msg.body:
        code = _BODY_CODE.get(type(section))
        if code is None:
            raise EncodeError(f"not a body section: {section!r}")
        encode_into(out, Described(ULong(code), section.value))


def encode_message(msg: Message) -> bytes:
    """The wire form of ``msg`` (the payload of its transfer frames)."""
    out = bytearray()
    if msg.header is not None:
        encode_into(out, msg.header)
    if msg.delivery_annotations is not None:
        encode_into(out, Described(ULong(0x71), msg.delivery_annotations))
    if msg.message_annotations is not None:
        encode_into(out, Described(ULong(0x72), msg.message_annotations))
    if msg.bare is not None:
        out += msg.bare
    else:
        _encode_bare(msg, out)
    if msg.footer is not None:
        encode_into(out, Described(ULong(0x78), msg.footer))
    return bytes(out)


def _section_code(descriptor: Any) -> int:
    if isinstance(descriptor, str):
        code = _SECTION_BY_NAME.get(descriptor)
    elif isinstance(descriptor, int) and not isinstance(descriptor, bool):
        code = int(descriptor) if int(descriptor) in _SECTION_TABLE else None
    else:
        code = None
    if code is None:
        raise DecodeError(f"not a message section: {descriptor!r}")
    return code


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """Parse a message payload into its sections; raises ``DecodeError`` if malformed."""
    buf: bytes | memoryview = data if data.__class__ is bytes else memoryview(data)
    msg = Message()
    pos = 0
    last_code = 0
    bare_start = -1
    bare_end = -1
    end = len(buf)
    while pos < end:
        start = pos
        if buf[pos] == 0x00 and pos + 4 < end and buf[pos + 1] == 0x53 and buf[pos + 2] == 0x75:
            # A data section whose descriptor is the small code (nearly every message's body):
            # its bytes are sliced out rather than decoded as a described value.
            c = buf[pos + 3]
            if c == 0xA0:
                first = pos + 5
                pos = first + buf[pos + 4]
            elif c == 0xB0 and pos + 8 <= end:
                first = pos + 8
                pos = first + (
                    (buf[pos + 4] << 24) | (buf[pos + 5] << 16) | (buf[pos + 6] << 8) | buf[pos + 7]
                )
            else:
                raise DecodeError("section amqp:data:binary has a value of the wrong type")
            if pos > end:
                raise DecodeError("truncated value")
            if last_code > 0x75:
                raise DecodeError("message sections out of order or repeated")
            last_code = 0x75
            if bare_start < 0:
                bare_start = start
            bare_end = pos
            value = buf[first:pos]
            msg.body.append(Data(value if value.__class__ is bytes else bytes(value)))
            continue
        v, pos = decode_value(buf, pos)
        if not isinstance(v, Described):
            raise DecodeError("message section is not a described value")
        code = _section_code(v.descriptor)
        _, target, vtype = _SECTION_TABLE[code]
        if code < last_code or (code == last_code and code not in (0x75, 0x76)):
            raise DecodeError("message sections out of order or repeated")
        if 0x75 <= last_code <= 0x77 and 0x75 <= code <= 0x77 and code != last_code:
            raise DecodeError("message body mixes section kinds")
        last_code = code
        if vtype is not None and not isinstance(v.value, vtype):
            raise DecodeError(f"section {_SECTION_TABLE[code][0]} has a value of the wrong type")
        if _BARE_FIRST <= code <= 0x77:
            if bare_start < 0:
                bare_start = start
            bare_end = pos
        if isinstance(target, str):
            if vtype is None:
                setattr(msg, target, from_described(v))
            else:
                setattr(msg, target, v.value)
        else:
            msg.body.append(target(v.value))
    if bare_start >= 0:
        bare = buf if bare_start == 0 and bare_end == end else buf[bare_start:bare_end]
        msg.bare = bare if bare.__class__ is bytes else bytes(bare)
    return msg


def split_header(data: bytes | bytearray | memoryview) -> tuple[Header | None, int]:
    """The header section a message payload starts with (``None`` without one) and the position
    just after it; the sections that follow are not decoded (see :func:`decode_message`)."""
    buf = memoryview(data)
    if not buf:
        return None, 0
    if buf[0] != 0x00:
        raise DecodeError("message section is not a described value")
    descriptor, _ = decode_value(buf, 1)
    if _section_code(descriptor) != 0x70:
        return None, 0
    header, end = decode_composite(buf, 0)
    assert isinstance(header, Header)
    return header, end
