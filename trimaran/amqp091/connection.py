"""Sans-IO server side of an AMQP 0-9-1 connection, in the style of h11.

Bytes in, events out, bytes to send out; no sockets and no clock: times come from the caller
(``now``, one monotonic clock throughout). It implements the runtime's machine surface
(:class:`trimaran.runtime.machine.Machine`)::

    conn = ServerConnection(now=now)
    conn.receive_data(data, now)              # only buffers
    while (event := conn.next_event()) is not None:
        ...                                   # act on it before the next frame is read
    sock.sendall(conn.data_to_send())

``next_event()`` parses frames only while no event is ready, so the caller acts on each frame before
a later one changes the machine: a method followed by channel.close in the same read is answered
before the channel goes. Everything the machine produces, including what the caller's own calls
cause (``reject_authentication``, ``close``), comes out of ``next_event()``; the event classes are in
:mod:`trimaran.amqp091.events`.

What the machine does by itself: protocol header check (a wrong header is answered with ours and
the connection ends), connection.start with our properties and capabilities, SASL response
parsing for PLAIN and AMQPLAIN, tune negotiation, the vhost check, channel open/close/close-ok,
channel.flow, connection.close/close-ok in both directions, heartbeats (see :meth:`tick`), the
content assembler, and every protocol error: a channel exception sends channel.close and discards
that channel's frames until close-ok; a connection exception sends connection.close and then
accepts only close-ok (or close).

What it leaves to the caller: the credential check (:class:`AuthenticationRequested` ->
:meth:`~ServerConnection.accept_authentication` / ``reject_authentication`` / ``send_challenge``),
and every method of the exchange/queue/basic/confirm/tx classes (:class:`MethodReceived`,
:class:`ContentReceived`), answered with :meth:`~ServerConnection.send_method` /
:meth:`~ServerConnection.send_content`, or refused with :meth:`~ServerConnection.close_channel` /
:meth:`~ServerConnection.close` / :meth:`~ServerConnection.raise_error`.
"""

import enum
import platform
from collections import deque
from collections.abc import Callable, Collection, Mapping
from typing import Final

from trimaran import __version__
from trimaran.amqp091.channel import DEFAULT_MAX_BODY_SIZE, Channel, ChannelState, ContentState
from trimaran.amqp091.events import (
    AuthenticationRequested,
    ChannelClosed,
    ChannelFlowChanged,
    ChannelOpened,
    ConnectionClosed,
    ConnectionClosing,
    ConnectionOpened,
    ConnectionTuned,
    ContentReceived,
    ContentRun,
    Event,
    HeartbeatTimeout,
    MethodReceived,
    ProtocolHeaderRejected,
    SecureOkReceived,
)
from trimaran.amqp091.fields import FieldTable, FieldValue, decode_table_contents
from trimaran.amqp091.frames import (
    HEARTBEAT_FRAME,
    NEED_DATA,
    BodyFrame,
    FrameDecoder,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    ProtocolHeader,
    classify_protocol_header,
    write_content,
    write_delivery,
    write_method,
)
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp091.spec import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    FRAME_MIN_SIZE,
    NOT_ALLOWED,
    PROTOCOL_HEADER,
    REPLY_CODES,
    REPLY_SUCCESS,
    UNEXPECTED_FRAME,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelFlowOk,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionSecure,
    ConnectionSecureOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ConnectionUpdateSecret,
    LocalProtocolError,
    Method,
    ProtocolError,
    truncate_shortstr,
)
from trimaran.runtime.machine import Machine


class ConnectionState(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    #: AuthenticationRequested/SecureOkReceived emitted; waiting for the caller's decision.
    AUTHENTICATING = "authenticating"
    AWAIT_SECURE_OK = "await-secure-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    #: We sent connection.close; only close-ok (or close) is processed.
    CLOSING = "closing"
    CLOSED = "closed"


CAPABILITIES: FieldTable = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}


def default_server_properties() -> FieldTable:
    return {
        "product": "Trimaran",
        "version": __version__,
        "platform": f"Python {platform.python_version()}",
        "information": "Multi-protocol messaging server",
        "capabilities": dict(CAPABILITIES),
    }


# Shared by every connection built without overrides: idle connections should not each hold one.
_DEFAULT_SERVER_PROPERTIES = default_server_properties()
#: The channel states every publish and delivery asks about: compiled, a Final is read from a C
#: static rather than looked up in the module and then on the enum class each time.
_OPEN: Final = ChannelState.OPEN
_AWAIT_METHOD: Final = ContentState.AWAIT_METHOD
#: The most publishes one ContentRun carries: what is routed at once, and what a publisher's burst
#: costs the loop before anything else on it runs.
RUN_MAX: Final = 128


