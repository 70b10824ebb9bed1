"""A sans-IO AMQP 0-9-1 client on one channel: what a shovel speaks to another broker.

Bytes and ``now`` in, events and bytes out, as the server's machine (``connection.py``) and the MQTT
client (``mqtt/client.py``); the codec is the server's. No sockets, no clock: ``now`` is the
caller's monotonic time::

    conn = ClientConnection(ClientParams(username="guest", password="guest"), now)
    sock.sendall(conn.data_to_send())           # the protocol header
    conn.receive_data(sock.recv(65536), now)    # only buffers
    while (event := conn.next_event()) is not None:
        ...                                     # act on it (publish, ack ...) before the next
    sock.sendall(conn.data_to_send())
    # and conn.tick(now) whenever now reaches conn.next_deadline()

What it owns: the handshake (SASL PLAIN, or AMQPLAIN where PLAIN is not offered; tune; the vhost),
channel 1, opened by itself after connection.open-ok (:class:`Opened` follows channel.open-ok), the
replies to its requests in the order they were sent, the content assembler for deliveries and
returned messages, publisher confirms (each publish after :meth:`~ClientConnection.select_confirms`
gets the next sequence number; :attr:`~ClientConnection.unconfirmed` counts those not yet acked or
nacked), heartbeats both ways, the open deadline, and every close.

What it promises: events come one frame at a time, in the order the frames arrived, so bytes fed in
one piece or cut anywhere give the same events. :class:`Closed` comes exactly once per connection
and last: nothing is read after it, and ``data_to_send()`` holds the last bytes (a close-ok, or the
machine's own connection.close), to flush before the socket is closed. End of stream
(:meth:`~ClientConnection.receive_eof`) is taken after the frames already buffered. What the server
sent wrong (a frame that does not decode, content out of order, a reply nothing asked for, a frame
on a channel other than 0 and 1) is answered with connection.close (501 FRAME_ERROR, 502
SYNTAX_ERROR, 503 COMMAND_INVALID, 504 CHANNEL_ERROR, 505 UNEXPECTED_FRAME) and reported at once.
The caller's mistakes (a request before :class:`Opened`, a value that cannot be encoded) raise
:class:`~trimaran.amqp091.spec.LocalProtocolError` and send nothing; requests after the connection
began to close are dropped quietly (the :class:`Closed` event says what became of it).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Final, cast

from trimaran import __version__
from trimaran.amqp091.fields import FieldTable, encode_table_contents
from trimaran.amqp091.frames import (
    HEARTBEAT_FRAME,
    NEED_DATA,
    BodyFrame,
    FrameDecoder,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    write_content,
    write_method,
)
from trimaran.amqp091.properties import BASIC_CLASS_ID, BasicProperties
from trimaran.amqp091.spec import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_END,
    FRAME_ERROR,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    PROTOCOL_HEADER,
    REPLY_CODES,
    REPLY_SUCCESS,
    UNEXPECTED_FRAME,
    BasicAck,
    BasicCancel,
    BasicCancelOk,
    BasicConsume,
    BasicConsumeOk,
    BasicDeliver,
    BasicNack,
    BasicPublish,
    BasicQos,
    BasicQosOk,
    BasicReject,
    BasicReturn,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelFlowOk,
    ChannelOpen,
    ChannelOpenOk,
    ConfirmSelect,
    ConfirmSelectOk,
    ConnectionBlocked,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ConnectionUnblocked,
    EncodeError,
    LocalProtocolError,
    Method,
    ProtocolError,
    QueueBind,
    QueueBindOk,
    QueueDeclare,
    QueueDeclareOk,
    truncate_shortstr,
)

#: Channels announced in tune-ok when the server sets no lower limit (only channel 1 is used).
CHANNEL_MAX: Final = 2047
#: Seconds the server is given to answer our connection.close with close-ok.
CLOSE_TIMEOUT: Final = 5.0
#: The largest frame read before tune when ``frame_max`` is 0 (the spec's floor is 4,096).
_HANDSHAKE_FRAME_MAX: Final = 131072
CAPABILITIES: Final[FieldTable] = {
    "publisher_confirms": True,
    "consumer_cancel_notify": True,
    "basic.nack": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
}
_CHANNEL: Final = 1
# basic.ack as one pack: frame type, channel, size, method index, delivery tag, bits, frame end.
_ACK_FRAME: Final = struct.Struct(">BHIIQBB")
_ACK_INDEX: Final = BasicAck.INDEX
_ACK_SIZE: Final = 4 + 8 + 1

# Connection states, in the order they are passed through.
_START, _TUNE, _OPEN_OK, _CHANNEL_OK, _OPEN, _CLOSING, _CLOSED = range(7)


@dataclass(frozen=True, slots=True)
class ClientParams:
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    #: Requested seconds; the negotiated value is the lower of both non-zero values (0 on one side:
    #: the other's).
    heartbeat: int = 60
    #: Requested; negotiated down to the server's (0: no limit of ours).
    frame_max: int = 131072
    #: The client property RabbitMQ's management UI shows.
    connection_name: str | None = None
    #: Seconds from the machine's construction until :class:`Opened`, else :class:`Closed`.
    connect_timeout: float = 10.0


# -- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Opened:
    """Connection and channel 1 are open; requests may be made."""

    server_properties: dict[str, object]
    frame_max: int
    heartbeat: int
    channel_max: int


@dataclass(frozen=True, slots=True)
class QueueDeclared:
    queue: str
    message_count: int
    consumer_count: int


@dataclass(frozen=True, slots=True)
class QueueBound:
    queue: str


@dataclass(frozen=True, slots=True)
class QosSet:
    prefetch_count: int


@dataclass(frozen=True, slots=True)
class ConsumeStarted:
    consumer_tag: str


@dataclass(frozen=True, slots=True)
class ConfirmsSelected:
    pass


@dataclass(frozen=True, slots=True)
class Delivered:
    """A message for the consumer; unless it consumes with ``no_ack``, settle it with
    :meth:`~ClientConnection.ack`, ``nack`` or ``reject`` by ``delivery_tag``."""

    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: BasicProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The broker's basic.ack (``ok``) or basic.nack of publish ``sequence``; ``multiple``: of
    every sequence up to it not confirmed before."""

    sequence: int
    multiple: bool
    ok: bool


