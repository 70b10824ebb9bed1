"""SQL for several nodes on one PostgreSQL: the nodes table, routes, session holders, spilled
forwards and the retained rows other nodes changed.

Blocking calls for a worker thread. A node is alive while its heartbeat is younger than the
time-out; releasing a dead node (its routes, its session holds, its shared-queue leases) happens once,
by whichever node deletes its row first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from trimaran.broker.message import Message
from trimaran.storage.engine import now_ms
from trimaran.storage.schema import (
    cluster_nodes,
    cluster_routes,
    cluster_sessions,
    cluster_spill,
    queue_pending,
    queue_spans,
    retained_messages,
)
from trimaran.storage.serialize import message_from


class NodeNameTaken(Exception):
    """Another live node registered under this name."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    incarnation: str
    address: str
    started_at: int
    heartbeat_at: int
    routes: int


def register(
    engine: Engine, name: str, incarnation: str, claims_as: str, address: str, timeout_ms: int
) -> list[str]:
    """Add this node; a dead row of the same name is released and replaced. Returns the names of
    the dead nodes released on the way. Raises :class:`NodeNameTaken` when a live node has the name."""
    now = now_ms()
    with engine.begin() as connection:
        row = connection.execute(
            select(cluster_nodes).where(cluster_nodes.c.name == name).with_for_update()
        ).first()
        released = []
        if row is not None:
            age = now - int(row.heartbeat_at)
            if age < timeout_ms:
                raise NodeNameTaken(
                    f"node_name {name!r} is in use by a live node at {row.address} (heartbeat "
                    f"{age / 1000:.1f} s ago); give each node its own node_name"
                )
            _release(connection, name, str(row.claims_as))
            released.append(name)
        connection.execute(
            insert(cluster_nodes).values(
                name=name,
                incarnation=incarnation,
                claims_as=claims_as,
                address=address,
                started_at=now,
                heartbeat_at=now,
            )
        )
        connection.execute(delete(cluster_routes).where(cluster_routes.c.node == name))
    return released


def heartbeat(engine: Engine, name: str, incarnation: str) -> bool:
    """Renew this node's heartbeat; False if its row is gone (the others declared it dead)."""
    with engine.begin() as connection:
        done = connection.execute(
            update(cluster_nodes)
            .where(and_(cluster_nodes.c.name == name, cluster_nodes.c.incarnation == incarnation))
            .values(heartbeat_at=now_ms())
        ).rowcount
    return bool(done)


def reap(engine: Engine, timeout_ms: int) -> list[str]:
    """Release every node whose heartbeat is older than the time-out; returns their names."""
    cutoff = now_ms() - timeout_ms
    released = []
    with engine.begin() as connection:
        dead = connection.execute(
            delete(cluster_nodes)
            .where(cluster_nodes.c.heartbeat_at < cutoff)
            .returning(cluster_nodes.c.name, cluster_nodes.c.claims_as)
        ).all()
        for row in dead:
            _release(connection, str(row.name), str(row.claims_as))
            released.append(str(row.name))
    return released


def _release(connection: Connection, name: str, claims_as: str) -> None:
    """A dead node's routes and session holds go; its shared-queue leases (held rows and spans)
    expire now, so the other nodes claim its unacknowledged messages again at once instead of
    after the lease."""
    connection.execute(delete(cluster_routes).where(cluster_routes.c.node == name))
    connection.execute(delete(cluster_sessions).where(cluster_sessions.c.node == name))
    connection.execute(delete(cluster_spill).where(cluster_spill.c.node == name))
    connection.execute(
        update(queue_pending)
        .where(and_(queue_pending.c.node == claims_as, queue_pending.c.state == "held"))
        .values(lease_until=0)
    )
    connection.execute(update(queue_spans).where(queue_spans.c.node == claims_as).values(lease_until=0))


def leave(engine: Engine, name: str, incarnation: str) -> None:
    """A clean shutdown: routes and the node row go; session holds stay for this node's restart."""
    with engine.begin() as connection:
        connection.execute(delete(cluster_routes).where(cluster_routes.c.node == name))
        connection.execute(
            delete(cluster_nodes).where(
                and_(cluster_nodes.c.name == name, cluster_nodes.c.incarnation == incarnation)
            )
        )


