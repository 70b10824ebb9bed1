"""AMQP 0-9-1 protocol definitions: constants, reply codes, errors and every method.

Each method is declared exactly once, below, as a slotted dataclass whose annotations name the
AMQP domain of every argument (``Short``, ``ShortStr``, ``Bit`` ...), in wire order. The
``@_method`` decorator records class id, method id, whether the method carries content, whether it
is synchronous and what answers it. After the last declaration ``_compile()`` reads that table and
generates one encoder and one decoder per method (consecutive ``bit`` arguments are packed into
octets, runs of fixed-size integers share one ``struct``). Nothing below is hand-encoded.

Python types of arguments:

* octet, short, long, longlong, timestamp -> ``int``
* bit -> ``bool``
* shortstr -> ``str`` (UTF-8; undecodable bytes survive via ``surrogateescape`` so that a round
  trip is byte-exact)
* longstr -> ``bytes`` (SASL responses, mechanisms, secrets are binary)
* table -> ``dict[str, FieldValue]`` (see :mod:`trimaran.amqp091.fields`)

Sources: the AMQP 0-9-1 XML specification, RabbitMQ's amqp-rabbitmq-0.9.1 codegen description
(which adds exchange.bind/unbind, basic.nack, confirm.*, connection.blocked/unblocked and
connection.update-secret) and RabbitMQ's errata.
"""

import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, TypeVar

from trimaran.amqp091.fields import FieldTable, decode_table, encode_table

# --------------------------------------------------------------------------------------------
# Constants

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
VERSION_MAJOR = 0
VERSION_MINOR = 9

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_MIN_SIZE = 4096
FRAME_END = 0xCE
#: type octet + channel short + size long before the payload, frame-end octet after it.
FRAME_OVERHEAD = 8

# Reply codes. "Soft" codes are channel exceptions, "hard" codes connection exceptions.
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541


@dataclass(frozen=True, slots=True)
class ReplyCode:
    code: int
    text: str
    #: True for a connection exception ("hard error"), False for a channel exception ("soft error").
    #: 200 and the 31x codes are used by channel.close / basic.return and are not errors as such.
    connection: bool


REPLY_CODES: dict[int, ReplyCode] = {
    rc.code: rc
    for rc in (
        ReplyCode(REPLY_SUCCESS, "REPLY_SUCCESS", False),
        ReplyCode(CONTENT_TOO_LARGE, "CONTENT_TOO_LARGE", False),
        ReplyCode(NO_ROUTE, "NO_ROUTE", False),
        ReplyCode(NO_CONSUMERS, "NO_CONSUMERS", False),
        ReplyCode(CONNECTION_FORCED, "CONNECTION_FORCED", True),
        ReplyCode(INVALID_PATH, "INVALID_PATH", True),
        ReplyCode(ACCESS_REFUSED, "ACCESS_REFUSED", False),
        ReplyCode(NOT_FOUND, "NOT_FOUND", False),
        ReplyCode(RESOURCE_LOCKED, "RESOURCE_LOCKED", False),
        ReplyCode(PRECONDITION_FAILED, "PRECONDITION_FAILED", False),
        ReplyCode(FRAME_ERROR, "FRAME_ERROR", True),
        ReplyCode(SYNTAX_ERROR, "SYNTAX_ERROR", True),
        ReplyCode(COMMAND_INVALID, "COMMAND_INVALID", True),
        ReplyCode(CHANNEL_ERROR, "CHANNEL_ERROR", True),
        ReplyCode(UNEXPECTED_FRAME, "UNEXPECTED_FRAME", True),
        ReplyCode(RESOURCE_ERROR, "RESOURCE_ERROR", False),
        ReplyCode(NOT_ALLOWED, "NOT_ALLOWED", True),
        ReplyCode(NOT_IMPLEMENTED, "NOT_IMPLEMENTED", True),
        ReplyCode(INTERNAL_ERROR, "INTERNAL_ERROR", True),
    )
}


def truncate_shortstr(text: str) -> str:
    """Cut ``text`` to what fits a shortstr (255 bytes of UTF-8), at a character boundary."""
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= 255:
        return text
    return raw[:255].decode("utf-8", "ignore")


def is_connection_exception(reply_code: int) -> bool:
    """True if ``reply_code`` must be raised with connection.close (unknown codes count as hard)."""
    rc = REPLY_CODES.get(reply_code)
    return True if rc is None else rc.connection


