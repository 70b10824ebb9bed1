"""What the MQTT machine hands the hull, one packet at a time (``ServerConnection.next_event()``),
except a run of plain PUBACKs, which is one event. A PUBLISH from the client is handed out as the
``Publish`` itself, its topic alias resolved (for QoS 1/2 call `ack_publish(packet_id)`): most
packets are one, and a wrapper would cost an object and a call each. With ``ServerLimits.publish_runs``
consecutive plain PUBLISHes of one QoS (0 or 1) are one ``PublishRun``, whatever their topics (for
QoS 1 call `ack_run(run)` once it is routed, or `walk_run(run)` to have its PUBLISHes handed out one
by one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from trimaran.mqtt.packets import Connect, Publish, PublishRun, SubscriptionOptions
from trimaran.mqtt.session import OutboundMessage


@dataclass(slots=True)
class ConnectRequest:
    """A valid CONNECT. Answer with `accept()` or `reject()`; nothing else is read until then."""

    connect: Connect
    client_id: str  # the client's id, or the one assigned for an empty id
    client_id_assigned: bool
    keep_alive: int  # effective keep alive (after Server Keep Alive)
    session_expiry_interval: int  # requested, seconds (capped; 0xFFFFFFFF = never)


@dataclass(slots=True)
class SubscribeRequest:
    """A SUBSCRIBE. `preset[i]` is a failure code the machine already decided for filter i (invalid,
    shared or wildcard not supported) or None; `existed[i]` tells whether the session already had that
    filter (for Retain Handling 1). Answer with `send_suback(packet_id, codes)`."""

    packet_id: int
    subscriptions: list[tuple[str, SubscriptionOptions]]
    subscription_identifier: int | None
    user_properties: list[tuple[str, str]]
    preset: list[int | None]
    existed: list[bool]


@dataclass(slots=True)
class UnsubscribeReceived:
    """An UNSUBSCRIBE, already answered and removed from the session; update the router."""

    packet_id: int
    topic_filters: list[str]
    existed: list[bool]


@dataclass(slots=True)
class MessageAcked:
    """An outbound QoS 1/2 delivery finished: PUBACK, PUBCOMP, or a PUBREC with an error code."""

    packet_id: int
    message: OutboundMessage
    reason_code: int


@dataclass(slots=True)
class MessagesAcked:
    """Outbound QoS 1 deliveries finished by a run of plain PUBACKs (success, no properties) that
    were read together, in the order they came: a subscriber acknowledging QoS 1 sends little else,
    and one event for the run spares an event per message."""

    messages: list[OutboundMessage]


# Why the machine dropped an outbound message (MessageDropped.reason, ServerConnection.dropped_why):
# the deck's drop reasons by the same names (broker/drops.py), which this module may not import.
DROP_TOO_LARGE: Final = "too_large"
DROP_EXPIRED: Final = "expired"
DROP_OFFLINE_QUEUE_FULL: Final = "offline_queue_full"
DROP_NOT_CONNECTED: Final = "not_connected"


@dataclass(slots=True)
class MessageDropped:
    """An outbound message was not sent: larger than the client's Maximum Packet Size, or expired
    (``reason``: one of the DROP_ names). Per spec a too large QoS 1/2 message counts as delivered."""

    message: OutboundMessage
    reason: str


@dataclass(slots=True)
class ConnectionClosed:
    """The connection is over: flush `data_to_send()` and close the socket."""

    reason_code: int
    reason: str
    by_client: bool  # the client sent DISCONNECT or closed the socket
    publish_will: bool


Event = (
    ConnectRequest
    | Publish
    | PublishRun
    | SubscribeRequest
    | UnsubscribeReceived
    | MessageAcked
    | MessagesAcked
    | MessageDropped
    | ConnectionClosed
)

# What the machine has ready, in order (a list read from a cursor: a deque costs 600 bytes a
# connection, and most of the time nothing is ready).
Events = list[Event]
