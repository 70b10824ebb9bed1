"""AMQP 1.0 composite types, declared once as tables of fields.

Each composite is a keyword-only dataclass whose fields carry their AMQP definition
(``fld(type, default=..., multiple=...)``); the :func:`composite` decorator turns the class
into a row of the registry (descriptor code and symbol plus its field table), compiles one
writer and one reader per field from it, and one generic encoder (registered with the codec,
so ``codec.encode(Open(...))`` works) and decoder (:func:`from_described`) run over the table.
Nothing is hand-written per type.

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
from typing import Any, ClassVar, TypeVar, cast, dataclass_transform

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

_REQUIRED: Any = dataclasses.MISSING

# Field type names: AMQP primitive names, "*" (any value), or a composite group / name.
_INT_TYPES: dict[str, type[int]] = {
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


@dataclasses.dataclass(frozen=True, slots=True)
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
    read: Callable[[Any], Any] = dataclasses.field(default=lambda v: v, compare=False, repr=False)


def fld(type_: str, *, default: Any = _REQUIRED, multiple: bool = False) -> Any:
    """Declare a composite field. No ``default`` means the field is mandatory."""
    md = {"amqp_type": type_, "multiple": multiple}
    if default is _REQUIRED:
        return dataclasses.field(metadata=md)
    return dataclasses.field(default=default, metadata=md)


class Composite:
    """Base of every described list type. Subclasses are made by :func:`composite`."""

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

C = TypeVar("C", bound=type[Composite])


@dataclass_transform(kw_only_default=True, field_specifiers=(fld,))
def composite(code: int, name: str, *groups: str) -> Callable[[C], C]:
    """Register a composite type: ``code`` is the descriptor's ulong (domain 0x00000000)."""

    def wrap(cls: C) -> C:
        dc: Any = dataclasses.dataclass(kw_only=True, slots=True)(cls)
        specs = []
        for f in dataclasses.fields(dc):
            default = None if f.default is dataclasses.MISSING else f.default
            spec = FieldSpec(
                f.name,
                f.metadata["amqp_type"],
                f.default is dataclasses.MISSING,
                f.metadata["multiple"],
                default,
            )
            specs.append(dataclasses.replace(spec, write=_field_writer(spec), read=_field_reader(spec)))
        dc.CODE = code
        dc.NAME = Symbol(name)
        dc.GROUPS = groups
        dc.FIELDS = tuple(specs)
        dc.MIN_FIELDS = max((i + 1 for i, sp in enumerate(specs) if sp.mandatory), default=0)
        dc.PREFIX = b"\x00\x53" + bytes([code]) if code < 0x100 else encode(ULong(code))
        register_encoder(dc, _write_composite)
        _BY_CODE[code] = dc
        _BY_NAME[name] = dc
        for g in (dc.__name__, *groups):
            _BY_GROUP.setdefault(g, set()).add(dc)
        _BY_GROUP.setdefault(_kebab(dc.__name__), set()).add(dc)
        return cast(C, dc)

    return wrap


def _kebab(name: str) -> str:
    return "".join("-" + c.lower() if c.isupper() else c for c in name).lstrip("-")


# --------------------------------------------------------------------------------------
# Generic encode / decode driven by FIELDS
# --------------------------------------------------------------------------------------


def _invalid(spec: FieldSpec, what: str) -> DecodeError:
    return DecodeError(f"field {spec.attr} must be {what}", "amqp:invalid-field")


def _field_writer(spec: FieldSpec) -> Callable[[bytearray, Any], None]:
    """A writer for one non-null field value, coercing plain Python values to the field type."""
    t = spec.type
    if spec.multiple:
        item = _field_writer(dataclasses.replace(spec, multiple=False))
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
        lo, hi = wrap._lo, wrap._hi  # type: ignore[attr-defined]
        raw = encoder_for(wrap)

        def write_int(out: bytearray, v: Any) -> None:
            if v.__class__ is bool or not isinstance(v, int) or not lo <= v <= hi:
                raise EncodeError(f"field {spec.attr} needs a {t}, got {v!r}")
            raw(out, v)

        return write_int
    if t in ("symbol", "string"):
        raw_str = encoder_for(Symbol if t == "symbol" else str)

        def write_str(out: bytearray, v: Any) -> None:
            if not isinstance(v, str):
                raise EncodeError(f"field {spec.attr} needs a {t}, got {v!r}")
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


def _field_reader(spec: FieldSpec) -> Callable[[Any], Any]:
    """A checker/converter for one decoded non-null field value."""
    t = spec.type
    wrap = _INT_TYPES.get(t)
    if wrap is not None:
        lo, hi = wrap._lo, wrap._hi  # type: ignore[attr-defined]

        def read_int(v: Any) -> Any:
            if v.__class__ is bool or not isinstance(v, int):
                raise _invalid(spec, f"a {t}")
            if not lo <= v <= hi:
                raise _invalid(spec, f"in range for {t}")
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
                raise _invalid(spec, what)
            return v

        return read_simple
    if t == "symbol":

        def read_symbol(v: Any) -> Any:
            if not isinstance(v, str):
                raise _invalid(spec, "a symbol")
            return v if v.__class__ is Symbol else Symbol(v)

        return read_symbol
    if t == "timestamp":

        def read_timestamp(v: Any) -> Any:
            if v.__class__ is bool or not isinstance(v, int):
                raise _invalid(spec, "a timestamp")
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
            raise _invalid(spec, f"a described {t}")
        obj = from_described(v)
        if type(obj) not in allowed:
            raise _invalid(spec, f"{t}, not {type(obj).__name__}")
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


