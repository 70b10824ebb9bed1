"""What the AMQP 0-9-1 machine (:class:`~trimaran.amqp091.connection.ServerConnection`) hands out
through ``next_event()``, one at a time, in the order the frames arrived."""

from dataclasses import dataclass, field

from trimaran.amqp091.fields import FieldTable
from trimaran.amqp091.frames import ProtocolHeader
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp091.spec import Method


@dataclass(slots=True)
class ProtocolHeaderRejected:
    """The client's first 8 bytes were not ``AMQP\\x00\\x00\\x09\\x01``; ours was queued in reply.

    :class:`ConnectionClosed` follows: flush ``data_to_send()`` and close the socket.
    """

    header: bytes
    kind: ProtocolHeader


@dataclass(slots=True)
class AuthenticationRequested:
    """connection.start-ok (or the last secure-ok's answer) arrived: decide.

    For PLAIN and AMQPLAIN, ``username``/``password`` are parsed from ``response``; for any other
    offered mechanism they are ``None`` and ``response`` is the raw SASL response.
    Answer with ``accept_authentication()``, ``reject_authentication()`` or ``send_challenge()``.
    """

    mechanism: str
    username: str | None
    password: str | None
    response: bytes
    client_properties: FieldTable
    locale: str


@dataclass(slots=True)
class SecureOkReceived:
    """The client answered our connection.secure challenge; decide as for AuthenticationRequested."""

    response: bytes


@dataclass(slots=True)
class ConnectionTuned:
    channel_max: int
    frame_max: int
    heartbeat: int


@dataclass(slots=True)
class ConnectionOpened:
    """connection.open accepted (open-ok sent): channels may be opened from now on."""

    virtual_host: str


@dataclass(slots=True)
class ChannelOpened:
    """channel.open accepted (open-ok sent)."""

    channel: int


@dataclass(slots=True)
class ChannelClosed:
    """The channel is gone for the application: drop its consumers, unacked messages, etc.

    ``by_peer``: the client sent channel.close (we answered close-ok). Otherwise the machine
    raised a channel exception itself while receiving (channel.close sent, close-ok awaited).
    Not emitted for :meth:`ServerConnection.close_channel`, which the caller knows about.
    """

    channel: int
    reply_code: int
    reply_text: str
    class_id: int = 0
    method_id: int = 0
    by_peer: bool = True


@dataclass(slots=True)
class ChannelFlowChanged:
    """The client sent channel.flow (flow-ok already sent): stop/resume content on the channel."""

    channel: int
    active: bool


@dataclass(slots=True, init=False)
class MethodReceived:
    """A method for the caller: exchange.*, queue.*, basic.* (but publish), confirm.*, tx.*,
    channel.flow-ok, connection.update-secret."""

    channel: int
    method: Method

    # Written out, as one per basic.ack: mypyc compiles it, the generated one runs interpreted.
    def __init__(self, channel: int, method: Method) -> None:
        self.channel = channel
        self.method = method


@dataclass(slots=True, init=False)
class ContentReceived:
    """A content-carrying method (basic.publish) with its properties and assembled body."""

    channel: int
    method: Method
    properties: BasicProperties
    body: bytes
    #: ``properties`` as the frame carried them (flag word and list), when read in one step
    encoded_properties: bytes | None = field(default=None, compare=False)

    # Written out, as one per message: mypyc compiles it, the generated one runs interpreted.
    def __init__(
        self,
        channel: int,
        method: Method,
        properties: BasicProperties,
        body: bytes,
        encoded_properties: bytes | None = None,
    ) -> None:
        self.channel = channel
        self.method = method
        self.properties = properties
        self.body = body
        self.encoded_properties = encoded_properties


@dataclass(slots=True, init=False)
class ContentRun:
    """Consecutive basic.publish frames of one channel, buffered together, with the same arguments
    (exchange, routing key, flags): routed once. Each content is its properties, its body and the
    properties as the frame carried them."""

    channel: int
    method: Method
    contents: list[tuple[BasicProperties, bytes, bytes]]

    def __init__(
        self, channel: int, method: Method, contents: list[tuple[BasicProperties, bytes, bytes]]
    ) -> None:
        self.channel = channel
        self.method = method
        self.contents = contents

    def each(self) -> list[ContentReceived]:
        """The run as one event a message, for whoever takes them one at a time."""
        return [ContentReceived(self.channel, self.method, p, b, e) for p, b, e in self.contents]


@dataclass(slots=True)
class ConnectionClosing:
    """The machine raised a connection exception: connection.close is queued and only close-ok is
    awaited (stop all work for this connection). :class:`ConnectionClosed` follows."""

    reply_code: int
    reply_text: str
    class_id: int = 0
    method_id: int = 0


@dataclass(slots=True)
class HeartbeatTimeout:
    """Nothing received for two heartbeat intervals. :class:`ConnectionClosed` follows."""

    silent_for: float


@dataclass(slots=True)
class ConnectionClosed:
    """The end. Flush ``data_to_send()`` and close the socket; nothing more will be processed.

    ``by_peer``: the client sent connection.close. Otherwise it is the reason we closed with
    (0 with a text for a header mismatch, heartbeat timeout or close-ok timeout).
    """

    reply_code: int
    reply_text: str
    class_id: int = 0
    method_id: int = 0
    by_peer: bool = False


Event = (
    ProtocolHeaderRejected
    | AuthenticationRequested
    | SecureOkReceived
    | ConnectionTuned
    | ConnectionOpened
    | ChannelOpened
    | ChannelClosed
    | ChannelFlowChanged
    | MethodReceived
    | ContentReceived
    | ContentRun
    | ConnectionClosing
    | HeartbeatTimeout
    | ConnectionClosed
)
