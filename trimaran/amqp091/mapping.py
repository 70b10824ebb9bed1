"""basic properties <-> the broker's protocol-neutral Message (DESIGN.md, "Cross-protocol model").

==================  =====================================================================
AMQP 0.9.1          Message
==================  =====================================================================
content_type        ``content_type``
correlation_id      ``correlation_data`` (UTF-8 bytes)
reply_to            ``response_topic``
headers             ``user_properties`` (values as text); a table with typed values is also
                    kept as published, in ``extra["header_table"]`` (its wire bytes), so that an
                    AMQP consumer gets every value back with its type tag, and as JSON in
                    ``extra["headers"]`` for the management API
x-death             from ``extra["deaths"]`` and ``extra["first_death"]``, which the queue
                    manager records for every dead letter (whatever protocol published it)
expiration (ms)     ``expires_at_ms`` (absolute) and ``extra["expiration"]``: delivered as the
                    publisher's string (a consumer that republishes keeps the TTL); the time
                    left for messages from other protocols
delivery_mode       ``qos`` (2 persistent -> 1, else 0) and ``extra["delivery_mode"]``; unset
                    stays unset (for messages from other protocols: 2 for QoS >= 1, else 1)
priority, message_id, timestamp, type, app_id, user_id, content_encoding
                    ``extra`` under the same names (other protocols ignore them)
exchange, key       ``extra["exchange"]``, ``extra["routing_key"]`` (for basic.deliver)
==================  =====================================================================
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

from trimaran.amqp091.fields import FieldTable, FieldValue, Int64, Timestamp, decode_table, table_bytes
from trimaran.amqp091.properties import BasicProperties
from trimaran.broker.mapping import property_text
from trimaran.broker.message import PROTOCOL_AMQP091, Message, now_ms
from trimaran.queue.policy import QUEUE_PREFIX, parse_queue_topic
from trimaran.topics import topic_to_routing_key
from trimaran.vhosts import TENANT, split_key

#: basic properties carried in ``Message.extra`` under their own names.
EXTRA_PROPERTIES = ("priority", "message_id", "timestamp", "type", "app_id", "user_id", "content_encoding")


class MappingError(ValueError):
    """A property that cannot be taken (e.g. an expiration that is not a number of milliseconds)."""


def _json_safe(value: Any) -> Any:
    """A field value as JSON-able data (the queue tables store ``extra`` as JSON)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, bool | str | bytes | None):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def parse_expiration(expiration: str) -> int:
    """RabbitMQ's rule: a non-negative integer of milliseconds, as a decimal string."""
    if not expiration.isdigit():
        raise MappingError(f"invalid expiration value {expiration!r}")
    return int(expiration)


def message_from_content(
    props: BasicProperties,
    body: bytes,
    topic: str,
    *,
    exchange: str,
    routing_key: str,
    publisher_id: str | None,
    now: int | None = None,
) -> Message:
    now = now_ms() if now is None else now
    qos, content_type, correlation, reply_to, expires, user_properties, extra = _content_form(
        props, exchange, routing_key, now
    )
    return Message(
        topic, body, qos, False, content_type, correlation, reply_to, None, expires, user_properties,
        publisher_id, PROTOCOL_AMQP091, now, extra,
    )  # fmt: skip


def messages_from_run(
    contents: list[tuple[BasicProperties, bytes, bytes]],
    topic: str,
    *,
    exchange: str,
    routing_key: str,
    publisher_id: str | None,
    now: int,
) -> list[Message]:
    """:func:`message_from_content` of each of a run's contents (properties, body, the properties'
    bytes, kept on the message), the fields the properties give worked out once for each
    properties object in a row (a publisher's run shares one: the decoder keeps them)."""
    out: list[Message] = []
    last = None
    for props, body, encoded in contents:
        if props is not last:
            last = props
            qos, content_type, correlation, reply_to, expires, user_properties, extra = _content_form(
                props, exchange, routing_key, now
            )
            kept_properties, kept_extra = user_properties, extra
        else:  # each message its own list and dict
            user_properties = list(kept_properties) if kept_properties else []
            extra = dict(kept_extra)
        message = Message(
            topic, body, qos, False, content_type, correlation, reply_to, None, expires, user_properties,
            publisher_id, PROTOCOL_AMQP091, now, extra,
        )  # fmt: skip
        message.encoded_properties = encoded
        out.append(message)
    return out


