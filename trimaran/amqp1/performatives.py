"""AMQP 1.0 composite types, declared once as tables of fields.

Each composite is a keyword-only dataclass (its fields and their defaults, which are the spec's),
followed by one :func:`composite` call giving its descriptor code and symbol, the groups it belongs
to, and each field's AMQP type in order (``"symbol[]"`` for a ``multiple`` field). That call turns
the class into a row of the registry, compiles one writer and one reader per field, and registers
the one generic encoder with the codec (so ``codec.encode(Open(...))`` works) and the one generic
decoder (:func:`from_described`), both running over the table. Nothing is hand-written per type.
A call after the class, not a class decorator: mypyc compiles these classes as native ones, which
a decorator of our own would prevent.

Encoding rules: a field equal to its default is sent as null, trailing nulls are omitted,
``multiple`` fields are sent as arrays. Decoding rules: null or missing fields take their
default, a missing mandatory field raises ``DecodeError`` with ``amqp:invalid-field``, extra
trailing fields are ignored, a ``multiple`` field is always decoded to a ``list`` (or
``None``), integers of restricted types are plain ``int``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from .codec import decode, decode_value, encode, encode_into, encoder_for, register_encoder
from .types import (
    Array,
    Byte,
    DecodeError,
    Described,
    EncodeError,
    Int,
    Long,
    Short,
    Symbol,
    T,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

# Field type names: AMQP primitive names, "*" (any value), or a composite group / name. Typed Any,
# not type[int]: compiled, a call through type[int] would give a plain int, not the wrapper.
_INT_TYPES: dict[str, Any] = {
    "ubyte": UByte,
    "ushort": UShort,
    "uint": UInt,
    "ulong": ULong,
    "byte": Byte,
    "short": Short,
    "int": Int,
    "long": Long,
}
_ARRAY_TYPES: dict[str, T] = {
    "symbol": T.SYMBOL,
    "string": T.STRING,
    "uint": T.UINT,
    "ulong": T.ULONG,
    "binary": T.BINARY,
}


def _identity(v: Any) -> Any:
    return v


@dataclass(frozen=True, slots=True)
class FieldSpec:
    attr: str
    type: str
    mandatory: bool
    multiple: bool
    default: Any
    # Compiled from the above by ``composite``: write a non-null value / check a decoded one.
    write: Callable[[bytearray, Any], None] = dataclasses.field(
        default=encode_into, compare=False, repr=False
    )
    read: Callable[[Any], Any] = dataclasses.field(default=_identity, compare=False, repr=False)


class Composite:
    """Base of every described list type: a dataclass subclass registered by :func:`composite`."""

    CODE: ClassVar[int]
    NAME: ClassVar[Symbol]
    GROUPS: ClassVar[tuple[str, ...]]
    FIELDS: ClassVar[tuple[FieldSpec, ...]]
    PREFIX: ClassVar[bytes]  # the encoded descriptor
    MIN_FIELDS: ClassVar[int]  # fields up to and including the last mandatory one

    def to_described(self) -> Described:
        return to_described(self)


_BY_CODE: dict[int, type[Composite]] = {}
_BY_NAME: dict[str, type[Composite]] = {}
_BY_GROUP: dict[str, set[type[Composite]]] = {}


def composite(
    cls: type[Composite], code: int, name: str, groups: tuple[str, ...], types: dict[str, str]
) -> None:
    """Register the dataclass ``cls`` as a composite type: ``code`` is the descriptor's ulong
    (domain 0x00000000), ``types`` each field's AMQP type, in the fields' order."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if [f.name for f in fields] != list(types):
        raise TypeError(f"{cls.__name__}: the AMQP types name {list(types)}, not its fields")
    specs = []
    for f in fields:
        mandatory = f.default is dataclasses.MISSING
        t = types[f.name]
        multiple = t.endswith("[]")
        if multiple:
            t = t[:-2]
        default = None if mandatory else f.default
        specs.append(
            FieldSpec(
                f.name,
                t,
                mandatory,
                multiple,
                default,
                _field_writer(f.name, t, multiple),
                _field_reader(f.name, t),
            )
        )
    cls.CODE = code
    cls.NAME = Symbol(name)
    cls.GROUPS = groups
    cls.FIELDS = tuple(specs)
    cls.MIN_FIELDS = max((i + 1 for i, sp in enumerate(specs) if sp.mandatory), default=0)
    cls.PREFIX = b"\x00\x53" + bytes([code]) if code < 0x100 else encode(ULong(code))
    register_encoder(cls, _write_composite)
    _BY_CODE[code] = cls
    _BY_NAME[name] = cls
    for g in (cls.__name__, *groups):
        _BY_GROUP.setdefault(g, set()).add(cls)
    _BY_GROUP.setdefault(_kebab(cls.__name__), set()).add(cls)