# --------------------------------------------------------------------------------------------
# Errors


class AMQPError(Exception):
    """Base of the errors raised by this package."""


class ProtocolError(AMQPError):
    """The peer broke the protocol. Carries what to answer with.

    ``reply_text`` is prefixed with the reply code's name RabbitMQ-style when sent
    (``"FRAME_ERROR - ..."``). ``class_id``/``method_id`` name the offending method, if any.
    ``channel`` is where it happened (0 for connection-level problems).
    """

    def __init__(
        self,
        reply_code: int,
        reply_text: str,
        *,
        channel: int = 0,
        class_id: int = 0,
        method_id: int = 0,
    ) -> None:
        super().__init__(reply_code, reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.channel = channel
        self.class_id = class_id
        self.method_id = method_id

    @property
    def connection_exception(self) -> bool:
        return is_connection_exception(self.reply_code)

    @property
    def full_text(self) -> str:
        rc = REPLY_CODES.get(self.reply_code)
        name = rc.text if rc is not None else str(self.reply_code)
        return truncate_shortstr(f"{name} - {self.reply_text}")

    def __str__(self) -> str:
        return f"{self.reply_code} {self.full_text}"


class LocalProtocolError(AMQPError):
    """We (the caller of this package) tried something the protocol or the state forbids."""


class EncodeError(LocalProtocolError, ValueError):
    """A value cannot be encoded (string too long, integer out of range, unsupported type)."""


# --------------------------------------------------------------------------------------------
# Domains. The second Annotated argument is the AMQP domain the codec is driven by.

Octet = Annotated[int, "octet"]
Short = Annotated[int, "short"]
Long = Annotated[int, "long"]
LongLong = Annotated[int, "longlong"]
Timestamp = Annotated[int, "timestamp"]
ShortStr = Annotated[str, "shortstr"]
LongStr = Annotated[bytes, "longstr"]
Bit = Annotated[bool, "bit"]
Table = Annotated[FieldTable, "table"]

DOMAINS = ("octet", "short", "long", "longlong", "timestamp", "shortstr", "longstr", "bit", "table")


class Method:
    """Base of every method. Class attributes are filled in by ``@_method``."""

    __slots__ = ()

    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    #: ``class_id << 16 | method_id``: the first four bytes of a method frame's payload.
    INDEX: ClassVar[int]
    #: Dotted AMQP name, e.g. ``"basic.publish"``.
    NAME: ClassVar[str]
    SYNCHRONOUS: ClassVar[bool]
    #: Methods that answer this one (empty if asynchronous).
    RESPONSES: ClassVar[tuple[type["Method"], ...]]
    HAS_CONTENT: ClassVar[bool]
    #: Who may send it: "client", "server" or "both".
    SENDER: ClassVar[str]
    #: ``(python_attribute, wire_name, domain)`` in wire order.
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]]
    _RESPONSE_NAMES: ClassVar[tuple[str, ...]]
    # Generated by _compile(): (method, out) -> None and (payload, offset) -> (method, offset).
    _encode_into: ClassVar[Callable[..., None]]
    _decode: ClassVar[Callable[..., tuple[Any, int]]]

    def encode_arguments(self) -> bytes:
        """The argument bytes (without class and method id)."""
        out = bytearray()
        encode_method_arguments(self, out)
        return bytes(out)


M = TypeVar("M", bound=Method)

#: Every method by ``INDEX``.
METHODS: dict[int, type[Method]] = {}
#: Every method by dotted name.
METHODS_BY_NAME: dict[str, type[Method]] = {}
CLASS_NAMES: dict[int, str] = {
    10: "connection",
    20: "channel",
    40: "exchange",
    50: "queue",
    60: "basic",
    85: "confirm",
    90: "tx",
}


def _method(
    class_id: int,
    method_id: int,
    name: str,
    *,
    sender: str,
    responses: tuple[str, ...] = (),
    content: bool = False,
) -> Callable[[type[M]], type[M]]:
    def register(cls: type[M]) -> type[M]:
        cls.CLASS_ID = class_id
        cls.METHOD_ID = method_id
        cls.INDEX = class_id << 16 | method_id
        cls.NAME = name
        cls.SYNCHRONOUS = bool(responses)
        cls._RESPONSE_NAMES = responses
        cls.RESPONSES = ()
        cls.HAS_CONTENT = content
        cls.SENDER = sender
        assert cls.INDEX not in METHODS, name
        METHODS[cls.INDEX] = cls
        METHODS_BY_NAME[name] = cls
        return cls

    return register


