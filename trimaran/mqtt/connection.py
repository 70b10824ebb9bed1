"""Server side of one MQTT connection as a sans-IO state machine (h11 style).

    conn = ServerConnection(ServerLimits(...), now=monotonic())
    conn.receive_data(data, now)               # bytes in
    while (event := conn.next_event()):        # events out, one packet at a time
    conn.accept(session) / conn.reject(code)   # answer a ConnectRequest
    conn.publish(OutboundMessage(...))         # to the client
    conn.ack_publish(packet_id)                # after the client's message is committed
    conn.send_suback(packet_id, codes)         # answer a SubscribeRequest
    sock.write(conn.data_to_send())            # bytes out, batched
    conn.next_deadline(), conn.tick(now), conn.receive_eof()

The machine never raises on bad client input: it answers per protocol level (MQTT 5.0 DISCONNECT with
a reason code, 3.1/3.1.1 plain close), emits `ConnectionClosed`, and ignores everything after. The
caller writes what `data_to_send()` returns and then closes the socket.

Standard library only (plus the pure topic rules of `trimaran.topics`).
"""

from __future__ import annotations

import math
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from trimaran.mqtt import reason_codes as rc
from trimaran.mqtt.codec import (
    MAX_PACKET_SIZE,
    NEED_DATA,
    NO_PROPERTIES,
    PINGREQ,
    PINGRESP_BYTES,
    Decoder,
    ProtocolError,
    encode,
    encode_plain_publish,
    run_acks,
    run_packets,
)
from trimaran.mqtt.events import (
    DROP_EXPIRED,
    DROP_NOT_CONNECTED,
    DROP_OFFLINE_QUEUE_FULL,
    DROP_TOO_LARGE,
    ConnectionClosed,
    ConnectRequest,
    Event,
    Events,
    MessageAcked,
    MessageDropped,
    MessagesAcked,
    SubscribeRequest,
    UnsubscribeReceived,
)
from trimaran.mqtt.packets import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PublishRun,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    granted_options,
)
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.mqtt.session import (
    AWAITING_PUBACK,
    AWAITING_PUBCOMP,
    OutboundMessage,
    Session,
    Subscription,
)
from trimaran.topics import SHARE_PREFIX, TopicError, is_valid_topic_name, split_shared

__all__ = [
    "CLIENT_DEFAULTS",
    "ClientLimits",
    "ConnectRequest",
    "ConnectionClosed",
    "ConnectionStats",
    "Event",
    "MessageAcked",
    "MessageDropped",
    "MessagesAcked",
    "ServerConnection",
    "ServerLimits",
    "State",
    "SubscribeRequest",
    "UnsubscribeReceived",
]

NO_EXPIRY: Final = 0xFFFFFFFF
_PACKET_ID: Final = struct.Struct("!H").pack
_PACKET_ID_NO_PROPERTIES: Final = struct.Struct("!HB").pack  # (id, 0): then a 5.0 PUBLISH's payload
NO_DEADLINE: Final = math.inf  # ServerConnection._deadline when nothing is due


@dataclass(slots=True)
class ServerLimits:
    """What this server allows and advertises. One instance can be shared by every connection."""

    max_packet_size: int = MAX_PACKET_SIZE  # inbound; advertised as Maximum Packet Size when smaller
    receive_maximum: int = 65535  # inbound unacknowledged QoS 1/2 PUBLISH (5.0); advertised
    maximum_qos: int = 2  # advertised (5.0) and enforced (0x9B)
    retain_available: bool = True
    wildcard_subscription_available: bool = True
    subscription_identifier_available: bool = True
    shared_subscription_available: bool = True
    topic_alias_maximum: int = 16  # inbound aliases the client may use; 0 disables
    outbound_topic_aliases: bool = True  # use aliases towards 5.0 clients that allow them
    server_keep_alive: int | None = None  # cap on keep alive (5.0 Server Keep Alive); None = client's
    connect_timeout: float = 10.0  # seconds allowed between the socket opening and a CONNECT
    supported_levels: frozenset[int] = frozenset({3, 4, 5})
    max_client_id_length: int = 65535
    assigned_client_id_prefix: str = "auto-"
    authentication_methods: frozenset[str] = frozenset()  # 5.0 enhanced auth methods (none yet)
    max_inflight_legacy: int = 32  # outbound window for 3.1/3.1.1 clients (no Receive Maximum)
    max_queued_messages: int = 1000  # per session, for sessions this machine creates
    max_queued_bytes: int = 0  # the same in payload and topic bytes; 0 = no bound
    maximum_session_expiry: int | None = None  # cap on the client's Session Expiry Interval
    max_packet_size_unauthenticated: int = 65536  # until accept(): a CONNECT larger is refused
    max_topic_length: int = 65535  # bytes of a topic name or filter (as UTF-8 characters)
    max_topic_levels: int = 128  # levels of a topic name or filter
    max_subscriptions: int = 0  # per session; 0 = no limit
    max_early_data: int = 1 << 20  # bytes buffered while accept()/reject() is pending
    # Hand consecutive plain QoS 0 (or QoS 1) PUBLISHes to one topic out as one PublishRun event
    # (the server's hull routes a run once, and acknowledges a QoS 1 run with `ack_run` or has it
    # read one PUBLISH at a time with `walk_run`); off, each PUBLISH is its own event.
    publish_runs: bool = False


@dataclass(slots=True)
class ConnectionStats:
    dropped_too_large: int = 0  # outbound packets larger than the client's maximum
    dropped_queue_full: int = 0
    dropped_expired: int = 0
    packets_received: int = 0
    packets_sent: int = 0


class ClientLimits:
    """What a client said at its CONNECT that it takes: 5.0's Receive Maximum, Maximum Packet Size,
    Topic Alias Maximum and Request Problem Information. One object is shared by every client that
    said nothing (``CLIENT_DEFAULTS``), and at 3.1/3.1.1 by all of one outbound window: four fields
    of every connection were 24 bytes (issue 47)."""

    __slots__ = ("max_packet_size", "problem_information", "receive_maximum", "topic_alias_maximum")

    def __init__(
        self,
        receive_maximum: int = 65535,
        max_packet_size: int = MAX_PACKET_SIZE,
        topic_alias_maximum: int = 0,
        problem_information: bool = True,
    ) -> None:
        self.receive_maximum = receive_maximum  # the outbound window
        self.max_packet_size = max_packet_size
        self.topic_alias_maximum = topic_alias_maximum  # 0: no outbound aliases
        self.problem_information = problem_information  # False: no reason strings or user properties


CLIENT_DEFAULTS: Final = ClientLimits()
# The 3.1/3.1.1 clients' limits by the server's window for them (one entry a setting).
_LEGACY_LIMITS: Final[dict[int, ClientLimits]] = {}


def _legacy_limits(window: int) -> ClientLimits:
    known = _LEGACY_LIMITS.get(window)
    if known is None:
        known = _LEGACY_LIMITS[window] = ClientLimits(window)
    return known


class _Extras:
    """What a connection holds only once it uses it: its drops' counters and the last drop's
    reason, topic aliases, QoS 2 resends held, a run walked a PUBLISH at a time, a clock other than
    the wall's. Made at the first use of any, as most connections use none (seven fields of every
    connection were 56 bytes; issue 47)."""

    __slots__ = (
        "aliases",
        "clock",
        "dropped_why",
        "expired",
        "held_resends",
        "queue_full",
        "too_large",
        "walk_at",
        "walk_run",
    )

    def __init__(self) -> None:
        self.too_large = 0  # not sent: larger than the client's Maximum Packet Size
        self.queue_full = 0  # not sent: its offline session's queue was full
        self.expired = 0  # not sent: its Message Expiry Interval ran out first
        self.dropped_why = ""  # why `publish` or `publish_encoded` last returned False (a DROP_ name)
        self.aliases: _Aliases | None = None
        self.held_resends: set[int] | None = None  # see settle_resend
        # A run being read one PUBLISH at a time (walk_run), and the next one's index in its packets.
        self.walk_run: PublishRun | None = None
        self.walk_at = 0
        self.clock: Callable[[], float] = time.time  # epoch seconds, for OutboundMessage.expires_at