def _content_form(
    props: BasicProperties, exchange: str, routing_key: str, now: int
) -> tuple[int, str | None, bytes | None, str | None, int | None, list[tuple[str, str]], dict[str, object]]:
    """What a message takes from a publish's properties: (qos, content type, correlation data,
    reply to, expiry, user properties, extra)."""
    extra: dict[str, object] = {"exchange": exchange, "routing_key": routing_key}
    user_properties: list[tuple[str, str]] = []
    headers = props.headers
    if headers:
        user_properties = [(k, property_text(v)) for k, v in headers.items()]
        if any(not isinstance(v, str) for v in headers.values()):
            extra["headers"] = _json_safe(headers)
            extra["header_table"] = table_bytes(headers)
    # EXTRA_PROPERTIES, each read by name rather than through getattr in a loop (once a message).
    if props.priority is not None:
        extra["priority"] = props.priority
    if props.message_id is not None:
        extra["message_id"] = props.message_id
    if props.timestamp is not None:
        extra["timestamp"] = props.timestamp
    if props.type is not None:
        extra["type"] = props.type
    if props.app_id is not None:
        extra["app_id"] = props.app_id
    if props.user_id is not None:
        extra["user_id"] = props.user_id
    if props.content_encoding is not None:
        extra["content_encoding"] = props.content_encoding
    if props.delivery_mode is not None:
        extra["delivery_mode"] = props.delivery_mode
    expires = None
    if props.expiration is not None:
        expires = now + parse_expiration(props.expiration)
        extra["expiration"] = props.expiration
    correlation = props.correlation_id
    data = None if correlation is None else correlation.encode("utf-8", "surrogateescape")
    qos = 1 if props.delivery_mode == 2 else 0
    return qos, props.content_type, data, props.reply_to, expires, user_properties, extra


def message_headers(message: Message) -> FieldTable | None:
    """The table an AMQP 0.9.1 publisher sent, every value with its own type, else the user
    properties as text (without x-death: see :func:`_headers`)."""
    if message.protocol == PROTOCOL_AMQP091:
        extra = message.extra
        raw = extra.get("header_table")
        if isinstance(raw, bytes):
            return decode_table(raw, 0)[0]
        typed = extra.get("headers")
        if isinstance(typed, dict):  # stored before header_table was kept
            return typed
    if message.user_properties:
        return dict(message.user_properties)
    return None


def _headers(message: Message) -> FieldTable | None:
    headers = message_headers(message)
    deaths = message.extra.get("deaths")
    if isinstance(deaths, list) and deaths:
        headers = dict(headers or {})
        _add_deaths(headers, deaths, message.extra.get("first_death"))
    return headers