# --------------------------------------------------------------------------------------------
# connection (10)


@_method(10, 10, "connection.start", sender="server", responses=("connection.start-ok",))
@dataclass(slots=True)
class ConnectionStart(Method):
    version_major: Octet = 0
    version_minor: Octet = 9
    server_properties: Table = field(default_factory=dict)
    mechanisms: LongStr = b"PLAIN"
    locales: LongStr = b"en_US"


@_method(10, 11, "connection.start-ok", sender="client")
@dataclass(slots=True)
class ConnectionStartOk(Method):
    client_properties: Table = field(default_factory=dict)
    mechanism: ShortStr = "PLAIN"
    response: LongStr = b""
    locale: ShortStr = "en_US"


@_method(10, 20, "connection.secure", sender="server", responses=("connection.secure-ok",))
@dataclass(slots=True)
class ConnectionSecure(Method):
    challenge: LongStr = b""


@_method(10, 21, "connection.secure-ok", sender="client")
@dataclass(slots=True)
class ConnectionSecureOk(Method):
    response: LongStr = b""


@_method(10, 30, "connection.tune", sender="server", responses=("connection.tune-ok",))
@dataclass(slots=True)
class ConnectionTune(Method):
    channel_max: Short = 0
    frame_max: Long = 0
    heartbeat: Short = 0


@_method(10, 31, "connection.tune-ok", sender="client")
@dataclass(slots=True)
class ConnectionTuneOk(Method):
    channel_max: Short = 0
    frame_max: Long = 0
    heartbeat: Short = 0


@_method(10, 40, "connection.open", sender="client", responses=("connection.open-ok",))
@dataclass(slots=True)
class ConnectionOpen(Method):
    virtual_host: ShortStr = "/"
    reserved_1: ShortStr = ""  # capabilities
    reserved_2: Bit = False  # insist


@_method(10, 41, "connection.open-ok", sender="server")
@dataclass(slots=True)
class ConnectionOpenOk(Method):
    reserved_1: ShortStr = ""  # known-hosts


@_method(10, 50, "connection.close", sender="both", responses=("connection.close-ok",))
@dataclass(slots=True)
class ConnectionClose(Method):
    reply_code: Short = 0
    reply_text: ShortStr = ""
    class_id: Short = 0
    method_id: Short = 0


@_method(10, 51, "connection.close-ok", sender="both")
@dataclass(slots=True)
class ConnectionCloseOk(Method):
    pass


@_method(10, 60, "connection.blocked", sender="server")
@dataclass(slots=True)
class ConnectionBlocked(Method):
    reason: ShortStr = ""


@_method(10, 61, "connection.unblocked", sender="server")
@dataclass(slots=True)
class ConnectionUnblocked(Method):
    pass


@_method(10, 70, "connection.update-secret", sender="client", responses=("connection.update-secret-ok",))
@dataclass(slots=True)
class ConnectionUpdateSecret(Method):
    new_secret: LongStr = b""
    reason: ShortStr = ""


@_method(10, 71, "connection.update-secret-ok", sender="server")
@dataclass(slots=True)
class ConnectionUpdateSecretOk(Method):
    pass


# --------------------------------------------------------------------------------------------
# channel (20)


@_method(20, 10, "channel.open", sender="client", responses=("channel.open-ok",))
@dataclass(slots=True)
class ChannelOpen(Method):
    reserved_1: ShortStr = ""  # out-of-band


@_method(20, 11, "channel.open-ok", sender="server")
@dataclass(slots=True)
class ChannelOpenOk(Method):
    reserved_1: LongStr = b""  # channel-id


@_method(20, 20, "channel.flow", sender="both", responses=("channel.flow-ok",))
@dataclass(slots=True)
class ChannelFlow(Method):
    active: Bit = True


@_method(20, 21, "channel.flow-ok", sender="both")
@dataclass(slots=True)
class ChannelFlowOk(Method):
    active: Bit = True