class _Aliases:
    """A connection's MQTT 5.0 topic aliases, both ways: made by the first it uses, as most clients
    use none (three fields of every connection were 24 bytes; issue 47)."""

    __slots__ = ("inbound", "next_outbound", "outbound")

    def __init__(self) -> None:
        self.inbound: dict[int, str] = {}  # the client's, alias -> topic
        self.outbound: dict[str, int] = {}  # ours to the client, topic -> alias
        self.next_outbound = 1  # the alias the next new topic gets


class State:
    AWAIT_CONNECT: Final = "await_connect"
    CONNECTING: Final = "connecting"  # CONNECT received, waiting for accept()/reject()
    CONNECTED: Final = "connected"
    CLOSED: Final = "closed"


class _Fail(Exception):
    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.message = message


# Packets the client must never send.
_SERVER_ONLY = (ConnAck, SubAck, UnsubAck, PingResp)
# Packets that may carry a reason string / user properties only if the client asked for them.
_PROBLEM_INFO_PACKETS = (PubAck, PubRec, PubRel, PubComp, SubAck, UnsubAck, Auth)
_V311_CONNACK_CODES: Final = frozenset(
    {
        ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
        ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
        ReasonCode.BAD_USER_NAME_OR_PASSWORD,
        ReasonCode.NOT_AUTHORIZED,
        ReasonCode.SERVER_UNAVAILABLE,
        ReasonCode.SERVER_BUSY,
        ReasonCode.BANNED,
        ReasonCode.BAD_AUTHENTICATION_METHOD,
        ReasonCode.QUOTA_EXCEEDED,  # a connection limit: 3.1.1's "server unavailable" (0x03)
    }
)


def _disconnect_code(code: int) -> int:
    """`code` if a DISCONNECT may carry it, else 0x80 Unspecified error."""
    return code if code in rc.DISCONNECT_CODES else ReasonCode.UNSPECIFIED_ERROR