def _parse_plain(response: bytes) -> tuple[str, str] | None:
    parts = response.split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        return parts[1].decode("utf-8"), parts[2].decode("utf-8")
    except UnicodeDecodeError:
        return None


def _parse_amqplain(response: bytes) -> tuple[str, str] | None:
    try:
        table = decode_table_contents(response)
    except ProtocolError:
        return None
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    out = []
    for value in (login, password):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if not isinstance(value, str):
            return None
        out.append(value)
    return out[0], out[1]


class ServerConnection(Machine):
    """Server side of one AMQP 0-9-1 connection. See the module docstring."""

    def __init__(
        self,
        *,
        virtual_hosts: Collection[str] | None = ("/",),
        mechanisms: Collection[str] = ("PLAIN", "AMQPLAIN"),
        locales: Collection[str] = ("en_US",),
        channel_max: int = 2047,
        frame_max: int = 131072,
        heartbeat: int = 60,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        server_properties: Mapping[str, FieldValue] | None = None,
        close_timeout: float = 5.0,
        handshake_timeout: float | None = None,
        max_packet_size_unauthenticated: int = 65536,
        now: float,
    ) -> None:
        """
        :param virtual_hosts: vhosts connection.open may name; ``None`` accepts any.
        :param mechanisms: SASL mechanisms offered, in order of preference.
        :param channel_max, frame_max, heartbeat: what connection.tune proposes (0 = no limit /
            no heartbeat). The client may lower channel_max and frame_max (asking for more is
            530 NOT_ALLOWED); its heartbeat value is taken as is, as RabbitMQ does.
        :param max_body_size: a larger content body is refused with 406 PRECONDITION_FAILED.
        :param server_properties: merged over :func:`default_server_properties` (a
            ``capabilities`` table given here is merged into ours).
        :param close_timeout: seconds to wait for connection.close-ok before giving up.
        :param handshake_timeout: seconds from ``now`` until connection.open must have arrived
            (``None``: no limit); then the connection just ends, as RabbitMQ's does.
        :param max_packet_size_unauthenticated: the largest frame accepted before the login is
            accepted (RabbitMQ's ``max_packet_size_unauthenticated``): a stranger cannot make the
            server buffer a large frame. 0: up to ``frame_max``.
        :param now: the caller's monotonic time at the start of the connection.
        """
        if frame_max and frame_max < FRAME_MIN_SIZE:
            raise ValueError(f"frame_max must be 0 or at least {FRAME_MIN_SIZE}")
        self._virtual_hosts = None if virtual_hosts is None else frozenset(virtual_hosts)
        # Set by the front end: why connection.open may not enter a vhost (None: it may).
        self.admit: Callable[[str], str | None] | None = None
        self._mechanisms = tuple(mechanisms)
        self._locales = tuple(locales)
        self._server_channel_max = channel_max
        self._server_frame_max = frame_max
        self._server_heartbeat = heartbeat
        self._max_body_size = max_body_size
        self._close_timeout = close_timeout
        props = _DEFAULT_SERVER_PROPERTIES
        if server_properties:
            props = default_server_properties()
            extra = dict(server_properties)
            caps = extra.pop("capabilities", None)
            props.update(extra)
            if isinstance(caps, dict):
                props["capabilities"] = {**CAPABILITIES, **caps}
        self._server_properties = props

        self.state = ConnectionState.AWAIT_HEADER
        #: Negotiated values (the proposals until connection.tune-ok arrives).
        self.channel_max = channel_max or 65535
        self.frame_max = frame_max
        self.heartbeat = 0
        self.virtual_host: str | None = None
        self.client_properties: FieldTable = {}
        self.mechanism: str | None = None
        #: The reason of the connection.close we sent, if any.
        self.close_reason: tuple[int, str, int, int] | None = None

        self._header = b""
        # Before the login is accepted, frames up to max_packet_size_unauthenticated; then, until
        # tune-ok, up to our own frame_max (the spec's 4096 is a floor; large PLAIN responses such
        # as OAuth tokens need more).
        limit = max_packet_size_unauthenticated
        self._decoder = FrameDecoder(min(limit, frame_max) if limit and frame_max else limit or frame_max)
        self._decoder_broken = False
        self._channels: dict[int, Channel] = {}
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self._eof = False  # the peer closed its side: end once the buffered frames are taken
        self._close_ok_due = False  # the peer's connection.close was handed out: close-ok next
        self._peer_closes = False  # close-ok sent to the peer's close: the socket is its to close
        self._now = now
        self._last_received = now
        self._last_sent = now
        self._closing_since: float | None = None
        self._handshake_until = None if handshake_timeout is None else now + handshake_timeout

    # -- introspection -------------------------------------------------------------------------

    @property
    def client_capabilities(self) -> FieldTable:
        caps = self.client_properties.get("capabilities")
        return caps if isinstance(caps, dict) else {}

    @property
    def server_properties(self) -> FieldTable:
        """What connection.start announces (shared between connections: do not mutate)."""
        return self._server_properties

    @property
    def open_channels(self) -> list[int]:
        """Channels usable for sending (open, not closing)."""
        return [n for n, ch in self._channels.items() if ch.state is ChannelState.OPEN]

    def channel(self, number: int) -> Channel | None:
        return self._channels.get(number)

    def is_channel_open(self, number: int) -> bool:
        ch = self._channels.get(number)
        return ch is not None and ch.state is ChannelState.OPEN

    # -- receiving -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The connection is over: nothing more is read; ``data_to_send()`` holds the last bytes."""
        return self.state is ConnectionState.CLOSED

    @property
    def peer_close_s(self) -> float:
        """After the close-ok to the peer's connection.close the peer closes the socket: RabbitMQ
        waits for it, and closes only after a timeout (here ``close_timeout``). A client that finds
        the socket shut first may report an error for its own clean close (amqp091-go's
        ``501 EOF``). Our own close ends with the close-ok we receive: then we close."""
        return self._close_timeout if self._peer_closes else 0.0

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Buffer bytes from the socket; ``next_event()`` parses them."""
        if self.state is ConnectionState.CLOSED or self._eof or not data:
            return
        self._now = self._last_received = now
        if self.state is ConnectionState.AWAIT_HEADER:
            self._header += bytes(data)
        elif not self._decoder_broken:
            self._decoder.feed(data)

    def receive_eof(self) -> None:
        """The peer closed its side: :class:`ConnectionClosed` follows the frames already buffered."""
        self._eof = True

    def next_event(self) -> Event | None:
        """The next event; parses frames only while none is ready, so at most the one frame whose
        events are handed out (frames without an event, heartbeats and content headers, are read
        past). ``None``: no whole frame is buffered, or the caller must decide on a login."""
        events = self._events
        while not events:
            if self._close_ok_due:
                self._send(0, ConnectionCloseOk())
                self._end()
                self._peer_closes = True
                return None
            state = self.state
            if state is ConnectionState.OPEN and not self._decoder_broken:
                # The hot paths, handed out as they are read rather than through the queue: a whole
                # publish (method, header, body) and a consumer's basic.ack, each without a frame
                # object, on a channel waiting for a method.
                decoder = self._decoder
                if number := decoder.publish_channel():
                    ch = self._channels.get(number)
                    if (
                        ch is not None
                        and ch.state is _OPEN
                        and ch.content_state is _AWAIT_METHOD
                        and (content := decoder.next_publish(ch.max_body_size)) is not None
                    ):
                        method, properties, body, encoded = content  # a native call, not *args
                        if not decoder.repeats():
                            return ContentReceived(number, method, properties, body, encoded)
                        return self._run(decoder, ch, method, (properties, body, encoded))
                elif (ack := decoder.next_ack()) is not None:
                    number, method = ack
                    ch = self._channels.get(number)
                    if ch is not None and ch.state is _OPEN and ch.content_state is _AWAIT_METHOD:
                        return MethodReceived(number, method)
                    try:  # whatever is wrong with it, as the frame would have been told
                        self._handle_frame(MethodFrame(number, method), events)
                    except ProtocolError as exc:
                        self._on_error(exc, events)
                    continue
            elif state is ConnectionState.CLOSED:
                return None
            elif state is ConnectionState.AWAIT_HEADER:
                if not self._receive_header(events) and not events:
                    if self._eof:
                        self._finish(events, 0, "connection lost (end of stream)", by_peer=True)
                        continue
                    return None
                continue
            elif state is ConnectionState.AUTHENTICATING:
                if not self._eof:
                    return None  # the caller decides first; the frames behind wait
                self._finish(events, 0, "connection lost (end of stream)", by_peer=True)
                continue
            if not self._next_frame(events) and not events:
                if self._eof:
                    self._finish(events, 0, "connection lost (end of stream)", by_peer=True)
                    continue
                return None
        return events.popleft()

    def _run(
        self, decoder: FrameDecoder, ch: Channel, method: Method, first: tuple[BasicProperties, bytes, bytes]
    ) -> ContentReceived | ContentRun:
        """The publishes that follow ``first`` on its channel with the same arguments, buffered
        whole: one event for them all (a publisher's burst, read in one go), up to ``RUN_MAX``.
        Each is decoded by ``next_publish``, which says what a bad one lacks as it always does."""
        number = ch.number
        contents = [first]
        max_body = ch.max_body_size
        while (
            len(contents) < RUN_MAX
            and decoder.repeats()
            and (content := decoder.next_publish(max_body)) is not None
        ):
            contents.append((content[1], content[2], content[3]))
        if len(contents) == 1:
            properties, body, encoded = first
            return ContentReceived(number, method, properties, body, encoded)
        return ContentRun(number, method, contents)

    def _next_frame(self, events: deque[Event]) -> bool:
        """Parse and act on one frame; False if no whole frame is buffered."""
        if self._decoder_broken:
            return False
        try:
            frame = self._decoder.next_frame()
        except ProtocolError as exc:
            if exc.reply_code == FRAME_ERROR:
                # The frame boundary is lost: nothing after this can be trusted.
                self._decoder_broken = True
                if self.state is ConnectionState.CLOSING:
                    self._finish(events, *self._close_reason_or(exc))
                else:
                    self._connection_exception(exc, events)
                    self._finish(events, *self._close_reason_or(exc))
                return True
            self._on_error(exc, events)
            return True
        if frame is NEED_DATA:
            return False
        try:
            self._handle_frame(frame, events)
        except ProtocolError as exc:
            self._on_error(exc, events)
        return True

    def _close_reason_or(self, exc: ProtocolError) -> tuple[int, str, int, int]:
        if self.close_reason is not None:
            return self.close_reason
        return exc.reply_code, exc.full_text, exc.class_id, exc.method_id

    def _receive_header(self, events: deque[Event]) -> bool:
        """Consume the protocol header (the bytes after it go to the decoder); False: need more."""
        head = self._header
        kind = classify_protocol_header(head)
        if kind is NEED_DATA:
            return False
        self._header = b""
        if kind is ProtocolHeader.AMQP_0_9_1 or kind is ProtocolHeader.AMQP_0_9:
            self._send(
                0,
                ConnectionStart(
                    version_major=0,
                    version_minor=9,
                    server_properties=self._server_properties,
                    mechanisms=" ".join(self._mechanisms).encode(),
                    locales=" ".join(self._locales).encode(),
                ),
            )
            self.state = ConnectionState.AWAIT_START_OK
            if len(head) > 8:
                self._decoder.feed(head[8:])
            return True
        self._out += PROTOCOL_HEADER
        events.append(ProtocolHeaderRejected(head[:8], kind))
        self._finish(events, 0, "protocol header mismatch")
        return True

    def _handle_frame(
        self, frame: MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame, events: deque[Event]
    ) -> None:
        state = self.state
        if state is ConnectionState.OPEN and frame.channel:
            ch = self._channels.get(frame.channel)
            if ch is not None and ch.state is ChannelState.OPEN:
                # The hot path: publish, header, body on an open channel.
                if type(frame) is MethodFrame:
                    if ch.content_state is not ContentState.AWAIT_METHOD:
                        raise ch.unexpected_method(frame.method.NAME)
                    self._channel_method(ch, frame.method, events)
                    return
                if type(frame) is BodyFrame:
                    content = ch.on_body(frame)
                elif type(frame) is HeaderFrame:
                    content = ch.on_header(frame)
                else:  # heartbeat: the decoder only yields them on channel 0
                    return
                if content is not None:
                    events.append(ContentReceived(frame.channel, *content))
                return
            self._other_channel_frame(ch, frame, events)
            return
        if type(frame) is HeartbeatFrame:
            return
        if state is ConnectionState.CLOSING:
            self._closing_frame(frame, events)
            return
        if frame.channel:
            raise ProtocolError(
                COMMAND_INVALID,
                f"frame on channel {frame.channel} before the connection is open",
                channel=0,
            )
        if type(frame) is not MethodFrame:
            raise ProtocolError(UNEXPECTED_FRAME, "content frame on channel 0")
        self._connection_method(frame.method, events)

    # -- connection (channel 0) ----------------------------------------------------------------

    def _connection_method(self, method: Method, events: deque[Event]) -> None:
        state = self.state
        if isinstance(method, ConnectionClose):
            # close-ok is queued when the caller asks for the next event, after acting on this one:
            # what it still sends for earlier frames (the confirms of publishes before the close)
            # goes out ahead of close-ok.
            self._close_ok_due = True
            events.append(
                ConnectionClosed(
                    method.reply_code, method.reply_text, method.class_id, method.method_id, by_peer=True
                )
            )
            return
        if method.CLASS_ID != 10:
            raise ProtocolError(
                COMMAND_INVALID,
                f"{method.NAME} on channel 0",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if state is ConnectionState.AWAIT_START_OK and isinstance(method, ConnectionStartOk):
            self._on_start_ok(method, events)
        elif state is ConnectionState.AWAIT_SECURE_OK and isinstance(method, ConnectionSecureOk):
            self.state = ConnectionState.AUTHENTICATING
            events.append(SecureOkReceived(method.response))
        elif state is ConnectionState.AWAIT_TUNE_OK and isinstance(method, ConnectionTuneOk):
            self._on_tune_ok(method, events)
        elif state is ConnectionState.AWAIT_OPEN and isinstance(method, ConnectionOpen):
            self._on_open(method, events)
        elif state is ConnectionState.OPEN and isinstance(method, ConnectionUpdateSecret):
            events.append(MethodReceived(0, method))
        else:
            raise ProtocolError(
                COMMAND_INVALID,
                f"{method.NAME} not expected in state {state.value}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )

    def _on_start_ok(self, method: ConnectionStartOk, events: deque[Event]) -> None:
        self.client_properties = method.client_properties
        self.mechanism = method.mechanism
        if method.mechanism not in self._mechanisms:
            raise ProtocolError(
                COMMAND_INVALID,
                f"unknown authentication mechanism {method.mechanism!r}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        username = password = None
        if method.mechanism in ("PLAIN", "AMQPLAIN"):
            parse = _parse_plain if method.mechanism == "PLAIN" else _parse_amqplain
            creds = parse(method.response)
            if creds is None:
                self._auth_failure(f"malformed {method.mechanism} response", events)
                return
            username, password = creds
        self.state = ConnectionState.AUTHENTICATING
        events.append(
            AuthenticationRequested(
                method.mechanism, username, password, method.response, method.client_properties, method.locale
            )
        )

    def _on_tune_ok(self, method: ConnectionTuneOk, events: deque[Event]) -> None:
        server_cm, server_fm = self._server_channel_max, self._server_frame_max
        if server_cm and method.channel_max > server_cm:
            raise ProtocolError(
                NOT_ALLOWED,
                f"channel_max {method.channel_max} is above the server's {server_cm}",
                class_id=10,
                method_id=31,
            )
        if method.frame_max and method.frame_max < FRAME_MIN_SIZE:
            raise ProtocolError(
                NOT_ALLOWED,
                f"frame_max {method.frame_max} is below {FRAME_MIN_SIZE}",
                class_id=10,
                method_id=31,
            )
        if server_fm and method.frame_max > server_fm:
            raise ProtocolError(
                NOT_ALLOWED,
                f"frame_max {method.frame_max} is above the server's {server_fm}",
                class_id=10,
                method_id=31,
            )
        self.channel_max = method.channel_max or server_cm or 65535
        self.frame_max = method.frame_max or server_fm
        self.heartbeat = method.heartbeat
        self._decoder.frame_max = self.frame_max
        self.state = ConnectionState.AWAIT_OPEN
        events.append(ConnectionTuned(self.channel_max, self.frame_max, self.heartbeat))

    def _on_open(self, method: ConnectionOpen, events: deque[Event]) -> None:
        vhost = method.virtual_host
        refusal: str | None = None
        if self._virtual_hosts is not None and vhost not in self._virtual_hosts:
            refusal = f"vhost {vhost} not found"  # RabbitMQ's words
        elif self.admit is not None:
            refusal = self.admit(vhost)
        if refusal is not None:
            raise ProtocolError(NOT_ALLOWED, refusal, class_id=method.CLASS_ID, method_id=method.METHOD_ID)
        self.virtual_host = vhost
        self._send(0, ConnectionOpenOk())
        self.state = ConnectionState.OPEN
        events.append(ConnectionOpened(vhost))

    def _closing_frame(
        self, frame: MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame, events: deque[Event]
    ) -> None:
        """While our connection.close is outstanding only close-ok (or a crossing close) counts."""
        if frame.channel or type(frame) is not MethodFrame:
            return
        method = frame.method
        if isinstance(method, ConnectionClose):
            self._send(0, ConnectionCloseOk())
        elif not isinstance(method, ConnectionCloseOk):
            return
        assert self.close_reason is not None  # set whenever the state is CLOSING
        self._finish(events, *self.close_reason)

    # -- channels ------------------------------------------------------------------------------

    def _other_channel_frame(
        self,
        ch: Channel | None,
        frame: MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame,
        events: deque[Event],
    ) -> None:
        number = frame.channel
        method = frame.method if type(frame) is MethodFrame else None
        if ch is None:
            if isinstance(method, ChannelOpen):
                # RabbitMQ limits how many channels are open, not their numbers (any 1-65535).
                if self.channel_max and len(self._channels) >= self.channel_max:
                    raise ProtocolError(
                        NOT_ALLOWED,
                        f"number of channels opened ({len(self._channels)}) has reached the "
                        f"negotiated channel_max ({self.channel_max})",
                    )
                self._channels[number] = Channel(number, self._max_body_size)
                self._send(number, ChannelOpenOk())
                events.append(ChannelOpened(number))
                return
            raise ProtocolError(
                CHANNEL_ERROR,
                "expected 'channel.open'",
                class_id=method.CLASS_ID if method else 0,
                method_id=method.METHOD_ID if method else 0,
            )
        # The channel is closing: discard everything but close and close-ok.
        if isinstance(method, ChannelCloseOk):
            del self._channels[number]
        elif isinstance(method, ChannelClose):
            self._send(number, ChannelCloseOk())

    def _channel_method(self, ch: Channel, method: Method, events: deque[Event]) -> None:
        number = ch.number
        if method.HAS_CONTENT:
            if method.SENDER == "server":
                raise self._invalid(method, number)
            ch.begin_content(method)
            return
        if method.CLASS_ID == 20:
            if isinstance(method, ChannelClose):
                self._send(number, ChannelCloseOk())
                del self._channels[number]
                events.append(
                    ChannelClosed(
                        number, method.reply_code, method.reply_text, method.class_id, method.method_id
                    )
                )
            elif isinstance(method, ChannelFlow):
                ch.flow_active = method.active
                self._send(number, ChannelFlowOk(active=method.active))
                events.append(ChannelFlowChanged(number, method.active))
            elif isinstance(method, ChannelFlowOk):
                events.append(MethodReceived(number, method))
            elif isinstance(method, ChannelOpen):
                raise ProtocolError(CHANNEL_ERROR, "second 'channel.open' seen", class_id=20, method_id=10)
            # channel.close-ok for a close we never sent: harmless, ignored.
            elif not isinstance(method, ChannelCloseOk):
                raise self._invalid(method, number)
            return
        if method.CLASS_ID == 10 or method.SENDER == "server":
            raise self._invalid(method, number)
        events.append(MethodReceived(number, method))

    @staticmethod
    def _invalid(method: Method, number: int) -> ProtocolError:
        return ProtocolError(
            COMMAND_INVALID,
            f"{method.NAME} is not a method a client may send on channel {number}",
            class_id=method.CLASS_ID,
            method_id=method.METHOD_ID,
        )

    # -- errors --------------------------------------------------------------------------------

    def _on_error(self, exc: ProtocolError, events: deque[Event]) -> None:
        if self.state is ConnectionState.CLOSING:
            return  # already closing: the peer's further mistakes do not matter
        if exc.connection_exception or not exc.channel:
            self._connection_exception(exc, events)
        else:
            if self._channel_exception(
                exc.channel, exc.reply_code, exc.full_text, exc.class_id, exc.method_id
            ):
                events.append(
                    ChannelClosed(
                        exc.channel, exc.reply_code, exc.full_text, exc.class_id, exc.method_id, by_peer=False
                    )
                )

    def _connection_exception(self, exc: ProtocolError, events: deque[Event]) -> None:
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return
        self._start_close(exc.reply_code, exc.full_text, exc.class_id, exc.method_id)
        events.append(ConnectionClosing(exc.reply_code, exc.full_text, exc.class_id, exc.method_id))

    def _channel_exception(self, number: int, code: int, text: str, class_id: int, method_id: int) -> bool:
        ch = self._channels.get(number)
        if ch is None or ch.state is not ChannelState.OPEN:
            return False
        ch.reset_content()
        ch.state = ChannelState.CLOSING
        ch.close_reason = (code, text, class_id, method_id)
        self._send(number, ChannelClose(code, truncate_shortstr(text), class_id, method_id))
        return True

    def _auth_failure(self, text: str, events: deque[Event]) -> None:
        text = truncate_shortstr(f"ACCESS_REFUSED - {text}")
        # No method named (0, 0), as RabbitMQ's refusal names none.
        if self.client_capabilities.get("authentication_failure_close") is True:
            self._start_close(ACCESS_REFUSED, text, 0, 0)
            events.append(ConnectionClosing(ACCESS_REFUSED, text, 0, 0))
            # The client will answer close-ok; the handler may also just close after a flush.
        else:
            self._finish(events, ACCESS_REFUSED, text, 0, 0)

    def _start_close(self, code: int, text: str, class_id: int, method_id: int) -> None:
        text = truncate_shortstr(text)
        self.close_reason = (code, text, class_id, method_id)
        self._send(0, ConnectionClose(code, text, class_id, method_id))
        self.state = ConnectionState.CLOSING
        self._closing_since = max(self._last_received, self._last_sent)
        for ch in self._channels.values():
            ch.reset_content()
        self._channels.clear()

    def _finish(
        self,
        events: deque[Event],
        code: int,
        text: str,
        class_id: int = 0,
        method_id: int = 0,
        *,
        by_peer: bool = False,
    ) -> None:
        self._end()
        events.append(ConnectionClosed(code, text, class_id, method_id, by_peer))

    def _end(self) -> None:
        self.state = ConnectionState.CLOSED
        self._close_ok_due = False
        self._channels.clear()
        self._decoder = FrameDecoder(0)

    # -- decisions of the caller ---------------------------------------------------------------

    def accept_authentication(self) -> None:
        """Credentials are good: send connection.tune."""
        self._require(ConnectionState.AUTHENTICATING)
        self._send(
            0,
            ConnectionTune(self._server_channel_max, self._server_frame_max, self._server_heartbeat),
        )
        self._decoder.frame_max = self._server_frame_max
        self.state = ConnectionState.AWAIT_TUNE_OK

    def reject_authentication(self, reply_text: str = "login refused") -> None:
        """Credentials are bad: connection.close 403 if the client announced
        ``authentication_failure_close``, else the connection simply ends (the events,
        :class:`ConnectionClosing` or :class:`ConnectionClosed`, come out of ``next_event()``)."""
        self._require(ConnectionState.AUTHENTICATING)
        self._auth_failure(reply_text, self._events)

    def send_challenge(self, challenge: bytes) -> None:
        """Send connection.secure; the answer comes as :class:`SecureOkReceived`."""
        self._require(ConnectionState.AUTHENTICATING)
        self._send(0, ConnectionSecure(challenge))
        self.state = ConnectionState.AWAIT_SECURE_OK

    def _require(self, state: ConnectionState) -> None:
        if self.state is not state:
            raise LocalProtocolError(f"not allowed in state {self.state.value}")

    # -- sending -------------------------------------------------------------------------------

    def send(
        self,
        channel: int,
        method: Method,
        properties: BasicProperties | None = None,
        body: bytes | bytearray | memoryview = b"",
    ) -> bool:
        """:meth:`send_content` for a method with content, :meth:`send_method` otherwise."""
        if method.HAS_CONTENT:
            return self.send_content(channel, method, properties, body)
        return self.send_method(channel, method)

    def send_method(self, channel: int, method: Method) -> bool:
        """Queue a method without content (a reply, basic.ack for confirms, basic.cancel, ...).

        Returns False (and sends nothing) when the channel or the connection is closing, so that
        work racing a close is dropped quietly. Raises :class:`LocalProtocolError` for a channel
        that was never opened, a method only clients send, or a content method (use
        :meth:`send_content`), and :class:`~trimaran.amqp091.spec.EncodeError` for bad values.
        """
        if method.HAS_CONTENT:
            raise LocalProtocolError(f"{method.NAME} carries content: use send_content()")
        if not self._may_send(channel, method):
            return False
        self._send(channel, method)
        return True

    def send_content(
        self,
        channel: int,
        method: Method,
        properties: BasicProperties | bytes | None,
        body: bytes | bytearray | memoryview,
    ) -> bool:
        """Queue basic.deliver / basic.get-ok / basic.return with its header and body frames,
        split by the negotiated frame_max. Same return value and errors as :meth:`send_method`."""
        if not method.HAS_CONTENT:
            raise LocalProtocolError(f"{method.NAME} carries no content: use send_method()")
        if not channel:
            raise LocalProtocolError("content cannot be sent on channel 0")
        if not self._may_send(channel, method):
            return False
        write_content(self._out, channel, method, properties, body, self.frame_max)
        return True

    def send_delivery(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: BasicProperties | bytes | None,
        body: bytes | bytearray | memoryview,
    ) -> bool:
        """``send_content`` of a basic.deliver without building the method (``write_delivery``):
        what every consumed message sends. Same return value and errors."""
        state = self.state
        if state is ConnectionState.CLOSING or state is ConnectionState.CLOSED:
            return False
        ch = self._channels.get(channel) if channel else None
        if ch is None:
            raise LocalProtocolError(f"channel {channel} is not open")
        if ch.state is not _OPEN:
            return False
        write_delivery(
            self._out, channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties,
            body, self.frame_max,
        )  # fmt: skip
        return True

    def _may_send(self, channel: int, method: Method) -> bool:
        if method.SENDER == "client":
            raise LocalProtocolError(f"{method.NAME} is sent by clients only")
        state = self.state
        if state is ConnectionState.CLOSING or state is ConnectionState.CLOSED:
            return False
        if channel == 0:
            if method.CLASS_ID != 10:
                raise LocalProtocolError(f"{method.NAME} cannot be sent on channel 0")
            if state is not ConnectionState.OPEN:
                raise LocalProtocolError(f"connection not open (state {state.value})")
            return True
        if method.CLASS_ID == 10:
            raise LocalProtocolError(f"{method.NAME} belongs on channel 0")
        ch = self._channels.get(channel)
        if ch is None:
            raise LocalProtocolError(f"channel {channel} is not open")
        return ch.state is ChannelState.OPEN

    def close_channel(
        self,
        channel: int,
        reply_code: int,
        reply_text: str,
        class_id: int = 0,
        method_id: int = 0,
    ) -> bool:
        """Raise a channel exception (or close a channel server-side): channel.close is sent and
        the channel's frames are discarded until the client's close-ok. ``reply_text`` is sent as
        given (RabbitMQ style is ``"NOT_FOUND - no queue 'q'"``). False if not open."""
        if self.state is not ConnectionState.OPEN:
            return False
        return self._channel_exception(channel, reply_code, reply_text, class_id, method_id)

    def close(
        self,
        reply_code: int = REPLY_SUCCESS,
        reply_text: str = "",
        class_id: int = 0,
        method_id: int = 0,
    ) -> None:
        """Close the connection (a connection exception, or a shutdown with 320
        CONNECTION_FORCED): connection.close is sent and only close-ok is accepted after it."""
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return
        if self.state is ConnectionState.AWAIT_HEADER:
            self.state = ConnectionState.CLOSED
            return
        if not reply_text:
            rc = REPLY_CODES.get(reply_code)
            reply_text = rc.text if rc is not None else "closed"
        self._start_close(reply_code, reply_text, class_id, method_id)
        assert self.close_reason is not None
        self._events.append(ConnectionClosing(*self.close_reason))

    def raise_error(self, error: ProtocolError) -> None:
        """Send the exception ``error`` describes: a channel exception for a soft reply code on a
        channel, a connection exception otherwise."""
        if error.connection_exception or not error.channel:
            self.close(error.reply_code, error.full_text, error.class_id, error.method_id)
        else:
            self.close_channel(
                error.channel, error.reply_code, error.full_text, error.class_id, error.method_id
            )

    def _send(self, channel: int, method: Method) -> None:
        write_method(self._out, channel, method)

    @property
    def has_data_to_send(self) -> bool:
        """Whether :meth:`data_to_send` would return anything."""
        return bool(self._out)

    def data_to_send(self, now: float | None = None) -> bytes:
        """Everything queued since the last call (b"" if nothing). ``now``: when it is sent (the
        last time the machine was given, if omitted), for the heartbeat."""
        out = self._out
        if not out:
            return b""
        data = bytes(out)
        self._out = bytearray()
        self._last_sent = self._now if now is None else now
        return data

    # -- time ----------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do (``None``: no timer needed)."""
        state = self.state
        if state is ConnectionState.CLOSED:
            return None
        if state is ConnectionState.CLOSING:
            assert self._closing_since is not None
            return self._closing_since + self._close_timeout
        handshake = self._handshake_until if state is not ConnectionState.OPEN else None
        hb = self.heartbeat
        if not hb or (state is not ConnectionState.OPEN and state is not ConnectionState.AWAIT_OPEN):
            return handshake
        beat = min(self._last_sent + hb / 2, self._last_received + 2 * hb)
        return beat if handshake is None else min(beat, handshake)

    def paused(self, now: float) -> None:
        """The runtime did not read the peer until ``now`` (``Machine.paused``): its heartbeats wait
        unread in the socket, so the missed-heartbeats clock starts again (RabbitMQ pauses its
        heartbeat monitor while it blocks a connection)."""
        if now > self._last_received:
            self._last_received = now

    def tick(self, now: float) -> None:
        """Heartbeats and timeouts. Queues a heartbeat frame after ``heartbeat / 2`` seconds of not
        sending; ends the connection after ``2 * heartbeat`` seconds of not receiving, after
        ``close_timeout`` seconds without connection.close-ok, or when the handshake deadline passes
        before connection.open."""
        events = self._events
        self._now = now
        state = self.state
        if state is ConnectionState.CLOSED:
            return
        if state is ConnectionState.CLOSING:
            assert self._closing_since is not None
            if now - self._closing_since >= self._close_timeout:
                assert self.close_reason is not None
                code, text, cid, mid = self.close_reason
                self._finish(events, code, text, cid, mid)
            return
        until = self._handshake_until
        if state is not ConnectionState.OPEN and until is not None and now >= until:
            self._finish(events, 0, "handshake timeout: no connection.open in time")
            return
        hb = self.heartbeat
        if not hb or (state is not ConnectionState.OPEN and state is not ConnectionState.AWAIT_OPEN):
            return
        silent = now - self._last_received
        if silent >= 2 * hb:
            events.append(HeartbeatTimeout(silent))
            self._finish(events, 0, f"missed heartbeats from client, timeout: {hb}s")
            return
        if not self._out and now - self._last_sent >= hb / 2:
            self._out += HEARTBEAT_FRAME