def _kebab(name: str) -> str:
    return "".join("-" + c.lower() if c.isupper() else c for c in name).lstrip("-")


# --------------------------------------------------------------------------------------
# Generic encode / decode driven by FIELDS
# --------------------------------------------------------------------------------------


def _invalid(attr: str, what: str) -> DecodeError:
    return DecodeError(f"field {attr} must be {what}", "amqp:invalid-field")


def _field_writer(attr: str, t: str, multiple: bool) -> Callable[[bytearray, Any], None]:
    """A writer for one non-null field value, coercing plain Python values to the field type."""
    if multiple:
        item = _field_writer(attr, t, False)
        array_type = _ARRAY_TYPES.get(t, T.SYMBOL)

        def write_multiple(out: bytearray, v: Any) -> None:
            if not isinstance(v, (list, tuple)):
                item(out, v)
                return
            items = [_coerce(t, x) for x in v]
            encode_into(out, Array(array_type, items))

        return write_multiple
    wrap = _INT_TYPES.get(t)
    if wrap is not None:
        lo: int = wrap._lo
        hi: int = wrap._hi
        raw = encoder_for(wrap)

        def write_int(out: bytearray, v: Any) -> None:
            if v.__class__ is bool or not isinstance(v, int) or not lo <= v <= hi:
                raise EncodeError(f"field {attr} needs a {t}, got {v!r}")
            raw(out, v)

        return write_int
    if t in ("symbol", "string"):
        raw_str = encoder_for(Symbol if t == "symbol" else str)

        def write_str(out: bytearray, v: Any) -> None:
            if not isinstance(v, str):
                raise EncodeError(f"field {attr} needs a {t}, got {v!r}")
            raw_str(out, v)

        return write_str
    if t == "boolean":
        return lambda out, v: out.append(0x41 if v else 0x42)
    if t in ("binary", "timestamp", "fields"):
        return lambda out, v: encode_into(out, _coerce(t, v))
    return encode_into  # map, "*", composites: the value's own type decides


def _coerce(t: str, v: Any) -> Any:
    """A plain Python value as the AMQP type ``t`` (for arrays and the slow paths)."""
    wrap = _INT_TYPES.get(t)
    if wrap is not None:
        if v.__class__ is bool or not isinstance(v, int):
            raise EncodeError(f"{t} needs an int, got {v!r}")
        return wrap(v)
    if t == "symbol":
        return Symbol(v)
    if t == "boolean":
        return bool(v)
    if t == "binary":
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise EncodeError(f"binary needs bytes, got {v!r}")
        return v
    if t == "timestamp":
        return v if isinstance(v, datetime.datetime) else Timestamp(v)
    if t == "fields":
        if not isinstance(v, dict):
            raise EncodeError("fields needs a dict")
        return {Symbol(k) if type(k) is str else k: x for k, x in v.items()}
    return v


