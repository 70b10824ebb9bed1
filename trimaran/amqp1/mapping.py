"""Between AMQP 1.0 messages and the broker's protocol-neutral Message (DESIGN.md's cross-protocol table).

=====================================  ==========================================
AMQP 1.0                               broker Message
=====================================  ==========================================
body: data sections                    payload (joined)
body: amqp-value string / binary       payload (UTF-8, payload_format 1 / bytes)
body: anything else                    payload = the encoded body sections
properties.content-type                content_type
properties.correlation-id              correlation_data (UTF-8 of a string id)
properties.reply-to                    response_topic (``topic://a/b`` -> ``a/b``,
                                       ``queue://q`` -> ``$queue/q``)
application-properties                 user_properties (values as text)
header.ttl / absolute-expiry-time      expires_at_ms (the earlier of the two)
unsettled / pre-settled transfer       qos 1 / qos 0
=====================================  ==========================================

:func:`from_wire` maps a transfer payload without decoding what the table does not read (the
message id, the body of a structured amqp-value ...), stepping over it by its size; what it does
not expect it leaves to :func:`from_amqp1` over a decoded message, which maps the same way.

A message that came from an AMQP 1.0 peer keeps its header, message annotations, bare message and
footer as bytes in ``extra["amqp1"]``, so another AMQP 1.0 peer gets it byte for byte (only the
header's delivery-count changes on a redelivery). Delivery annotations are per hop and dropped.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from trimaran.amqp1.addresses import QUEUE_SCHEME, TOPIC_SCHEME
from trimaran.amqp1.codec import decode_value, value_end
from trimaran.amqp1.messages import AmqpValue, Data, Header, Properties, encode_message, split_header
from trimaran.amqp1.messages import Message as A1Message
from trimaran.amqp1.types import DecodeError, Timestamp
from trimaran.broker.mapping import property_text
from trimaran.broker.message import PROTOCOL_AMQP1, Message, now_ms
from trimaran.queue.policy import QUEUE_PREFIX

EXTRA_KEY: Final = "amqp1"


def address_to_topic(address: str) -> str:
    """An AMQP 1.0 address as the router / queue topic other protocols use (for reply-to)."""
    if address.startswith(TOPIC_SCHEME):
        return address[len(TOPIC_SCHEME) :]
    if address.startswith(QUEUE_SCHEME):
        return QUEUE_PREFIX + address[len(QUEUE_SCHEME) :]
    return address


def topic_to_address(topic: str) -> str:
    """The inverse of :func:`address_to_topic` for addresses we hand to AMQP 1.0 peers."""
    if topic.startswith(QUEUE_PREFIX):
        return topic
    return TOPIC_SCHEME + topic


def _payload(msg: A1Message) -> tuple[bytes, int | None]:
    body = msg.body
    if not body:
        return b"", None
    if len(body) == 1 and body[0].__class__ is Data:
        return body[0].value, None
    data = msg.data
    if data is not None:
        return data, None
    if len(body) == 1 and isinstance(body[0], AmqpValue):
        value = body[0].value
        if isinstance(value, str):
            return value.encode("utf-8", "surrogatepass"), 1
        if isinstance(value, bytes):
            return value, None
        if value is None:
            return b"", None
    return encode_message(A1Message(body=list(body))), None


def _correlation_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, uuid.UUID):
        return str(value).encode()
    return str(value).encode("utf-8", "surrogatepass")


def from_amqp1(
    msg: A1Message,
    topic: str,
    publisher_id: str | None,
    *,
    settled: bool,
    now: int | None = None,
    raw: bytes | None = None,
) -> Message:
    """The broker message for an AMQP 1.0 message sent to ``topic`` (a router topic or ``$queue/q``).
    ``raw``: the transfer payload ``msg`` was decoded from, kept as is when nothing is dropped."""
    now = now_ms() if now is None else now
    payload, payload_format = _payload(msg)
    props = msg.properties
    expires: int | None = None
    header = msg.header
    if header is not None and header.ttl:
        expires = now + int(header.ttl)
    content_type = correlation = reply_to = None
    if props is not None:
        if props.absolute_expiry_time:
            at = int(props.absolute_expiry_time)
            expires = at if expires is None else min(expires, at)
        content_type = None if props.content_type is None else str(props.content_type)
        correlation = _correlation_bytes(props.correlation_id)
        if props.reply_to is not None:
            reply_to = address_to_topic(property_text(props.reply_to))
    app = msg.application_properties
    user_properties = (
        [(property_text(k), property_text(v)) for k, v in app.items() if v is not None] if app else []
    )
    if raw is not None and msg.delivery_annotations is None:
        wire = bytes(raw)  # nothing to drop: forward the transfer payload as it came
    else:
        kept = A1Message(
            header=msg.header,
            message_annotations=msg.message_annotations,
            properties=msg.properties,
            application_properties=msg.application_properties,
            body=msg.body,
            footer=msg.footer,
            bare=msg.bare,
        )
        wire = encode_message(kept)
    return Message(
        topic=topic,
        payload=payload,
        qos=0 if settled else 1,
        content_type=content_type,
        correlation_data=correlation,
        response_topic=reply_to,
        payload_format=payload_format,
        expires_at_ms=expires,
        user_properties=user_properties,
        publisher_id=publisher_id,
        protocol=PROTOCOL_AMQP1,
        created_at_ms=now,
        extra={EXTRA_KEY: wire},
    )


def _list_start(buf: bytes, pos: int) -> tuple[int, int, int]:
    """A list at ``pos``: its count, where its first item starts and where it ends."""
    c = buf[pos]
    if c == 0xC0:
        return buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    if c == 0xD0:
        size = (buf[pos + 1] << 24) | (buf[pos + 2] << 16) | (buf[pos + 3] << 8) | buf[pos + 4]
        count = (buf[pos + 5] << 24) | (buf[pos + 6] << 16) | (buf[pos + 7] << 8) | buf[pos + 8]
        return count, pos + 9, pos + 5 + size
    if c == 0x45:
        return 0, pos + 1, pos + 1
    raise DecodeError("section is not a list")


def from_wire(
    raw: bytes, topic: str, publisher_id: str | None, *, settled: bool, now: int | None = None
) -> Message | None:
    """:func:`from_amqp1` straight from a transfer payload, decoding only what the broker reads
    (the header's ttl; to, reply-to, correlation-id, content-type and absolute-expiry-time of the
    properties; the application-properties; a body that is data, a string or binary) and
    stepping over the rest by its size. The message is kept as it came, as ``raw``. None when it
    is not that simple (delivery annotations to drop, a descriptor spelled long, sections out of
    order, a field of an unexpected type, bytes that do not add up): then
    :func:`~trimaran.amqp1.messages.decode_message` and :func:`from_amqp1` decide, and say what
    is wrong."""
    try:
        n = len(raw)
        pos = 0
        last = 0
        ttl: int | None = None
        reply_to: Any = None
        correlation: Any = None
        content_type: Any = None
        absolute_expiry: Any = None
        app: Any = None
        data: bytes | None = None  # the first data section; parts from the second on
        parts: list[bytes] | None = None
        payload = b""
        payload_format: int | None = None
        body_start = -1
        while pos < n:
            if raw[pos] != 0x00 or raw[pos + 1] != 0x53:
                return None
            code = raw[pos + 2]
            if code < last or (code == last and code != 0x75 and code != 0x76):
                return None
            if 0x75 <= last <= 0x77 and 0x75 <= code <= 0x77 and code != last:
                return None  # body kinds mixed
            last = code
            p = pos + 3
            if code == 0x75:  # data
                c = raw[p]
                if c == 0xA0:
                    first = p + 2
                    pos = first + raw[p + 1]
                elif c == 0xB0:
                    first = p + 5
                    pos = first + ((raw[p + 1] << 24) | (raw[p + 2] << 16) | (raw[p + 3] << 8) | raw[p + 4])
                else:
                    return None
                if pos > n:
                    return None
                if data is None:
                    data = raw[first:pos]
                elif parts is None:
                    parts = [data, raw[first:pos]]
                else:
                    parts.append(raw[first:pos])
                continue
            if code == 0x70:  # header: its ttl only
                if raw[p] == 0x45:  # empty (proton's default header)
                    pos = p + 1
                    continue
                if raw[p] == 0xC0:  # list8, the usual: read in place
                    count = raw[p + 2]
                    pos = p + 2 + raw[p + 1]
                    p += 3
                else:
                    count, p, pos = _list_start(raw, p)
                for i in range(count if count < 3 else 3):
                    c = raw[p]
                    if i == 2:
                        if c == 0x70:
                            ttl = (raw[p + 1] << 24) | (raw[p + 2] << 16) | (raw[p + 3] << 8) | raw[p + 4]
                        elif c == 0x52:
                            ttl = raw[p + 1]
                        elif c != 0x43 and c != 0x40:
                            return None
                    elif c == 0x56 or c == 0x50:  # durable as a boolean byte, priority as a ubyte
                        p += 2
                        continue
                    elif c != 0x40 and c != 0x41 and c != 0x42:
                        p = value_end(raw, p)
                        continue
                    p += 1
            elif code == 0x73:  # properties: what the broker maps
                if raw[p] == 0xC0:  # list8, the usual: read in place
                    count = raw[p + 2]
                    pos = p + 2 + raw[p + 1]
                    p += 3
                else:
                    count, p, pos = _list_start(raw, p)
                for i in range(count if count < 9 else 9):
                    c = raw[p]
                    if c == 0x40:
                        p += 1
                        continue
                    if c == 0x00 and (i == 4 or i == 5):
                        return None  # a described id: the composite decoder knows what it is
                    if i == 4:
                        reply_to, p = decode_value(raw, p)
                    elif i == 5:
                        correlation, p = decode_value(raw, p)
                    elif i == 6:
                        if c != 0xA3 and c != 0xB3:
                            return None
                        content_type, p = decode_value(raw, p)
                    elif i == 8:
                        if c != 0x83:
                            return None
                        absolute_expiry, p = decode_value(raw, p)
                    elif c == 0x53:  # proton's message-id, a ulong, stepped over in place
                        p += 2
                    elif c == 0x80:
                        p += 9
                    else:
                        p = value_end(raw, p)
            elif code == 0x74:  # application-properties
                app, pos = decode_value(raw, p)
                if app.__class__ is not dict:
                    return None
            elif code == 0x77:  # amqp-value: a string or binary is the payload, the rest as encoded
                body_start = pos
                c = raw[p]
                if c == 0xC1:  # a map (proton's usual body), stepped over in place
                    pos = p + 2 + raw[p + 1]
                elif c == 0xD1:
                    pos = p + 5 + ((raw[p + 1] << 24) | (raw[p + 2] << 16) | (raw[p + 3] << 8) | raw[p + 4])
                else:
                    pos = value_end(raw, p)
                if c == 0xA1 or c == 0xB1:
                    payload = raw[p + (2 if c == 0xA1 else 5) : pos]
                    payload.decode("utf-8")  # as the codec would: a string must be UTF-8
                    payload_format = 1
                elif c == 0xA0:
                    payload = raw[p + 2 : pos]
                elif c == 0xB0:
                    payload = raw[p + 5 : pos]
                elif c != 0x40:
                    payload = raw[body_start:pos]
            elif code == 0x76:  # amqp-sequence: the body as encoded
                if body_start < 0:
                    body_start = pos
                pos = value_end(raw, p)
                payload = raw[body_start:pos]
            elif code == 0x72 or code == 0x78:  # message annotations, footer: kept in the bytes
                pos = value_end(raw, p)
            else:
                return None  # delivery annotations (dropped: decode_message) or not a section
        if pos != n:
            return None
    except (DecodeError, IndexError, UnicodeDecodeError):
        return None
    if parts is not None:
        payload = b"".join(parts)
    elif data is not None:
        payload = data
    now = now_ms() if now is None else now
    expires = now + ttl if ttl else None
    if absolute_expiry:
        at = int(absolute_expiry)
        expires = at if expires is None else min(expires, at)
    return Message(
        topic=topic,
        payload=payload,
        qos=0 if settled else 1,
        content_type=None if content_type is None else str(content_type),
        correlation_data=None if correlation is None else _correlation_bytes(correlation),
        response_topic=None if reply_to is None else address_to_topic(property_text(reply_to)),
        payload_format=payload_format,
        expires_at_ms=expires,
        user_properties=[(property_text(k), property_text(v)) for k, v in app.items() if v is not None]
        if app
        else [],
        publisher_id=publisher_id,
        protocol=PROTOCOL_AMQP1,
        created_at_ms=now,
        extra={EXTRA_KEY: raw},
    )


def _correlation_id(data: bytes) -> Any:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def to_amqp1(message: Message, *, delivery_count: int = 0, now: int | None = None, cut: int = 0) -> bytes:
    """The transfer payload for ``message``; ``delivery_count`` > 0 marks a redelivery; ``cut``: the
    length of the vhost prefix its ``to`` loses (trimaran/vhosts.py)."""
    kept = message.extra.get(EXTRA_KEY) if message.extra else None
    if isinstance(kept, bytes):
        if not delivery_count:
            return kept
        # Only the header changes: decode it alone and keep the bytes after it as they are.
        old, rest = split_header(kept)
        old = old or Header()
        again = Header(
            durable=old.durable,
            priority=old.priority,
            ttl=old.ttl,
            first_acquirer=False,
            delivery_count=delivery_count,
        )
        return encode_message(A1Message(header=again)) + memoryview(kept)[rest:]
    now = now_ms() if now is None else now
    ttl = None
    if message.expires_at_ms is not None:
        ttl = max(1, message.expires_at_ms - now)
    header: Header | None = None
    if ttl is not None or message.qos or delivery_count:
        header = Header(durable=message.qos > 0, ttl=ttl, delivery_count=delivery_count)
    props = Properties(
        to=topic_to_address(message.topic[cut:]),
        content_type=message.content_type,
        correlation_id=None
        if message.correlation_data is None
        else _correlation_id(message.correlation_data),
        reply_to=None if message.response_topic is None else topic_to_address(message.response_topic),
        creation_time=Timestamp(message.created_at_ms) if message.created_at_ms else None,
    )
    app: dict[Any, Any] | None = None
    if message.user_properties:
        app = dict(message.user_properties)  # a repeated name keeps its last value
    msg = A1Message(header=header, properties=props, application_properties=app, body=[Data(message.payload)])
    return encode_message(msg)


__all__ = [
    "EXTRA_KEY",
    "address_to_topic",
    "from_amqp1",
    "from_wire",
    "to_amqp1",
    "topic_to_address",
]
