"""MQTT control packets as plain dataclasses, one per packet type, for MQTT 3.1, 3.1.1 and 5.0.

Fields that do not exist in a protocol level are left at their defaults there: 3.1/3.1.1 packets carry
empty `Properties`, reason code 0 on PUBACK/PUBREC/PUBREL/PUBCOMP/DISCONNECT, and an empty
`reason_codes` list on UNSUBACK.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from trimaran.mqtt.properties import PacketType, Properties

__all__ = [
    "Auth",
    "ConnAck",
    "Connect",
    "Disconnect",
    "Packet",
    "PacketType",
    "PingReq",
    "PingResp",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "PublishRun",
    "SubAck",
    "Subscribe",
    "SubscriptionOptions",
    "UnsubAck",
    "Unsubscribe",
    "Will",
]

# Protocol levels (the "Protocol Version" byte of CONNECT). Final: compiled, each use is the number
# itself, not a look in the module's globals (two a message in the decoder's run).
MQTT_3_1: Final = 3
MQTT_3_1_1: Final = 4
MQTT_5: Final = 5


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    protocol_name: str = "MQTT"  # "MQIsdp" for level 3
    protocol_level: int = MQTT_3_1_1
    clean_start: bool = True  # "Clean Session" in 3.1/3.1.1
    keep_alive: int = 60
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class ConnAck:
    session_present: bool = False
    reason_code: int = 0  # 3.1/3.1.1: the CONNACK return code
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True, init=False)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # present iff qos > 0
    properties: Properties = field(default_factory=Properties)
    # The packet as received, when those very bytes are what a subscriber of the same protocol
    # family and QoS gets (no retain, no DUP, no properties; at QoS 1/2 with its own packet id):
    # fan-in then forwards them without encoding.
    wire: bytes | None = field(default=None, compare=False, repr=False)

    # Written out, as one per message: mypyc compiles it, the generated one runs interpreted.
    # ``properties`` None stands for the default, a new empty Properties.
    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: Properties | None = None,
        wire: bytes | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = Properties() if properties is None else properties
        self.wire = wire


@dataclass(slots=True, init=False)
class PublishRun:
    """Consecutive PUBLISHes of one QoS (``qos``, 0 or 1) read together from one client, none with
    retain, DUP or properties, to ``topic`` (or each to its own of ``topics``): the decoder hands
    them out as one (``Decoder.runs``), so that the server routes them once (once a topic) and
    forwards their bytes as they came where a subscriber takes them so. ``wire``: the packets as
    received, back to back; ``head``: the bytes of each between its remaining length and its
    payload (topic, at QoS 1 the packet id, and at 5.0 the empty properties); ``largest``: the
    size of the largest packet (a client's Maximum Packet Size is per packet)."""

    topic: str
    wire: bytes
    count: int
    largest: int
    head: int
    v5: bool
    qos: int = 0
    # Each packet's topic, when they are not all ``topic`` (its first packet's; ``head`` is then
    # the first packet's too, and each packet's is read from its own topic field).
    topics: list[str] | None = None
    # At QoS 1, each packet's id as read, two bytes each (the decoder reads them to refuse id 0):
    # its PUBACKs (codec.run_acks). None in the runs cut from it (codec.run_stretches).
    ids: bytearray | None = field(default=None, compare=False, repr=False)
    # The run's bytes as other kinds of subscriber get them (codec.encode_run), made at the first
    # such subscriber: (5.0?, subscription identifiers) -> (bytes, largest packet).
    encoded: dict[tuple[bool, tuple[int, ...]], tuple[bytes, int]] | None = None
    # Each packet as (its bytes, its payload), cut once for every subscriber that takes the run
    # with its own packet ids (codec.run_packets): a fan-out to 16 read the run 16 times.
    packets: list[tuple[bytes, bytes]] | None = field(default=None, compare=False, repr=False)

    # Written out, as one per run: mypyc compiles it, the generated one runs interpreted.
    def __init__(
        self,
        topic: str,
        wire: bytes,
        count: int,
        largest: int,
        head: int,
        v5: bool,
        qos: int = 0,
        topics: list[str] | None = None,
        ids: bytearray | None = None,
        encoded: dict[tuple[bool, tuple[int, ...]], tuple[bytes, int]] | None = None,
        packets: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.topic = topic
        self.wire = wire
        self.count = count
        self.largest = largest
        self.head = head
        self.v5 = v5
        self.qos = qos
        self.topics = topics
        self.ids = ids
        self.encoded = encoded
        self.packets = packets


@dataclass(slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubscriptionOptions:
    qos: int = 0
    no_local: bool = False  # 5.0 only
    retain_as_published: bool = False  # 5.0 only
    retain_handling: int = 0  # 5.0 only: 0 send, 1 send if new subscription, 2 do not send


def granted_options(
    qos: int, no_local: bool = False, retain_as_published: bool = False, retain_handling: int = 0
) -> SubscriptionOptions:
    """The one object for these options, for a session's subscriptions: never changed once
    granted, and a fleet uses a few sets (a copy each was 120 bytes of every subscription, issue
    47). The valid sets are 36; anything else is made, not kept."""
    key = (qos, no_local, retain_as_published, retain_handling)
    options = _GRANTED.get(key)
    if options is None:
        options = SubscriptionOptions(qos, no_local, retain_as_published, retain_handling)
        if qos in (0, 1, 2) and retain_handling in (0, 1, 2):
            _GRANTED[key] = options
    return options


_GRANTED: dict[tuple[int, bool, bool, int], SubscriptionOptions] = {}


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[tuple[str, SubscriptionOptions]]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubAck:
    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # 5.0 only; empty in 3.1/3.1.1
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0  # 5.0 only
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
