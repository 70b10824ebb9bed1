"""AMQP 1.0 primitive encoding (OASIS AMQP 1.0, part 1 "types").

``encode(value) -> bytes`` and ``decode(data) -> value`` convert between the Python
representations of :mod:`trimaran.amqp1.types` and the wire encoding. The encoder always
picks the most compact encoding (``uint0``, ``smalluint``, ``str8``, ``list8`` ...); the
decoder accepts every encoding. ``decode_value(buf, pos)`` decodes one value starting at
``pos`` and returns it with the position after it, reading straight from ``bytes`` or a
``memoryview`` without copying the buffer; only binary values are copied out as ``bytes``.

Malformed input raises :class:`~trimaran.amqp1.types.DecodeError` and nothing else.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Callable
from typing import Any

from .types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    DecodeError,
    Described,
    EncodeError,
    Float,
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

__all__ = ["decode", "decode_value", "encode", "encode_into", "encoder_for", "register_encoder", "value_end"]

Buffer = bytes | bytearray | memoryview

_B = struct.Struct(">B")
_b = struct.Struct(">b")
_H = struct.Struct(">H")
_h = struct.Struct(">h")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_Q = struct.Struct(">Q")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")
_BB = struct.Struct(">BB")
_II = struct.Struct(">II")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)

# --------------------------------------------------------------------------------------
# Bodies: what follows a format code. Shared by single values and array elements.
# --------------------------------------------------------------------------------------

_BodyWriter = Callable[[bytearray, Any], None]


def _w_none(out: bytearray, v: Any) -> None:
    return None


def _w_fixed(s: struct.Struct) -> _BodyWriter:
    pack = s.pack

    def w(out: bytearray, v: Any) -> None:
        out += pack(v)

    return w


def _w_bool(out: bytearray, v: Any) -> None:
    out.append(1 if v else 0)


def _w_char(out: bytearray, v: Any) -> None:
    out += _I.pack(ord(v))


def _w_raw(out: bytearray, v: Any) -> None:
    out += v


def _w_uuid(out: bytearray, v: Any) -> None:
    out += v.bytes


def _w_vbin8(out: bytearray, v: Any) -> None:
    out.append(len(v))
    out += v


def _w_vbin32(out: bytearray, v: Any) -> None:
    out += _I.pack(len(v))
    out += v


def _w_str8(out: bytearray, v: Any) -> None:
    _w_vbin8(out, v.encode("utf-8"))


def _w_str32(out: bytearray, v: Any) -> None:
    _w_vbin32(out, v.encode("utf-8"))


def _sym_bytes(v: str) -> bytes:
    try:
        return v.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"symbol is not ASCII: {v!r}") from None


def _w_sym8(out: bytearray, v: Any) -> None:
    _w_vbin8(out, _sym_bytes(v))


def _w_sym32(out: bytearray, v: Any) -> None:
    _w_vbin32(out, _sym_bytes(v))


def _list_content(v: Any) -> bytearray:
    tmp = bytearray()
    for item in v:
        encode_into(tmp, item)
    return tmp


def _map_content(v: Any) -> bytearray:
    tmp = bytearray()
    for k, item in v.items():
        encode_into(tmp, k)
        encode_into(tmp, item)
    return tmp


def _w_compound8(out: bytearray, count: int, content: bytes | bytearray) -> None:
    out += _BB.pack(len(content) + 1, count)
    out += content


def _w_compound32(out: bytearray, count: int, content: bytes | bytearray) -> None:
    out += _II.pack(len(content) + 4, count)
    out += content


def _w_list8(out: bytearray, v: Any) -> None:
    _w_compound8(out, len(v), _list_content(v))


def _w_list32(out: bytearray, v: Any) -> None:
    _w_compound32(out, len(v), _list_content(v))


def _w_map8(out: bytearray, v: Any) -> None:
    _w_compound8(out, 2 * len(v), _map_content(v))


def _w_map32(out: bytearray, v: Any) -> None:
    _w_compound32(out, 2 * len(v), _map_content(v))


def _w_array8(out: bytearray, v: Any) -> None:
    _w_compound8(out, len(v.items), _array_content(v))


def _w_array32(out: bytearray, v: Any) -> None:
    _w_compound32(out, len(v.items), _array_content(v))


_BODY_WRITERS: dict[int, _BodyWriter] = {
    0x40: _w_none,
    0x41: _w_none,
    0x42: _w_none,
    0x43: _w_none,
    0x44: _w_none,
    0x45: _w_none,
    0x56: _w_bool,
    0x50: _w_fixed(_B),
    0x51: _w_fixed(_b),
    0x52: _w_fixed(_B),
    0x53: _w_fixed(_B),
    0x54: _w_fixed(_b),
    0x55: _w_fixed(_b),
    0x60: _w_fixed(_H),
    0x61: _w_fixed(_h),
    0x70: _w_fixed(_I),
    0x71: _w_fixed(_i),
    0x72: _w_fixed(_f),
    0x73: _w_char,
    0x74: _w_raw,
    0x80: _w_fixed(_Q),
    0x81: _w_fixed(_q),
    0x82: _w_fixed(_d),
    0x83: _w_fixed(_q),
    0x84: _w_raw,
    0x94: _w_raw,
    0x98: _w_uuid,
    0xA0: _w_vbin8,
    0xB0: _w_vbin32,
    0xA1: _w_str8,
    0xB1: _w_str32,
    0xA3: _w_sym8,
    0xB3: _w_sym32,
    0xC0: _w_list8,
    0xD0: _w_list32,
    0xC1: _w_map8,
    0xD1: _w_map32,
    0xE0: _w_array8,
    0xF0: _w_array32,
}

# Fixed element constructor per array element type (the variable-width ones pick 8 or 32).
_ARRAY_FIXED_CODE: dict[T, int] = {
    T.NULL: 0x40,
    T.BOOLEAN: 0x56,
    T.UBYTE: 0x50,
    T.USHORT: 0x60,
    T.UINT: 0x70,
    T.ULONG: 0x80,
    T.BYTE: 0x51,
    T.SHORT: 0x61,
    T.INT: 0x71,
    T.LONG: 0x81,
    T.FLOAT: 0x72,
    T.DOUBLE: 0x82,
    T.DECIMAL32: 0x74,
    T.DECIMAL64: 0x84,
    T.DECIMAL128: 0x94,
    T.CHAR: 0x73,
    T.TIMESTAMP: 0x83,
    T.UUID: 0x98,
}
_ARRAY_VAR_CODES: dict[T, tuple[int, int]] = {
    T.BINARY: (0xA0, 0xB0),
    T.STRING: (0xA1, 0xB1),
    T.SYMBOL: (0xA3, 0xB3),
}
_ARRAY_COMPOUND_CODES: dict[T, tuple[int, int]] = {
    T.LIST: (0xC0, 0xD0),
    T.MAP: (0xC1, 0xD1),
    T.ARRAY: (0xE0, 0xF0),
}
_COMPOUND_CONTENT: dict[T, Callable[[Any], tuple[int, bytearray]]] = {
    T.LIST: lambda v: (len(v), _list_content(v)),
    T.MAP: lambda v: (2 * len(v), _map_content(v)),
    T.ARRAY: lambda v: (len(v.items), _array_content(v)),
}


def _array_content(arr: Array) -> bytearray:
    """Element constructor (with descriptor) followed by the element bodies."""
    out = bytearray()
    if arr.descriptor is not None:
        out.append(0x00)
        encode_into(out, arr.descriptor)
    t = arr.type
    items = arr.items
    try:
        code = _ARRAY_FIXED_CODE.get(t)
        if code is not None:
            out.append(code)
            writer = _BODY_WRITERS[code]
            for item in items:
                writer(out, _coerce_array_item(t, item))
        elif t in _ARRAY_VAR_CODES:
            small, large = _ARRAY_VAR_CODES[t]
            raws: list[bytes] = []
            for item in items:
                if t is T.BINARY:
                    raws.append(bytes(item))
                elif t is T.STRING:
                    raws.append(item.encode("utf-8"))
                else:
                    raws.append(_sym_bytes(item))
            wide = any(len(r) > 0xFF for r in raws)
            out.append(large if wide else small)
            w = _w_vbin32 if wide else _w_vbin8
            for r in raws:
                w(out, r)
        else:
            small, large = _ARRAY_COMPOUND_CODES[t]
            parts = [_COMPOUND_CONTENT[t](item) for item in items]
            wide = any(len(c) > 0xFE or n > 0xFF for n, c in parts)
            out.append(large if wide else small)
            wc = _w_compound32 if wide else _w_compound8
            for n, c in parts:
                wc(out, n, c)
    except (struct.error, AttributeError, TypeError) as exc:
        raise EncodeError(f"array item does not fit type {t.value}: {exc}") from None
    return out


def _coerce_array_item(t: T, item: Any) -> Any:
    if t is T.NULL:
        if item is not None:
            raise EncodeError("array of null holds a non-null item")
    elif t is T.BOOLEAN:
        if not isinstance(item, bool):
            raise EncodeError("array of boolean holds a non-boolean item")
    elif t is T.CHAR:
        if not isinstance(item, str) or len(item) != 1:
            raise EncodeError("array of char holds a non-char item")
    elif t in (T.DECIMAL32, T.DECIMAL64, T.DECIMAL128):
        item = {T.DECIMAL32: Decimal32, T.DECIMAL64: Decimal64, T.DECIMAL128: Decimal128}[t](item)
    elif t is T.UUID:
        if not isinstance(item, uuid.UUID):
            raise EncodeError("array of uuid holds a non-uuid item")
    elif t in (T.FLOAT, T.DOUBLE):
        if not isinstance(item, (int, float)) or isinstance(item, bool):
            raise EncodeError("array of float holds a non-number")
    elif isinstance(item, bool) or not isinstance(item, int):
        raise EncodeError(f"array of {t.value} holds a non-integer item")
    return item


# --------------------------------------------------------------------------------------
# Encoding single values
# --------------------------------------------------------------------------------------


def _e_none(out: bytearray, v: Any) -> None:
    out.append(0x40)


def _e_bool(out: bytearray, v: Any) -> None:
    out.append(0x41 if v else 0x42)


# One closure per format code and width: a single ``pack`` writes the code and the body (as fast
# as the hand-written functions were, and nothing half-written when the value is out of range).


def _e_fixed(code: int, fmt: str) -> _BodyWriter:
    """Format code ``code`` followed by the value packed as ``fmt`` (a struct code)."""
    pack = struct.Struct(">B" + fmt).pack

    def w(out: bytearray, v: Any) -> None:
        out += pack(code, v)

    return w


def _e_unsigned(zero: int, small: int, large: int, fmt: str) -> _BodyWriter:
    """uint / ulong: the zero-width code for 0, one byte below 256, else the full width."""
    pack_large = struct.Struct(">B" + fmt).pack
    pack_small = _BB.pack

    def w(out: bytearray, v: Any) -> None:
        if v == 0:
            out.append(zero)
        elif v < 0x100:
            out += pack_small(small, v)
        else:
            out += pack_large(large, v)

    return w


def _e_signed(small: int, large: int, fmt: str) -> _BodyWriter:
    """int / long: one signed byte from -128 to 127, else the full width."""
    pack_large = struct.Struct(">B" + fmt).pack
    pack_small = struct.Struct(">Bb").pack

    def w(out: bytearray, v: Any) -> None:
        if -0x80 <= v <= 0x7F:
            out += pack_small(small, v)
        else:
            out += pack_large(large, v)

    return w


_e_ubyte = _e_fixed(0x50, "B")
_e_ushort = _e_fixed(0x60, "H")
_e_uint = _e_unsigned(0x43, 0x52, 0x70, "I")
_e_ulong = _e_unsigned(0x44, 0x53, 0x80, "Q")
_e_byte = _e_fixed(0x51, "b")
_e_short = _e_fixed(0x61, "h")
_e_int = _e_signed(0x54, 0x71, "i")
_e_long = _e_signed(0x55, 0x81, "q")
_e_float = _e_fixed(0x72, "f")
_e_double = _e_fixed(0x82, "d")
_e_timestamp = _e_fixed(0x83, "q")


def _e_pyint(out: bytearray, v: Any) -> None:
    if -0x8000_0000_0000_0000 <= v <= 0x7FFF_FFFF_FFFF_FFFF:
        _e_long(out, v)
    elif 0 <= v <= 0xFFFF_FFFF_FFFF_FFFF:
        _e_ulong(out, v)
    else:
        raise EncodeError(f"integer does not fit 64 bits: {v}")


def _e_code_raw(code: int) -> _BodyWriter:
    def w(out: bytearray, v: Any) -> None:
        out.append(code)
        out += v

    return w


def _e_char(out: bytearray, v: Any) -> None:
    out.append(0x73)
    out += _I.pack(ord(v))


def _e_datetime(out: bytearray, v: Any) -> None:
    if v.tzinfo is None:
        v = v.replace(tzinfo=datetime.UTC)
    _e_timestamp(out, (v - _EPOCH) // _MS)


def _e_uuid(out: bytearray, v: Any) -> None:
    out.append(0x98)
    out += v.bytes


def _e_binary(out: bytearray, v: Any) -> None:
    n = len(v) if not isinstance(v, memoryview) else v.nbytes
    if n <= 0xFF:
        out += _BB.pack(0xA0, n)
    else:
        out.append(0xB0)
        out += _I.pack(n)
    out += v


def _e_vstr(out: bytearray, raw: bytes, small: int, large: int) -> None:
    if len(raw) <= 0xFF:
        out += _BB.pack(small, len(raw))
    else:
        out.append(large)
        out += _I.pack(len(raw))
    out += raw


def _e_string(out: bytearray, v: Any) -> None:
    _e_vstr(out, v.encode("utf-8"), 0xA1, 0xB1)


def _e_symbol(out: bytearray, v: Any) -> None:
    _e_vstr(out, _sym_bytes(v), 0xA3, 0xB3)


def _e_compound(out: bytearray, count: int, content: bytearray, c8: int, c32: int) -> None:
    if count <= 0xFF and len(content) <= 0xFE:
        out += _BB.pack(c8, len(content) + 1)
        out.append(count)
    else:
        out.append(c32)
        out += _II.pack(len(content) + 4, count)
    out += content


def _e_list(out: bytearray, v: Any) -> None:
    if not v:
        out.append(0x45)
        return
    _e_compound(out, len(v), _list_content(v), 0xC0, 0xD0)


def _e_map(out: bytearray, v: Any) -> None:
    _e_compound(out, 2 * len(v), _map_content(v), 0xC1, 0xD1)


def _e_array(out: bytearray, v: Any) -> None:
    _e_compound(out, len(v.items), _array_content(v), 0xE0, 0xF0)


def _e_described(out: bytearray, v: Any) -> None:
    out.append(0x00)
    encode_into(out, v.descriptor)
    encode_into(out, v.value)


_ENCODERS: dict[type, _BodyWriter] = {
    type(None): _e_none,
    bool: _e_bool,
    UByte: _e_ubyte,
    UShort: _e_ushort,
    UInt: _e_uint,
    ULong: _e_ulong,
    Byte: _e_byte,
    Short: _e_short,
    Int: _e_int,
    Long: _e_long,
    int: _e_pyint,
    Float: _e_float,
    float: _e_double,
    Decimal32: _e_code_raw(0x74),
    Decimal64: _e_code_raw(0x84),
    Decimal128: _e_code_raw(0x94),
    Char: _e_char,
    Timestamp: _e_timestamp,
    datetime.datetime: _e_datetime,
    uuid.UUID: _e_uuid,
    bytes: _e_binary,
    bytearray: _e_binary,
    memoryview: _e_binary,
    str: _e_string,
    Symbol: _e_symbol,
    list: _e_list,
    tuple: _e_list,
    dict: _e_map,
    Array: _e_array,
    Described: _e_described,
}

# Subclasses (IntEnum, user subclasses of str ...) resolve through the MRO once and are cached.


def _resolve_encoder(tp: type) -> _BodyWriter:
    for base in tp.__mro__:
        enc = _ENCODERS.get(base)
        if enc is not None:
            _ENCODERS[tp] = enc
            return enc
    raise EncodeError(f"cannot encode a {tp.__name__} as AMQP")


def register_encoder(tp: type, writer: Callable[[bytearray, Any], None]) -> None:
    """Let ``encode_into`` write values of ``tp`` (e.g. a composite class) with ``writer``."""
    _ENCODERS[tp] = writer


def encoder_for(tp: type) -> Callable[[bytearray, Any], None]:
    """The writer ``encode_into`` uses for values of exactly ``tp``."""
    enc = _ENCODERS.get(tp)
    return enc if enc is not None else _resolve_encoder(tp)


def encode_into(out: bytearray, value: Any) -> None:
    """Append the AMQP encoding of ``value`` to ``out``."""
    enc = _ENCODERS.get(type(value))
    if enc is None:
        enc = _resolve_encoder(type(value))
    try:
        enc(out, value)
    except struct.error as exc:
        raise EncodeError(f"value out of range for its AMQP type: {value!r} ({exc})") from None


def encode(value: Any) -> bytes:
    """The AMQP encoding of ``value``."""
    out = bytearray()
    encode_into(out, value)
    return bytes(out)


# --------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------

_Reader = Callable[[Buffer, int], tuple[Any, int]]


def _need(buf: Buffer, end: int) -> None:
    if end > len(buf):
        raise DecodeError("truncated value")


def _r_const(value: Any) -> _Reader:
    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        return value, pos

    return r


def _r_fixed(s: struct.Struct, wrap: Callable[[Any], Any]) -> _Reader:
    unpack_from = s.unpack_from
    size = s.size

    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        return wrap(unpack_from(buf, pos)[0]), pos + size

    return r


def _r_bool(buf: Buffer, pos: int) -> tuple[Any, int]:
    b = buf[pos]
    if b > 1:
        raise DecodeError("boolean byte is neither 0 nor 1")
    return b == 1, pos + 1


def _r_char(buf: Buffer, pos: int) -> tuple[Any, int]:
    cp = _I.unpack_from(buf, pos)[0]
    if cp > 0x10FFFF:
        raise DecodeError("char is not a Unicode code point")
    return Char(chr(cp)), pos + 4


def _r_raw(n: int, wrap: Callable[[bytes], Any]) -> _Reader:
    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        end = pos + n
        _need(buf, end)
        return wrap(bytes(buf[pos:end])), end

    return r


def _r_vbin(width: int) -> Callable[[Buffer, int], tuple[int, int]]:
    if width == 1:

        def span(buf: Buffer, pos: int) -> tuple[int, int]:
            end = pos + 1 + buf[pos]
            _need(buf, end)
            return pos + 1, end

    else:

        def span(buf: Buffer, pos: int) -> tuple[int, int]:
            end = pos + 4 + _I.unpack_from(buf, pos)[0]
            _need(buf, end)
            return pos + 4, end

    return span


def _r_binary(width: int) -> _Reader:
    span = _r_vbin(width)

    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        start, end = span(buf, pos)
        return bytes(buf[start:end]), end

    return r


def _r_string(width: int) -> _Reader:
    span = _r_vbin(width)

    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        start, end = span(buf, pos)
        return str(buf[start:end], "utf-8"), end

    return r


def _r_symbol(width: int) -> _Reader:
    span = _r_vbin(width)

    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        start, end = span(buf, pos)
        return Symbol(str(buf[start:end], "ascii")), end

    return r


def _compound_header(buf: Buffer, pos: int, width: int) -> tuple[int, int, int]:
    """Returns (count, position of the first element, end position)."""
    if width == 1:
        size, count = _BB.unpack_from(buf, pos)
        start = pos + 2
        end = pos + 1 + size
    else:
        size, count = _II.unpack_from(buf, pos)
        start = pos + 8
        end = pos + 4 + size
    if end < start:
        raise DecodeError("compound size smaller than its count field")
    _need(buf, end)
    return count, start, end


def _r_list(width: int) -> _Reader:
    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        count, p, end = _compound_header(buf, pos, width)
        if count > end - p:
            raise DecodeError("list count exceeds its size")
        items = []
        for _ in range(count):
            v, p = _decode(buf, p)
            items.append(v)
        if p != end:
            raise DecodeError("list size does not match its elements")
        return items, end

    return r


def _r_map(width: int) -> _Reader:
    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        count, p, end = _compound_header(buf, pos, width)
        if count & 1:
            raise DecodeError("map has an odd number of elements")
        if count > end - p:
            raise DecodeError("map count exceeds its size")
        result = {}
        for _ in range(count // 2):
            k, p = _decode(buf, p)
            v, p = _decode(buf, p)
            try:
                result[k] = v
            except TypeError:
                raise DecodeError("map key is not hashable") from None
        if p != end:
            raise DecodeError("map size does not match its elements")
        return result, end

    return r


_ZERO_WIDTH = frozenset({0x40, 0x41, 0x42, 0x43, 0x44, 0x45})


def _r_array(width: int) -> _Reader:
    def r(buf: Buffer, pos: int) -> tuple[Any, int]:
        count, p, end = _compound_header(buf, pos, width)
        if p >= end:
            raise DecodeError("array without element constructor")
        descriptor = None
        code = buf[p]
        p += 1
        if code == 0x00:
            descriptor, p = _decode(buf, p)
            _need(buf, p + 1)
            code = buf[p]
            p += 1
        t = _CODE_TYPE.get(code)
        if t is None or code == 0x00:
            raise DecodeError(f"invalid array element constructor 0x{code:02x}")
        if code in _ZERO_WIDTH:
            # Zero-width elements cost no input bytes: bound the count by the input size so
            # that a few bytes cannot make us build a list of billions of items.
            if count > 64 * len(buf) + 256:
                raise DecodeError("array count is implausible")
        elif count > end - p:
            raise DecodeError("array count exceeds its size")
        reader = _READERS[code]
        items = []
        for _ in range(count):
            v, p = reader(buf, p)
            items.append(v)
        if p != end:
            raise DecodeError("array size does not match its elements")
        return Array(t, items, descriptor), end

    return r


def _r_described(buf: Buffer, pos: int) -> tuple[Any, int]:
    descriptor, pos = _decode(buf, pos)
    value, pos = _decode(buf, pos)
    return Described(descriptor, value), pos


def _fast(tp: type) -> Callable[[int], Any]:
    """Wrap a decoded int without the range check (a fixed-width field is always in range)."""
    new = int.__new__
    return lambda v: new(tp, v)


_READERS: dict[int, _Reader] = {
    0x00: _r_described,
    0x40: _r_const(None),
    0x41: _r_const(True),
    0x42: _r_const(False),
    0x56: _r_bool,
    0x50: _r_fixed(_B, _fast(UByte)),
    0x60: _r_fixed(_H, _fast(UShort)),
    0x70: _r_fixed(_I, _fast(UInt)),
    0x52: _r_fixed(_B, _fast(UInt)),
    0x43: _r_const(UInt(0)),
    0x80: _r_fixed(_Q, _fast(ULong)),
    0x53: _r_fixed(_B, _fast(ULong)),
    0x44: _r_const(ULong(0)),
    0x51: _r_fixed(_b, _fast(Byte)),
    0x61: _r_fixed(_h, _fast(Short)),
    0x71: _r_fixed(_i, _fast(Int)),
    0x54: _r_fixed(_b, _fast(Int)),
    0x81: _r_fixed(_q, _fast(Long)),
    0x55: _r_fixed(_b, _fast(Long)),
    0x72: _r_fixed(_f, Float),
    0x82: _r_fixed(_d, float),
    0x74: _r_raw(4, Decimal32),
    0x84: _r_raw(8, Decimal64),
    0x94: _r_raw(16, Decimal128),
    0x73: _r_char,
    0x83: _r_fixed(_q, _fast(Timestamp)),
    0x98: _r_raw(16, lambda b: uuid.UUID(bytes=b)),
    0xA0: _r_binary(1),
    0xB0: _r_binary(4),
    0xA1: _r_string(1),
    0xB1: _r_string(4),
    0xA3: _r_symbol(1),
    0xB3: _r_symbol(4),
    0x45: _r_const(None),  # replaced below: list0 must give a fresh list each time
    0xC0: _r_list(1),
    0xD0: _r_list(4),
    0xC1: _r_map(1),
    0xD1: _r_map(4),
    0xE0: _r_array(1),
    0xF0: _r_array(4),
}


def _r_list0(buf: Buffer, pos: int) -> tuple[Any, int]:
    return [], pos


_READERS[0x45] = _r_list0

_CODE_TYPE: dict[int, T] = {
    0x40: T.NULL,
    0x41: T.BOOLEAN,
    0x42: T.BOOLEAN,
    0x56: T.BOOLEAN,
    0x50: T.UBYTE,
    0x60: T.USHORT,
    0x70: T.UINT,
    0x52: T.UINT,
    0x43: T.UINT,
    0x80: T.ULONG,
    0x53: T.ULONG,
    0x44: T.ULONG,
    0x51: T.BYTE,
    0x61: T.SHORT,
    0x71: T.INT,
    0x54: T.INT,
    0x81: T.LONG,
    0x55: T.LONG,
    0x72: T.FLOAT,
    0x82: T.DOUBLE,
    0x74: T.DECIMAL32,
    0x84: T.DECIMAL64,
    0x94: T.DECIMAL128,
    0x73: T.CHAR,
    0x83: T.TIMESTAMP,
    0x98: T.UUID,
    0xA0: T.BINARY,
    0xB0: T.BINARY,
    0xA1: T.STRING,
    0xB1: T.STRING,
    0xA3: T.SYMBOL,
    0xB3: T.SYMBOL,
    0x45: T.LIST,
    0xC0: T.LIST,
    0xD0: T.LIST,
    0xC1: T.MAP,
    0xD1: T.MAP,
    0xE0: T.ARRAY,
    0xF0: T.ARRAY,
}


def _decode(buf: Buffer, pos: int) -> tuple[Any, int]:
    reader = _READERS.get(buf[pos])
    if reader is None:
        raise DecodeError(f"invalid format code 0x{buf[pos]:02x}")
    return reader(buf, pos + 1)


_LOW_LEVEL_ERRORS = (struct.error, IndexError, ValueError, TypeError, RecursionError, OverflowError)


def decode_value(buf: Buffer, pos: int = 0) -> tuple[Any, int]:
    """Decode one value at ``pos``; returns it and the position just after it."""
    try:
        return _decode(buf, pos)
    except DecodeError:
        raise
    except _LOW_LEVEL_ERRORS as exc:
        # UnicodeDecodeError is a ValueError; struct.error covers short fixed-width reads.
        raise DecodeError(f"malformed AMQP value: {exc}") from None


def decode(data: Buffer) -> Any:
    """Decode exactly one value that fills ``data``."""
    value, pos = decode_value(data, 0)
    if pos != len(data):
        raise DecodeError("trailing bytes after value")
    return value


# Bytes a value's constructor is followed by, by the constructor's high nibble (part 1, 1.2:
# the subcategory of a primitive type's format code says how its width is found); a negative
# entry is the width of the size that precedes a variable-width, compound or array value.
_WIDTH_BY_NIBBLE = (None, None, None, None, 0, 1, 2, 4, 8, 16, -1, -4, -1, -4, -1, -4)


def value_end(buf: Buffer, pos: int) -> int:
    """Where the value at ``pos`` ends, found from its constructor and size alone: nothing in it
    is decoded (what a message section the broker does not read needs). Raises ``DecodeError``
    for an unknown constructor or a value that runs past the buffer."""
    n = len(buf)
    while True:  # a described value: its descriptor, then the value it describes
        if pos >= n:
            raise DecodeError("truncated value")
        code = buf[pos]
        if code != 0x00:
            break
        pos = value_end(buf, pos + 1)
    if code not in _READERS:
        raise DecodeError(f"invalid format code 0x{code:02x}")
    width = _WIDTH_BY_NIBBLE[code >> 4]
    assert width is not None  # every known code but 0x00 has one
    if width >= 0:
        end = pos + 1 + width
    elif width == -1:
        if pos + 1 >= n:
            raise DecodeError("truncated value")
        end = pos + 2 + buf[pos + 1]
    else:
        if pos + 5 > n:
            raise DecodeError("truncated value")
        end = pos + 5 + ((buf[pos + 1] << 24) | (buf[pos + 2] << 16) | (buf[pos + 3] << 8) | buf[pos + 4])
    if end > n:
        raise DecodeError("truncated value")
    return end
