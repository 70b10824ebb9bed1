"""SQL for the AMQP 0.9.1 front end: durable exchanges and the bindings between durable ends.

Blocking calls; the handler runs them on a worker thread, each call one transaction. RabbitMQ's rule:
only durable exchanges persist, and a binding persists when its source and destination are both
durable. This module stores what it is given; the handler decides (it knows queue durability).

Field tables (exchange and binding arguments) are stored as tagged JSON so every AMQP field type
comes back as it went in (see :func:`encode_value`).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, and_, delete, or_, select

from trimaran.amqp091.exchanges import Binding, Exchange, freeze_arguments
from trimaran.amqp091.fields import Float32, Int8, Int16, Int64, Timestamp, UInt8, UInt16, UInt32
from trimaran.storage.engine import now_ms
from trimaran.storage.schema import amqp_bindings, amqp_exchanges

__all__ = [
    "AmqpStore",
    "binding_key",
    "decode_table",
    "decode_value",
    "encode_table",
    "encode_value",
    "table_from_json",
    "table_to_json",
]

# -- tagged JSON ------------------------------------------------------------------------------------
#
# JSON null, booleans, strings and arrays stand for themselves; a plain int is a JSON integer and a
# finite plain float a JSON number with a fraction or exponent. Everything else is an object
# {"$t": tag, "v": value} with the field-table tag of fields.py: b B s u i l (sized ints), f (Float32),
# d (a non-finite float, as text), D (Decimal, as text), T (Timestamp), x (bytes, base64) and F (a
# nested table: "v" is an object of encoded values). Every JSON object is such a tag, so a table can
# never be mistaken for one.

_TAG = "$t"
_SIZED: dict[type, str] = {
    Int8: "b",
    UInt8: "B",
    Int16: "s",
    UInt16: "u",
    UInt32: "i",
    Int64: "l",
    Timestamp: "T",
}
_SIZED_BY_TAG: dict[str, type[int]] = {tag: typ for typ, tag in _SIZED.items()}


def encode_value(value: object) -> Any:
    """A field value in its JSON-safe tagged form."""
    typ = type(value)
    if value is None or typ is bool or typ is str:
        return value
    if typ is int:
        return value
    if typ is float:
        f = float(value)  # type: ignore[arg-type]
        return f if f == f and f not in (float("inf"), float("-inf")) else {_TAG: "d", "v": repr(f)}
    tag = _SIZED.get(typ)
    if tag is not None:
        return {_TAG: tag, "v": int(value)}  # type: ignore[call-overload]
    if typ is Float32:
        return {_TAG: "f", "v": repr(float(value))}  # type: ignore[arg-type]
    if isinstance(value, bytes | bytearray | memoryview):
        return {_TAG: "x", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Decimal):
        return {_TAG: "D", "v": str(value)}
    if isinstance(value, datetime.datetime):
        return {_TAG: "T", "v": int(value.timestamp())}
    if isinstance(value, dict):
        return {_TAG: "F", "v": encode_table(value)}
    if isinstance(value, list | tuple):
        return [encode_value(v) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return encode_value(float(value))
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"cannot store a {typ.__name__} as a field value")


def decode_value(data: Any) -> object:
    if isinstance(data, list):
        return [decode_value(v) for v in data]
    if not isinstance(data, dict):
        return data  # None, bool, int, float, str
    tag = data[_TAG]
    raw = data["v"]
    sized = _SIZED_BY_TAG.get(tag)
    if sized is not None:
        return sized(raw)
    if tag == "x":
        return base64.b64decode(raw)
    if tag == "D":
        return Decimal(raw)
    if tag == "F":
        return decode_table(raw)
    if tag == "f":
        return Float32(float(raw))
    if tag == "d":
        return float(raw)
    raise ValueError(f"unknown stored field tag {tag!r}")


def encode_table(table: Mapping[str, object]) -> dict[str, Any]:
    return {str(k): encode_value(v) for k, v in table.items()}


def decode_table(data: Mapping[str, Any]) -> dict[str, object]:
    return {k: decode_value(v) for k, v in data.items()}


def table_to_json(table: Mapping[str, object], *, canonical: bool = False) -> str:
    """The table as ASCII JSON text (so strings holding undecodable bytes via ``surrogateescape``
    survive any database encoding), in its own key order; ``canonical`` sorts the keys at every
    level, so that equal tables give equal text."""
    return json.dumps(encode_table(table), sort_keys=canonical, separators=(",", ":"))


def table_from_json(text: str) -> dict[str, object]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("stored arguments are not a table")
    return decode_table(data)


def binding_key(binding: Binding) -> str:
    """The digest that makes a stored binding unique within its vhost."""
    text = json.dumps(
        [
            binding.source,
            binding.destination,
            binding.destination_kind,
            binding.routing_key,
            table_to_json(binding.arguments_dict(), canonical=True),
        ],
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


# -- the store --------------------------------------------------------------------------------------


class AmqpStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def load(self, vhost: str = "/") -> tuple[list[Exchange], list[Binding]]:
        """Every saved exchange and binding of ``vhost``, for ``ExchangeRegistry.restore``."""
        with self.engine.connect() as connection:
            xrows = connection.execute(
                select(amqp_exchanges).where(amqp_exchanges.c.vhost == vhost).order_by(amqp_exchanges.c.name)
            ).all()
            brows = connection.execute(
                select(amqp_bindings)
                .where(amqp_bindings.c.vhost == vhost)
                .order_by(amqp_bindings.c.created_at, amqp_bindings.c.binding_key)
            ).all()
        exchanges = [
            Exchange(
                row.name,
                row.type,
                bool(row.durable),
                bool(row.auto_delete),
                bool(row.internal),
                table_from_json(row.arguments),
            )
            for row in xrows
        ]
        bindings = [
            Binding(
                row.source,
                row.destination,
                "exchange" if row.destination_kind == "exchange" else "queue",
                row.routing_key,
                freeze_arguments(table_from_json(row.arguments)),
            )
            for row in brows
        ]
        return exchanges, bindings

    def save_exchange(self, exchange: Exchange, *, vhost: str = "/") -> None:
        """Insert or replace one exchange."""
        with self.engine.begin() as connection:
            connection.execute(delete(amqp_exchanges).where(_exchange_row(vhost, exchange.name)))
            connection.execute(
                amqp_exchanges.insert().values(
                    vhost=vhost,
                    name=exchange.name,
                    type=exchange.type,
                    durable=exchange.durable,
                    auto_delete=exchange.auto_delete,
                    internal=exchange.internal,
                    arguments=table_to_json(exchange.arguments),
                    created_at=now_ms(),
                )
            )

    def delete_exchange(self, name: str, *, vhost: str = "/") -> None:
        """Delete an exchange and every binding it is the source or destination of."""
        with self.engine.begin() as connection:
            _delete_exchanges(connection, vhost, [name])

    def save_binding(self, binding: Binding, *, vhost: str = "/") -> None:
        """Store a binding (saving it again is a no-op)."""
        key = binding_key(binding)
        with self.engine.begin() as connection:
            connection.execute(delete(amqp_bindings).where(_binding_row(vhost, key)))
            connection.execute(
                amqp_bindings.insert().values(
                    vhost=vhost,
                    binding_key=key,
                    source=binding.source,
                    destination=binding.destination,
                    destination_kind=binding.destination_kind,
                    routing_key=binding.routing_key,
                    arguments=table_to_json(binding.arguments_dict()),
                    created_at=now_ms(),
                )
            )

    def delete_binding(self, binding: Binding, *, vhost: str = "/") -> None:
        with self.engine.begin() as connection:
            connection.execute(delete(amqp_bindings).where(_binding_row(vhost, binding_key(binding))))

    def delete_queue_bindings(self, queue: str, *, vhost: str = "/") -> None:
        """The queue was deleted: forget every binding to it."""
        with self.engine.begin() as connection:
            connection.execute(
                delete(amqp_bindings).where(
                    amqp_bindings.c.vhost == vhost,
                    amqp_bindings.c.destination_kind == "queue",
                    amqp_bindings.c.destination == queue,
                )
            )

    def forget(
        self, bindings: Iterable[Binding] = (), exchanges: Iterable[str] = (), *, vhost: str = "/"
    ) -> None:
        """Delete many bindings and exchanges (with their bindings) in one transaction: what
        ``ExchangeRegistry.last_removed_bindings`` / ``last_auto_deleted`` list after a cascade."""
        keys = [binding_key(b) for b in bindings]
        names = list(exchanges)
        if not keys and not names:
            return
        with self.engine.begin() as connection:
            for start in range(0, len(keys), 500):
                connection.execute(
                    delete(amqp_bindings).where(
                        amqp_bindings.c.vhost == vhost,
                        amqp_bindings.c.binding_key.in_(keys[start : start + 500]),
                    )
                )
            if names:
                _delete_exchanges(connection, vhost, names)


def _exchange_row(vhost: str, name: str) -> ColumnElement[bool]:
    return and_(amqp_exchanges.c.vhost == vhost, amqp_exchanges.c.name == name)


def _binding_row(vhost: str, key: str) -> ColumnElement[bool]:
    return and_(amqp_bindings.c.vhost == vhost, amqp_bindings.c.binding_key == key)


def _delete_exchanges(connection: Connection, vhost: str, names: list[str]) -> None:
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        connection.execute(
            delete(amqp_bindings).where(
                amqp_bindings.c.vhost == vhost,
                or_(
                    amqp_bindings.c.source.in_(chunk),
                    and_(
                        amqp_bindings.c.destination_kind == "exchange", amqp_bindings.c.destination.in_(chunk)
                    ),
                ),
            )
        )
        connection.execute(
            delete(amqp_exchanges).where(amqp_exchanges.c.vhost == vhost, amqp_exchanges.c.name.in_(chunk))
        )
