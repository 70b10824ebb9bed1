"""The typed values of AMQP 0-9-1 field tables: numbers that keep their wire tag (fields.py).

Subclasses of ``int`` and ``float``, so that they compare, hash and compute as the plain number
and the encoder reads the tag from the type. Kept out of fields.py because mypyc does not compile
subclasses of builtin types: this module always runs interpreted, fields.py compiled.
"""

__all__ = ["Float32", "Int8", "Int16", "Int64", "Timestamp", "UInt8", "UInt16", "UInt32", "UInt64"]


class Int8(int):
    """A table integer sent with tag 'b'."""

    __slots__ = ()


class UInt8(int):
    """A table integer sent with tag 'B'."""

    __slots__ = ()


class Int16(int):
    """A table integer sent with tag 's'."""

    __slots__ = ()


class UInt16(int):
    """A table integer sent with tag 'u'."""

    __slots__ = ()


class UInt32(int):
    """A table integer sent with tag 'i'."""

    __slots__ = ()


class Int64(int):
    """A table integer sent with tag 'l'."""

    __slots__ = ()


class UInt64(int):
    """A table integer sent with tag 'L' (unsigned 64-bit: py-amqp, under kombu and Celery, writes
    large integers so, and RabbitMQ reads them)."""

    __slots__ = ()


class Timestamp(int):
    """Seconds since the epoch, sent with tag 'T' (unsigned 64-bit)."""

    __slots__ = ()


class Float32(float):
    """A table float sent with tag 'f'."""

    __slots__ = ()