@composite(0x1D, "amqp:error:list")
class Error(Composite):
    condition: str = fld("symbol")
    description: str | None = fld("string", default=None)
    info: dict[Any, Any] | None = fld("fields", default=None)


@composite(0x10, "amqp:open:list", "frame")
class Open(Composite):
    container_id: str = fld("string")
    hostname: str | None = fld("string", default=None)
    max_frame_size: int = fld("uint", default=MAX_UINT)
    channel_max: int = fld("ushort", default=0xFFFF)
    idle_time_out: int | None = fld("uint", default=None)
    outgoing_locales: list[str] | None = fld("symbol", default=None, multiple=True)
    incoming_locales: list[str] | None = fld("symbol", default=None, multiple=True)
    offered_capabilities: list[str] | None = fld("symbol", default=None, multiple=True)
    desired_capabilities: list[str] | None = fld("symbol", default=None, multiple=True)
    properties: dict[Any, Any] | None = fld("fields", default=None)


@composite(0x11, "amqp:begin:list", "frame")
class Begin(Composite):
    remote_channel: int | None = fld("ushort", default=None)
    next_outgoing_id: int = fld("uint")
    incoming_window: int = fld("uint")
    outgoing_window: int = fld("uint")
    handle_max: int = fld("uint", default=MAX_UINT)
    offered_capabilities: list[str] | None = fld("symbol", default=None, multiple=True)
    desired_capabilities: list[str] | None = fld("symbol", default=None, multiple=True)
    properties: dict[Any, Any] | None = fld("fields", default=None)


@composite(0x12, "amqp:attach:list", "frame")
class Attach(Composite):
    name: str = fld("string")
    handle: int = fld("uint")
    role: bool = fld("boolean")
    snd_settle_mode: int = fld("ubyte", default=SND_MIXED)
    rcv_settle_mode: int = fld("ubyte", default=RCV_FIRST)
    source: Any = fld("*", default=None)
    target: Any = fld("*", default=None)
    unsettled: dict[Any, Any] | None = fld("map", default=None)
    incomplete_unsettled: bool = fld("boolean", default=False)
    initial_delivery_count: int | None = fld("uint", default=None)
    max_message_size: int | None = fld("ulong", default=None)
    offered_capabilities: list[str] | None = fld("symbol", default=None, multiple=True)
    desired_capabilities: list[str] | None = fld("symbol", default=None, multiple=True)
    properties: dict[Any, Any] | None = fld("fields", default=None)


@composite(0x13, "amqp:flow:list", "frame")
class Flow(Composite):
    next_incoming_id: int | None = fld("uint", default=None)
    incoming_window: int = fld("uint")
    next_outgoing_id: int = fld("uint")
    outgoing_window: int = fld("uint")
    handle: int | None = fld("uint", default=None)
    delivery_count: int | None = fld("uint", default=None)
    link_credit: int | None = fld("uint", default=None)
    available: int | None = fld("uint", default=None)
    drain: bool = fld("boolean", default=False)
    echo: bool = fld("boolean", default=False)
    properties: dict[Any, Any] | None = fld("fields", default=None)


@composite(0x14, "amqp:transfer:list", "frame")
class Transfer(Composite):
    handle: int = fld("uint")
    delivery_id: int | None = fld("uint", default=None)
    delivery_tag: bytes | None = fld("binary", default=None)
    message_format: int | None = fld("uint", default=None)
    settled: bool | None = fld("boolean", default=None)
    more: bool = fld("boolean", default=False)
    rcv_settle_mode: int | None = fld("ubyte", default=None)
    state: Any = fld("delivery-state", default=None)
    resume: bool = fld("boolean", default=False)
    aborted: bool = fld("boolean", default=False)
    batchable: bool = fld("boolean", default=False)


@composite(0x15, "amqp:disposition:list", "frame")
class Disposition(Composite):
    role: bool = fld("boolean")
    first: int = fld("uint")
    last: int | None = fld("uint", default=None)
    settled: bool = fld("boolean", default=False)
    state: Any = fld("delivery-state", default=None)
    batchable: bool = fld("boolean", default=False)


@composite(0x16, "amqp:detach:list", "frame")
class Detach(Composite):
    handle: int = fld("uint")
    closed: bool = fld("boolean", default=False)
    error: Error | None = fld("error", default=None)


@composite(0x17, "amqp:end:list", "frame")
class End(Composite):
    error: Error | None = fld("error", default=None)


