"""The JMS selector of an AMQP 1.0 receiver: found in its source's filter set, read against any
protocol's message.

The filter is ``apache.org:selector-filter:string`` (code ``0x0000468C00000004``), recognised by
its descriptor under whatever key of the filter set the client chose (Qpid JMS says
``jms-selector``, proton ``selector``). A selector reads a message's fields as Qpid JMS and
ActiveMQ Artemis map JMS onto AMQP 1.0:

==================  =====================================  ==============================================
JMS header          AMQP 1.0                               other protocols' messages
==================  =====================================  ==============================================
JMSMessageID        properties.message-id                  AMQP 0.9.1 message_id
JMSCorrelationID    properties.correlation-id              correlation data / correlation_id (as text)
JMSType             properties.subject                     AMQP 0.9.1 type
JMSPriority         header.priority (4 when absent)        AMQP 0.9.1 priority (4 when absent)
JMSTimestamp        properties.creation-time               AMQP 0.9.1 timestamp (s -> ms), else arrival
JMSDeliveryMode     header.durable: ``'PERSISTENT'`` or    persistent (AMQP 0.9.1 delivery_mode 2, MQTT
                    ``'NON_PERSISTENT'``                   QoS 1 or 2) or not
JMSExpiration       properties.absolute-expiry-time, else  the expiry (ms since the epoch), 0 for never
                    the ttl's expiry, 0 for never
==================  =====================================  ==============================================

Any other name is an application property (AMQP 1.0 application-properties and AMQP 0.9.1
headers keep their types; MQTT user properties are text, compared with a number as one when they
are one: :class:`~trimaran.selector.Text`). A non-string message or correlation id reads as Qpid
JMS prints it (``ID:AMQP_UUID:...``, ``ID:AMQP_ULONG:...``, ``ID:AMQP_BINARY:...``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Final

from trimaran.amqp1.mapping import EXTRA_KEY
from trimaran.amqp1.messages import decode_message
from trimaran.amqp1.types import DecodeError, Described, Symbol
from trimaran.broker.message import PROTOCOL_AMQP091, PROTOCOL_MQTT, Message
from trimaran.selector import Selector, Text, compile_selector

__all__ = [
    "SELECTOR_CODE",
    "SELECTOR_FILTER",
    "find_selector",
    "message_fields",
    "parse_selector",
    "selecting",
]

SELECTOR_FILTER: Final = Symbol("apache.org:selector-filter:string")
SELECTOR_CODE: Final = 0x0000_468C_0000_0004
DEFAULT_PRIORITY: Final = 4


def find_selector(filters: dict[Any, Any] | None) -> tuple[Any, Described] | None:
    """The selector filter's key and described value in a source's filter set, or None."""
    if not filters:
        return None
    for key, value in filters.items():
        if isinstance(value, Described) and value.descriptor in (SELECTOR_FILTER, SELECTOR_CODE):
            return key, value
    return None


def selecting(selector: Selector, remember: int = 0) -> Callable[[Message], bool]:
    """The predicate a queue consumer or a topic link checks each message with. ``remember``: how
    many verdicts to keep (a queue consumer meets the messages it left behind again at each take;
    a topic link sees each message once and keeps none)."""
    if not remember:

        def selects(message: Message) -> bool:
            return selector(message_fields(message))

        return selects
    verdicts: dict[int, tuple[Message, bool]] = {}  # id -> (the message, kept alive so ids stay its)

    def selects_once(message: Message) -> bool:
        seen = verdicts.get(id(message))
        if seen is not None and seen[0] is message:
            return seen[1]
        verdict = selector(message_fields(message))
        if len(verdicts) >= remember:
            del verdicts[next(iter(verdicts))]  # the oldest
        verdicts[id(message)] = (message, verdict)
        return verdict

    return selects_once


def _plain(value: Any) -> Any:
    """A typed field value as the selector's types (codec wrappers as their plain type); a type
    JMS selectors cannot name (binary, lists, maps ...) is NULL."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    return None


def _id_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, uuid.UUID):
        return f"ID:AMQP_UUID:{value}"
    if isinstance(value, int):
        return f"ID:AMQP_ULONG:{int(value)}"
    if isinstance(value, bytes | bytearray | memoryview):
        return "ID:AMQP_BINARY:" + bytes(value).hex().upper()
    return str(value)


def message_fields(message: Message) -> dict[str, Any]:
    """What a selector reads of ``message``: its application properties and the JMS headers."""
    extra = message.extra
    raw = extra.get(EXTRA_KEY) if extra else None
    if isinstance(raw, bytes):
        try:
            return _amqp1_fields(message, raw)
        except DecodeError:
            pass  # accepted once, so never seen; read what the deck holds
    fields: dict[str, Any]
    typed = extra.get("headers") if message.protocol == PROTOCOL_AMQP091 else None
    if isinstance(typed, dict):
        fields = {str(k): _plain(v) for k, v in typed.items()}
    elif message.protocol == PROTOCOL_MQTT:
        fields = {k: Text(v) for k, v in message.user_properties}
    else:
        fields = dict(message.user_properties)
    correlation = message.correlation_data
    stamp = extra.get("timestamp")
    priority = extra.get("priority")
    fields["JMSMessageID"] = _id_text(extra.get("message_id"))
    fields["JMSCorrelationID"] = None if correlation is None else correlation.decode("utf-8", "replace")
    fields["JMSType"] = _plain(extra.get("type"))
    fields["JMSPriority"] = priority if isinstance(priority, int) else DEFAULT_PRIORITY
    fields["JMSTimestamp"] = stamp * 1000 if isinstance(stamp, int) else message.created_at_ms
    fields["JMSDeliveryMode"] = "PERSISTENT" if message.qos else "NON_PERSISTENT"
    fields["JMSExpiration"] = message.expires_at_ms or 0
    return fields


def _amqp1_fields(message: Message, raw: bytes) -> dict[str, Any]:
    decoded = decode_message(raw)
    fields = {str(k): _plain(v) for k, v in (decoded.application_properties or {}).items()}
    header, props = decoded.header, decoded.properties
    fields["JMSPriority"] = DEFAULT_PRIORITY if header is None else int(header.priority)
    fields["JMSDeliveryMode"] = "PERSISTENT" if header is not None and header.durable else "NON_PERSISTENT"
    expiry = message.expires_at_ms or 0
    if props is not None:
        fields["JMSMessageID"] = _id_text(props.message_id)
        fields["JMSCorrelationID"] = _id_text(props.correlation_id)
        fields["JMSType"] = props.subject
        fields["JMSTimestamp"] = None if props.creation_time is None else int(props.creation_time)
        if props.absolute_expiry_time:
            expiry = int(props.absolute_expiry_time)
    fields["JMSExpiration"] = expiry
    return fields


def parse_selector(text: Any) -> Selector:
    """Compile a selector filter's value (``SelectorError`` when it does not parse)."""
    return compile_selector(text if isinstance(text, str) else "" if text is None else str(text))