class ServerConnection(Decoder):
    """The machine is its own `Decoder` (its base, a `Machine`): the buffer, the topic cache, the
    inbound limit and the protocol level are fields of this one object, not of a second object every
    connection held (compiled, 288 + 128 bytes became 352; from the source, 296 + 120 became 368;
    issue 47)."""

    __slots__ = (
        "_connect",
        "_deadline",
        "_extras",
        "_inbound_unacked",
        "_last_rx",
        "_out",
        "_pending_subscribes",
        "_ready",
        "_ready_at",
        "_valid_topic",
        "client_id",
        "client_limits",
        "keep_alive",
        "limits",
        "packets_received",
        "packets_sent",
        "pending_out",
        "report_plain_acks",
        "session",
        "state",
        "uses_topic_aliases",
    )

    def __init__(
        self,
        limits: ServerLimits | None = None,
        *,
        now: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`now` is the caller's monotonic time (keep alive, connect timeout); `clock` gives wall-clock
        epoch seconds, used only for `OutboundMessage.expires_at`."""
        limits = limits or ServerLimits()
        # Until the login is decided, a packet may be no larger than the unauthenticated limit. The
        # decoder's `protocol_level` is the machine's: 0, then 3, 4 or 5 as the CONNECT is read (a
        # field: deliveries ask).
        super().__init__(min(limits.max_packet_size, limits.max_packet_size_unauthenticated))
        # The flags first, after the decoder's last field (`runs`): compiled, the three share one word.
        self.runs = limits.publish_runs
        # Whether PUBLISHes to this client carry outbound topic aliases, so that each is encoded for
        # this connection alone (`publish` does that; `publish_encoded` would send the full topic).
        # Known at CONNECT; a field, as every delivery asks.
        self.uses_topic_aliases = False
        # MessageAcked for every finished delivery; False: only for tagged ones (a hull that has
        # nothing to do when a plain pub/sub delivery is acknowledged saves an event per message).
        self.report_plain_acks = True
        self.limits = limits
        self.state: str = State.AWAIT_CONNECT
        # Bytes for the client until data_to_send(); None when there are none (an idle connection
        # holds no list: 56 bytes, issue #47).
        self._out: list[bytes] | None = None
        self.pending_out = 0  # bytes of PUBLISHes in _out: a subscriber's backlog not yet written
        self._connect: Connect | None = None
        # When tick() must be called; NO_DEADLINE for never. A float, not an optional one: compiled,
        # a field rather than an object made by every read.
        self._deadline = now + self.limits.connect_timeout
        self._last_rx = now
        self.keep_alive = 0
        self.client_id = ""
        self.session: Session | None = None
        self.client_limits = CLIENT_DEFAULTS  # the client's, once its CONNECT is read
        # Client packet id -> QoS, not yet acked by the handler; made by the first QoS 1/2 PUBLISH.
        self._inbound_unacked: dict[int, int] | None = None
        # SUBSCRIBEs the hull has not answered: made by one, dropped when all are answered.
        self._pending_subscribes: dict[int, Subscribe] | None = None
        # What next_event() hands out, in order, from _ready_at; None when all were handed out (an
        # idle connection holds no list: 72 bytes, issue #47). `_pending()` makes one.
        self._ready: Events | None = None
        self._ready_at = 0
        self._valid_topic: str | None = None  # the last topic name checked: publishers repeat theirs
        # ConnectionStats' counters: those of every packet as fields (an object of their own would
        # be 72 bytes of every connection, issue #47), the drops' in the extras.
        self.packets_received = 0
        self.packets_sent = 0
        self._extras: _Extras | None = None
        if clock is not time.time:  # (last: compiled, the fields above are set before any call)
            self._extra().clock = clock

    # ------------------------------------------------------------------------------------- public

    @property
    def connect_packet(self) -> Connect | None:
        """The CONNECT while the login is decided; once accepted, only if it carries a will."""
        return self._connect

    @property
    def quiet(self) -> bool:
        """Connected, with nothing queued for the client: what a QoS 0 publish leaves."""
        return self._out is None and self.state == State.CONNECTED

    @property
    def closed(self) -> bool:
        # peer_close_s stays 0: the server ends the connection (after a DISCONNECT too, as Mosquitto)
        return self.state == State.CLOSED

    @property
    def stats(self) -> ConnectionStats:
        """The counters, as they stand."""
        extras = self._extras
        if extras is None:
            return ConnectionStats(0, 0, 0, self.packets_received, self.packets_sent)
        return ConnectionStats(
            extras.too_large, extras.queue_full, extras.expired, self.packets_received, self.packets_sent
        )

    @property
    def dropped_why(self) -> str:
        """Why `publish` or `publish_encoded` last returned False (a DROP_ name)."""
        extras = self._extras
        return "" if extras is None else extras.dropped_why

    @property
    def session_expiry_interval(self) -> int:
        """The session's, in seconds (0xFFFFFFFF: never); 0 before it is accepted."""
        session = self.session
        return 0 if session is None else session.expiry_interval

    def _extra(self) -> _Extras:
        """The extras, to use one."""
        extras = self._extras
        if extras is None:
            extras = self._extras = _Extras()
        return extras

    def _dropped(self, why: str) -> bool:
        """False, for a message `publish` or `publish_encoded` did not send, and why."""
        self._extra().dropped_why = why
        return False

    def data_to_send(self) -> bytes:
        """All bytes queued for the client since the last call (b"" if none)."""
        out = self._out
        if out is None:
            return b""
        data = b"".join(out)
        self._out = None
        self.pending_out = 0
        return data

    def receive_data(self, data: bytes, now: float) -> None:
        """Buffer bytes from the socket; ``next_event()`` decodes them one packet at a time."""
        if self.state == State.CLOSED or not data:
            return
        self.feed(data)
        self._last_rx = now
        if self.keep_alive and self.state == State.CONNECTED:
            self._deadline = now + self.keep_alive * 1.5
        elif self.state == State.CONNECTING and self.buffered > self.limits.max_early_data:
            self._refuse(self._pending(), ReasonCode.QUOTA_EXCEEDED, "too much data before CONNACK")

    def next_event(self) -> Event | None:
        """The next event, decoding at most one more packet (or one run of plain PUBACKs); None when no
        whole packet is buffered (or a CONNECT waits for ``accept``/``reject``)."""
        ready = self._ready
        at = self._ready_at
        if ready is None or at == len(ready):
            if ready is not None and at:
                ready = self._ready = None  # all handed out: the list goes
            at = 0
            # Decode and act on one packet at a time until one makes an event; stop when no whole
            # packet is buffered or one failed. Written out here: this runs once per packet. The
            # events' list is made before the first packet that may make one (not for a PINGREQ).
            # Packets are decoded while connected or awaiting CONNECT (CONNECTING waits for the hull's
            # accept or reject): compared as constants, where a set's lookup cost ten times as much.
            while not ready and (self.state == State.CONNECTED or self.state == State.AWAIT_CONNECT):
                extras = self._extras
                if extras is not None and extras.walk_run is not None:
                    # a run's PUBLISHes, each its own event, before the rest
                    ready = self._pending()
                    try:
                        self._on_publish(self._walked(), ready)
                    except _Fail as failed:  # (its own name: mypyc gives one name one type)
                        self._fail(ready, failed.reason_code, failed.message)
                        break
                    continue
                # Only a connection with deliveries in flight expects PUBACKs (a publisher's reads
                # skip the look); a stray one is read by next_packet and ignored the same way.
                if (
                    self.state == State.CONNECTED
                    and self.session.inflight  # type: ignore[union-attr]
                    and (packet_ids := self.next_pubacks())
                ):
                    ready = self._pending()
                    self._plain_pubacks(packet_ids, ready)
                    continue
                try:
                    packet = self.next_packet()
                except ProtocolError as exc:
                    ready = self._pending()
                    self._fail(ready, exc.reason_code, exc.message)
                    break
                if packet is NEED_DATA:
                    break
                self.packets_received += 1
                if packet is PINGREQ:  # (the decoder's one PINGREQ) an idle connection's one packet
                    self._pong()
                    continue
                if ready is None:  # (_pending() written out: once a packet)
                    ready = self._ready = []
                    self._ready_at = 0
                try:
                    if type(packet) is Publish:  # most packets: one dispatch shorter
                        self._on_publish(packet, ready)  # the decoder refuses one before CONNECT
                    elif type(packet) is PublishRun:
                        self._on_run(packet, ready)
                    elif self.state == State.AWAIT_CONNECT:
                        assert isinstance(packet, Connect)  # the decoder refuses anything else first
                        self._on_connect(packet, ready)
                    else:
                        assert not isinstance(packet, PublishRun)  # (for mypy: handled above)
                        self._on_packet(packet, ready)
                except _Fail as fail:  # (its own name: mypyc gives one name one type in a function)
                    self._fail(ready, fail.reason_code, fail.message)
                    break
            if not ready:
                self._ready = None
                self._ready_at = 0
                return None
        self._ready_at = at + 1
        return ready[at]

    def _pending(self) -> Events:
        """The events next_event() is to hand out, for one more at the end (made if there are none)."""
        ready = self._ready
        if ready is None:
            ready = self._ready = []
            self._ready_at = 0
        return ready

    def receive_eof(self) -> None:
        """The socket closed under us (no DISCONNECT): a ConnectionClosed event if still open."""
        if self.state != State.CLOSED:
            was_connected = self.state == State.CONNECTED
            self.state = State.CLOSED
            self._deadline = NO_DEADLINE
            self._pending().append(
                ConnectionClosed(
                    ReasonCode.UNSPECIFIED_ERROR,
                    "connection lost",
                    by_client=True,
                    publish_will=was_connected,
                )
            )

    def next_deadline(self) -> float | None:
        """Monotonic time at which `tick` must be called, or None."""
        deadline = self._deadline
        return None if self.state == State.CLOSED or deadline == NO_DEADLINE else deadline

    def paused(self, now: float) -> None:
        """The runtime did not read the client until ``now`` (``Machine.paused``): its keep alive
        starts again, as if its PINGREQ, unread in the socket, had come now."""
        if self.state == State.CONNECTED and self.keep_alive and now > self._last_rx:
            self._last_rx = now
            self._deadline = now + self.keep_alive * 1.5

    def tick(self, now: float) -> None:
        """Close a connection whose CONNECT or keep alive is overdue."""
        if self.state == State.CLOSED or now < self._deadline:
            return
        events = self._pending()
        if self.state in (State.AWAIT_CONNECT, State.CONNECTING):
            self._close(
                events, ReasonCode.MAXIMUM_CONNECT_TIME, "no CONNECT within the connect timeout", False
            )
        else:
            self._close(
                events,
                ReasonCode.KEEP_ALIVE_TIMEOUT,
                f"nothing received for 1.5 x keep alive ({self.keep_alive} s)",
                True,
            )

    # --------------------------------------------------------------------------------- connecting

    def accept(
        self,
        session: Session | None = None,
        *,
        session_present: bool = False,
        properties: Properties | None = None,
    ) -> None:
        """Accept the pending CONNECT: send CONNACK and resend the session's inflight messages;
        what the client sent meanwhile is decoded by the next ``next_event()`` calls.

        `session` is the stored session to resume (Clean Start 0), or None for a new one.
        `session_present` must be True only when such a session was resumed. `properties` are added to
        the CONNACK (5.0), e.g. a capped session_expiry_interval or user properties. The keep alive
        clock runs from the last data received.
        """
        if self.state == State.CLOSED:
            return  # the client went away while the handler was deciding
        if self.state != State.CONNECTING or self._connect is None:
            raise RuntimeError(f"accept() in state {self.state}")
        connect = self._connect
        level = self.protocol_level
        if session is None or connect.clean_start:
            session_present = False
        if session is not None:
            for message in session.queue.items or ():
                message.wire = None  # cut for the connection that queued it (publish_qos1_run)
        else:
            session = Session(
                self.client_id,
                max_queued=self.limits.max_queued_messages,
                max_queued_bytes=self.limits.max_queued_bytes,
            )
        session.expiry_interval = self._requested_expiry(connect)
        self.session = session
        props = properties.copy() if properties is not None else Properties()
        if level == MQTT_5:
            self._connack_properties(connect, props)
            if props.session_expiry_interval is not None:
                session.expiry_interval = props.session_expiry_interval
        ack = ConnAck(session_present and level > 3, 0, props)
        self._send(ack)
        self.state = State.CONNECTED
        if connect.will is None:
            self._connect = None  # only its will is needed later: an idle client keeps no packet
        self.max_packet_size = self.limits.max_packet_size
        self._deadline = self._last_rx + self.keep_alive * 1.5 if self.keep_alive else NO_DEADLINE
        events = self._pending()
        for entry in session.inflight_entries():
            self._send_inflight(entry, events)
        self._pump(events)

    def reject(self, reason_code: int, reason_string: str | None = None) -> None:
        """Refuse the pending CONNECT with a 5.0 reason code (mapped to a 3.1.1 return code)."""
        if self.state == State.CLOSED:
            return
        if self.state != State.CONNECTING:
            raise RuntimeError(f"reject() in state {self.state}")
        self._refuse(self._pending(), reason_code, reason_string or "connection refused")

    # ----------------------------------------------------------------------------------- outbound

    def publish(self, message: OutboundMessage) -> bool:
        """Send a message to the client, or queue it in the session (QoS 1/2 beyond the window).

        False if it was dropped: too large for the client (counted; a QoS 1/2 message then counts as
        delivered), expired (`message.expires_at`), QoS 0 while not connected, or the session queue is
        full while not connected. Connected, the queue takes every QoS 1/2 message: the caller holds
        the publishers feeding a queue above its high-water mark (what was acknowledged to them is
        never dropped). A QoS 1/2 message that expires or no longer fits while queued is reported
        later as a MessageDropped event (from ``next_event()``).
        """
        if message.qos == 0:
            if self.state != State.CONNECTED:
                return self._dropped(DROP_NOT_CONNECTED)
            why = self._send_publish(message, 0, None, False)
            return True if why is None else self._dropped(why)
        if self.session is None:
            return self._dropped(DROP_NOT_CONNECTED)
        if (
            self.state == State.CONNECTED
            and self.client_limits.max_packet_size < MAX_PACKET_SIZE  # _fits's shortcut, without the call
            and not self._fits(message)
        ):
            self._extra().too_large += 1
            return self._dropped(DROP_TOO_LARGE)
        session = self.session
        inflight = session.inflight
        if self.state == State.CONNECTED and (
            inflight is None or len(inflight) < self.client_limits.receive_maximum
        ):
            if not session.queue.items:
                # Room in the window and nothing waiting before it: straight to inflight
                # (_send_inflight written out for a new entry).
                session.start_inflight(message)
                reason = self._send_publish(message, message.qos, message.packet_id, False)
                message.wire = None  # its one use: a resend carries DUP, encoded anew
                if reason is None:
                    message.sent = True
                else:
                    session.drop_inflight(message.packet_id)
                    self._pending().append(MessageDropped(message, reason))
                return True
            message.wire = None  # queued: encoded at its turn, perhaps for another connection
            session.backlog().append(message)
            self._pump(self._pending())
            return True
        # The window is full, or offline: it waits its turn (a PUBACK pumps the queue).
        message.wire = None
        if self.state == State.CONNECTED:
            session.backlog().append(message)  # unbounded here: the hull holds the publishers
            return True
        if not session.enqueue(message):
            self._extra().queue_full += 1
            return self._dropped(DROP_OFFLINE_QUEUE_FULL)
        return True

    def publish_encoded(self, data: bytes) -> bool:
        """Send a QoS 0 PUBLISH already encoded for this protocol level, the same bytes for every
        subscriber (fan-out encodes once). The caller keeps to `publish` for a message with an expiry
        (its interval counts down per send) and for a client that `uses_topic_aliases`.
        False if not connected or larger than the client's Maximum Packet Size (counted)."""
        if self.state != State.CONNECTED:
            return self._dropped(DROP_NOT_CONNECTED)
        size = len(data)
        if size > self.client_limits.max_packet_size:
            self._extra().too_large += 1
            return self._dropped(DROP_TOO_LARGE)
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self.pending_out += size
        self.packets_sent += 1
        return True

    def publish_run(self, data: bytes, count: int, largest: int) -> bool:
        """Send ``count`` QoS 0 PUBLISHes encoded back to back for this protocol level (a
        PublishRun, or `codec.encode_run`), ``largest`` the size of the largest: `publish_encoded` for
        each, at once. False, and nothing sent, if not connected or one is larger than the client's
        Maximum Packet Size: the caller then sends them one by one."""
        if self.state != State.CONNECTED or largest > self.client_limits.max_packet_size:
            return False
        # `_queue_packets`' queueing, written out: a paced publisher's lone message takes this path
        # once a subscriber, and a shared helper cost it a call (42.0 -> 43.3 a message, measured).
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self.pending_out += len(data)
        self.packets_sent += count
        return True

    def publish_qos1_run(self, run: PublishRun) -> bool:
        """Send each PUBLISH of a QoS 1 run (a PublishRun of this protocol family: the caller
        checks) to its topic at QoS 1, as `publish` would one by one: with this session's packet ids
        into the inflight window while it has room and nothing waits before them, the rest queued
        in the session (a PUBACK pumps them; the caller holds the publishers of a queue above its
        high-water mark). False, and nothing done, where each must take `publish`: not connected,
        outbound topic aliases, or a message larger than the client's Maximum Packet Size."""
        session = self.session
        if (
            self.state != State.CONNECTED
            or session is None
            or self.uses_topic_aliases
            or run.largest > self.client_limits.max_packet_size
        ):
            return False
        packets = run_packets(run)
        inflight = session.inflight
        if inflight is None:
            inflight = session.inflight = {}
        queue = session.backlog()
        items = queue.items
        if items is None:
            items = queue.items = []
        # Within the window, and so within the 65535 packet ids, whatever the limits say: the ids
        # need no check a message.
        room = 0 if items else min(self.client_limits.receive_maximum, 0xFFFF) - len(inflight)
        back = 3 if self.protocol_level == MQTT_5 else 2  # the packet id's place, before the payload
        # What is sent is the run as read, each packet id replaced by ours in place: one copy of
        # the run, not three pieces a message.
        out = bytearray(run.wire) if room > 0 else bytearray()
        end = 0  # where the packet ends in the run
        sent = 0
        last = 0  # where the last one sent ends
        topic = run.topic
        topics = run.topics
        for i, (wire, payload) in enumerate(packets):
            if topics is not None:
                topic = topics[i]
            end += len(wire)
            if sent < room:
                # session.start_inflight() written out: once per message
                pid = session.next_packet_id
                while pid in inflight:
                    pid = pid % 0xFFFF + 1
                session.next_packet_id = pid % 0xFFFF + 1
                inflight[pid] = OutboundMessage(
                    topic, payload, 1, False, NO_PROPERTIES, None, None, False, None,
                    pid, AWAITING_PUBACK, True,
                )  # fmt: skip
                at = end - len(payload) - back
                out[at] = pid >> 8
                out[at + 1] = pid & 0xFF
                sent += 1
                last = end
                continue
            # Queued cut before its packet id, with its payload: the PUBACK that makes room sends
            # it without encoding it again (`_pump`, which puts back the 5.0 empty properties'
            # byte), for no more memory than its head. (accept() forgets the cuts: the session's
            # next connection may be of another level.)
            cut = (wire[: len(wire) - len(payload) - back], payload)
            message = OutboundMessage(topic, payload, 1, False, NO_PROPERTIES, None, None, False, cut)
            items.append(message)  # session.queue.append() written out
            queue.bytes += len(payload) + len(topic)
        if sent:
            if last < len(out):
                del out[last:]  # the rest waits in the session
            self._queue_packets(bytes(out), sent)
        if items and len(inflight) < self.client_limits.receive_maximum:
            self._pump(self._pending())  # room, but the queue was not empty: its head goes first
        return True

    def walk_run(self, run: PublishRun) -> None:
        """Hand out the PUBLISHes of ``run`` (its event, just handed out) one at a time, each as if
        it had been read alone, before anything read after them: for the runs the hull cannot take
        whole (refused, a ``$`` topic, a broker that must see each publish)."""
        run_packets(run)  # cut once (run.packets), read a packet at a time
        extras = self._extra()
        extras.walk_at = 0
        extras.walk_run = run

    def ack_run(self, run: PublishRun) -> None:
        """Acknowledge each PUBLISH of a QoS 1 run (its event, taken whole): plain PUBACKs, in
        order, once the hull has routed them."""
        if self.state != State.CONNECTED:
            return  # too late to answer; a QoS 1 message keeps nothing here
        data = run_acks(run)
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self.packets_sent += run.count

    def ack_publish(self, packet_id: int, reason_code: int = 0, properties: Properties | None = None) -> None:
        """Acknowledge a QoS 1/2 PUBLISH event: PUBACK (QoS 1) or PUBREC (QoS 2). Call it once the
        message is safe (committed); a reason code >= 0x80 refuses it (5.0)."""
        unacked = self._inbound_unacked
        qos = None if unacked is None else unacked.pop(packet_id, None)
        if qos is None or self.session is None:
            return
        if qos == 2:
            self._settled_qos2(packet_id)
        if self.state != State.CONNECTED:
            # Too late to answer, but the message is ours now: when the client resends it on its next
            # connection it must be recognised as a duplicate (and answered with PUBREC).
            if qos == 2 and reason_code < 0x80:
                if self.session.inbound_qos2 is None:
                    self.session.inbound_qos2 = {}
                self.session.inbound_qos2[packet_id] = None
            return
        if reason_code == 0 and properties is None:
            # Hot path: a plain success ack is always 4 bytes, the same at every level.
            data = bytes((0x40 if qos == 1 else 0x50, 2, packet_id >> 8, packet_id & 0xFF))
            out = self._out
            if out is None:
                self._out = [data]
            else:
                out.append(data)
            self.packets_sent += 1
        elif qos == 1:
            self._send(PubAck(packet_id, reason_code, properties or Properties()))
        else:
            self._send(PubRec(packet_id, reason_code, properties or Properties()))
        if qos == 2 and (reason_code < 0x80 or self.protocol_level < MQTT_5):
            # PUBREC sent: a resend is recognised until the PUBREL (made by the session's first).
            if self.session.inbound_qos2 is None:
                self.session.inbound_qos2 = {}
            self.session.inbound_qos2[packet_id] = None

    def settle_resend(
        self, packet_id: int, reason_code: int = 0, properties: Properties | None = None
    ) -> bool:
        """The first copy of a QoS 2 PUBLISH this connection holds a resend of (it came on an earlier
        connection of the session, whose ``ack_publish`` has just run) is acknowledged: answer the
        resend alike. A 3.1.1 refusal is only forgotten here: 3.1.1 refuses by closing, which is the
        caller's to do. False when no resend of ``packet_id`` is held here."""
        extras = self._extras
        held = None if extras is None else extras.held_resends
        if held is None or packet_id not in held:
            return False
        if reason_code >= 0x80 and self.protocol_level < MQTT_5:
            assert self._inbound_unacked is not None  # held: it came in as unacknowledged
            del self._inbound_unacked[packet_id]
            self._settled_qos2(packet_id)
        else:
            self.ack_publish(packet_id, reason_code, properties)
        return True

    def send_suback(
        self, packet_id: int, reason_codes: list[int], properties: Properties | None = None
    ) -> None:
        """Answer a SubscribeRequest: one code per filter (granted QoS 0-2 or a 5.0 failure code).
        Preset failures override, granted QoS is capped at maximum_qos, and granted filters are stored
        in the session."""
        pending = self._pending_subscribes
        request = None if pending is None else pending.pop(packet_id, None)
        if pending is not None and not pending:
            self._pending_subscribes = None  # answered: an emptied dict keeps its table (~220 bytes)
        if request is None or self.state != State.CONNECTED or self.session is None:
            return
        if len(reason_codes) != len(request.subscriptions):
            raise ValueError("one reason code per topic filter")
        preset = self._preset_codes(request)
        sub_id = request.properties.subscription_identifiers
        codes: list[int] = []
        for (topic_filter, options), code, fixed in zip(
            request.subscriptions, reason_codes, preset, strict=True
        ):
            if fixed is not None:
                code = fixed
            if code < 0x80:
                code = min(code, options.qos, self.limits.maximum_qos)
                granted = granted_options(
                    code, options.no_local, options.retain_as_published, options.retain_handling
                )
                self.session.add_subscription(
                    Subscription(topic_filter, granted, sub_id[0] if sub_id else None)
                )
            elif self.protocol_level < MQTT_5:
                code = rc.SUBACK_FAILURE_V311
            codes.append(code)
        self._send(SubAck(packet_id, codes, properties or Properties()))

    def disconnect(
        self,
        reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN,
        reason_string: str | None = None,
        server_reference: str | None = None,
    ) -> None:
        """Server-initiated close (takeover 0x8E, shutdown 0x8B, ...). 5.0 gets a DISCONNECT."""
        if self.state == State.CLOSED:
            return
        events = self._pending()
        if self.state in (State.AWAIT_CONNECT, State.CONNECTING) and self._connect is not None:
            self._refuse(events, reason_code, reason_string or "refused")
            return
        props = Properties(reason_string=reason_string, server_reference=server_reference)
        if self.state == State.CONNECTED and self.protocol_level == MQTT_5:
            self._send(Disconnect(_disconnect_code(reason_code), props))
        self.state = State.CLOSED
        events.append(ConnectionClosed(reason_code, reason_string or "closed by server", False, True))

    # ------------------------------------------------------------------------------------ receive

    def _pong(self) -> None:
        """A PINGRESP: two constant bytes, nothing to make or encode (an idle connection's one
        exchange); a client whose Maximum Packet Size is 1 gets none, as from _send."""
        if self.client_limits.max_packet_size >= 2:
            out = self._out
            if out is None:
                self._out = [PINGRESP_BYTES]
            else:
                out.append(PINGRESP_BYTES)
            self.packets_sent += 1
        else:
            self._extra().too_large += 1

    def _on_packet(self, packet: Packet, events: Events) -> None:
        if isinstance(packet, Publish):
            self._on_publish(packet, events)
        elif isinstance(packet, PubAck):
            self._on_puback(packet, events)
        elif isinstance(packet, PubRec):
            self._on_pubrec(packet, events)
        elif isinstance(packet, PubRel):
            self._on_pubrel(packet)
        elif isinstance(packet, PubComp):
            self._on_pubcomp(packet, events)
        elif isinstance(packet, PingReq):
            self._pong()
        elif isinstance(packet, Subscribe):
            self._on_subscribe(packet, events)
        elif isinstance(packet, Unsubscribe):
            self._on_unsubscribe(packet, events)
        elif isinstance(packet, Disconnect):
            self._on_disconnect(packet, events)
        elif isinstance(packet, Auth):
            # Only reachable without an authentication method: CONNECT with one is refused with 0x8C
            # (no method is supported yet), and 0x8C is not a DISCONNECT reason code.
            raise _Fail(ReasonCode.PROTOCOL_ERROR, "AUTH without an authentication method in CONNECT")
        elif isinstance(packet, Connect):
            raise _Fail(ReasonCode.PROTOCOL_ERROR, "second CONNECT on the connection")
        else:
            assert isinstance(packet, _SERVER_ONLY), packet
            raise _Fail(ReasonCode.PROTOCOL_ERROR, f"{type(packet).__name__} is sent by servers only")

    def _on_connect(self, connect: Connect, events: Events) -> None:
        limits = self.limits
        level = connect.protocol_level  # (the decoder set self.protocol_level to it as it read it)
        self._connect = connect
        props = connect.properties
        if level not in limits.supported_levels:
            self._refuse(
                events, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"protocol level {level} not supported"
            )
            return
        if level == MQTT_5:
            if (
                props.receive_maximum
                or props.maximum_packet_size
                or props.topic_alias_maximum
                or props.request_problem_information == 0
            ):
                self.client_limits = ClientLimits(
                    props.receive_maximum or 65535,
                    props.maximum_packet_size or MAX_PACKET_SIZE,
                    props.topic_alias_maximum or 0,
                    props.request_problem_information != 0,
                )
                aliases = self.client_limits.topic_alias_maximum > 0
                self.uses_topic_aliases = aliases and limits.outbound_topic_aliases
            if props.authentication_method is not None and (
                props.authentication_method not in limits.authentication_methods
            ):
                self._refuse(
                    events, ReasonCode.BAD_AUTHENTICATION_METHOD, "authentication method not supported"
                )
                return
        else:
            self.client_limits = _legacy_limits(limits.max_inflight_legacy)
        # Client identifier.
        client_id = connect.client_id
        assigned = False
        if not client_id:
            if level == 3 or (level == 4 and not connect.clean_start):
                self._refuse(events, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client identifier")
                return
            client_id = limits.assigned_client_id_prefix + secrets.token_hex(8)
            assigned = True
        elif len(client_id) > limits.max_client_id_length:
            self._refuse(events, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client identifier too long")
            return
        self.client_id = client_id
        # Will.
        will = connect.will
        if will is not None:
            if not is_valid_topic_name(will.topic):
                self._refuse(events, ReasonCode.TOPIC_NAME_INVALID, "invalid will topic")
                return
            if will.qos > limits.maximum_qos:
                self._refuse(events, ReasonCode.QOS_NOT_SUPPORTED, f"will QoS {will.qos} not supported")
                return
            if will.retain and not limits.retain_available:
                self._refuse(events, ReasonCode.RETAIN_NOT_SUPPORTED, "retained will not supported")
                return
        # Keep alive.
        # 5.0 is told the cap (Server Keep Alive). 3.1.1 cannot be told, so a longer keep alive is
        # kept (lowering it would close a client that pings as it said), but none at all (0) gets
        # the cap: a connection that never speaks is not kept for ever.
        keep_alive = connect.keep_alive
        cap = limits.server_keep_alive
        if cap is not None and (keep_alive == 0 or (keep_alive > cap and level == MQTT_5)):
            keep_alive = cap
        self.keep_alive = keep_alive
        self.state = State.CONNECTING
        expiry = self._requested_expiry(connect)
        events.append(ConnectRequest(connect, client_id, assigned, keep_alive, expiry))

    def _requested_expiry(self, connect: Connect) -> int:
        """The session expiry the CONNECT asks for, within the server's cap (asked again by
        ``accept``: the session holds it from then on, the machine no copy)."""
        if connect.protocol_level == MQTT_5:
            expiry = connect.properties.session_expiry_interval or 0
        else:
            expiry = 0 if connect.clean_start else NO_EXPIRY
        cap = self.limits.maximum_session_expiry
        return expiry if cap is None else min(expiry, cap)

    def _connack_properties(self, connect: Connect, props: Properties) -> None:
        limits = self.limits
        if limits.receive_maximum < 65535:
            props.receive_maximum = limits.receive_maximum
        if limits.maximum_qos < 2:
            props.maximum_qos = limits.maximum_qos
        if not limits.retain_available:
            props.retain_available = 0
        if limits.max_packet_size < MAX_PACKET_SIZE:
            props.maximum_packet_size = limits.max_packet_size
        if not connect.client_id:
            props.assigned_client_identifier = self.client_id
        if limits.topic_alias_maximum:
            props.topic_alias_maximum = limits.topic_alias_maximum
        if not limits.wildcard_subscription_available:
            props.wildcard_subscription_available = 0
        if not limits.subscription_identifier_available:
            props.subscription_identifier_available = 0
        if not limits.shared_subscription_available:
            props.shared_subscription_available = 0
        if self.keep_alive != connect.keep_alive:
            props.server_keep_alive = self.keep_alive
        requested = connect.properties.session_expiry_interval or 0
        if props.session_expiry_interval is None and self.session_expiry_interval != requested:
            props.session_expiry_interval = self.session_expiry_interval

    def _on_run(self, run: PublishRun, events: Events) -> None:
        """What `_on_publish` does for each of a run's PUBLISHes, once: they are QoS 0 or 1 without
        retain or properties (so no alias) to one non-empty topic, whose name alone needs checking.
        At QoS 1 the hull acknowledges the run whole, before the next packet is read: so none of its
        packet ids is unacknowledged or a resend of one, and each finds the same room under Receive
        Maximum as the first. Where that is not so (PUBLISHes still unacknowledged, no room, QoS 1
        not allowed), its PUBLISHes are walked, one event each."""
        self.packets_received += run.count - 1
        if run.topics is not None:
            for topic in dict.fromkeys(run.topics):  # each once, in order
                if topic != self._valid_topic:
                    self._check_topic(topic)
        elif run.topic != self._valid_topic:
            self._check_topic(run.topic)
        if run.qos and (
            self._inbound_unacked
            or (
                self.protocol_level == MQTT_5
                and (
                    self.limits.maximum_qos < 1
                    or len(self.session.inbound_qos2 or ()) >= self.limits.receive_maximum  # type: ignore[union-attr]
                )
            )
        ):
            self.walk_run(run)
            return
        events.append(run)

    def _walked(self) -> Publish:
        """The next PUBLISH of the run being walked, as the decoder would have read it alone."""
        extras = self._extras
        assert extras is not None
        run = extras.walk_run
        assert run is not None and run.packets is not None
        at = extras.walk_at
        wire, payload = run.packets[at]
        topic = run.topic if run.topics is None else run.topics[at]
        at += 1
        if at == run.count:
            extras.walk_run = None
            at = 0
        extras.walk_at = at
        packet_id = None
        if run.qos:
            pos = 1
            while wire[pos] & 0x80:  # the remaining length's continuation bytes
                pos += 1
            pos += 3 + (wire[pos + 1] << 8 | wire[pos + 2])  # then the topic field: the packet id
            packet_id = wire[pos] << 8 | wire[pos + 1]
        return Publish(topic, payload, run.qos, False, False, packet_id, NO_PROPERTIES, wire)

    def _check_topic(self, topic: str) -> None:
        """A topic name a client published to that is not the last one it used."""
        limits = self.limits
        if not is_valid_topic_name(topic):
            raise _Fail(ReasonCode.TOPIC_NAME_INVALID, "invalid topic name")
        if len(topic) > limits.max_topic_length or topic.count("/") >= limits.max_topic_levels:
            raise _Fail(
                ReasonCode.TOPIC_NAME_INVALID,
                f"topic over {limits.max_topic_length} characters or {limits.max_topic_levels} levels",
            )
        self._valid_topic = topic

    def _on_publish(self, publish: Publish, events: Events) -> None:
        level = self.protocol_level
        limits = self.limits
        if level == MQTT_5:
            props = publish.properties
            if publish.qos > limits.maximum_qos:
                raise _Fail(ReasonCode.QOS_NOT_SUPPORTED, f"QoS {publish.qos} is above the maximum")
            if publish.retain and not limits.retain_available:
                raise _Fail(ReasonCode.RETAIN_NOT_SUPPORTED, "retain is not available")
            if props.subscription_identifiers:
                raise _Fail(ReasonCode.PROTOCOL_ERROR, "subscription identifier in a client PUBLISH")
            alias = props.topic_alias
            if alias is not None:
                if alias > limits.topic_alias_maximum:
                    raise _Fail(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} above the maximum")
                aliases = self._topic_aliases().inbound
                if publish.topic:
                    aliases[alias] = publish.topic
                else:
                    topic = aliases.get(alias)
                    if topic is None:
                        raise _Fail(ReasonCode.PROTOCOL_ERROR, f"unknown topic alias {alias}")
                    publish.topic = topic
                props.topic_alias = None
            elif not publish.topic:
                raise _Fail(ReasonCode.PROTOCOL_ERROR, "empty topic name without a topic alias")
        if publish.topic != self._valid_topic:
            self._check_topic(publish.topic)
        qos = publish.qos
        if qos == 0:
            events.append(publish)
            return
        assert publish.packet_id is not None and self.session is not None
        pid = publish.packet_id
        unacked = self._inbound_unacked
        if unacked is None:
            unacked = self._inbound_unacked = {}
        received = self.session.inbound_qos2
        if qos == 2:
            if received is not None and pid in received:
                # Resent before our PUBREC arrived: answer again, do not deliver twice.
                self._send(PubRec(pid))
                return
            if pid in unacked:
                return  # the handler has not acknowledged the first copy yet
            pending = self.session.inbound_pending
            if pending is not None and pid in pending:
                # The first copy came on an earlier connection of this session and is not yet
                # acknowledged (its commit runs): this one is answered with it (settle_resend).
                unacked[pid] = 2
                extras = self._extra()
                held = extras.held_resends
                if held is None:
                    held = extras.held_resends = set()
                held.add(pid)
                return
        elif pid in unacked:
            events.append(publish)  # QoS 1 resend: at least once
            return
        if (
            level == MQTT_5
            and len(unacked) + (0 if received is None else len(received)) >= limits.receive_maximum
        ):
            raise _Fail(
                ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                "more unacknowledged QoS 1/2 PUBLISH than Receive Maximum",
            )
        unacked[pid] = qos
        if qos == 2:
            session = self.session
            if session.inbound_pending is None:
                session.inbound_pending = {}
            session.inbound_pending[pid] = None
        events.append(publish)

    def _settled_qos2(self, packet_id: int) -> None:
        """A QoS 2 PUBLISH is acknowledged: no longer pending in the session, nor held here."""
        assert self.session is not None
        pending = self.session.inbound_pending
        if pending is not None:
            pending.pop(packet_id, None)
        extras = self._extras
        if extras is not None and extras.held_resends is not None:
            extras.held_resends.discard(packet_id)

    def _on_pubrel(self, packet: PubRel) -> None:
        assert self.session is not None
        pid = packet.packet_id
        received = self.session.inbound_qos2
        if received is not None and pid in received:
            del received[pid]  # kept when empty: a QoS 2 publisher sends the next soon
            self._send(PubComp(pid))
        else:
            self._send(PubComp(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

    def _on_puback(self, packet: PubAck, events: Events) -> None:
        self._puback(packet.packet_id, packet.reason_code, events)

    def _puback(self, packet_id: int, reason_code: int, events: Events) -> None:
        session = self.session
        assert session is not None
        entry = session.on_puback(packet_id)
        if entry is not None:
            self._acked(entry, reason_code, events)
            if session.queue:
                self._pump(events)

    def _plain_pubacks(self, packet_ids: list[int], events: Events) -> None:
        """A run of plain PUBACKs at the head of the buffer: one MessagesAcked for the deliveries
        they finish (no packet object, no event per PUBACK), then the session's queue moves into
        the window they freed."""
        session = self.session
        assert session is not None
        report = self.report_plain_acks
        finished: list[OutboundMessage] | None = None
        inflight = session.inflight
        assert inflight is not None  # next_event reads plain PUBACKs only while some are inflight
        for packet_id in packet_ids:
            entry = inflight.get(packet_id)  # session.on_puback() written out: once per delivery
            if entry is None or entry.state != AWAITING_PUBACK:
                continue
            del inflight[packet_id]
            if report or entry.tag is not None:
                if finished is None:
                    finished = []
                    events.append(MessagesAcked(finished))
                finished.append(entry)
        self.packets_received += len(packet_ids)
        if session.queue.items:
            self._pump(events)

    def _acked(self, entry: OutboundMessage, reason_code: int, events: Events) -> None:
        if self.report_plain_acks or entry.tag is not None:
            events.append(MessageAcked(entry.packet_id, entry, reason_code))

    def _on_pubrec(self, packet: PubRec, events: Events) -> None:
        assert self.session is not None
        entry = self.session.on_pubrec(packet.packet_id, packet.reason_code)
        if entry is None:
            self._send(PubRel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
        elif entry.state == AWAITING_PUBCOMP and packet.packet_id in (self.session.inflight or ()):
            self._send(PubRel(entry.packet_id))
        else:  # refused with an error code: the flow ends here
            self._acked(entry, packet.reason_code, events)
            self._pump(events)

    def _on_pubcomp(self, packet: PubComp, events: Events) -> None:
        assert self.session is not None
        entry = self.session.on_pubcomp(packet.packet_id)
        if entry is not None:
            self._acked(entry, packet.reason_code, events)
            self._pump(events)

    def _preset_codes(self, packet: Subscribe) -> list[int | None]:
        limits = self.limits
        v5 = self.protocol_level == MQTT_5
        out: list[int | None] = []
        assert self.session is not None
        held = self.session.subscriptions
        room = limits.max_subscriptions - len(held) if limits.max_subscriptions else None
        for topic_filter, _options in packet.subscriptions:
            code: int | None = None
            try:
                group, inner = split_shared(topic_filter)
            except TopicError:
                code = ReasonCode.TOPIC_FILTER_INVALID
            else:
                if len(topic_filter) > limits.max_topic_length or (
                    topic_filter.count("/") >= limits.max_topic_levels
                ):
                    code = ReasonCode.TOPIC_FILTER_INVALID
                elif group is not None and not limits.shared_subscription_available:
                    code = ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                elif not limits.wildcard_subscription_available and ("+" in inner or "#" in inner):
                    code = ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED
                elif room is not None and topic_filter not in held:
                    if room <= 0:
                        code = ReasonCode.QUOTA_EXCEEDED  # subscriptions per client
                    room -= 1
            if code is not None and not v5:
                code = rc.SUBACK_FAILURE_V311
            out.append(code)
        return out

    def _on_subscribe(self, packet: Subscribe, events: Events) -> None:
        assert self.session is not None
        sub_ids = packet.properties.subscription_identifiers
        if sub_ids and not self.limits.subscription_identifier_available:
            raise _Fail(
                ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, "subscription identifiers not supported"
            )
        if self.protocol_level == MQTT_5:
            for topic_filter, options in packet.subscriptions:
                if options.no_local and topic_filter.startswith(SHARE_PREFIX):
                    raise _Fail(ReasonCode.PROTOCOL_ERROR, "No Local on a shared subscription")
        if self._pending_subscribes is None:
            self._pending_subscribes = {}
        self._pending_subscribes[packet.packet_id] = packet
        events.append(
            SubscribeRequest(
                packet.packet_id,
                packet.subscriptions,
                sub_ids[0] if sub_ids else None,
                packet.properties.user_properties,
                self._preset_codes(packet),
                [f in self.session.subscriptions for f, _ in packet.subscriptions],
            )
        )

    def _on_unsubscribe(self, packet: Unsubscribe, events: Events) -> None:
        assert self.session is not None
        existed = [self.session.remove_subscription(f) for f in packet.topic_filters]
        codes = [ReasonCode.SUCCESS if e else ReasonCode.NO_SUBSCRIPTION_EXISTED for e in existed]
        self._send(
            UnsubAck(packet.packet_id, [int(c) for c in codes] if self.protocol_level == MQTT_5 else [])
        )
        events.append(UnsubscribeReceived(packet.packet_id, packet.topic_filters, existed))

    def _on_disconnect(self, packet: Disconnect, events: Events) -> None:
        expiry = packet.properties.session_expiry_interval
        if expiry is not None:
            if self.session_expiry_interval == 0 and expiry != 0:
                raise _Fail(ReasonCode.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 on CONNECT")
            if self.session is not None:
                self.session.expiry_interval = expiry
        self.state = State.CLOSED
        code = packet.reason_code
        events.append(
            ConnectionClosed(
                code,
                packet.properties.reason_string or "client disconnected",
                by_client=True,
                publish_will=code != ReasonCode.NORMAL_DISCONNECTION,
            )
        )

    # --------------------------------------------------------------------------------- failures

    def _fail(self, events: Events, reason_code: int, message: str) -> None:
        """Protocol violation by the client: answer per level and close."""
        if self.state in (State.AWAIT_CONNECT, State.CONNECTING):
            if reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                # The CONNECT could not even be read: answer in 3.1.1 form, which every client reads.
                refusal = encode(ConnAck(False, rc.ConnAckReturnCode.UNACCEPTABLE_PROTOCOL_VERSION), 4)
                self._out = [*(self._out or ()), refusal]
            self._close(events, reason_code, message, False)
            return
        self._close(events, reason_code, message, True)

    def _close(self, events: Events, reason_code: int, message: str, publish_will: bool) -> None:
        if self.state == State.CONNECTED and self.protocol_level == MQTT_5:
            self._send(Disconnect(_disconnect_code(reason_code), Properties(reason_string=message)))
        self.state = State.CLOSED
        self._deadline = NO_DEADLINE
        events.append(ConnectionClosed(reason_code, message, False, publish_will))

    def _refuse(self, events: Events, reason_code: int, message: str) -> None:
        """Refuse a CONNECT with a CONNACK (5.0 reason code, or its 3.1.1 return code) and close."""
        if self.protocol_level == MQTT_5:
            if reason_code not in rc.CONNACK_CODES or reason_code < 0x80:
                reason_code = ReasonCode.UNSPECIFIED_ERROR
            self._send(ConnAck(False, reason_code, Properties(reason_string=message)))
        elif reason_code in _V311_CONNACK_CODES:
            self._send(ConnAck(False, rc.to_v311_connack(reason_code)))
        self.state = State.CLOSED
        self._deadline = NO_DEADLINE
        events.append(ConnectionClosed(reason_code, message, False, False))

    # ------------------------------------------------------------------------------------- sending

    def _send(self, packet: Packet) -> bool:
        """Encode for the client and queue; honours Maximum Packet Size and Request Problem Information."""
        level = self.protocol_level or 4
        if (
            level == MQTT_5
            and isinstance(packet, _PROBLEM_INFO_PACKETS)
            and not self.client_limits.problem_information
        ):
            props = packet.properties
            if props.reason_string is not None or props.user_properties:
                packet.properties = props = props.copy()
                props.reason_string = None
                props.user_properties = []
        data = encode(packet, level)
        if len(data) > self.client_limits.max_packet_size and not isinstance(packet, Publish):
            # Reason string and user properties are the only optional parts (section 3.1.2.11.4).
            original = getattr(packet, "properties", None)
            if isinstance(original, Properties):
                slim = original.copy()
                slim.reason_string = None
                slim.user_properties = []
                packet.properties = slim  # type: ignore[union-attr]
                data = encode(packet, level)
        if len(data) > self.client_limits.max_packet_size:
            self._extra().too_large += 1
            return False
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self.packets_sent += 1
        return True

    def _fits(self, message: OutboundMessage) -> bool:
        if self.client_limits.max_packet_size >= MAX_PACKET_SIZE:
            return True
        publish = Publish(message.topic, message.payload, message.qos, message.retain, False,
                          1 if message.qos else None, message.properties)  # fmt: skip
        return len(encode(publish, self.protocol_level)) <= self.client_limits.max_packet_size

    def _send_publish(
        self, message: OutboundMessage, qos: int, packet_id: int | None, dup: bool
    ) -> str | None:
        """Encode and queue one PUBLISH, with an outbound topic alias when the client allows them and
        the Message Expiry Interval set to the time left. Returns why it was dropped, or None."""
        level = self.protocol_level
        props = message.properties
        flag = dup or (message.redelivered and qos > 0)  # never DUP at QoS 0 (MQTT-3.3.1-2)
        alias = 0
        new_alias = False
        wire = message.wire
        if wire is not None and not flag and not self.uses_topic_aliases:
            # Encoded once for every subscriber (the handler's fan-out): only the id is this one's.
            data = b"".join((wire[0], _PACKET_ID(packet_id), wire[1]))
        elif message.expires_at is None and (
            level != MQTT_5 or (props is NO_PROPERTIES and not self.uses_topic_aliases)
        ):
            # The common delivery: no properties to send, nothing that depends on the time.
            data = encode_plain_publish(
                message.topic, message.payload, qos, message.retain, flag, packet_id, level
            )
        else:
            if message.expires_at is not None:
                extras = self._extras
                remaining = message.expires_at - (time.time() if extras is None else extras.clock())
                if remaining <= 0 and not dup:  # a resend is already on its way: finish it
                    self._extra().expired += 1
                    return DROP_EXPIRED
                if remaining > 0 and level == MQTT_5:
                    props = props.copy()
                    props.message_expiry_interval = math.ceil(remaining)
            publish = Publish(message.topic, message.payload, qos, message.retain, flag, packet_id, props)
            if self.uses_topic_aliases:
                known = self._topic_aliases()
                alias = known.outbound.get(message.topic, 0)
                if not alias:
                    new_alias = True
                    alias = known.next_outbound
                aliased = props.copy()
                aliased.topic_alias = alias
                publish.properties = aliased
                if not new_alias:
                    publish.topic = ""
            data = encode(publish, level)
            if alias and len(data) > self.client_limits.max_packet_size:
                publish.topic = message.topic
                publish.properties = props
                alias = 0
                data = encode(publish, level)
        size = len(data)
        if size > self.client_limits.max_packet_size:
            self._extra().too_large += 1
            return DROP_TOO_LARGE
        if alias and new_alias:
            self._commit_alias(message.topic, alias)
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self.pending_out += size
        self.packets_sent += 1
        return None

    def _topic_aliases(self) -> _Aliases:
        extras = self._extra()
        known = extras.aliases
        if known is None:
            known = extras.aliases = _Aliases()
        return known

    def _commit_alias(self, topic: str, alias: int) -> None:
        known = self._topic_aliases()
        aliases = known.outbound
        if len(aliases) >= self.client_limits.topic_alias_maximum:
            # All aliases taken: reuse this number, forgetting the topic it stood for.
            for old_topic, old_alias in aliases.items():
                if old_alias == alias:
                    del aliases[old_topic]
                    break
        aliases[topic] = alias
        known.next_outbound = alias % self.client_limits.topic_alias_maximum + 1

    def _send_inflight(self, entry: OutboundMessage, events: Events) -> None:
        if entry.state == AWAITING_PUBCOMP:
            self._send(PubRel(entry.packet_id))
            return
        reason = self._send_publish(entry, entry.qos, entry.packet_id, entry.sent)
        if reason is None:
            entry.sent = True
            return
        # Expired, or too large for this client: behave as if it was delivered (MQTT-3.1.2-25).
        assert self.session is not None
        self.session.drop_inflight(entry.packet_id)
        events.append(MessageDropped(entry, reason))

    def _pump(self, events: Events) -> None:
        """Move queued QoS 1/2 messages into the inflight window and send them."""
        session = self.session
        if session is None or self.state != State.CONNECTED:
            return
        inflight = session.inflight
        # Within the window, and so within the 65535 packet ids (no check a message below).
        window = min(self.client_limits.receive_maximum, 0xFFFF)
        taken = session.queue.take(window - (0 if inflight is None else len(inflight)))
        if not taken:
            return
        if inflight is None:
            inflight = session.inflight = {}
        # QoS 1 messages queued cut at their packet id (publish_qos1_run's) are sent as one write:
        # start_inflight() and _send_publish() written out, once per message of a subscriber that
        # is behind (a PUBACK makes room for the next).
        parts: list[bytes] | None = None
        limit = 0 if self.uses_topic_aliases else self.client_limits.max_packet_size
        v5 = self.protocol_level == MQTT_5
        between = 3 if v5 else 2  # the packet id, and at 5.0 the empty properties' byte
        for message in taken:
            wire = message.wire
            if (
                wire is not None
                and message.qos == 1
                and not message.redelivered
                and len(wire[0]) + between + len(wire[1]) <= limit
            ):
                pid = session.next_packet_id
                while pid in inflight:
                    pid = pid % 0xFFFF + 1
                session.next_packet_id = pid % 0xFFFF + 1
                message.packet_id = pid
                message.state = AWAITING_PUBACK
                message.sent = True
                inflight[pid] = message
                message.wire = None  # its one use (a resend carries DUP, encoded anew)
                if parts is None:
                    parts = []
                parts += (wire[0], _PACKET_ID_NO_PROPERTIES(pid, 0) if v5 else _PACKET_ID(pid), wire[1])
                continue
            if parts is not None:  # what went before, in order
                self._queue_packets(b"".join(parts), len(parts) // 3)
                parts = None
            # (a cut is this loop's to use: encoded anew, for the limit's sake or with DUP)
            message.wire = None
            # _send_inflight() written out for a new entry: never sent, never awaiting PUBCOMP
            session.start_inflight(message)
            reason = self._send_publish(message, message.qos, message.packet_id, False)
            if reason is None:
                message.sent = True
            else:
                # Expired, or too large for this client: as if it was delivered (MQTT-3.1.2-25).
                session.drop_inflight(message.packet_id)
                events.append(MessageDropped(message, reason))
        if parts is not None:
            self._queue_packets(b"".join(parts), len(parts) // 3)

    def _queue_packets(self, data: bytes, count: int) -> None:
        """Queue ``count`` QoS 1 PUBLISHes, back to back in ``data``, as one write: a run's
        delivery, or what a PUBACK lets through."""
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self.pending_out += len(data)
        self.packets_sent += count