@composite(0x18, "amqp:close:list", "frame")
class Close(Composite):
    error: Error | None = fld("error", default=None)


# Delivery states and outcomes.


@composite(0x23, "amqp:received:list", "delivery-state")
class Received(Composite):
    section_number: int = fld("uint")
    section_offset: int = fld("ulong")


@composite(0x24, "amqp:accepted:list", "delivery-state", "outcome")
class Accepted(Composite):
    pass


@composite(0x25, "amqp:rejected:list", "delivery-state", "outcome")
class Rejected(Composite):
    error: Error | None = fld("error", default=None)


@composite(0x26, "amqp:released:list", "delivery-state", "outcome")
class Released(Composite):
    pass


@composite(0x27, "amqp:modified:list", "delivery-state", "outcome")
class Modified(Composite):
    delivery_failed: bool | None = fld("boolean", default=None)
    undeliverable_here: bool | None = fld("boolean", default=None)
    message_annotations: dict[Any, Any] | None = fld("fields", default=None)


# Terminus types.


@composite(0x28, "amqp:source:list", "source")
class Source(Composite):
    address: Any = fld("*", default=None)
    durable: int = fld("uint", default=0)
    expiry_policy: str = fld("symbol", default=Symbol("session-end"))
    timeout: int = fld("uint", default=0)
    dynamic: bool = fld("boolean", default=False)
    dynamic_node_properties: dict[Any, Any] | None = fld("fields", default=None)
    distribution_mode: str | None = fld("symbol", default=None)
    filter: dict[Any, Any] | None = fld("map", default=None)
    default_outcome: Any = fld("*", default=None)
    outcomes: list[str] | None = fld("symbol", default=None, multiple=True)
    capabilities: list[str] | None = fld("symbol", default=None, multiple=True)


@composite(0x29, "amqp:target:list", "target")
class Target(Composite):
    address: Any = fld("*", default=None)
    durable: int = fld("uint", default=0)
    expiry_policy: str = fld("symbol", default=Symbol("session-end"))
    timeout: int = fld("uint", default=0)
    dynamic: bool = fld("boolean", default=False)
    dynamic_node_properties: dict[Any, Any] | None = fld("fields", default=None)
    capabilities: list[str] | None = fld("symbol", default=None, multiple=True)


@composite(0x30, "amqp:coordinator:list", "target")
class Coordinator(Composite):
    """The transaction coordinator target (part 4): a sender link to it declares and discharges."""

    capabilities: list[str] | None = fld("symbol", default=None, multiple=True)


@composite(0x31, "amqp:declare:list")
class Declare(Composite):
    """The body of a message to the coordinator: start a transaction (no global ids here)."""

    global_id: Any = fld("*", default=None)


@composite(0x32, "amqp:discharge:list")
class Discharge(Composite):
    """End transaction ``txn_id``: commit, or roll back when ``fail``."""

    txn_id: bytes = fld("binary")
    fail: bool = fld("boolean", default=False)


@composite(0x33, "amqp:declared:list", "delivery-state", "outcome")
class Declared(Composite):
    """The coordinator's outcome for a declare: the new transaction's id."""

    txn_id: bytes = fld("binary")


@composite(0x34, "amqp:transactional-state:list", "delivery-state")
class TransactionalState(Composite):
    """A transfer's or disposition's state inside transaction ``txn_id`` (the outcome takes
    effect when it commits)."""

    txn_id: bytes = fld("binary")
    outcome: Any = fld("*", default=None)


@composite(0x2B, "amqp:delete-on-close:list", "lifetime-policy")
class DeleteOnClose(Composite):
    pass


@composite(0x2C, "amqp:delete-on-no-links:list", "lifetime-policy")
class DeleteOnNoLinks(Composite):
    pass


@composite(0x2D, "amqp:delete-on-no-messages:list", "lifetime-policy")
class DeleteOnNoMessages(Composite):
    pass


@composite(0x2E, "amqp:delete-on-no-links-or-messages:list", "lifetime-policy")
class DeleteOnNoLinksOrMessages(Composite):
    pass


# SASL frames (frame type 1).


@composite(0x40, "amqp:sasl-mechanisms:list", "sasl")
class SaslMechanisms(Composite):
    sasl_server_mechanisms: list[str] = fld("symbol", multiple=True)


@composite(0x41, "amqp:sasl-init:list", "sasl")
class SaslInit(Composite):
    mechanism: str = fld("symbol")
    initial_response: bytes | None = fld("binary", default=None)
    hostname: str | None = fld("string", default=None)


@composite(0x42, "amqp:sasl-challenge:list", "sasl")
class SaslChallenge(Composite):
    challenge: bytes = fld("binary")


@composite(0x43, "amqp:sasl-response:list", "sasl")
class SaslResponse(Composite):
    response: bytes = fld("binary")


@composite(0x44, "amqp:sasl-outcome:list", "sasl")
class SaslOutcome(Composite):
    code: int = fld("ubyte")
    additional_data: bytes | None = fld("binary", default=None)


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
