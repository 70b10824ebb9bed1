"""AMQP 0-9-1 field tables and field arrays, with RabbitMQ's type tags.

RabbitMQ does not follow the 0-9-1 PDF's tag table; it follows its errata ("Qpid/Rabbit" column),
which every mainstream client uses. We do the same:

====  ==================  ==================================================
tag   wire type           Python value (decoded)
====  ==================  ==================================================
t     boolean (octet)     ``bool``
b     signed 8-bit        :class:`Int8`
B     unsigned 8-bit      :class:`UInt8`
s     signed 16-bit       :class:`Int16`  (0-9-1 PDF: 's' = short string; not so in practice)
u     unsigned 16-bit     :class:`UInt16`
I     signed 32-bit       ``int``
i     unsigned 32-bit     :class:`UInt32`
l     signed 64-bit       :class:`Int64`
f     32-bit float        :class:`Float32`
d     64-bit float        ``float``
D     decimal             ``decimal.Decimal`` (scale octet + signed 32-bit value)
S     long string         ``str`` (UTF-8, undecodable bytes kept via ``surrogateescape``)
x     byte array          ``bytes``
A     field array         ``list``
T     timestamp (u64)     :class:`Timestamp` (seconds since the epoch)
F     nested table        ``dict``
V     void                ``None``
====  ==================  ==================================================

'B', 'u' and 'i' are the 0-9-1 PDF's tags that RabbitMQ also accepts; we decode them but never
pick them for a plain ``int``. Anything else ('L', 'U', 'c', ...) is a syntax error (502).

Encoding picks the tag from the value's type: the int/float subclasses above keep their tag, a plain
``int`` becomes 'I' when it fits in 32 bits and 'l' otherwise, a plain ``float`` 'd', ``str`` 'S',
``bytes``/``bytearray``/``memoryview`` 'x', ``list``/``tuple`` 'A', ``dict`` 'F', ``None`` 'V',
``datetime`` 'T'. Because decoding returns exactly those types, ``encode(decode(b)) == b`` for every
table this module decodes (save duplicate keys, where the last one wins).
"""

import datetime
import struct
from decimal import Decimal
from typing import Any, NoReturn, TypeAlias

from trimaran.amqp091.errors import SYNTAX_ERROR, EncodeError, ProtocolError

# The typed values live in their own module, which mypyc leaves interpreted: it cannot compile a
# subclass of int or float. fields re-exports them all, as the rest of the code imports them from here.
# (The star import re-exports them for type checkers; compiled, it binds no names at run time, and
# the named import does.)
from trimaran.amqp091.field_types import *  # noqa: F403
from trimaran.amqp091.field_types import Float32, Int8, Int16, Int64, Timestamp, UInt8, UInt16, UInt32, UInt64

FieldValue: TypeAlias = (
    bool | int | float | Decimal | str | bytes | list["FieldValue"] | dict[str, "FieldValue"] | None
)
FieldTable = dict[str, FieldValue]
FieldArray = list[FieldValue]


_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_DEC = struct.Struct(">Bi")

# tag -> (struct, python type) for the fixed-size numbers.
_NUMBERS: dict[int, tuple[struct.Struct, type]] = {
    ord("b"): (struct.Struct(">b"), Int8),
    ord("B"): (struct.Struct(">B"), UInt8),
    ord("s"): (struct.Struct(">h"), Int16),
    ord("u"): (struct.Struct(">H"), UInt16),
    ord("I"): (_I32, int),
    ord("i"): (struct.Struct(">I"), UInt32),
    ord("l"): (_I64, Int64),
    ord("L"): (struct.Struct(">Q"), UInt64),
    ord("f"): (struct.Struct(">f"), Float32),
    ord("d"): (_F64, float),
    ord("T"): (struct.Struct(">Q"), Timestamp),
}
# python type -> packed tag + struct, for encoding.
_TYPED: dict[type, tuple[bytes, struct.Struct]] = {
    typ: (bytes([tag]), st) for tag, (st, typ) in _NUMBERS.items() if typ not in (int, float)
}
_TAG_I = b"I"
_TAG_L = b"l"
_TAG_D = b"d"


