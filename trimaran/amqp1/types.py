"""AMQP 1.0 type system: Python representations of the primitive and described types.

Python loses AMQP type information for integers (ubyte .. long all become ``int``), for
symbols versus strings, and for float versus double, so this module gives such values a
small wrapper type. The wrappers subclass the natural Python type, so ``UInt(5) == 5`` and
``Symbol("a") == "a"`` hold and the values can be used anywhere a plain value can.

Mapping used by :mod:`trimaran.amqp1.codec`:

=================  ===========================  ==========================================
AMQP type          decoded as                   plain Python values encoded as this type
=================  ===========================  ==========================================
null               ``None``                     ``None``
boolean            ``bool``                     ``bool``
ubyte/ushort       ``UByte`` / ``UShort``       -
uint / ulong       ``UInt`` / ``ULong``         ``int`` in [2**63, 2**64) -> ulong
byte/short/int     ``Byte`` / ``Short`` / ``Int`` -
long               ``Long``                     ``int`` in the signed 64-bit range
float              ``Float``                    -
double             ``float``                    ``float``
decimal32/64/128   ``Decimal32/64/128``         - (opaque IEEE 754 bytes)
char               ``Char``                     -
timestamp          ``Timestamp`` (ms, signed)   ``datetime.datetime`` (aware or UTC)
uuid               ``uuid.UUID``                ``uuid.UUID``
binary             ``bytes``                    ``bytes``, ``bytearray``, ``memoryview``
string             ``str``                      ``str``
symbol             ``Symbol``                   -
list               ``list``                     ``list``, ``tuple``
map                ``dict``                     ``dict``
array              ``Array``                    -
described          ``Described``                -
=================  ===========================  ==========================================

So ``decode(encode(x)) == x`` holds with matching types for every value built from these
representations; a plain ``int`` comes back as ``Long`` (which still equals it).
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass
from typing import Any

# mypyc compiles this module, and builds the wrappers below as ordinary Python classes: it cannot
# make native classes of builtin types' subclasses.
from trimaran.compiled import mypyc_attr

__all__ = [
    "Array",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "DecodeError",
    "Described",
    "EncodeError",
    "Float",
    "Int",
    "Long",
    "Short",
    "Symbol",
    "T",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
]


class DecodeError(ValueError):
    """Malformed AMQP 1.0 input. ``condition`` is the AMQP error condition to answer with."""

    def __init__(self, message: str, condition: str = "amqp:decode-error") -> None:
        super().__init__(message)
        self.condition = condition


class EncodeError(ValueError):
    """A value that cannot be represented in AMQP 1.0 (out of range, unknown Python type)."""


@mypyc_attr(native_class=False)
class _RangedInt(int):
    _lo = 0
    _hi = 0
    __slots__ = ()

    def __new__(cls, value: int = 0) -> Any:
        v = int.__new__(cls, value)
        if not cls._lo <= v <= cls._hi:
            raise EncodeError(f"{cls.__name__} out of range: {int(value)}")
        return v

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


@mypyc_attr(native_class=False)
class UByte(_RangedInt):
    _lo = 0
    _hi = 0xFF
    __slots__ = ()


@mypyc_attr(native_class=False)
class UShort(_RangedInt):
    _lo = 0
    _hi = 0xFFFF
    __slots__ = ()


@mypyc_attr(native_class=False)
class UInt(_RangedInt):
    _lo = 0
    _hi = 0xFFFF_FFFF
    __slots__ = ()


@mypyc_attr(native_class=False)
class ULong(_RangedInt):
    _lo = 0
    _hi = 0xFFFF_FFFF_FFFF_FFFF
    __slots__ = ()


@mypyc_attr(native_class=False)
class Byte(_RangedInt):
    _lo = -0x80
    _hi = 0x7F
    __slots__ = ()


@mypyc_attr(native_class=False)
class Short(_RangedInt):
    _lo = -0x8000
    _hi = 0x7FFF
    __slots__ = ()


@mypyc_attr(native_class=False)
class Int(_RangedInt):
    _lo = -0x8000_0000
    _hi = 0x7FFF_FFFF
    __slots__ = ()


@mypyc_attr(native_class=False)
class Long(_RangedInt):
    _lo = -0x8000_0000_0000_0000
    _hi = 0x7FFF_FFFF_FFFF_FFFF
    __slots__ = ()


@mypyc_attr(native_class=False)
class Timestamp(_RangedInt):
    """Milliseconds since the Unix epoch (signed 64-bit)."""

    _lo = -0x8000_0000_0000_0000
    _hi = 0x7FFF_FFFF_FFFF_FFFF
    __slots__ = ()


_F32 = struct.Struct(">f")


@mypyc_attr(native_class=False)
class Float(float):
    """An IEEE 754 single-precision value. The value is rounded to 32 bits on creation."""

    __slots__ = ()

    def __new__(cls, value: float = 0.0) -> Float:
        v = float(value)
        if math.isfinite(v) and abs(v) > 3.4028234663852886e38:
            raise EncodeError(f"Float out of range: {v}")
        return float.__new__(cls, _F32.unpack(_F32.pack(v))[0])

    def __repr__(self) -> str:
        return f"Float({float(self)!r})"


@mypyc_attr(native_class=False)
class Symbol(str):
    """An AMQP symbol: an ASCII name such as ``amqp:decode-error``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str(self)!r})"


