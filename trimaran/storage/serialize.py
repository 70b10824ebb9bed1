"""Messages to and from SQL rows: payload as bytes, the rest as one JSON text column.

Shared by retained messages, MQTT session queues and the durable queues, so every table stores a
message the same way and Spark reads one format.
"""

from __future__ import annotations

import base64
import binascii
import json
import json.encoder as json_encoder
from typing import Any

from trimaran.broker.message import Message

_BYTES = "$b64"
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # json.dumps builds one per call


def _bytes_or_refuse(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        # b64encode's own call: once per durable AMQP 1.0 message (its bytes are kept in extra)
        return {_BYTES: binascii.b2a_base64(value, newline=False).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# Once per durable message: the C encoder built once (json's encode() builds one per call, and a
# walk through _plain first costs as much again). No cycle check: these values come from our own
# codecs, never cyclic. Anything it refuses (a key that is not text) takes the _plain path.
_make_c_encoder: Any = getattr(json_encoder, "c_make_encoder", None)  # None without the _json module
_C_ENCODER = (
    None
    if _make_c_encoder is None
    else _make_c_encoder(
        None, _bytes_or_refuse, json_encoder.encode_basestring, None, ":", ",", False, False, True
    )
)


def _plain(value: Any) -> Any:
    """JSON-safe form of a property value; bytes become ``{"$b64": ...}``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _restore(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES in value:
            return base64.b64decode(value[_BYTES])
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


# Most publishers send messages alike in all but created_at_ms: an AMQP 0.9.1 publisher the same
# property bytes again and again (Message.encoded_properties), an MQTT one none at all. Their JSON
# is built once per shape and created_at_ms appended, not encoded afresh for every message.
_SHAPES: dict[tuple[object, ...], str] = {}
_SHAPES_MAX = 1024


def properties_json(message: Message) -> str:
    """Everything but topic, payload, qos and retain, as compact JSON (absent fields left out)."""
    key = _shape(message)
    if key is None:
        return _json(message)
    shape = _SHAPES.get(key)
    if shape is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        shape = _SHAPES[key] = _json(message, created_at=False)[: -len("}")]
    return f'{shape},"created_at_ms":{message.created_at_ms}}}'


def _shape(message: Message) -> tuple[object, ...] | None:
    """What decides a message's JSON but created_at_ms, where that is cheap to know; else None."""
    if message.expires_at_ms is not None:  # per message
        return None
    encoded = message.encoded_properties
    if encoded is not None:  # the rest of an AMQP 0.9.1 message's properties come from these bytes
        extra = message.extra
        return (encoded, extra.get("exchange"), extra.get("routing_key"), message.publisher_id)
    if (
        message.extra
        or message.user_properties
        or message.content_type is not None
        or message.correlation_data is not None
        or message.response_topic is not None
        or message.payload_format is not None
    ):
        return None
    return (message.protocol, message.publisher_id)


def _json(message: Message, *, created_at: bool = True) -> str:
    props: dict[str, Any] = {"protocol": message.protocol}
    if created_at:
        props["created_at_ms"] = message.created_at_ms
    if message.content_type is not None:
        props["content_type"] = message.content_type
    if message.correlation_data is not None:
        props["correlation_data"] = _plain(message.correlation_data)
    if message.response_topic is not None:
        props["response_topic"] = message.response_topic
    if message.payload_format is not None:
        props["payload_format"] = message.payload_format
    if message.expires_at_ms is not None:
        props["expires_at_ms"] = message.expires_at_ms
    if message.user_properties:
        props["user_properties"] = [list(pair) for pair in message.user_properties]
    if message.publisher_id is not None:
        props["publisher_id"] = message.publisher_id
    if message.extra:
        props["extra"] = message.extra
    if _C_ENCODER is not None:
        try:
            return "".join(_C_ENCODER(props, 0))
        except (TypeError, ValueError):
            pass
    if "extra" in props:
        props["extra"] = _plain(message.extra)
    return _ENCODER.encode(props)


def message_from(topic: str, payload: bytes, qos: int, retain: bool, properties: str | None) -> Message:
    props: dict[str, Any] = json.loads(properties) if properties else {}
    correlation = props.get("correlation_data")
    return Message(
        topic=topic,
        payload=bytes(payload),
        qos=qos,
        retain=retain,
        content_type=props.get("content_type"),
        correlation_data=_restore(correlation) if correlation is not None else None,
        response_topic=props.get("response_topic"),
        payload_format=props.get("payload_format"),
        expires_at_ms=props.get("expires_at_ms"),
        user_properties=[(str(k), str(v)) for k, v in props.get("user_properties", [])],
        publisher_id=props.get("publisher_id"),
        protocol=props.get("protocol", "internal"),
        created_at_ms=props.get("created_at_ms", 0),
        extra=_restore(props.get("extra", {})),
    )
