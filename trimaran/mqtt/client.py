"""A sans-IO MQTT client (3.1.1 and 5.0): what a bridge speaks to another broker.

Bytes and ``now`` in, events and bytes out, as the server's machine (``connection.py``); the codec is
the same. The client's half of the session (the publishes the remote has not acknowledged, QoS 2
exchanges half done, the packet identifiers) lives in a :class:`ClientSession` that outlasts each
connection, so that a reconnect with ``clean_start`` off resends what the remote may not have, with
DUP set, as MQTT 4.4 asks.

Events come one packet at a time (``next_event``). A received QoS 1 or 2 message is acknowledged
only when the caller says it has it (:meth:`ClientConnection.acknowledge`): a bridge's promise that
what the remote let go of is held here first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trimaran.mqtt.codec import NEED_DATA, Decoder, ProtocolError, encode
from trimaran.mqtt.packets import (
    MQTT_5,
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
    SubscriptionOptions,
    UnsubAck,
)
from trimaran.mqtt.properties import Properties

#: The reason codes of a CONNACK that refuses, in 3.1.1 (return codes 1-5) and 5.0 (0x80 and up).
CONNACK_REASONS = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
    0x80: "unspecified error",
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x88: "server unavailable",
    0x89: "server busy",
    0x8A: "banned",
    0x8C: "bad authentication method",
    0x90: "topic name invalid",
    0x95: "packet too large",
    0x97: "quota exceeded",
    0x9C: "use another server",
    0x9D: "server moved",
    0x9F: "connection rate exceeded",
}


@dataclass(slots=True)
class Connected:
    """The remote accepted the CONNECT; ``session_present``: it kept the session (and what was
    unacknowledged has been sent again)."""

    session_present: bool
    properties: Properties


@dataclass(slots=True)
class Received:
    """A PUBLISH from the remote. At QoS 1 and 2, call ``acknowledge(packet_id)`` once it is held."""

    publish: Publish


@dataclass(slots=True)
class Acknowledged:
    """The remote took an outbound QoS 1 or 2 message (its PUBACK, or at QoS 2 its PUBREC: from then
    on the message is the remote's, and the PUBREL / PUBCOMP that follow are this machine's).
    ``reason_code`` >= 0x80: it refused it (5.0) and will not deliver it; resent, it would be
    refused again."""

    packet_id: int
    reason_code: int = 0


@dataclass(slots=True)
class Subscribed:
    packet_id: int
    reason_codes: list[int]


@dataclass(slots=True)
class Closed:
    """The connection is over: ``reason`` says why in words, for the log."""

    reason: str
    refused: bool = False  # the remote refused the CONNECT: retrying as is may well fail again
    unanswered: bool = False  # the remote closed the connection before any CONNACK


Event = Connected | Received | Acknowledged | Subscribed | Closed


@dataclass(slots=True)
class ClientSession:
    """The client's side of an MQTT session, kept across connections."""

    # Outbound QoS 1/2 messages sent and not yet PUBACKed / PUBRECed, in the order sent.
    unacknowledged: dict[int, Publish] = field(default_factory=dict)
    # Outbound QoS 2 messages PUBRECed: PUBREL sent, PUBCOMP awaited.
    released: dict[int, None] = field(default_factory=dict)
    # Inbound QoS 2 messages seen and not yet released by the remote's PUBREL -> whether the
    # caller has acknowledged them (PUBREC): a PUBLISH with one of these identifiers is the same
    # message again, answered with a PUBREC once acknowledged, and not handed out twice.
    receiving: dict[int, bool] = field(default_factory=dict)
    last_id: int = 0

    def next_id(self) -> int:
        """A packet identifier no outbound exchange holds (there are 65,535; the window is far less)."""
        packet_id = self.last_id
        while True:
            packet_id = packet_id % 65535 + 1
            if packet_id not in self.unacknowledged and packet_id not in self.released:
                self.last_id = packet_id
                return packet_id

    @property
    def in_flight(self) -> int:
        return len(self.unacknowledged) + len(self.released)


_CONNECTING, _CONNECTED, _CLOSED = range(3)