def load_routes(engine: Engine) -> dict[str, list[str]]:
    """Every live node's routes."""
    query = select(cluster_routes.c.node, cluster_routes.c.topic_filter).join(
        cluster_nodes, cluster_nodes.c.name == cluster_routes.c.node
    )
    routes: dict[str, list[str]] = {}
    with engine.connect() as connection:
        for node, topic_filter in connection.execute(query):
            routes.setdefault(str(node), []).append(str(topic_filter))
    return routes


def nodes(engine: Engine) -> list[NodeRow]:
    counts = select(cluster_routes.c.node, func.count().label("n")).group_by(cluster_routes.c.node).subquery()
    query = (
        select(cluster_nodes, func.coalesce(counts.c.n, 0).label("routes"))
        .outerjoin(counts, counts.c.node == cluster_nodes.c.name)
        .order_by(cluster_nodes.c.name)
    )
    with engine.connect() as connection:
        return [
            NodeRow(
                str(r.name),
                str(r.incarnation),
                str(r.address),
                int(r.started_at),
                int(r.heartbeat_at),
                int(r.routes),
            )
            for r in connection.execute(query)
        ]


def take_spill(engine: Engine, ids: list[int]) -> dict[int, bytes]:
    """Read and delete spilled forwards."""
    with engine.begin() as connection:
        rows = connection.execute(
            delete(cluster_spill)
            .where(cluster_spill.c.id.in_(ids))
            .returning(cluster_spill.c.id, cluster_spill.c.batch)
        ).all()
    return {int(r.id): bytes(r.batch) for r in rows}


def load_retained(engine: Engine, topics: list[str] | None) -> dict[str, Message | None]:
    """The stored retained message of each topic (None: cleared), or of every topic stored."""
    found: dict[str, Message | None] = dict.fromkeys(topics or ())
    now = now_ms()
    query = select(retained_messages)
    if topics is not None:
        query = query.where(retained_messages.c.topic.in_(topics))
    with engine.connect() as connection:
        for row in connection.execute(query):
            if row.expires_at is None or row.expires_at > now:
                found[row.topic] = message_from(row.topic, row.payload, row.qos, True, row.properties)
    return found


# -- session holders ---------------------------------------------------------------------------------


def owned_sessions(engine: Engine, name: str, client_ids: Iterable[str]) -> set[str]:
    ids = list(client_ids)
    if not ids:
        return set()
    with engine.connect() as connection:
        rows = connection.execute(
            select(cluster_sessions.c.client_id).where(
                and_(cluster_sessions.c.node == name, cluster_sessions.c.client_id.in_(ids))
            )
        )
        return {str(r.client_id) for r in rows}


def session_holder(engine: Engine, client_id: str, me: str, timeout_ms: int) -> tuple[str | None, bool]:
    """(the live node other than ``me`` holding ``client_id``'s session, whether ``me`` held it).
    When no other live node holds it, ``me`` holds it from now on."""
    cutoff = now_ms() - timeout_ms
    with engine.begin() as connection:
        row = connection.execute(
            select(cluster_sessions.c.node, cluster_nodes.c.heartbeat_at)
            .outerjoin(cluster_nodes, cluster_nodes.c.name == cluster_sessions.c.node)
            .where(cluster_sessions.c.client_id == client_id)
            .with_for_update(of=cluster_sessions)
        ).first()
        if row is not None and row.node != me and row.heartbeat_at is not None and row.heartbeat_at >= cutoff:
            return str(row.node), False
        _hold(connection, client_id, me)
    return None, row is not None and row.node == me


def hold_session(engine: Engine, client_id: str, me: str) -> None:
    with engine.begin() as connection:
        _hold(connection, client_id, me)


def _hold(connection: Connection, client_id: str, me: str) -> None:
    statement: Any = pg_insert(cluster_sessions).values(client_id=client_id, node=me, updated_at=now_ms())
    statement = statement.on_conflict_do_update(
        index_elements=[cluster_sessions.c.client_id],
        set_={"node": statement.excluded.node, "updated_at": statement.excluded.updated_at},
    )
    connection.execute(statement)


def release_sessions(engine: Engine, me: str, client_ids: Iterable[str]) -> None:
    ids = list(client_ids)
    if ids:
        with engine.begin() as connection:
            connection.execute(
                delete(cluster_sessions).where(
                    and_(cluster_sessions.c.node == me, cluster_sessions.c.client_id.in_(ids))
                )
            )