@dataclass(frozen=True, slots=True)
class Returned:
    """A mandatory publish the broker could not route, given back (its confirm follows)."""

    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str
    properties: BasicProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class Blocked:
    """RabbitMQ stops reading this connection while it publishes (a resource alarm); may come
    before :class:`Opened`, as the server sends it once tune is done."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unblocked:
    pass


@dataclass(frozen=True, slots=True)
class ConsumerCancelled:
    """The broker cancelled the consumer (its queue was deleted); answered with cancel-ok."""

    consumer_tag: str


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection is over, the last event. ``reason`` in words for the log (a close's code name,
    code and text: ``"NOT_FOUND 404: no queue 'q' in vhost '/'"``); ``reply_code``: the close's,
    None where no close was exchanged (end of stream, time-outs); ``by_peer``: the server (or the
    network) ended it."""

    reason: str
    reply_code: int | None
    by_peer: bool


Event = (
    Opened
    | QueueDeclared
    | QueueBound
    | QosSet
    | ConsumeStarted
    | ConfirmsSelected
    | Delivered
    | Confirmed
    | Returned
    | Blocked
    | Unblocked
    | ConsumerCancelled
    | Closed
)


def client_properties(connection_name: str | None = None) -> FieldTable:
    props: FieldTable = {
        "product": "Trimaran",
        "version": __version__,
        "platform": "Python",
        "capabilities": dict(CAPABILITIES),
    }
    if connection_name is not None:
        props["connection_name"] = connection_name
    return props