def _write_composite(out: bytearray, obj: Any) -> None:
    """Encode a composite: its descriptor, then its fields as a list without trailing nulls."""
    out += obj.PREFIX
    body = bytearray()
    count = 0
    nulls = 0
    for spec in obj.FIELDS:
        v = getattr(obj, spec.attr)
        if v is None or (not spec.mandatory and v == spec.default and type(v) is type(spec.default)):
            nulls += 1
            continue
        if nulls:
            body += b"\x40" * nulls
            count += nulls
            nulls = 0
        spec.write(body, v)
        count += 1
    if not count:
        out.append(0x45)
    elif count <= 0xFF and len(body) <= 0xFE:
        out += bytes((0xC0, len(body) + 1, count))
        out += body
    else:
        out.append(0xD0)
        out += (len(body) + 4).to_bytes(4, "big") + count.to_bytes(4, "big")
        out += body


def to_described(obj: Composite) -> Described:
    """The composite as a generic described value (descriptor code and field list)."""
    value = decode(encode(obj))
    assert isinstance(value, Described)
    return value


def _field_reader(attr: str, t: str) -> Callable[[Any], Any]:
    """A checker/converter for one decoded non-null field value."""
    wrap = _INT_TYPES.get(t)
    if wrap is not None:
        lo: int = wrap._lo
        hi: int = wrap._hi

        def read_int(v: Any) -> Any:
            if v.__class__ is bool or not isinstance(v, int):
                raise _invalid(attr, f"a {t}")
            if not lo <= v <= hi:
                raise _invalid(attr, f"in range for {t}")
            return int(v)

        return read_int
    simple: dict[str, tuple[type | tuple[type, ...], str]] = {
        "string": (str, "a string"),
        "binary": (bytes, "binary"),
        "boolean": (bool, "a boolean"),
        "fields": (dict, "a map"),
        "map": (dict, "a map"),
    }
    if t in simple:
        kind, what = simple[t]

        def read_simple(v: Any) -> Any:
            if not isinstance(v, kind):
                raise _invalid(attr, what)
            return v

        return read_simple
    if t == "symbol":

        def read_symbol(v: Any) -> Any:
            if not isinstance(v, str):
                raise _invalid(attr, "a symbol")
            return v if v.__class__ is Symbol else Symbol(v)

        return read_symbol
    if t == "timestamp":

        def read_timestamp(v: Any) -> Any:
            if v.__class__ is bool or not isinstance(v, int):
                raise _invalid(attr, "a timestamp")
            return Timestamp(v)

        return read_timestamp
    if t == "*":

        def read_any(v: Any) -> Any:
            if isinstance(v, Described) and isinstance(v.value, list) and _lookup(v.descriptor) is not None:
                return from_described(v)
            return v

        return read_any

    def read_composite(v: Any) -> Any:
        # A composite group or type name: resolved at decode time (the group may grow).
        allowed = _BY_GROUP.get(t)
        if allowed is None or not isinstance(v, Described):
            raise _invalid(attr, f"a described {t}")
        obj = from_described(v)
        if type(obj) not in allowed:
            raise _invalid(attr, f"{t}, not {type(obj).__name__}")
        return obj

    return read_composite


def _lookup(descriptor: Any) -> type[Composite] | None:
    if isinstance(descriptor, str):
        return _BY_NAME.get(descriptor)
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return _BY_CODE.get(descriptor)
    return None


def from_described(d: Described) -> Composite:
    """Build the registered composite that ``d`` describes."""
    cls = _lookup(d.descriptor)
    if cls is None:
        raise DecodeError(f"unknown descriptor {d.descriptor!r}")
    return _build(cls, d.value)


def _build(cls: type[Composite], values: Any) -> Composite:
    if not isinstance(values, list):
        raise DecodeError(f"{cls.__name__} body is not a list")
    fields = cls.FIELDS
    if len(values) < cls.MIN_FIELDS:
        missing = next(s for s in fields[len(values) :] if s.mandatory)
        raise DecodeError(f"{cls.NAME}: mandatory field {missing.attr} is missing", "amqp:invalid-field")
    kwargs: dict[str, Any] = {}
    # zip stops at the shorter: absent and null fields keep the dataclass default (= the spec's)
    for spec, v in zip(fields, values, strict=False):
        if v is None:
            if spec.mandatory:
                raise DecodeError(f"{cls.NAME}: mandatory field {spec.attr} is null", "amqp:invalid-field")
        elif spec.multiple:
            items = v.items if isinstance(v, Array) else v if isinstance(v, list) else [v]
            kwargs[spec.attr] = [spec.read(x) for x in items]
        else:
            kwargs[spec.attr] = spec.read(v)
    return cls(**kwargs)


