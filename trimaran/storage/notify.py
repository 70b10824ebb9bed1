"""PostgreSQL LISTEN/NOTIFY for several nodes: psycopg 3's async connections, off the SQLAlchemy
pool (a LISTEN holds its connection for the node's life; the sender's transactions are its own).

:class:`Sender` writes one flush of a node in one transaction: its route changes, the session holds
it let go, oversized forwards into ``cluster_spill``, then every NOTIFY. The notifications go out at
the commit, after the rows they name are visible. :func:`listen` yields what this node's channels
receive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Engine

from trimaran.storage.engine import now_ms, postgres_connect_args


def conninfo(engine: Engine) -> str:
    """The libpq URL of the engine's database (the SQLAlchemy driver name taken off)."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass(slots=True)
class Flush:
    """One node's writes for one flush (empty lists cost nothing)."""

    node: str
    routes_added: list[str] = field(default_factory=list)
    routes_removed: list[str] = field(default_factory=list)
    sessions_released: list[str] = field(default_factory=list)
    # (channel, text) in order; a text of None is a spill: ``spills`` has its bytes, the text is
    # built by ``spill_text(row id)`` once the row exists.
    notices: list[tuple[str, str | None]] = field(default_factory=list)
    spills: list[tuple[str, bytes]] = field(default_factory=list)  # (receiving node, batch)

    def __bool__(self) -> bool:
        return bool(self.routes_added or self.routes_removed or self.sessions_released or self.notices)


async def connect(url: str, statement_timeout_s: float, *, name: str) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection (``conn.transaction()`` opens one when wanted), named in
    ``pg_stat_activity`` so an operator sees which node holds it and what for."""
    args = postgres_connect_args(statement_timeout_s)
    return await psycopg.AsyncConnection.connect(url, autocommit=True, application_name=name, **args)


class Sender:
    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self.connection = connection

    async def send(self, flush: Flush, spill_text: Any) -> None:
        """Write ``flush`` in one transaction (``spill_text(row_id) -> str`` names a spilled batch)."""
        node = flush.node
        conn = self.connection
        async with conn.transaction():
            cur = conn.cursor()
            if flush.routes_removed:
                await cur.execute(
                    "DELETE FROM cluster_routes WHERE node = %s AND topic_filter = ANY(%s)",
                    (node, flush.routes_removed),
                )
            if flush.routes_added:
                await cur.execute(
                    "INSERT INTO cluster_routes (node, topic_filter) SELECT %s, unnest(%s::text[]) "
                    "ON CONFLICT DO NOTHING",
                    (node, flush.routes_added),
                )
            if flush.sessions_released:
                await cur.execute(
                    "DELETE FROM cluster_sessions WHERE node = %s AND client_id = ANY(%s)",
                    (node, flush.sessions_released),
                )
            spilled: list[str] = []
            for receiver, batch in flush.spills:
                await cur.execute(
                    "INSERT INTO cluster_spill (node, batch, created_at) VALUES (%s, %s, %s) RETURNING id",
                    (receiver, batch, now_ms()),
                )
                row = await cur.fetchone()
                assert row is not None
                spilled.append(spill_text(int(row[0])))
            channels: list[str] = []
            texts: list[str] = []
            spill_at = 0
            for channel, text in flush.notices:
                if text is None:
                    text = spilled[spill_at]
                    spill_at += 1
                channels.append(channel)
                texts.append(text)
            if channels:
                await cur.execute(
                    "SELECT pg_notify(c, t) FROM unnest(%s::text[], %s::text[]) "
                    "WITH ORDINALITY AS n(c, t, i) ORDER BY i",
                    (channels, texts),
                )

    async def notify(self, channel: str, text: str) -> None:
        await self.connection.execute("SELECT pg_notify(%s, %s)", (channel, text))


async def listen(connection: psycopg.AsyncConnection[Any], channels: Sequence[str]) -> None:
    """LISTEN on ``channels`` (an autocommit connection): from here on nothing sent is missed."""
    for channel in channels:
        await connection.execute(f'LISTEN "{channel}"')


async def received(connection: psycopg.AsyncConnection[Any]) -> AsyncIterator[tuple[str, str]]:
    """(channel, text) of each notification, in the order they were sent, forever."""
    async for notification in connection.notifies():
        yield notification.channel, notification.payload