@_method(20, 40, "channel.close", sender="both", responses=("channel.close-ok",))
@dataclass(slots=True)
class ChannelClose(Method):
    reply_code: Short = 0
    reply_text: ShortStr = ""
    class_id: Short = 0
    method_id: Short = 0


@_method(20, 41, "channel.close-ok", sender="both")
@dataclass(slots=True)
class ChannelCloseOk(Method):
    pass


# --------------------------------------------------------------------------------------------
# exchange (40)


@_method(40, 10, "exchange.declare", sender="client", responses=("exchange.declare-ok",))
@dataclass(slots=True)
class ExchangeDeclare(Method):
    reserved_1: Short = 0  # ticket
    exchange: ShortStr = ""
    type: ShortStr = "direct"
    passive: Bit = False
    durable: Bit = False
    auto_delete: Bit = False
    internal: Bit = False
    no_wait: Bit = False
    arguments: Table = field(default_factory=dict)


@_method(40, 11, "exchange.declare-ok", sender="server")
@dataclass(slots=True)
class ExchangeDeclareOk(Method):
    pass


@_method(40, 20, "exchange.delete", sender="client", responses=("exchange.delete-ok",))
@dataclass(slots=True)
class ExchangeDelete(Method):
    reserved_1: Short = 0
    exchange: ShortStr = ""
    if_unused: Bit = False
    no_wait: Bit = False


@_method(40, 21, "exchange.delete-ok", sender="server")
@dataclass(slots=True)
class ExchangeDeleteOk(Method):
    pass


@_method(40, 30, "exchange.bind", sender="client", responses=("exchange.bind-ok",))
@dataclass(slots=True)
class ExchangeBind(Method):
    reserved_1: Short = 0
    destination: ShortStr = ""
    source: ShortStr = ""
    routing_key: ShortStr = ""
    no_wait: Bit = False
    arguments: Table = field(default_factory=dict)


@_method(40, 31, "exchange.bind-ok", sender="server")
@dataclass(slots=True)
class ExchangeBindOk(Method):
    pass


@_method(40, 40, "exchange.unbind", sender="client", responses=("exchange.unbind-ok",))
@dataclass(slots=True)
class ExchangeUnbind(Method):
    reserved_1: Short = 0
    destination: ShortStr = ""
    source: ShortStr = ""
    routing_key: ShortStr = ""
    no_wait: Bit = False
    arguments: Table = field(default_factory=dict)


# 51, not 41: that is how RabbitMQ numbered it.
@_method(40, 51, "exchange.unbind-ok", sender="server")
@dataclass(slots=True)
class ExchangeUnbindOk(Method):
    pass


# --------------------------------------------------------------------------------------------
# queue (50)


@_method(50, 10, "queue.declare", sender="client", responses=("queue.declare-ok",))
@dataclass(slots=True)
class QueueDeclare(Method):
    reserved_1: Short = 0
    queue: ShortStr = ""
    passive: Bit = False
    durable: Bit = False
    exclusive: Bit = False
    auto_delete: Bit = False
    no_wait: Bit = False
    arguments: Table = field(default_factory=dict)


@_method(50, 11, "queue.declare-ok", sender="server")
@dataclass(slots=True)
class QueueDeclareOk(Method):
    queue: ShortStr = ""
    message_count: Long = 0
    consumer_count: Long = 0


@_method(50, 20, "queue.bind", sender="client", responses=("queue.bind-ok",))
@dataclass(slots=True)
class QueueBind(Method):
    reserved_1: Short = 0
    queue: ShortStr = ""
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    no_wait: Bit = False
    arguments: Table = field(default_factory=dict)


@_method(50, 21, "queue.bind-ok", sender="server")
@dataclass(slots=True)
class QueueBindOk(Method):
    pass


@_method(50, 30, "queue.purge", sender="client", responses=("queue.purge-ok",))
@dataclass(slots=True)
class QueuePurge(Method):
    reserved_1: Short = 0
    queue: ShortStr = ""
    no_wait: Bit = False


@_method(50, 31, "queue.purge-ok", sender="server")
@dataclass(slots=True)
class QueuePurgeOk(Method):
    message_count: Long = 0


@_method(50, 40, "queue.delete", sender="client", responses=("queue.delete-ok",))
@dataclass(slots=True)
class QueueDelete(Method):
    reserved_1: Short = 0
    queue: ShortStr = ""
    if_unused: Bit = False
    if_empty: Bit = False
    no_wait: Bit = False


