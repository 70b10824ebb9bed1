"""MQTT 5.0 properties: the property table (section 2.2.2.2) and the `Properties` value.

The wire encoding and decoding of properties lives in `codec.py`; this module only knows what each
property is, its data type, and which packets may carry it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import IntEnum


class PacketType(IntEnum):
    """MQTT control packet types (fixed header bits 7-4)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


# Pseudo packet type for the Will Properties inside a CONNECT payload.
WILL = 0


class DataType(IntEnum):
    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARINT = 4
    UTF8 = 5
    BINARY = 6
    UTF8_PAIR = 7


@dataclass(frozen=True, slots=True)
class PropertyDef:
    identifier: int
    name: str  # attribute name on `Properties`
    data_type: DataType
    packets: frozenset[int]  # PacketType values, plus WILL for Will Properties
    multiple: bool = False  # may appear more than once


_P = PacketType
_ALL = frozenset({*(int(t) for t in PacketType if t not in (_P.PINGREQ, _P.PINGRESP)), WILL})
_MSG = frozenset({_P.PUBLISH, WILL})
_REASON_STRING = frozenset(
    {_P.CONNACK, _P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP, _P.SUBACK, _P.UNSUBACK, _P.DISCONNECT, _P.AUTH}
)
_T = DataType

PROPERTY_TABLE: tuple[PropertyDef, ...] = (
    PropertyDef(0x01, "payload_format_indicator", _T.BYTE, _MSG),
    PropertyDef(0x02, "message_expiry_interval", _T.FOUR_BYTE_INT, _MSG),
    PropertyDef(0x03, "content_type", _T.UTF8, _MSG),
    PropertyDef(0x08, "response_topic", _T.UTF8, _MSG),
    PropertyDef(0x09, "correlation_data", _T.BINARY, _MSG),
    # Several in a PUBLISH (one per matching subscription), at most one in a SUBSCRIBE.
    PropertyDef(0x0B, "subscription_identifiers", _T.VARINT, frozenset({_P.PUBLISH, _P.SUBSCRIBE}), True),
    PropertyDef(
        0x11, "session_expiry_interval", _T.FOUR_BYTE_INT, frozenset({_P.CONNECT, _P.CONNACK, _P.DISCONNECT})
    ),
    PropertyDef(0x12, "assigned_client_identifier", _T.UTF8, frozenset({_P.CONNACK})),
    PropertyDef(0x13, "server_keep_alive", _T.TWO_BYTE_INT, frozenset({_P.CONNACK})),
    PropertyDef(0x15, "authentication_method", _T.UTF8, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    PropertyDef(0x16, "authentication_data", _T.BINARY, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    PropertyDef(0x17, "request_problem_information", _T.BYTE, frozenset({_P.CONNECT})),
    PropertyDef(0x18, "will_delay_interval", _T.FOUR_BYTE_INT, frozenset({WILL})),
    PropertyDef(0x19, "request_response_information", _T.BYTE, frozenset({_P.CONNECT})),
    PropertyDef(0x1A, "response_information", _T.UTF8, frozenset({_P.CONNACK})),
    PropertyDef(0x1C, "server_reference", _T.UTF8, frozenset({_P.CONNACK, _P.DISCONNECT})),
    PropertyDef(0x1F, "reason_string", _T.UTF8, _REASON_STRING),
    PropertyDef(0x21, "receive_maximum", _T.TWO_BYTE_INT, frozenset({_P.CONNECT, _P.CONNACK})),
    PropertyDef(0x22, "topic_alias_maximum", _T.TWO_BYTE_INT, frozenset({_P.CONNECT, _P.CONNACK})),
    PropertyDef(0x23, "topic_alias", _T.TWO_BYTE_INT, frozenset({_P.PUBLISH})),
    PropertyDef(0x24, "maximum_qos", _T.BYTE, frozenset({_P.CONNACK})),
    PropertyDef(0x25, "retain_available", _T.BYTE, frozenset({_P.CONNACK})),
    PropertyDef(0x26, "user_properties", _T.UTF8_PAIR, _ALL, True),
    PropertyDef(0x27, "maximum_packet_size", _T.FOUR_BYTE_INT, frozenset({_P.CONNECT, _P.CONNACK})),
    PropertyDef(0x28, "wildcard_subscription_available", _T.BYTE, frozenset({_P.CONNACK})),
    PropertyDef(0x29, "subscription_identifier_available", _T.BYTE, frozenset({_P.CONNACK})),
    PropertyDef(0x2A, "shared_subscription_available", _T.BYTE, frozenset({_P.CONNACK})),
)

PROPERTIES_BY_ID: dict[int, PropertyDef] = {p.identifier: p for p in PROPERTY_TABLE}
PROPERTIES_BY_NAME: dict[str, PropertyDef] = {p.name: p for p in PROPERTY_TABLE}

# Properties whose value must be 0 or 1 (anything else is a Protocol Error).
BOOLEAN_BYTE_PROPERTIES: frozenset[str] = frozenset(
    {
        "payload_format_indicator",
        "request_problem_information",
        "request_response_information",
        "maximum_qos",
        "retain_available",
        "wildcard_subscription_available",
        "subscription_identifier_available",
        "shared_subscription_available",
    }
)


def properties_for(packet_type: int) -> tuple[PropertyDef, ...]:
    """The property definitions a packet type may carry, in identifier order."""
    return _BY_PACKET[packet_type]


_BY_PACKET: dict[int, tuple[PropertyDef, ...]] = {
    t: tuple(p for p in PROPERTY_TABLE if t in p.packets) for t in (WILL, *(int(t) for t in PacketType))
}


@dataclass(slots=True, init=False, repr=False)
class Properties:
    """MQTT 5.0 properties of one packet. `None` (or an empty list) means absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    # Order is kept and duplicates are allowed (section 3.1.2.11.8).
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    # Written out, as MQTT 5.0 builds one per message: mypyc compiles it, the generated one runs
    # interpreted. A list left None stands for its default, a new empty list.
    def __init__(
        self,
        payload_format_indicator: int | None = None,
        message_expiry_interval: int | None = None,
        content_type: str | None = None,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        subscription_identifiers: list[int] | None = None,
        session_expiry_interval: int | None = None,
        assigned_client_identifier: str | None = None,
        server_keep_alive: int | None = None,
        authentication_method: str | None = None,
        authentication_data: bytes | None = None,
        request_problem_information: int | None = None,
        will_delay_interval: int | None = None,
        request_response_information: int | None = None,
        response_information: str | None = None,
        server_reference: str | None = None,
        reason_string: str | None = None,
        receive_maximum: int | None = None,
        topic_alias_maximum: int | None = None,
        topic_alias: int | None = None,
        maximum_qos: int | None = None,
        retain_available: int | None = None,
        user_properties: list[tuple[str, str]] | None = None,
        maximum_packet_size: int | None = None,
        wildcard_subscription_available: int | None = None,
        subscription_identifier_available: int | None = None,
        shared_subscription_available: int | None = None,
    ) -> None:
        self.payload_format_indicator = payload_format_indicator
        self.message_expiry_interval = message_expiry_interval
        self.content_type = content_type
        self.response_topic = response_topic
        self.correlation_data = correlation_data
        self.subscription_identifiers = [] if subscription_identifiers is None else subscription_identifiers
        self.session_expiry_interval = session_expiry_interval
        self.assigned_client_identifier = assigned_client_identifier
        self.server_keep_alive = server_keep_alive
        self.authentication_method = authentication_method
        self.authentication_data = authentication_data
        self.request_problem_information = request_problem_information
        self.will_delay_interval = will_delay_interval
        self.request_response_information = request_response_information
        self.response_information = response_information
        self.server_reference = server_reference
        self.reason_string = reason_string
        self.receive_maximum = receive_maximum
        self.topic_alias_maximum = topic_alias_maximum
        self.topic_alias = topic_alias
        self.maximum_qos = maximum_qos
        self.retain_available = retain_available
        self.user_properties = [] if user_properties is None else user_properties
        self.maximum_packet_size = maximum_packet_size
        self.wildcard_subscription_available = wildcard_subscription_available
        self.subscription_identifier_available = subscription_identifier_available
        self.shared_subscription_available = shared_subscription_available

    def __repr__(self) -> str:
        parts = []
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if value is not None and value != []:
                parts.append(f"{name}={value!r}")
        return f"Properties({', '.join(parts)})"

    def is_empty(self) -> bool:
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if value is not None and value != []:
                return False
        return True

    def copy(self) -> Properties:
        new = Properties()
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            setattr(new, name, list(value) if isinstance(value, list) else value)
        return new


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Properties))
assert set(_FIELD_NAMES) == set(PROPERTIES_BY_NAME), "Properties fields and PROPERTY_TABLE disagree"