class ClientConnection:
    """One connection of an MQTT client: the CONNECT is queued at once.

    ``connect_timeout``: seconds for the CONNACK. ``max_inflight``: outbound QoS 1/2 messages
    unacknowledged at most (and at most the remote's Receive Maximum): see :attr:`can_publish`.
    ``bridge``: announce a bridge in the CONNECT, as Mosquitto's bridges do (3.1.1).
    """

    def __init__(
        self,
        connect: Connect,
        session: ClientSession,
        now: float,
        *,
        connect_timeout: float = 10.0,
        max_inflight: int = 64,
        max_packet_size: int = 268_435_460,
        bridge: bool = False,
    ) -> None:
        self.level = connect.protocol_level
        self.session = session
        self.keep_alive = connect.keep_alive
        self.max_inflight = max_inflight
        self.remote_max_packet_size: int | None = None
        self.remote_maximum_qos = 2
        self.remote_retain_available = True
        self._connect = connect
        self._decoder = Decoder(max_packet_size, connect.protocol_level)
        self._out = bytearray(encode(connect, connect.protocol_level))
        if bridge:
            # Mosquitto's try_private: bit 7 of the protocol level says "a bridge" (the remote then
            # sends it nothing it published itself, and retained flags as published). The level
            # byte follows the fixed header and the protocol name (2 + 4 bytes).
            header = 2
            while self._out[header - 1] & 0x80:
                header += 1
            self._out[header + 6] |= 0x80
        self._state = _CONNECTING
        self._connack_by = now + connect_timeout
        self._now = now  # the caller's time at its last call: when a packet is sent
        self._last_sent = now
        self._ping_sent: float | None = None
        self._pending: list[Event] = []

    # -- the machine surface ----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._state == _CLOSED

    @property
    def connected(self) -> bool:
        return self._state == _CONNECTED

    def receive_data(self, data: bytes, now: float) -> None:
        if self._state != _CLOSED:
            self._now = now
            self._decoder.feed(data)
            self._ping_sent = None  # anything from the remote shows it alive

    def receive_eof(self, why: str | None = None) -> None:
        """The connection ended; ``why``: the socket's words for it, if it said more than EOF."""
        if self._state == _CONNECTING:
            self._close(
                why or "the remote closed the connection without answering the CONNECT", unanswered=True
            )
        else:
            self._close(why or "the remote closed the connection")

    def next_event(self) -> Event | None:
        while True:
            if self._pending:
                return self._pending.pop(0)
            if self._state == _CLOSED:
                return None
            try:
                packet = self._decoder.next_packet()
            except ProtocolError as exc:
                self._fail(exc.reason_code, f"malformed packet from the remote: {exc}")
                continue
            if packet is NEED_DATA:
                return None
            assert not isinstance(packet, PublishRun)  # the decoder makes runs only when asked
            event = self._handle(packet)
            if event is not None:
                return event

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_deadline(self) -> float | None:
        """The CONNACK's; then when a PINGREQ is due (nothing sent for the keep-alive), and after it
        when its answer is overdue (a keep-alive later)."""
        if self._state == _CONNECTING:
            return self._connack_by
        if self._state == _CLOSED or not self.keep_alive:
            return None
        if self._ping_sent is not None:
            return self._ping_sent + self.keep_alive
        return self._last_sent + self.keep_alive

    def tick(self, now: float) -> None:
        self._now = now
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return
        if self._state == _CONNECTING:
            self._close("no CONNACK in time")
        elif self._ping_sent is not None:
            self._close(f"no answer from the remote within the keep-alive ({self.keep_alive} s)")
        else:
            self._send(PingReq(), now)
            self._ping_sent = now

    # -- the caller's calls -----------------------------------------------------------------------

    @property
    def can_publish(self) -> bool:
        """Whether a QoS 1/2 publish fits the window now (QoS 0 always goes)."""
        return self._state == _CONNECTED and self.session.in_flight < self.max_inflight

    def publish(self, publish: Publish, now: float) -> int | None:
        """Send a message; at QoS 1/2 it gets a packet identifier and is kept until acknowledged
        (:class:`Acknowledged`). Returns the identifier (None at QoS 0). The caller checks
        :meth:`fits` and, at QoS 1/2, :attr:`can_publish` first."""
        if publish.qos:
            publish.packet_id = self.session.next_id()
            self.session.unacknowledged[publish.packet_id] = publish
            if self._state != _CONNECTED:
                return publish.packet_id  # the CONNACK sends what is unacknowledged
        self._send(publish, now)
        return publish.packet_id

    def fits(self, publish: Publish) -> bool:
        """Whether the remote takes a packet this large (its 5.0 Maximum Packet Size), before
        :meth:`publish` gives it its packet identifier (two bytes, counted here)."""
        limit = self.remote_max_packet_size
        if limit is None:
            return True
        if publish.qos and not publish.packet_id:
            publish.packet_id = 1  # (any: the size is the same)
            try:
                return len(encode(publish, self.level)) <= limit
            finally:
                publish.packet_id = None
        return len(encode(publish, self.level)) <= limit

    def subscribe(self, subscriptions: list[tuple[str, SubscriptionOptions]], now: float) -> int:
        packet_id = self.session.next_id()
        self._send(Subscribe(packet_id, subscriptions), now)
        return packet_id

    def acknowledge(self, publish: Publish, now: float) -> None:
        """The caller holds a received QoS 1/2 message: PUBACK, or PUBREC (then PUBCOMP follows the
        remote's PUBREL by itself). On a later connection than the message's, the answer goes on
        this one, where the remote has sent the message again with the same identifier: the
        caller acknowledges nothing across a new session (QoS 2's are dropped here, as the
        session forgot them). Closed: the remote sends it again on the next connection."""
        packet_id = publish.packet_id
        if packet_id is None or not publish.qos:
            return
        if publish.qos == 2:
            if packet_id not in self.session.receiving:
                # A new session forgot it (or its PUBREL came): marked held, the identifier would
                # make the remote's next message with it a "resend", answered and never handed out.
                return
            self.session.receiving[packet_id] = True
        if self._state == _CONNECTED:
            self._send(PubAck(packet_id) if publish.qos == 1 else PubRec(packet_id), now)

    def disconnect(self, now: float, reason_code: int = 0) -> None:
        """A normal DISCONNECT (the remote drops a will then); closed after it."""
        if self._state == _CONNECTED:
            self._send(Disconnect(reason_code), now)
        self._close("disconnected")

    # -- inside -----------------------------------------------------------------------------------

    def _handle(self, packet: Packet) -> Event | None:
        if self._state == _CONNECTING:
            if not isinstance(packet, ConnAck):
                self._fail(0x82, f"the remote sent {type(packet).__name__} before its CONNACK")
                return None
            return self._connack(packet)
        if isinstance(packet, Publish):
            return self._received(packet)
        if isinstance(packet, PubAck):
            return self._acked(packet.packet_id, packet.reason_code)
        if isinstance(packet, PubRec):
            if packet.packet_id in self.session.released:
                self._send(PubRel(packet.packet_id), None)  # its PUBREL was lost: again
                return None
            event = self._acked(packet.packet_id, packet.reason_code)
            if event is not None and packet.reason_code < 0x80:
                self.session.released[packet.packet_id] = None
                self._send(PubRel(packet.packet_id), None)
            return event
        if isinstance(packet, PubComp):
            self.session.released.pop(packet.packet_id, None)
            return None
        if isinstance(packet, PubRel):
            self.session.receiving.pop(packet.packet_id, None)
            self._send(PubComp(packet.packet_id), None)
            return None
        if isinstance(packet, SubAck):
            return Subscribed(packet.packet_id, packet.reason_codes)
        if isinstance(packet, PingResp | UnsubAck):
            return None
        if isinstance(packet, Disconnect):
            text = packet.properties.reason_string
            self._close(
                f"the remote disconnected (reason code 0x{packet.reason_code:02X}"
                + (f": {text})" if text else ")")
            )
            return None
        self._fail(0x82, f"the remote sent {type(packet).__name__}, which a server never sends")
        return None

    def _connack(self, ack: ConnAck) -> Event | None:
        code = ack.reason_code
        if code:
            why = CONNACK_REASONS.get(code, "refused")
            text = ack.properties.reason_string
            self._pending.append(
                Closed(
                    f"the remote refused the connection: {why} (0x{code:02X})"
                    + (f", {text}" if text else ""),
                    True,
                )
            )
            self._state = _CLOSED
            return None
        props = ack.properties
        if self.level == MQTT_5:
            if props.receive_maximum is not None:
                self.max_inflight = min(self.max_inflight, props.receive_maximum)
            self.remote_max_packet_size = props.maximum_packet_size
            if props.maximum_qos is not None:
                self.remote_maximum_qos = props.maximum_qos
            if props.retain_available is not None:
                self.remote_retain_available = bool(props.retain_available)
            if props.server_keep_alive is not None:
                self.keep_alive = props.server_keep_alive
        if ack.session_present and self._connect.clean_start:
            self._fail(0x82, "the remote said it kept a session the client asked to start afresh")
            return None  # MQTT-3.2.2-4: the client closes
        self._state = _CONNECTED
        session = self.session
        if ack.session_present:
            # MQTT 4.4: resend what the remote may not have, in the order first sent.
            for publish in session.unacknowledged.values():
                publish.dup = True
                self._send(publish, None)
            for packet_id in session.released:
                self._send(PubRel(packet_id), None)
        else:
            # A new session: PUBRECed messages are the remote's; the rest are sent afresh.
            session.released.clear()
            session.receiving.clear()
            for publish in session.unacknowledged.values():
                publish.dup = False
                self._send(publish, None)
        return Connected(ack.session_present, props)

    def _received(self, publish: Publish) -> Event | None:
        if publish.qos == 2 and publish.packet_id is not None:
            receiving = self.session.receiving
            acknowledged = receiving.get(publish.packet_id)
            if acknowledged is not None:  # the same message again (DUP): never handed out twice
                if acknowledged:
                    self._send(PubRec(publish.packet_id), None)
                return None
            receiving[publish.packet_id] = False
        return Received(publish)

    def _acked(self, packet_id: int, reason_code: int) -> Event | None:
        if self.session.unacknowledged.pop(packet_id, None) is None:
            return None  # not ours (an answer to a message resent and acknowledged twice)
        return Acknowledged(packet_id, reason_code)

    def _send(self, packet: Packet, now: float | None) -> None:
        """Queue a packet; ``now`` None: the time of the caller's last call."""
        self._out += encode(packet, self.level)
        if now is not None:
            self._now = now
        self._last_sent = self._now

    def _fail(self, reason_code: int, why: str) -> None:
        if self._state == _CONNECTED and self.level == MQTT_5:
            self._send(Disconnect(reason_code), None)
        self._close(why)

    def _close(self, why: str, *, unanswered: bool = False) -> None:
        if self._state != _CLOSED:
            self._state = _CLOSED
            self._pending.append(Closed(why, unanswered=unanswered))