@_method(50, 41, "queue.delete-ok", sender="server")
@dataclass(slots=True)
class QueueDeleteOk(Method):
    message_count: Long = 0


@_method(50, 50, "queue.unbind", sender="client", responses=("queue.unbind-ok",))
@dataclass(slots=True)
class QueueUnbind(Method):
    reserved_1: Short = 0
    queue: ShortStr = ""
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    arguments: Table = field(default_factory=dict)


@_method(50, 51, "queue.unbind-ok", sender="server")
@dataclass(slots=True)
class QueueUnbindOk(Method):
    pass


# --------------------------------------------------------------------------------------------
# basic (60)


@_method(60, 10, "basic.qos", sender="client", responses=("basic.qos-ok",))
@dataclass(slots=True)
class BasicQos(Method):
    prefetch_size: Long = 0
    prefetch_count: Short = 0
    global_: Bit = False


@_method(60, 11, "basic.qos-ok", sender="server")
@dataclass(slots=True)
class BasicQosOk(Method):
    pass


@_method(60, 20, "basic.consume", sender="client", responses=("basic.consume-ok",))
@dataclass(slots=True)
class BasicConsume(Method):
    reserved_1: Short = 0
    queue: ShortStr = ""
    consumer_tag: ShortStr = ""
    no_local: Bit = False
    no_ack: Bit = False
    exclusive: Bit = False
    no_wait: Bit = False
    arguments: Table = field(default_factory=dict)


@_method(60, 21, "basic.consume-ok", sender="server")
@dataclass(slots=True)
class BasicConsumeOk(Method):
    consumer_tag: ShortStr = ""


# RabbitMQ's consumer_cancel_notify: the server may send basic.cancel too.
@_method(60, 30, "basic.cancel", sender="both", responses=("basic.cancel-ok",))
@dataclass(slots=True)
class BasicCancel(Method):
    consumer_tag: ShortStr = ""
    no_wait: Bit = False


@_method(60, 31, "basic.cancel-ok", sender="both")
@dataclass(slots=True)
class BasicCancelOk(Method):
    consumer_tag: ShortStr = ""


@_method(60, 40, "basic.publish", sender="client", content=True)
@dataclass(slots=True)
class BasicPublish(Method):
    reserved_1: Short = 0
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    mandatory: Bit = False
    immediate: Bit = False


@_method(60, 50, "basic.return", sender="server", content=True)
@dataclass(slots=True)
class BasicReturn(Method):
    reply_code: Short = 0
    reply_text: ShortStr = ""
    exchange: ShortStr = ""
    routing_key: ShortStr = ""


@_method(60, 60, "basic.deliver", sender="server", content=True)
@dataclass(slots=True)
class BasicDeliver(Method):
    consumer_tag: ShortStr = ""
    delivery_tag: LongLong = 0
    redelivered: Bit = False
    exchange: ShortStr = ""
    routing_key: ShortStr = ""


@_method(60, 70, "basic.get", sender="client", responses=("basic.get-ok", "basic.get-empty"))
@dataclass(slots=True)
class BasicGet(Method):
    reserved_1: Short = 0
    queue: ShortStr = ""
    no_ack: Bit = False


@_method(60, 71, "basic.get-ok", sender="server", content=True)
@dataclass(slots=True)
class BasicGetOk(Method):
    delivery_tag: LongLong = 0
    redelivered: Bit = False
    exchange: ShortStr = ""
    routing_key: ShortStr = ""
    message_count: Long = 0


@_method(60, 72, "basic.get-empty", sender="server")
@dataclass(slots=True)
class BasicGetEmpty(Method):
    reserved_1: ShortStr = ""  # cluster-id


# Publisher confirms make the server send basic.ack/basic.nack too.
@_method(60, 80, "basic.ack", sender="both")
@dataclass(slots=True)
class BasicAck(Method):
    delivery_tag: LongLong = 0
    multiple: Bit = False


@_method(60, 90, "basic.reject", sender="client")
@dataclass(slots=True)
class BasicReject(Method):
    delivery_tag: LongLong = 0
    requeue: Bit = True


@_method(60, 100, "basic.recover-async", sender="client")
@dataclass(slots=True)
class BasicRecoverAsync(Method):
    requeue: Bit = False