@mypyc_attr(native_class=False)
class Char(str):
    """A single Unicode code point (AMQP char, UTF-32)."""

    __slots__ = ()

    def __new__(cls, value: str) -> Char:
        if len(value) != 1:
            raise EncodeError("Char holds exactly one code point")
        return str.__new__(cls, value)

    def __repr__(self) -> str:
        return f"Char({str(self)!r})"


@mypyc_attr(native_class=False)
class _Opaque(bytes):
    _size = 0
    __slots__ = ()

    def __new__(cls, value: bytes) -> Any:
        v = bytes.__new__(cls, value)
        if len(v) != cls._size:
            raise EncodeError(f"{cls.__name__} needs exactly {cls._size} bytes")
        return v

    def __repr__(self) -> str:
        return f"{type(self).__name__}({bytes(self)!r})"


@mypyc_attr(native_class=False)
class Decimal32(_Opaque):
    """IEEE 754-2008 decimal32 kept as its 4 raw bytes (big-endian)."""

    _size = 4
    __slots__ = ()


@mypyc_attr(native_class=False)
class Decimal64(_Opaque):
    """IEEE 754-2008 decimal64 kept as its 8 raw bytes (big-endian)."""

    _size = 8
    __slots__ = ()


@mypyc_attr(native_class=False)
class Decimal128(_Opaque):
    """IEEE 754-2008 decimal128 kept as its 16 raw bytes (big-endian)."""

    _size = 16
    __slots__ = ()


class T(enum.Enum):
    """AMQP primitive type names, used for array element types and composite field types."""

    NULL = "null"
    BOOLEAN = "boolean"
    UBYTE = "ubyte"
    USHORT = "ushort"
    UINT = "uint"
    ULONG = "ulong"
    BYTE = "byte"
    SHORT = "short"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    DECIMAL32 = "decimal32"
    DECIMAL64 = "decimal64"
    DECIMAL128 = "decimal128"
    CHAR = "char"
    TIMESTAMP = "timestamp"
    UUID = "uuid"
    BINARY = "binary"
    STRING = "string"
    SYMBOL = "symbol"
    LIST = "list"
    MAP = "map"
    ARRAY = "array"


@dataclass(frozen=True, slots=True)
class Described:
    """A described value: ``descriptor`` is a ``ULong`` code or a ``Symbol`` name."""

    descriptor: Any
    value: Any


@dataclass(frozen=True, slots=True)
class Array:
    """An AMQP array: every item has the same type ``type``.

    For an array of described values, ``descriptor`` is set and ``items`` hold the bare
    values (of ``type``) that the descriptor applies to.
    """

    type: T
    items: list[Any]
    descriptor: Any = None

    def __hash__(self) -> int:
        return hash((self.type, len(self.items), self.descriptor))
