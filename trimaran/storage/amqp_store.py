"""SQL for the AMQP 0.9.1 front end: durable exchanges and the bindings between durable ends.

Rows and JSON text only: storage knows no AMQP type. The hull (``amqp091.durable``) maps its
exchanges and bindings to these rows, field tables (the ``arguments``) to JSON text. Blocking calls,
each one transaction; the handler runs them on a worker thread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, Engine, and_, delete, or_, select

from trimaran.storage.engine import now_ms
from trimaran.storage.schema import amqp_bindings, amqp_exchanges

__all__ = ["AmqpStore", "BindingRow", "ExchangeRow", "binding_key"]


@dataclass(frozen=True, slots=True)
class ExchangeRow:
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: str  # a JSON object, as the hull wrote it


@dataclass(frozen=True, slots=True)
class BindingRow:
    source: str
    destination: str
    destination_kind: str  # "queue" or "exchange"
    routing_key: str
    arguments: str  # a JSON object, as the hull wrote it


def binding_key(binding: BindingRow) -> str:
    """The digest that makes a stored binding unique within its vhost: equal arguments in another
    key order give the same key (the JSON is re-written with sorted keys)."""
    canonical = json.dumps(json.loads(binding.arguments), sort_keys=True, separators=(",", ":"))
    text = json.dumps(
        [binding.source, binding.destination, binding.destination_kind, binding.routing_key, canonical],
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


# -- the store --------------------------------------------------------------------------------------


class AmqpStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def load(self, vhost: str = "/") -> tuple[list[ExchangeRow], list[BindingRow]]:
        """Every saved exchange (by name) and binding (in the order they were made) of ``vhost``."""
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
            ExchangeRow(row.name, row.type, bool(row.durable), bool(row.auto_delete), bool(row.internal),
                        row.arguments)
            for row in xrows
        ]  # fmt: skip
        bindings = [
            BindingRow(row.source, row.destination, row.destination_kind, row.routing_key, row.arguments)
            for row in brows
        ]
        return exchanges, bindings

    def save_exchange(self, exchange: ExchangeRow, *, vhost: str = "/") -> None:
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
                    arguments=exchange.arguments,
                    created_at=now_ms(),
                )
            )

    def delete_vhost(self, vhost: str) -> None:
        """Every exchange and binding of ``vhost`` (the vhost is deleted)."""
        with self.engine.begin() as connection:
            connection.execute(delete(amqp_bindings).where(amqp_bindings.c.vhost == vhost))
            connection.execute(delete(amqp_exchanges).where(amqp_exchanges.c.vhost == vhost))

    def delete_exchange(self, name: str, *, vhost: str = "/") -> None:
        """Delete an exchange and every binding it is the source or destination of."""
        with self.engine.begin() as connection:
            _delete_exchanges(connection, vhost, [name])

    def save_binding(self, binding: BindingRow, *, vhost: str = "/") -> None:
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
                    arguments=binding.arguments,
                    created_at=now_ms(),
                )
            )

    def delete_binding(self, binding: BindingRow, *, vhost: str = "/") -> None:
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
        self, bindings: Iterable[BindingRow] = (), exchanges: Iterable[str] = (), *, vhost: str = "/"
    ) -> None:
        """Delete many bindings and exchanges (with their bindings) in one transaction."""
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