def _negotiate(ours: int, theirs: int) -> int:
    """The lower of two non-zero values; where one is 0, the other."""
    return min(ours, theirs) if ours and theirs else ours or theirs


def describe_close(reply_code: int, reply_text: str) -> str:
    """``"NOT_FOUND 404: no queue 'q'"`` from RabbitMQ's ``"NOT_FOUND - no queue 'q'"``."""
    known = REPLY_CODES.get(reply_code)
    name = known.text if known is not None else "reply code"
    text = reply_text.removeprefix(f"{name} - ")
    return f"{name} {reply_code}: {text}" if text else f"{name} {reply_code}"


class ClientConnection:
    """One connection of an AMQP 0-9-1 client, and its channel 1. See the module docstring."""

    def __init__(self, params: ClientParams, now: float) -> None:
        if params.frame_max and not FRAME_MIN_SIZE <= params.frame_max <= 0xFFFFFFFF:
            raise ValueError(f"frame_max must be 0 or from {FRAME_MIN_SIZE} to 2**32 - 1")
        if not 0 <= params.heartbeat <= 0xFFFF:
            raise ValueError("heartbeat must be from 0 to 65535 seconds")
        self.params = params
        #: Negotiated in tune (the requested values until then).
        self.frame_max = params.frame_max
        self.heartbeat = 0
        self.channel_max = 0
        self.server_properties: dict[str, object] = {}
        self._state = _START
        self._decoder = FrameDecoder(params.frame_max or _HANDSHAKE_FRAME_MAX)
        self._out = bytearray(PROTOCOL_HEADER)
        self._events: deque[Event] = deque()
        self._eof = False
        self._eof_why: str | None = None
        self._now = now  # the caller's time at its last call: when queued bytes are taken
        self._last_received = now
        self._last_sent = now
        self._open_by = now + params.connect_timeout
        self._close_by = 0.0
        self._own_close = (REPLY_SUCCESS, "")  # the connection.close we sent (state _CLOSING)
        self._blocked = False
        # The replies awaited on channel 1, in the order asked: (reply class, what the event needs).
        self._replies: deque[tuple[type[Method], object]] = deque()
        # The content being assembled: its method, then from its header the properties and size.
        self._content: BasicDeliver | BasicReturn | None = None
        self._properties: BasicProperties | None = None
        self._body_size = 0
        self._received = 0
        self._chunks: list[bytes] = []
        # Publisher confirms: the last sequence number given, every one below _low confirmed, and
        # those above it confirmed one by one ahead of it.
        self._confirming = False
        self._published = 0
        self._low = 1
        self._ahead: set[int] = set()

    # -- state ------------------------------------------------------------------------------------

    @property
    def opened(self) -> bool:
        """:class:`Opened` has been produced and the connection is not closing nor closed."""
        return self._state == _OPEN

    @property
    def closed(self) -> bool:
        """:class:`Closed` has been produced (or is queued): nothing more is read."""
        return self._state == _CLOSED

    @property
    def blocked(self) -> bool:
        """The server sent connection.blocked and not yet connection.unblocked."""
        return self._blocked

    @property
    def unconfirmed(self) -> int:
        """Publishes sent in confirm mode and neither acked nor nacked yet."""
        return self._published - self._low + 1 - len(self._ahead)

    # -- bytes in, events out ---------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> None:
        """Buffer bytes from the socket (any byte counts as the server's heartbeat); ``next_event``
        parses them."""
        if self._state == _CLOSED or self._eof or not data:
            return
        self._now = self._last_received = now
        self._decoder.feed(data)

    def receive_eof(self, why: str | None = None) -> None:
        """The socket ended; ``why``: the socket's words for it, if it said more than EOF.
        :class:`Closed` follows the events of the frames already buffered; a second call, or one
        after :class:`Closed`, does nothing."""
        if not self._eof:
            self._eof = True
            self._eof_why = why

    def next_event(self) -> Event | None:
        """The next event, parsing frames only while none is ready; None when no whole frame is
        buffered."""
        events = self._events
        while not events:
            if self._state == _CLOSED:
                return None
            try:
                frame = self._decoder.next_frame()
                if frame is NEED_DATA:
                    if not self._eof:
                        return None
                    self._lost()
                    continue
                self._on_frame(frame)
            except ProtocolError as exc:
                self._protocol_error(exc)
        return events.popleft()

    def data_to_send(self) -> bytes:
        """Everything queued since the last call (b"" if nothing). The bytes count as sent at the
        caller's last ``now`` (of ``receive_data``, ``tick`` or ``close``): a time older than the
        real one only brings the next heartbeat forward."""
        out = self._out
        if not out:
            return b""
        data = bytes(out)
        out.clear()
        self._last_sent = self._now
        return data

    # -- time -------------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest ``now`` at which :meth:`tick` has something to do: the open deadline until
        :class:`Opened`, a heartbeat due (half the heartbeat after the last bytes taken), the
        server's heartbeats overdue (twice the heartbeat after its last bytes), close-ok overdue."""
        state = self._state
        if state == _CLOSED:
            return None
        if state == _CLOSING:
            return self._close_by
        deadline = self._open_by if state != _OPEN else None
        hb = self.heartbeat
        if hb and state >= _OPEN_OK:
            beat = min(self._last_sent + hb / 2, self._last_received + 2 * hb)
            deadline = beat if deadline is None else min(deadline, beat)
        return deadline

    def tick(self, now: float) -> None:
        """Handle what is due at ``now``: the open deadline, a heartbeat frame out after half the
        heartbeat of sending nothing, :class:`Closed` after twice the heartbeat of receiving
        nothing, and after :data:`CLOSE_TIMEOUT` seconds without close-ok."""
        self._now = now
        state = self._state
        if state == _CLOSED:
            return
        if state == _CLOSING:
            if now >= self._close_by:
                code, text = self._own_close
                self._finish(f"{text or 'closed'} (no close-ok from the server in time)", code, False)
            return
        if state != _OPEN and now >= self._open_by:
            self._finish(f"timed out opening the connection ({self.params.connect_timeout:g} s)", None, False)
            return
        hb = self.heartbeat
        if not hb or state < _OPEN_OK:
            return
        if now - self._last_received >= 2 * hb:
            self._finish(f"missed heartbeats: nothing from the server in {2 * hb} s", None, False)
        elif not self._out and now - self._last_sent >= hb / 2:
            self._out += HEARTBEAT_FRAME

    # -- the caller's calls -----------------------------------------------------------------------

    def close(self, now: float, reply_code: int = REPLY_SUCCESS, reply_text: str = "") -> None:
        """Send connection.close; :class:`Closed` when close-ok comes (or end of stream, or after
        :data:`CLOSE_TIMEOUT`). Before tune-ok has been sent there is nothing to close: Closed at
        once, and the caller drops the socket."""
        self._now = now
        state = self._state
        if state >= _CLOSING:
            return
        if state <= _TUNE:
            self._finish(reply_text or "closed before the connection was open", None, False)
            return
        reply_text = truncate_shortstr(reply_text)
        self._send(0, ConnectionClose(reply_code, reply_text, 0, 0))
        self._state = _CLOSING
        self._own_close = (reply_code, reply_text)
        self._close_by = now + CLOSE_TIMEOUT
        self._reset_content()
        self._replies.clear()

    def declare_queue(
        self,
        queue: str,
        *,
        passive: bool = False,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, object] | None = None,
    ) -> None:
        """queue.declare; :class:`QueueDeclared` answers it (a passive declare of a missing queue:
        the server closes the channel, so :class:`Closed`)."""
        table = cast("FieldTable", arguments or {})
        self._request(
            QueueDeclare(0, queue, passive, durable, exclusive, auto_delete, False, table), QueueDeclareOk
        )

    def bind_queue(
        self, queue: str, exchange: str, routing_key: str, arguments: dict[str, object] | None = None
    ) -> None:
        """queue.bind; :class:`QueueBound` answers it."""
        table = cast("FieldTable", arguments or {})
        self._request(QueueBind(0, queue, exchange, routing_key, False, table), QueueBindOk, queue)

    def qos(self, prefetch_count: int) -> None:
        """basic.qos for the channel's consumers; :class:`QosSet` answers it."""
        self._request(BasicQos(0, prefetch_count, False), BasicQosOk, prefetch_count)

    def consume(
        self, queue: str, *, no_ack: bool = False, consumer_tag: str = "", exclusive: bool = False
    ) -> None:
        """basic.consume; :class:`ConsumeStarted` answers it (with the server's tag if none given),
        then :class:`Delivered` for each message."""
        self._request(
            BasicConsume(0, queue, consumer_tag, False, no_ack, exclusive, False, {}), BasicConsumeOk
        )

    def select_confirms(self) -> None:
        """confirm.select; :class:`ConfirmsSelected` answers it. Every publish from now on gets the
        next sequence number, 1 first, and a :class:`Confirmed` in time."""
        if self._request(ConfirmSelect(False), ConfirmSelectOk):
            self._confirming = True

    def publish(
        self,
        exchange: str,
        routing_key: str,
        properties: BasicProperties,
        body: bytes,
        *,
        mandatory: bool = False,
    ) -> int:
        """basic.publish, its content header and its body in frames of at most ``frame_max``. Returns
        the publish's sequence number in confirm mode, else 0 (0 too once closing: not sent)."""
        if self._state != _OPEN:
            self._check_opened()
            return 0
        method = BasicPublish(0, exchange, routing_key, mandatory, False)
        write_content(self._out, _CHANNEL, method, properties, body, self.frame_max)
        if self._confirming:
            self._published += 1
            return self._published
        return 0

    def ack(self, delivery_tag: int, *, multiple: bool = False) -> None:
        if self._state != _OPEN:
            self._check_opened()
            return
        try:
            self._out += _ACK_FRAME.pack(
                FRAME_METHOD, _CHANNEL, _ACK_SIZE, _ACK_INDEX, delivery_tag, 1 if multiple else 0, FRAME_END
            )
        except struct.error as exc:
            raise EncodeError(f"cannot encode basic.ack of delivery tag {delivery_tag!r}: {exc}") from exc

    def nack(self, delivery_tag: int, *, multiple: bool = False, requeue: bool = True) -> None:
        if self._state != _OPEN:
            self._check_opened()
            return
        write_method(self._out, _CHANNEL, BasicNack(delivery_tag, multiple, requeue))

    def reject(self, delivery_tag: int, *, requeue: bool = True) -> None:
        if self._state != _OPEN:
            self._check_opened()
            return
        write_method(self._out, _CHANNEL, BasicReject(delivery_tag, requeue))

    def _request(self, method: Method, reply: type[Method], argument: object = None) -> bool:
        """Send a synchronous method on channel 1 and await ``reply``; False: closing, not sent."""
        if self._state != _OPEN:
            self._check_opened()
            return False
        write_method(self._out, _CHANNEL, method)
        self._replies.append((reply, argument))
        return True

    def _check_opened(self) -> None:
        """Raise for a request before :class:`Opened`; one after the close began is dropped."""
        if self._state < _OPEN:
            raise LocalProtocolError("the connection is not open yet: wait for Opened")

    # -- frames -----------------------------------------------------------------------------------

    def _on_frame(self, frame: MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame) -> None:
        state = self._state
        if state == _OPEN and frame.channel == _CHANNEL:
            # The usual case: a delivery's three frames, a confirm.
            if type(frame) is MethodFrame:
                if self._content is not None:
                    raise self._unexpected(frame.method.NAME)
                self._channel_method(frame.method)
            elif type(frame) is HeaderFrame:
                self._on_header(frame)
            elif type(frame) is BodyFrame:
                self._on_body(frame)
            return
        if type(frame) is HeartbeatFrame:
            return
        if state == _CLOSING:
            self._closing_frame(frame)
            return
        channel = frame.channel
        if type(frame) is not MethodFrame:
            if channel == 0:
                raise ProtocolError(UNEXPECTED_FRAME, "content frame on channel 0")
        elif channel == 0:
            self._connection_method(frame.method)
            return
        elif channel == _CHANNEL and state == _CHANNEL_OK:
            method = frame.method
            if isinstance(method, ChannelOpenOk):
                self._state = _OPEN
                self._events.append(
                    Opened(self.server_properties, self.frame_max, self.heartbeat, self.channel_max)
                )
                return
            if isinstance(method, ChannelClose):
                self._channel_closed(method)
                return
            raise ProtocolError(
                COMMAND_INVALID,
                f"{method.NAME} on channel 1 before channel.open-ok",
                channel=channel,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        raise ProtocolError(CHANNEL_ERROR, f"frame on channel {channel}, which is not open", channel=channel)

    def _connection_method(self, method: Method) -> None:
        state = self._state
        if isinstance(method, ConnectionClose):
            self._send(0, ConnectionCloseOk())
            reason = describe_close(method.reply_code, method.reply_text)
            if state == _TUNE and method.reply_code == ACCESS_REFUSED:
                reason = f"authentication failed: {reason}"
            self._finish(reason, method.reply_code, True)
        elif state == _START and isinstance(method, ConnectionStart):
            self._on_start(method)
        elif state == _TUNE and isinstance(method, ConnectionTune):
            self._on_tune(method)
        elif state == _OPEN_OK and isinstance(method, ConnectionOpenOk):
            self._send(_CHANNEL, ChannelOpen())
            self._state = _CHANNEL_OK
        elif state >= _OPEN_OK and isinstance(method, ConnectionBlocked):
            self._blocked = True
            self._events.append(Blocked(method.reason))
        elif state >= _OPEN_OK and isinstance(method, ConnectionUnblocked):
            self._blocked = False
            self._events.append(Unblocked())
        else:
            raise ProtocolError(
                COMMAND_INVALID,
                f"{method.NAME} not expected on channel 0 here",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )

    def _on_start(self, start: ConnectionStart) -> None:
        if (start.version_major, start.version_minor) != (0, 9):
            self._finish(
                f"the server speaks AMQP {start.version_major}-{start.version_minor}, not 0-9-1", None, False
            )
            return
        self.server_properties = cast("dict[str, object]", start.server_properties)
        params = self.params
        offered = start.mechanisms.split()
        if b"PLAIN" in offered:
            mechanism = "PLAIN"
            response = f"\x00{params.username}\x00{params.password}".encode()
        elif b"AMQPLAIN" in offered:
            mechanism = "AMQPLAIN"
            response = encode_table_contents({"LOGIN": params.username, "PASSWORD": params.password})
        else:
            names = start.mechanisms.decode("utf-8", "replace") or "none"
            self._finish(
                f"the server offers neither PLAIN nor AMQPLAIN authentication ({names})", None, False
            )
            return
        props = client_properties(params.connection_name)
        self._send(0, ConnectionStartOk(props, mechanism, response, "en_US"))
        self._state = _TUNE

    def _on_tune(self, tune: ConnectionTune) -> None:
        params = self.params
        self.channel_max = min(tune.channel_max, CHANNEL_MAX) if tune.channel_max else CHANNEL_MAX
        self.frame_max = _negotiate(params.frame_max, tune.frame_max)
        self.heartbeat = _negotiate(params.heartbeat, tune.heartbeat)
        self._decoder.frame_max = self.frame_max
        self._send(0, ConnectionTuneOk(self.channel_max, self.frame_max, self.heartbeat))
        self._send(0, ConnectionOpen(params.vhost))
        self._state = _OPEN_OK

    def _channel_method(self, method: Method) -> None:
        if type(method) is BasicDeliver or type(method) is BasicReturn:
            self._content = method
        elif type(method) is BasicAck:
            self._confirm(method.delivery_tag, method.multiple, True)
        elif type(method) is BasicNack:
            self._confirm(method.delivery_tag, method.multiple, False)
        elif self._replies and type(method) is self._replies[0][0]:
            self._reply(method, self._replies.popleft()[1])
        elif isinstance(method, ChannelClose):
            self._channel_closed(method)
        elif isinstance(method, BasicCancel):
            if not method.no_wait:
                self._send(_CHANNEL, BasicCancelOk(method.consumer_tag))
            self._events.append(ConsumerCancelled(method.consumer_tag))
        elif isinstance(method, ChannelFlow):
            self._send(_CHANNEL, ChannelFlowOk(method.active))
        else:
            awaited = f"; awaiting {self._replies[0][0].NAME}" if self._replies else ""
            raise ProtocolError(
                COMMAND_INVALID,
                f"unexpected {method.NAME} on channel 1{awaited}",
                channel=_CHANNEL,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )

    def _reply(self, method: Method, argument: object) -> None:
        events = self._events
        if isinstance(method, QueueDeclareOk):
            events.append(QueueDeclared(method.queue, method.message_count, method.consumer_count))
        elif isinstance(method, QueueBindOk):
            events.append(QueueBound(cast(str, argument)))
        elif isinstance(method, BasicQosOk):
            events.append(QosSet(cast(int, argument)))
        elif isinstance(method, BasicConsumeOk):
            events.append(ConsumeStarted(method.consumer_tag))
        else:
            events.append(ConfirmsSelected())

    def _confirm(self, sequence: int, multiple: bool, ok: bool) -> None:
        if not self._confirming or sequence > self._published:
            name = "basic.ack" if ok else "basic.nack"
            raise ProtocolError(
                COMMAND_INVALID,
                f"{name} of publish {sequence}, but {self._published} were published in confirm mode",
                channel=_CHANNEL,
            )
        low = self._low
        ahead = self._ahead
        if multiple:
            if sequence == 0:  # "everything outstanding"
                sequence = self._published
            if sequence < low:
                return  # all confirmed already
            low = sequence + 1
            if ahead:
                ahead.difference_update([s for s in ahead if s <= sequence])
        elif sequence == low:
            low += 1
        elif sequence > low and sequence not in ahead:
            ahead.add(sequence)
        else:
            return  # confirmed before: no second event
        while ahead and low in ahead:
            ahead.remove(low)
            low += 1
        self._low = low
        self._events.append(Confirmed(sequence, multiple, ok))

    # -- content ----------------------------------------------------------------------------------

    def _on_header(self, frame: HeaderFrame) -> None:
        method = self._content
        if method is None or self._properties is not None:
            raise self._unexpected("a content header")
        if frame.class_id != BASIC_CLASS_ID:
            raise self._unexpected(f"a content header of class {frame.class_id}")
        if frame.body_size == 0:
            self._reset_content()
            self._content_done(method, frame.properties, b"")
            return
        self._properties = frame.properties
        self._body_size = frame.body_size
        self._received = 0

    def _on_body(self, frame: BodyFrame) -> None:
        properties = self._properties
        method = self._content
        if properties is None or method is None:
            raise self._unexpected("a content body")
        payload = frame.payload
        received = self._received + len(payload)
        if received < self._body_size:
            self._chunks.append(payload)
            self._received = received
            return
        if received > self._body_size:
            raise ProtocolError(
                FRAME_ERROR,
                f"content body of {received} bytes exceeds the announced {self._body_size}",
                channel=_CHANNEL,
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        chunks = self._chunks
        if chunks:
            chunks.append(payload)
            payload = b"".join(chunks)
        self._reset_content()
        self._content_done(method, properties, payload)

    def _content_done(
        self, method: BasicDeliver | BasicReturn, properties: BasicProperties, body: bytes
    ) -> None:
        if type(method) is BasicDeliver:
            self._events.append(
                Delivered(
                    method.consumer_tag,
                    method.delivery_tag,
                    method.redelivered,
                    method.exchange,
                    method.routing_key,
                    properties,
                    body,
                )
            )
        else:
            returned = cast(BasicReturn, method)
            self._events.append(
                Returned(
                    returned.reply_code,
                    returned.reply_text,
                    returned.exchange,
                    returned.routing_key,
                    properties,
                    body,
                )
            )

    def _reset_content(self) -> None:
        self._content = None
        self._properties = None
        self._body_size = self._received = 0
        if self._chunks:
            self._chunks = []

    def _unexpected(self, what: str) -> ProtocolError:
        if self._content is None:
            expected = "a method frame"
        elif self._properties is None:
            expected = "a content header"
        else:
            expected = "a content body"
        return ProtocolError(
            UNEXPECTED_FRAME, f"expected {expected}, got {what} on channel 1", channel=_CHANNEL
        )

    # -- closing ----------------------------------------------------------------------------------

    def _closing_frame(self, frame: MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame) -> None:
        """While our connection.close is outstanding only close-ok (or a crossing close) counts."""
        if frame.channel or type(frame) is not MethodFrame:
            return
        method = frame.method
        if isinstance(method, ConnectionClose):
            self._send(0, ConnectionCloseOk())
            self._finish(describe_close(method.reply_code, method.reply_text), method.reply_code, True)
        elif isinstance(method, ConnectionCloseOk):
            code, text = self._own_close
            self._finish(text or "closed", code, False)

    def _channel_closed(self, close: ChannelClose) -> None:
        """The server closed channel 1, the only one: close-ok, then the connection goes too."""
        self._send(_CHANNEL, ChannelCloseOk())
        self._send(0, ConnectionClose(REPLY_SUCCESS, "channel 1 closed by the server", 0, 0))
        self._finish(describe_close(close.reply_code, close.reply_text), close.reply_code, True)

    def _protocol_error(self, exc: ProtocolError) -> None:
        state = self._state
        if state == _CLOSED:
            return
        if state == _START and self._decoder.unconsumed().startswith(b"AMQP"):
            header = self._decoder.unconsumed()[:8]
            self._finish(
                f"the server refused AMQP 0-9-1: it answered with protocol header {header!r}", None, True
            )
            return
        if state != _CLOSING:
            self._send(0, ConnectionClose(exc.reply_code, exc.full_text, exc.class_id, exc.method_id))
        self._finish(
            f"protocol error: {describe_close(exc.reply_code, exc.full_text)}", exc.reply_code, False
        )

    def _lost(self) -> None:
        """End of stream, after every buffered frame."""
        why = self._eof_why
        state = self._state
        if state == _CLOSING:
            code, text = self._own_close
            self._finish(text or "closed", code, False)
        elif state == _TUNE:
            self._finish(
                "authentication failed: the server closed the connection after connection.start-ok"
                + (f" ({why})" if why else ""),
                None,
                True,
            )
        elif state == _START:
            self._finish(why or "the server closed the connection before connection.start", None, True)
        else:
            self._finish(why or "connection lost", None, True)

    def _finish(self, reason: str, reply_code: int | None, by_peer: bool) -> None:
        if self._state == _CLOSED:
            return
        self._state = _CLOSED
        self._reset_content()
        self._replies.clear()
        self._decoder = FrameDecoder(0)
        self._events.append(Closed(reason, reply_code, by_peer))

    def _send(self, channel: int, method: Method) -> None:
        write_method(self._out, channel, method)