def _syntax(text: str) -> NoReturn:
    raise ProtocolError(SYNTAX_ERROR, text)


def _encode_error(text: str) -> NoReturn:
    raise EncodeError(text)


# --------------------------------------------------------------------------------------------
# Decoding


#: How deep tables and arrays may nest. Compiled, the decoder's recursion is not bounded by
#: Python's recursion limit (which stopped the interpreted one at a few hundred levels), and a
#: frame of nested tables would otherwise run the C stack out.
MAX_NESTING = 100


def decode_table(buf: bytes, off: int, depth: int = 0) -> tuple[FieldTable, int]:
    """Decode a length-prefixed table at ``buf[off:]``; return it and the offset after it.
    ``depth``: how many tables and arrays enclose it."""
    if depth > MAX_NESTING:
        _syntax(f"field tables nested deeper than {MAX_NESTING}")
    try:
        (size,) = _U32.unpack_from(buf, off)
    except struct.error:
        _syntax("field table truncated")
    off += 4
    end = off + size
    if end > len(buf):
        _syntax("field table longer than its frame")
    table = _decode_pairs(buf, off, end, depth)
    return table, end


def decode_table_contents(buf: bytes) -> FieldTable:
    """Decode a table without its length prefix (as AMQPLAIN's SASL response is sent)."""
    return _decode_pairs(buf, 0, len(buf), 0)


def _decode_pairs(buf: bytes, off: int, end: int, depth: int) -> FieldTable:
    table: FieldTable = {}
    try:
        while off < end:
            n = buf[off]
            off += 1
            key = buf[off : off + n].decode("utf-8", "surrogateescape")
            off += n
            table[key], off = _decode_value(buf, off, depth)
    except (IndexError, struct.error, RecursionError):
        _syntax("field table truncated")
    if off != end:
        _syntax("field table entry overruns the table")
    return table


def decode_array(buf: bytes, off: int) -> tuple[FieldArray, int]:
    """Decode a length-prefixed field array at ``buf[off:]``; return it and the offset after it."""
    try:
        return _decode_array(buf, off, 0)
    except (IndexError, struct.error, RecursionError):
        _syntax("field array truncated")


def encode_array(items: FieldArray | tuple[FieldValue, ...], out: bytearray) -> None:
    """Append a length-prefixed field array to ``out``."""
    start = len(out)
    out += b"\x00\x00\x00\x00"
    for item in items:
        _encode_value(item, out)
    _U32.pack_into(out, start, len(out) - start - 4)


def _decode_array(buf: bytes, off: int, depth: int) -> tuple[FieldArray, int]:
    if depth > MAX_NESTING:
        _syntax(f"field arrays nested deeper than {MAX_NESTING}")
    (size,) = _U32.unpack_from(buf, off)
    off += 4
    end = off + size
    if end > len(buf):
        _syntax("field array longer than its frame")
    items: FieldArray = []
    while off < end:
        value, off = _decode_value(buf, off, depth)
        items.append(value)
    if off != end:
        _syntax("field array entry overruns the array")
    return items, end


def _decode_value(buf: bytes, off: int, depth: int) -> tuple[FieldValue, int]:
    tag = buf[off]
    off += 1
    if tag == 0x53:  # S
        (n,) = _U32.unpack_from(buf, off)
        off += 4
        if off + n > len(buf):
            _syntax("long string truncated")
        return buf[off : off + n].decode("utf-8", "surrogateescape"), off + n
    if tag == 0x74:  # t
        return buf[off] != 0, off + 1
    num = _NUMBERS.get(tag)
    if num is not None:
        st, typ = num
        value = st.unpack_from(buf, off)[0]
        return (value if typ is int or typ is float else typ(value)), off + st.size
    if tag == 0x46:  # F
        return decode_table(buf, off, depth + 1)
    if tag == 0x41:  # A
        return _decode_array(buf, off, depth + 1)
    if tag == 0x78:  # x
        (n,) = _U32.unpack_from(buf, off)
        off += 4
        if off + n > len(buf):
            _syntax("byte array truncated")
        return buf[off : off + n], off + n
    if tag == 0x56:  # V
        return None, off
    if tag == 0x44:  # D
        scale, raw = _DEC.unpack_from(buf, off)
        return Decimal(raw).scaleb(-scale), off + 5
    _syntax(f"unknown field type {chr(tag)!r}")