def _add_deaths(headers: FieldTable, deaths: list[Any], first: object) -> None:
    """RabbitMQ's x-death (newest first, one table per queue and reason) and x-first-death-*."""
    table: list[FieldValue] = []
    for death in deaths:
        if not isinstance(death, dict):
            continue
        keys = death.get("routing_keys")
        entry: dict[str, FieldValue] = {
            "count": Int64(int(death.get("count") or 1)),
            "reason": str(death.get("reason", "")),
            "queue": split_key(str(death.get("queue", "")))[1],  # its name in its vhost
            "time": Timestamp(int(death.get("time") or 0) // 1000),
            "exchange": str(death.get("exchange", "")),
            "routing-keys": [str(k) for k in keys] if isinstance(keys, list) else [],
        }
        if isinstance(death.get("original_expiration"), str):
            entry["original-expiration"] = death["original_expiration"]
        table.append(entry)
    headers["x-death"] = table
    if isinstance(first, dict):
        for key in ("queue", "reason", "exchange"):
            if isinstance(first.get(key), str):
                value = split_key(first[key])[1] if key == "queue" else first[key]
                headers.setdefault(f"x-first-death-{key}", value)


_NO_EXTRA: dict[str, object] = {}


def properties_from_message(message: Message, now: int | None = None) -> BasicProperties:
    # Once per delivery: one constructor call with every field, no setattr loop.
    ours = message.protocol == PROTOCOL_AMQP091
    get = (message.extra if ours else _NO_EXTRA).get
    mode = get("delivery_mode")
    if not isinstance(mode, int):
        mode = None if ours else 2 if message.qos else 1
    correlation = message.correlation_data
    published = get("expiration")
    expiration = published if isinstance(published, str) else None
    if expiration is None and message.expires_at_ms is not None:
        now = now_ms() if now is None else now
        expiration = str(max(0, message.expires_at_ms - now))
    return BasicProperties(
        message.content_type,
        get("content_encoding"),  # type: ignore[arg-type]
        _headers(message),
        mode,
        get("priority"),  # type: ignore[arg-type]
        None if correlation is None else correlation.decode("utf-8", "surrogateescape"),
        message.response_topic,
        expiration,
        get("message_id"),  # type: ignore[arg-type]
        get("timestamp"),  # type: ignore[arg-type]
        get("type"),  # type: ignore[arg-type]
        get("user_id"),  # type: ignore[arg-type]
        get("app_id"),  # type: ignore[arg-type]
    )


def delivery_properties(message: Message) -> BasicProperties | bytes:
    """What a consumer is sent: an AMQP 0.9.1 publisher's own property bytes, unchanged (no copy of
    the message keeps them, see ``Message.encoded_properties``), else the mapped properties."""
    encoded = message.encoded_properties
    if encoded is not None and message.protocol == PROTOCOL_AMQP091:
        return encoded
    return properties_from_message(message)


def delivery_form(message: Message) -> tuple[str, str, BasicProperties | bytes]:
    """(exchange, routing key, properties) for a basic.deliver or get-ok of ``message``: an AMQP
    0.9.1 publish's own address and property bytes in one call (the usual case), else what
    :func:`delivery_address` and :func:`delivery_properties` make of it."""
    if message.protocol == PROTOCOL_AMQP091:
        extra = message.extra
        exchange, key, encoded = extra.get("exchange"), extra.get("routing_key"), message.encoded_properties
        if encoded is not None and isinstance(exchange, str) and isinstance(key, str):
            return exchange, key, encoded
    exchange, key = delivery_address(message)
    return exchange, key, delivery_properties(message)


def delivery_address(message: Message) -> tuple[str, str]:
    """(exchange, routing key) for basic.deliver: the AMQP publish's own, or one derived from the
    topic for a message that came from MQTT or AMQP 1.0."""
    extra = message.extra
    if message.protocol == PROTOCOL_AMQP091 or "deaths" in extra:  # a dead letter: its DLX and key
        exchange, key = extra.get("exchange"), extra.get("routing_key")
        if isinstance(exchange, str) and isinstance(key, str):
            return exchange, key
    topic = message.topic
    if topic[:1] == "$" and topic.startswith(TENANT):
        topic = split_key(topic)[1]  # the consumer's vhost is the message's: its own names
    if topic.startswith(QUEUE_PREFIX):
        parsed = parse_queue_topic(topic)  # the queue's name: $queue/$dlq/q is queue $dlq/q
        return "", parsed[0] if parsed is not None else topic[len(QUEUE_PREFIX) :].split("/", 1)[0]
    return "amq.topic", topic_to_routing_key(topic)
