"""A column of rows as a PostgreSQL binary array, for the writer's ``INSERT ... SELECT FROM unnest()``.

psycopg dumps a list value by value in Python, after a scan of the list for the values' type (and
for integers, their width): on a shared queue's commits that was a fifth of the writer thread's own
work. The writer knows each column's type, so it packs the array in PostgreSQL's binary format
itself, with one C call a value. A column that does not pack (a value of another type, an integer
out of range) goes to psycopg as a list, as before, and fails or casts there as it did.

Below the writer; imports nothing of the package. psycopg is imported only by :func:`register`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

_HEADER = struct.Struct(">iiiii").pack  # dimensions, has nulls, element type, length, lower bound
_EMPTY = struct.Struct(">iii").pack  # no dimensions
_LENGTH = struct.Struct(">i").pack
_INT8 = struct.Struct(">iq").pack  # length and value
_INT4 = struct.Struct(">ii").pack
_NULL = _LENGTH(-1)


class PgArray:
    """An array packed for PostgreSQL: its binary form, passed as it is (``%b``)."""

    __slots__ = ("data",)
    element_oid = 0
    array_oid = 0

    def __init__(self, data: bytes) -> None:
        self.data = data


class BigintArray(PgArray):
    __slots__ = ()
    element_oid, array_oid = 20, 1016


class IntegerArray(PgArray):
    __slots__ = ()
    element_oid, array_oid = 23, 1007


class TextArray(PgArray):
    __slots__ = ()
    element_oid, array_oid = 25, 1009


class ByteaArray(PgArray):
    __slots__ = ()
    element_oid, array_oid = 17, 1001


KINDS: dict[str, type[PgArray]] = {
    "bigint": BigintArray,
    "integer": IntegerArray,
    "text": TextArray,
    "bytea": ByteaArray,
}


def packed(values: Sequence[Any], pg_type: str) -> PgArray | list[Any]:
    """``values`` as an array of ``pg_type`` (a key of :data:`KINDS`); a list where they do not pack."""
    kind = KINDS[pg_type]
    if not values:
        return kind(_EMPTY(0, 0, kind.element_oid))
    try:
        if kind is BigintArray:
            body = b"".join([_NULL if v is None else _INT8(8, v) for v in values])
        elif kind is IntegerArray:
            body = b"".join([_NULL if v is None else _INT4(4, v) for v in values])
        else:
            if kind is TextArray:
                values = [v if v is None else v.encode() for v in values]
            body = b"".join([_NULL if v is None else _LENGTH(len(v)) + v for v in values])
    except (struct.error, TypeError, AttributeError):
        return list(values)
    has_null = 1 if None in values else 0
    return kind(_HEADER(1, has_null, kind.element_oid, len(values), 1) + body)


def _dump(self: Any, obj: PgArray) -> bytes:
    return obj.data


def register(adapters: Any) -> None:
    """Teach psycopg's ``adapters`` (a connection's, or ``psycopg.adapters``) to pass the arrays."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    for kind in KINDS.values():
        # Made by type(), not a class statement: where this module is type-checked without psycopg
        # (the isolated build of a wheel, which compiles the writer's imports), Dumper is Any, and
        # strict mypy refuses a class that subclasses Any, failing the compiled build.
        dumper = type("_Dumper", (Dumper,), {"format": Format.BINARY, "oid": kind.array_oid, "dump": _dump})
        adapters.register_dumper(kind, dumper)
