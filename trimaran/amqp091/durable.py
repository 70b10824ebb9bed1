"""Durable exchanges and bindings: AMQP 0.9.1's side of ``storage.amqp_store``.

Storage keeps rows and JSON text and knows no AMQP type; this module turns an :class:`Exchange` or
:class:`Binding` into such a row and back. Field tables (exchange and binding arguments) become
tagged JSON, so that every AMQP field type comes back as it went in (see :func:`encode_value`).

RabbitMQ's rule: only durable exchanges persist, and a binding persists when its source and
destination are both durable. The handler decides (it knows queue durability); this stores what it
is given. Blocking calls: the handler runs them on a worker thread, each call one transaction.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from trimaran.amqp091.exchanges import Binding, DestinationKind, Exchange, freeze_arguments
from trimaran.amqp091.fields import Float32, Int8, Int16, Int64, Timestamp, UInt8, UInt16, UInt32
from trimaran.storage.amqp_store import AmqpStore, BindingRow, ExchangeRow

__all__ = [
    "DurableExchanges",
    "binding_of",
    "binding_row",
    "decode_value",
    "encode_value",
    "exchange_of",
    "exchange_row",
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
        return {_TAG: "F", "v": _encode_table(value)}
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
        return _decode_table(raw)
    if tag == "f":
        return Float32(float(raw))
    if tag == "d":
        return float(raw)
    raise ValueError(f"unknown stored field tag {tag!r}")


def _encode_table(table: Mapping[str, object]) -> dict[str, Any]:
    return {str(k): encode_value(v) for k, v in table.items()}


def _decode_table(data: Mapping[str, Any]) -> dict[str, object]:
    return {k: decode_value(v) for k, v in data.items()}


def table_to_json(table: Mapping[str, object], *, canonical: bool = False) -> str:
    """The table as ASCII JSON text (so strings holding undecodable bytes via ``surrogateescape``
    survive any database encoding), in its own key order; ``canonical`` sorts the keys at every
    level, so that equal tables give equal text."""
    return json.dumps(_encode_table(table), sort_keys=canonical, separators=(",", ":"))


def table_from_json(text: str) -> dict[str, object]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("stored arguments are not a table")
    return _decode_table(data)


# -- rows -------------------------------------------------------------------------------------------


def exchange_row(exchange: Exchange) -> ExchangeRow:
    return ExchangeRow(
        exchange.name,
        exchange.type,
        exchange.durable,
        exchange.auto_delete,
        exchange.internal,
        table_to_json(exchange.arguments),
    )


def exchange_of(row: ExchangeRow) -> Exchange:
    return Exchange(
        row.name, row.type, row.durable, row.auto_delete, row.internal, table_from_json(row.arguments)
    )


def binding_row(binding: Binding) -> BindingRow:
    return BindingRow(
        binding.source,
        binding.destination,
        binding.destination_kind,
        binding.routing_key,
        table_to_json(binding.arguments_dict()),
    )


def binding_of(row: BindingRow) -> Binding:
    kind: DestinationKind = "exchange" if row.destination_kind == "exchange" else "queue"
    return Binding(
        row.source, row.destination, kind, row.routing_key, freeze_arguments(table_from_json(row.arguments))
    )


class DurableExchanges:
    """The exchange store in AMQP's own types, for the handler (``front.store``)."""

    def __init__(self, store: AmqpStore, vhost: str = "/") -> None:
        self.store = store
        self.vhost = vhost  # whose rows these calls read and write, unless one names another

    def load(self, vhost: str | None = None) -> tuple[list[Exchange], list[Binding]]:
        """Every saved exchange and binding of ``vhost``, for ``ExchangeRegistry.restore``."""
        exchanges, bindings = self.store.load(vhost or self.vhost)
        return [exchange_of(r) for r in exchanges], [binding_of(r) for r in bindings]

    def save_exchange(self, exchange: Exchange, *, vhost: str | None = None) -> None:
        self.store.save_exchange(exchange_row(exchange), vhost=vhost or self.vhost)

    def delete_exchange(self, name: str, *, vhost: str | None = None) -> None:
        """The exchange and every binding it is the source or destination of."""
        self.store.delete_exchange(name, vhost=vhost or self.vhost)

    def save_binding(self, binding: Binding, *, vhost: str | None = None) -> None:
        self.store.save_binding(binding_row(binding), vhost=vhost or self.vhost)

    def delete_binding(self, binding: Binding, *, vhost: str | None = None) -> None:
        self.store.delete_binding(binding_row(binding), vhost=vhost or self.vhost)

    def delete_queue_bindings(self, queue: str, *, vhost: str | None = None) -> None:
        self.store.delete_queue_bindings(queue, vhost=vhost or self.vhost)

    def forget(
        self, bindings: Iterable[Binding] = (), exchanges: Iterable[str] = (), *, vhost: str | None = None
    ) -> None:
        """What ``ExchangeRegistry.last_removed_bindings`` / ``last_auto_deleted`` list after a
        cascade, in one transaction."""
        self.store.forget([binding_row(b) for b in bindings], exchanges, vhost=vhost or self.vhost)
