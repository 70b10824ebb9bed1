"""One message model for every protocol.

A :class:`Message` is created once per publish by a front end (MQTT, AMQP 0.9.1, AMQP 1.0 or an
internal producer such as ``$SYS``), stored in the retained store and handed to every matching
subscriber. It is mutable only for speed of construction: once published, treat it as immutable and
use :meth:`Message.copy_with` to make a changed copy (for example a retain flag cleared for one
subscriber), because the same object is shared by all deliveries.

Times are integers in epoch milliseconds, like everywhere else in Trimaran.

A QoS is 0, 1 or 2, checked where it comes from outside rather than on every construction (a call
per message on every hull): the MQTT codec refuses QoS 3 as malformed, the admin API's schema
refuses it, the AMQP mappings only make 0 or 1, and :meth:`Message.copy_with` checks a changed one.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "PROTOCOLS",
    "PROTOCOL_AMQP091",
    "PROTOCOL_AMQP1",
    "PROTOCOL_INTERNAL",
    "PROTOCOL_MQTT",
    "Message",
    "now_ms",
]

PROTOCOL_MQTT: Final = "mqtt"
PROTOCOL_AMQP091: Final = "amqp091"
PROTOCOL_AMQP1: Final = "amqp1"
PROTOCOL_INTERNAL: Final = "internal"
PROTOCOLS: Final = frozenset({PROTOCOL_MQTT, PROTOCOL_AMQP091, PROTOCOL_AMQP1, PROTOCOL_INTERNAL})

_time_ns = time.time_ns


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return _time_ns() // 1_000_000


@dataclass(slots=True, eq=True, init=False)
class Message:
    """A published message, independent of the protocol that carried it.

    Field mapping used by the front ends (see DESIGN.md, "Cross-protocol model"):

    - ``content_type``: MQTT 5 content-type, AMQP 0.9.1 ``content_type``, AMQP 1.0 ``content-type``.
    - ``correlation_data``: MQTT 5 correlation-data, AMQP ``correlation_id`` (as bytes).
    - ``response_topic``: MQTT 5 response-topic, AMQP ``reply_to``.
    - ``payload_format``: MQTT 5 payload-format-indicator (0 bytes, 1 UTF-8), ``None`` if absent.
    - ``expires_at_ms``: absolute expiry (epoch ms), ``None`` for "never".
    - ``user_properties``: MQTT 5 user properties, AMQP 0.9.1 headers, AMQP 1.0 application-properties;
      order is kept and a name may repeat.
    - ``publisher_id``: the publishing connection's client/container id, used for MQTT 5 No Local.
    - ``extra``: properties that only a front end of the same protocol understands (AMQP 0.9.1
      ``priority``, ``message_id``, AMQP 1.0 annotations ...). Other front ends ignore it.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    content_type: str | None = None
    correlation_data: bytes | None = None
    response_topic: str | None = None
    payload_format: int | None = None
    expires_at_ms: int | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    publisher_id: str | None = None
    protocol: str = PROTOCOL_INTERNAL
    created_at_ms: int = field(default_factory=now_ms)
    extra: dict[str, object] = field(default_factory=dict)
    #: The properties as the publisher's own frame carried them (AMQP 0.9.1: the content header's
    #: flag word and property list), written as they are to a consumer of the same protocol instead
    #: of being mapped and encoded again, and the key of the stored JSON's shape
    #: (``storage.serialize``). Never copied: ``copy_with`` (a dead letter, another topic) leaves a
    #: copy without it, so a changed message is always encoded afresh.
    encoded_properties: bytes | None = field(default=None, init=False, compare=False, repr=False)

    # Written out, as one is built per message: mypyc compiles it, the generated one runs
    # interpreted. None for user_properties, created_at_ms or extra: a fresh list, now, a fresh dict.
    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        content_type: str | None = None,
        correlation_data: bytes | None = None,
        response_topic: str | None = None,
        payload_format: int | None = None,
        expires_at_ms: int | None = None,
        user_properties: list[tuple[str, str]] | None = None,
        publisher_id: str | None = None,
        protocol: str = PROTOCOL_INTERNAL,
        created_at_ms: int | None = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.content_type = content_type
        self.correlation_data = correlation_data
        self.response_topic = response_topic
        self.payload_format = payload_format
        self.expires_at_ms = expires_at_ms
        self.user_properties = [] if user_properties is None else user_properties
        self.publisher_id = publisher_id
        self.protocol = protocol
        self.created_at_ms = now_ms() if created_at_ms is None else created_at_ms
        self.extra = {} if extra is None else extra
        self.encoded_properties = None

    def is_expired(self, now_ms: int) -> bool:
        """True when the message has an expiry and ``now_ms`` is at or past it."""
        expires = self.expires_at_ms
        return expires is not None and now_ms >= expires

    def remaining_expiry_s(self, now_ms: int) -> int | None:
        """Seconds left before expiry, for MQTT 5's Message Expiry Interval when forwarding.

        ``None`` if the message never expires. Rounded up, so a message that has not expired yet is
        forwarded with at least 1 second (MQTT has no way to say "less than a second"); 0 once expired.
        """
        expires = self.expires_at_ms
        if expires is None:
            return None
        left = expires - now_ms
        if left <= 0:
            return 0
        return -(-left // 1000)

    @staticmethod
    def expiry_from_interval(interval_s: int | None, now_ms: int) -> int | None:
        """``expires_at_ms`` for a relative expiry in seconds (MQTT 5 Message Expiry Interval)."""
        if interval_s is None:
            return None
        return now_ms + interval_s * 1000

    def copy_with(self, **changes: Any) -> Message:
        """A shallow copy with some fields changed (``user_properties`` and ``extra`` are shared)."""
        qos = changes.get("qos", 0)
        if not 0 <= qos <= 2:
            raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
        return dataclasses.replace(self, **changes)