def decode_composite(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[Composite, int]:
    """Decode one registered composite at ``pos``; returns it and the position after it."""
    if pos >= len(buf) or buf[pos] != 0x00:
        raise DecodeError("expected a described type")
    descriptor, p = decode_value(buf, pos + 1)
    cls = _lookup(descriptor)
    if cls is None:
        raise DecodeError(f"unknown descriptor {descriptor!r}")
    values, end = decode_value(buf, p)
    return _build(cls, values), end


# --------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------

ROLE_SENDER = False
ROLE_RECEIVER = True
SND_UNSETTLED = 0
SND_SETTLED = 1
SND_MIXED = 2
RCV_FIRST = 0
RCV_SECOND = 1
MAX_UINT = 0xFFFF_FFFF

DECODE_ERROR = Symbol("amqp:decode-error")
INTERNAL_ERROR = Symbol("amqp:internal-error")
NOT_FOUND = Symbol("amqp:not-found")
UNAUTHORIZED_ACCESS = Symbol("amqp:unauthorized-access")
RESOURCE_LIMIT_EXCEEDED = Symbol("amqp:resource-limit-exceeded")
RESOURCE_LOCKED = Symbol("amqp:resource-locked")
NOT_ALLOWED = Symbol("amqp:not-allowed")
INVALID_FIELD = Symbol("amqp:invalid-field")
NOT_IMPLEMENTED = Symbol("amqp:not-implemented")
ILLEGAL_STATE = Symbol("amqp:illegal-state")
PRECONDITION_FAILED = Symbol("amqp:precondition-failed")
CONNECTION_FORCED = Symbol("amqp:connection:forced")
FRAMING_ERROR = Symbol("amqp:connection:framing-error")
WINDOW_VIOLATION = Symbol("amqp:session:window-violation")
ERRANT_LINK = Symbol("amqp:session:errant-link")
HANDLE_IN_USE = Symbol("amqp:session:handle-in-use")
UNATTACHED_HANDLE = Symbol("amqp:session:unattached-handle")
DETACH_FORCED = Symbol("amqp:link:detach-forced")
TRANSFER_LIMIT_EXCEEDED = Symbol("amqp:link:transfer-limit-exceeded")
MESSAGE_SIZE_EXCEEDED = Symbol("amqp:link:message-size-exceeded")
LINK_REDIRECT = Symbol("amqp:link:redirect")
LINK_STOLEN = Symbol("amqp:link:stolen")

# --------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class Error(Composite):
    condition: str
    description: str | None = None
    info: dict[Any, Any] | None = None


composite(
    Error, 0x1D, "amqp:error:list", (), {"condition": "symbol", "description": "string", "info": "fields"}
)


@dataclass(kw_only=True, slots=True)
class Open(Composite):
    container_id: str
    hostname: str | None = None
    max_frame_size: int = MAX_UINT
    channel_max: int = 0xFFFF
    idle_time_out: int | None = None
    outgoing_locales: list[str] | None = None
    incoming_locales: list[str] | None = None
    offered_capabilities: list[str] | None = None
    desired_capabilities: list[str] | None = None
    properties: dict[Any, Any] | None = None


composite(
    Open,
    0x10,
    "amqp:open:list",
    ("frame",),
    {
        "container_id": "string",
        "hostname": "string",
        "max_frame_size": "uint",
        "channel_max": "ushort",
        "idle_time_out": "uint",
        "outgoing_locales": "symbol[]",
        "incoming_locales": "symbol[]",
        "offered_capabilities": "symbol[]",
        "desired_capabilities": "symbol[]",
        "properties": "fields",
    },
)


@dataclass(kw_only=True, slots=True)
class Begin(Composite):
    remote_channel: int | None = None
    next_outgoing_id: int
    incoming_window: int
    outgoing_window: int
    handle_max: int = MAX_UINT
    offered_capabilities: list[str] | None = None
    desired_capabilities: list[str] | None = None
    properties: dict[Any, Any] | None = None


composite(
    Begin,
    0x11,
    "amqp:begin:list",
    ("frame",),
    {
        "remote_channel": "ushort",
        "next_outgoing_id": "uint",
        "incoming_window": "uint",
        "outgoing_window": "uint",
        "handle_max": "uint",
        "offered_capabilities": "symbol[]",
        "desired_capabilities": "symbol[]",
        "properties": "fields",
    },
)


@dataclass(kw_only=True, slots=True)
class Attach(Composite):
    name: str
    handle: int
    role: bool
    snd_settle_mode: int = SND_MIXED
    rcv_settle_mode: int = RCV_FIRST
    source: Any = None
    target: Any = None
    unsettled: dict[Any, Any] | None = None
    incomplete_unsettled: bool = False
    initial_delivery_count: int | None = None
    max_message_size: int | None = None
    offered_capabilities: list[str] | None = None
    desired_capabilities: list[str] | None = None
    properties: dict[Any, Any] | None = None


composite(
    Attach,
    0x12,
    "amqp:attach:list",
    ("frame",),
    {
        "name": "string",
        "handle": "uint",
        "role": "boolean",
        "snd_settle_mode": "ubyte",
        "rcv_settle_mode": "ubyte",
        "source": "*",
        "target": "*",
        "unsettled": "map",
        "incomplete_unsettled": "boolean",
        "initial_delivery_count": "uint",
        "max_message_size": "ulong",
        "offered_capabilities": "symbol[]",
        "desired_capabilities": "symbol[]",
        "properties": "fields",
    },
)


@dataclass(kw_only=True, slots=True)
class Flow(Composite):
    next_incoming_id: int | None = None
    incoming_window: int
    next_outgoing_id: int
    outgoing_window: int
    handle: int | None = None
    delivery_count: int | None = None
    link_credit: int | None = None
    available: int | None = None
    drain: bool = False
    echo: bool = False
    properties: dict[Any, Any] | None = None


composite(
    Flow,
    0x13,
    "amqp:flow:list",
    ("frame",),
    {
        "next_incoming_id": "uint",
        "incoming_window": "uint",
        "next_outgoing_id": "uint",
        "outgoing_window": "uint",
        "handle": "uint",
        "delivery_count": "uint",
        "link_credit": "uint",
        "available": "uint",
        "drain": "boolean",
        "echo": "boolean",
        "properties": "fields",
    },
)


@dataclass(kw_only=True, slots=True)
class Transfer(Composite):
    handle: int
    delivery_id: int | None = None
    delivery_tag: bytes | None = None
    message_format: int | None = None
    settled: bool | None = None
    more: bool = False
    rcv_settle_mode: int | None = None
    state: Any = None
    resume: bool = False
    aborted: bool = False
    batchable: bool = False


composite(
    Transfer,
    0x14,
    "amqp:transfer:list",
    ("frame",),
    {
        "handle": "uint",
        "delivery_id": "uint",
        "delivery_tag": "binary",
        "message_format": "uint",
        "settled": "boolean",
        "more": "boolean",
        "rcv_settle_mode": "ubyte",
        "state": "delivery-state",
        "resume": "boolean",
        "aborted": "boolean",
        "batchable": "boolean",
    },
)


@dataclass(kw_only=True, slots=True)
class Disposition(Composite):
    role: bool
    first: int
    last: int | None = None
    settled: bool = False
    state: Any = None
    batchable: bool = False


composite(
    Disposition,
    0x15,
    "amqp:disposition:list",
    ("frame",),
    {
        "role": "boolean",
        "first": "uint",
        "last": "uint",
        "settled": "boolean",
        "state": "delivery-state",
        "batchable": "boolean",
    },
)


@dataclass(kw_only=True, slots=True)
class Detach(Composite):
    handle: int
    closed: bool = False
    error: Error | None = None


composite(
    Detach, 0x16, "amqp:detach:list", ("frame",), {"handle": "uint", "closed": "boolean", "error": "error"}
)


@dataclass(kw_only=True, slots=True)
class End(Composite):
    error: Error | None = None


composite(End, 0x17, "amqp:end:list", ("frame",), {"error": "error"})


@dataclass(kw_only=True, slots=True)
class Close(Composite):
    error: Error | None = None


composite(Close, 0x18, "amqp:close:list", ("frame",), {"error": "error"})


# Delivery states and outcomes.


@dataclass(kw_only=True, slots=True)
class Received(Composite):
    section_number: int
    section_offset: int


composite(
    Received,
    0x23,
    "amqp:received:list",
    ("delivery-state",),
    {"section_number": "uint", "section_offset": "ulong"},
)


@dataclass(kw_only=True, slots=True)
class Accepted(Composite):
    pass


composite(Accepted, 0x24, "amqp:accepted:list", ("delivery-state", "outcome"), {})


@dataclass(kw_only=True, slots=True)
class Rejected(Composite):
    error: Error | None = None


composite(Rejected, 0x25, "amqp:rejected:list", ("delivery-state", "outcome"), {"error": "error"})


@dataclass(kw_only=True, slots=True)
class Released(Composite):
    pass


composite(Released, 0x26, "amqp:released:list", ("delivery-state", "outcome"), {})


@dataclass(kw_only=True, slots=True)
class Modified(Composite):
    delivery_failed: bool | None = None
    undeliverable_here: bool | None = None
    message_annotations: dict[Any, Any] | None = None


composite(
    Modified,
    0x27,
    "amqp:modified:list",
    ("delivery-state", "outcome"),
    {"delivery_failed": "boolean", "undeliverable_here": "boolean", "message_annotations": "fields"},
)


# Terminus types.


@dataclass(kw_only=True, slots=True)
class Source(Composite):
    address: Any = None
    durable: int = 0
    expiry_policy: str = Symbol("session-end")
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    distribution_mode: str | None = None
    filter: dict[Any, Any] | None = None
    default_outcome: Any = None
    outcomes: list[str] | None = None
    capabilities: list[str] | None = None


composite(
    Source,
    0x28,
    "amqp:source:list",
    ("source",),
    {
        "address": "*",
        "durable": "uint",
        "expiry_policy": "symbol",
        "timeout": "uint",
        "dynamic": "boolean",
        "dynamic_node_properties": "fields",
        "distribution_mode": "symbol",
        "filter": "map",
        "default_outcome": "*",
        "outcomes": "symbol[]",
        "capabilities": "symbol[]",
    },
)


@dataclass(kw_only=True, slots=True)
class Target(Composite):
    address: Any = None
    durable: int = 0
    expiry_policy: str = Symbol("session-end")
    timeout: int = 0
    dynamic: bool = False
    dynamic_node_properties: dict[Any, Any] | None = None
    capabilities: list[str] | None = None


composite(
    Target,
    0x29,
    "amqp:target:list",
    ("target",),
    {
        "address": "*",
        "durable": "uint",
        "expiry_policy": "symbol",
        "timeout": "uint",
        "dynamic": "boolean",
        "dynamic_node_properties": "fields",
        "capabilities": "symbol[]",
    },
)


@dataclass(kw_only=True, slots=True)
class Coordinator(Composite):
    """The transaction coordinator target (part 4): a sender link to it declares and discharges."""

    capabilities: list[str] | None = None


composite(Coordinator, 0x30, "amqp:coordinator:list", ("target",), {"capabilities": "symbol[]"})


@dataclass(kw_only=True, slots=True)
class Declare(Composite):
    """The body of a message to the coordinator: start a transaction (no global ids here)."""

    global_id: Any = None


composite(Declare, 0x31, "amqp:declare:list", (), {"global_id": "*"})


@dataclass(kw_only=True, slots=True)
class Discharge(Composite):
    """End transaction ``txn_id``: commit, or roll back when ``fail``."""

    txn_id: bytes
    fail: bool = False


composite(Discharge, 0x32, "amqp:discharge:list", (), {"txn_id": "binary", "fail": "boolean"})


@dataclass(kw_only=True, slots=True)
class Declared(Composite):
    """The coordinator's outcome for a declare: the new transaction's id."""

    txn_id: bytes


composite(Declared, 0x33, "amqp:declared:list", ("delivery-state", "outcome"), {"txn_id": "binary"})


@dataclass(kw_only=True, slots=True)
class TransactionalState(Composite):
    """A transfer's or disposition's state inside transaction ``txn_id`` (the outcome takes
    effect when it commits)."""

    txn_id: bytes
    outcome: Any = None


composite(
    TransactionalState,
    0x34,
    "amqp:transactional-state:list",
    ("delivery-state",),
    {"txn_id": "binary", "outcome": "*"},
)


@dataclass(kw_only=True, slots=True)
class DeleteOnClose(Composite):
    pass


composite(DeleteOnClose, 0x2B, "amqp:delete-on-close:list", ("lifetime-policy",), {})


@dataclass(kw_only=True, slots=True)
class DeleteOnNoLinks(Composite):
    pass


composite(DeleteOnNoLinks, 0x2C, "amqp:delete-on-no-links:list", ("lifetime-policy",), {})


@dataclass(kw_only=True, slots=True)
class DeleteOnNoMessages(Composite):
    pass


composite(DeleteOnNoMessages, 0x2D, "amqp:delete-on-no-messages:list", ("lifetime-policy",), {})


@dataclass(kw_only=True, slots=True)
class DeleteOnNoLinksOrMessages(Composite):
    pass


composite(
    DeleteOnNoLinksOrMessages, 0x2E, "amqp:delete-on-no-links-or-messages:list", ("lifetime-policy",), {}
)


# SASL frames (frame type 1).


@dataclass(kw_only=True, slots=True)
class SaslMechanisms(Composite):
    sasl_server_mechanisms: list[str]


composite(
    SaslMechanisms, 0x40, "amqp:sasl-mechanisms:list", ("sasl",), {"sasl_server_mechanisms": "symbol[]"}
)


@dataclass(kw_only=True, slots=True)
class SaslInit(Composite):
    mechanism: str
    initial_response: bytes | None = None
    hostname: str | None = None


composite(
    SaslInit,
    0x41,
    "amqp:sasl-init:list",
    ("sasl",),
    {"mechanism": "symbol", "initial_response": "binary", "hostname": "string"},
)


@dataclass(kw_only=True, slots=True)
class SaslChallenge(Composite):
    challenge: bytes


composite(SaslChallenge, 0x42, "amqp:sasl-challenge:list", ("sasl",), {"challenge": "binary"})


@dataclass(kw_only=True, slots=True)
class SaslResponse(Composite):
    response: bytes


composite(SaslResponse, 0x43, "amqp:sasl-response:list", ("sasl",), {"response": "binary"})


@dataclass(kw_only=True, slots=True)
class SaslOutcome(Composite):
    code: int
    additional_data: bytes | None = None


composite(
    SaslOutcome, 0x44, "amqp:sasl-outcome:list", ("sasl",), {"code": "ubyte", "additional_data": "binary"}
)


FRAME_TYPES: tuple[type[Composite], ...] = (
    Open,
    Begin,
    Attach,
    Flow,
    Transfer,
    Disposition,
    Detach,
    End,
    Close,
)
SASL_TYPES: tuple[type[Composite], ...] = (SaslMechanisms, SaslInit, SaslChallenge, SaslResponse, SaslOutcome)
DELIVERY_STATES: tuple[type[Composite], ...] = (Received, Accepted, Rejected, Released, Modified)
ALL_COMPOSITES: tuple[type[Composite], ...] = tuple(_BY_CODE.values())