@_method(60, 110, "basic.recover", sender="client", responses=("basic.recover-ok",))
@dataclass(slots=True)
class BasicRecover(Method):
    requeue: Bit = False


@_method(60, 111, "basic.recover-ok", sender="server")
@dataclass(slots=True)
class BasicRecoverOk(Method):
    pass


@_method(60, 120, "basic.nack", sender="both")
@dataclass(slots=True)
class BasicNack(Method):
    delivery_tag: LongLong = 0
    multiple: Bit = False
    requeue: Bit = True


# --------------------------------------------------------------------------------------------
# confirm (85), RabbitMQ extension


@_method(85, 10, "confirm.select", sender="client", responses=("confirm.select-ok",))
@dataclass(slots=True)
class ConfirmSelect(Method):
    no_wait: Bit = False  # "nowait" in RabbitMQ's description


@_method(85, 11, "confirm.select-ok", sender="server")
@dataclass(slots=True)
class ConfirmSelectOk(Method):
    pass


# --------------------------------------------------------------------------------------------
# tx (90)


@_method(90, 10, "tx.select", sender="client", responses=("tx.select-ok",))
@dataclass(slots=True)
class TxSelect(Method):
    pass


@_method(90, 11, "tx.select-ok", sender="server")
@dataclass(slots=True)
class TxSelectOk(Method):
    pass


@_method(90, 20, "tx.commit", sender="client", responses=("tx.commit-ok",))
@dataclass(slots=True)
class TxCommit(Method):
    pass


@_method(90, 21, "tx.commit-ok", sender="server")
@dataclass(slots=True)
class TxCommitOk(Method):
    pass


@_method(90, 30, "tx.rollback", sender="client", responses=("tx.rollback-ok",))
@dataclass(slots=True)
class TxRollback(Method):
    pass


@_method(90, 31, "tx.rollback-ok", sender="server")
@dataclass(slots=True)
class TxRollbackOk(Method):
    pass


# --------------------------------------------------------------------------------------------
# Codec generation from the declarations above.

_FIXED = {"octet": ("B", 1), "short": ("H", 2), "long": ("I", 4), "longlong": ("Q", 8), "timestamp": ("Q", 8)}
_L = struct.Struct(">I")


class _Truncated(Exception):
    pass


def _wire_name(attr: str) -> str:
    return attr.rstrip("_").replace("_", "-")


def _fields_of(cls: type[Method]) -> tuple[tuple[str, str, str], ...]:
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = getattr(f.type, "__metadata__", None)
        if not meta or meta[0] not in DOMAINS:
            raise TypeError(f"{cls.__name__}.{f.name} has no AMQP domain")
        out.append((f.name, _wire_name(f.name), meta[0]))
    return tuple(out)


def _groups(fields: tuple[tuple[str, str, str], ...]) -> list[tuple[str, list[str]]]:
    """Split into runs: ("fixed", attrs) / ("bits", attrs) (<= 8 each) / (domain, [attr])."""
    groups: list[tuple[str, list[str]]] = []
    for attr, _wire, dom in fields:
        kind = "fixed" if dom in _FIXED else dom
        if (
            groups
            and groups[-1][0] == kind
            and (kind == "fixed" or (kind == "bit" and len(groups[-1][1]) < 8))
        ):
            groups[-1][1].append(attr)
            continue
        groups.append((kind, [attr]))
    return groups