# --------------------------------------------------------------------------------------------
# Encoding


def encode_table(table: FieldTable | None, out: bytearray) -> None:
    """Append ``table`` with its length prefix to ``out``."""
    start = len(out)
    out += b"\x00\x00\x00\x00"
    if table:
        _encode_pairs(table, out)
    _U32.pack_into(out, start, len(out) - start - 4)


def encode_table_contents(table: FieldTable) -> bytes:
    """Encode a table without its length prefix (AMQPLAIN's SASL response)."""
    out = bytearray()
    _encode_pairs(table, out)
    return bytes(out)


def table_bytes(table: FieldTable | None) -> bytes:
    out = bytearray()
    encode_table(table, out)
    return bytes(out)


def _encode_pairs(table: dict[Any, Any], out: bytearray) -> None:
    # Any, not FieldTable: a caller's keys may not be what its type says, and compiled, a str-typed
    # key would raise TypeError before the check below could refuse it with an EncodeError.
    for key, value in table.items():
        if not isinstance(key, str):
            _encode_error(f"field table key {key!r} is not a str")
        k = key.encode("utf-8", "surrogateescape")
        if len(k) > 255:
            _encode_error(f"field table key {key[:20]!r}... longer than 255 bytes")
        out.append(len(k))
        out += k
        _encode_value(value, out)


def _encode_value(value: Any, out: bytearray) -> None:
    typ = type(value)
    if typ is str:
        s = value.encode("utf-8", "surrogateescape")
        out += b"S"
        out += _U32.pack(len(s))
        out += s
    elif typ is bool:
        out += b"t\x01" if value else b"t\x00"
    elif typ is int:
        if -0x80000000 <= value <= 0x7FFFFFFF:
            out += _TAG_I
            out += _I32.pack(value)
        else:
            out += _TAG_L
            try:
                out += _I64.pack(value)
            except struct.error:
                _encode_error(f"integer {value} does not fit in 64 bits")
    elif typ is float:
        out += _TAG_D
        out += _F64.pack(value)
    elif typ in _TYPED:
        tag, st = _TYPED[typ]
        out += tag
        try:
            out += st.pack(value)
        except (struct.error, OverflowError):
            _encode_error(f"{value!r} does not fit its field type {tag.decode()!r}")
    elif isinstance(value, dict):
        out += b"F"
        encode_table(value, out)
    elif isinstance(value, (list, tuple)):
        out += b"A"
        encode_array(value, out)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out += b"x"
        out += _U32.pack(len(value))
        out += value
    elif value is None:
        out += b"V"
    elif isinstance(value, Decimal):
        out += b"D"
        out += _encode_decimal(value)
    elif isinstance(value, datetime.datetime):
        out += b"T"
        out += struct.pack(">Q", int(value.timestamp()))
    elif isinstance(value, bool):  # bool subclasses cannot exist, kept for clarity
        out += b"t\x01" if value else b"t\x00"
    elif isinstance(value, int):
        _encode_value(int(value), out)
    elif isinstance(value, float):
        _encode_value(float(value), out)
    elif isinstance(value, str):
        _encode_value(str(value), out)
    else:
        _encode_error(f"cannot put a {typ.__name__} into a field table")


def _encode_decimal(value: Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        _encode_error(f"decimal {value} is not finite")
    raw = int("".join(map(str, digits)) or "0")
    if sign:
        raw = -raw
    if exponent > 0:
        raw *= 10**exponent
        exponent = 0
    scale = -exponent
    if scale > 255 or not -0x80000000 <= raw <= 0x7FFFFFFF:
        _encode_error(f"decimal {value} does not fit scale octet + 32-bit value")
    return _DEC.pack(scale, raw)