def _compile_method(cls: type[Method]) -> None:
    fields = cls.FIELDS
    domains = {attr: dom for attr, _w, dom in fields}
    ns: dict[str, Any] = {
        "cls": cls,
        "_L": _L,
        "_T": _Truncated,
        "encode_table": encode_table,
        "decode_table": decode_table,
    }
    enc = ["def encode(m, out):"]
    dec = ["def decode(buf, off):"]
    for gi, (kind, attrs) in enumerate(_groups(fields)):
        if kind == "fixed":
            fmt = ">" + "".join(_FIXED[domains[a]][0] for a in attrs)
            size = sum(_FIXED[domains[a]][1] for a in attrs)
            ns[f"_S{gi}"] = struct.Struct(fmt)
            enc.append(f"    out += _S{gi}.pack({', '.join('m.' + a for a in attrs)})")
            dec.append(f"    {''.join(a + ', ' for a in attrs)}= _S{gi}.unpack_from(buf, off)")
            dec.append(f"    off += {size}")
        elif kind == "bit":
            bits = " | ".join(f"({1 << i} if m.{a} else 0)" for i, a in enumerate(attrs))
            enc.append(f"    out.append({bits})")
            dec.append("    b = buf[off]")
            dec.append("    off += 1")
            for i, a in enumerate(attrs):
                dec.append(f"    {a} = bool(b & {1 << i})")
        elif kind == "shortstr":
            (a,) = attrs
            enc.append(f"    s = m.{a}.encode('utf-8', 'surrogateescape')")
            enc.append("    out.append(len(s))")  # ValueError past 255
            enc.append("    out += s")
            dec.append("    n = buf[off]")
            dec.append("    off += 1")
            dec.append(f"    {a} = buf[off:off + n].decode('utf-8', 'surrogateescape')")
            dec.append("    off += n")
            dec.append("    if off > len(buf): raise _T")
        elif kind == "longstr":
            (a,) = attrs
            enc.append(f"    out += _L.pack(len(m.{a}))")
            enc.append(f"    out += m.{a}")
            dec.append("    (n,) = _L.unpack_from(buf, off)")
            dec.append("    off += 4")
            dec.append(f"    {a} = buf[off:off + n]")
            dec.append("    off += n")
            dec.append("    if off > len(buf): raise _T")
        elif kind == "table":
            (a,) = attrs
            enc.append(f"    encode_table(m.{a}, out)")
            dec.append(f"    {a}, off = decode_table(buf, off)")
        else:  # pragma: no cover - _fields_of rejects unknown domains
            raise TypeError(kind)
    if not fields:
        enc.append("    pass")
    dec.append(f"    return cls({', '.join(a for a, _w, _d in fields)}), off")
    exec(compile("\n".join(enc) + "\n" + "\n".join(dec) + "\n", f"<amqp091 {cls.NAME}>", "exec"), ns)
    cls._encode_into = staticmethod(ns["encode"])
    cls._decode = staticmethod(ns["decode"])


def _compile() -> None:
    for cls in METHODS.values():
        cls.FIELDS = _fields_of(cls)
        cls.RESPONSES = tuple(METHODS_BY_NAME[n] for n in cls._RESPONSE_NAMES)
        _compile_method(cls)


_compile()


def encode_method_arguments(method: Method, out: bytearray) -> None:
    """Append ``method``'s arguments to ``out``. Raises :class:`EncodeError` for bad values."""
    try:
        method._encode_into(method, out)
    except EncodeError:
        raise
    except (struct.error, ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise EncodeError(f"cannot encode {method.NAME}: {exc}") from exc


def decode_method(payload: bytes, channel: int = 0) -> Method:
    """Decode a whole method-frame payload (class id, method id, arguments)."""
    if len(payload) < 4:
        raise ProtocolError(FRAME_ERROR, "method frame shorter than 4 bytes", channel=channel)
    index = _L.unpack_from(payload, 0)[0]
    cls = METHODS.get(index)
    if cls is None:
        raise ProtocolError(
            COMMAND_INVALID,
            f"unknown method class {index >> 16} method {index & 0xFFFF}",
            channel=channel,
            class_id=index >> 16,
            method_id=index & 0xFFFF,
        )
    try:
        method, off = cls._decode(payload, 4)
    except ProtocolError as exc:
        exc.channel, exc.class_id, exc.method_id = channel, cls.CLASS_ID, cls.METHOD_ID
        raise
    except (_Truncated, struct.error, IndexError):
        raise ProtocolError(
            SYNTAX_ERROR,
            f"{cls.NAME} arguments truncated",
            channel=channel,
            class_id=cls.CLASS_ID,
            method_id=cls.METHOD_ID,
        ) from None
    if off != len(payload):
        raise ProtocolError(
            SYNTAX_ERROR,
            f"{len(payload) - off} bytes after the arguments of {cls.NAME}",
            channel=channel,
            class_id=cls.CLASS_ID,
            method_id=cls.METHOD_ID,
        )
    return method  # type: ignore[no-any-return]


def method_name(class_id: int, method_id: int) -> str:
    cls = METHODS.get(class_id << 16 | method_id)
    return cls.NAME if cls is not None else f"{class_id}.{method_id}"
