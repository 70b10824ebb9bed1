"""This node among several on one PostgreSQL.

- Membership: a row in ``cluster_nodes`` renewed every ``heartbeat_s``; each node reaps rows older
  than ``node_timeout_s`` (one wins the delete) and releases the dead node's routes, session holds
  and shared-queue leases.
- Routes: the router tells us when a filter appears or goes here; the change is written to
  ``cluster_routes`` and announced on the broadcast channel, so every node keeps every node's routes
  in memory (:class:`~trimaran.cluster.routes.RouteTable`).
- Forwards: a publish with a matching route on another node is encoded once, queued for that node
  and sent at the next flush: all forwards gathered during one loop iteration (and while the
  previous flush was in flight) leave in one transaction of NOTIFYs on the node's own channel.
  A node delivers what it receives to its own subscribers only.
- Retained messages: the publishing node writes them (the broker's write-behind); after the commit
  the changed topics are announced and the other nodes reload them from the table.
- Sessions: the :class:`~trimaran.broker.holders.SessionHolders` port, ``cluster_sessions`` says
  which node holds a client's session; taking it over asks the holder on its channel and waits for
  its reply (or the time-out).

One task group owns the listening connection, the flusher and the heartbeat; app.py starts it in its
root group and stops it at shutdown.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import socket
import time
from typing import Any, Final

import anyio
import anyio.to_thread
import psycopg
from anyio.abc import TaskGroup, TaskStatus

from trimaran.broker.core import Broker
from trimaran.broker.holders import HandOver
from trimaran.broker.message import Message
from trimaran.cluster.routes import RouteTable
from trimaran.cluster.wire import (
    FORWARD,
    HANDED,
    LEFT,
    RETAINED,
    ROUTES,
    SPILLED,
    TAKE,
    decode_batch,
    encode_forward,
    notice_text,
    pack,
    pack_lines,
    parse_notice,
    unpack_inline,
)
from trimaran.config import ClusterSettings, ConfigError
from trimaran.errors import first_line
from trimaran.storage import cluster_store
from trimaran.storage.notify import Flush, Sender, connect, conninfo, listen, received
from trimaran.storage.store import Storage

log = logging.getLogger(__name__)

BROADCAST: Final = "trimaran_cluster"
MAX_PENDING: Final = 100_000  # forwards queued while PostgreSQL does not answer, past which they drop
RECONNECT_S: Final = 1.0
_NOTHING: Final[tuple[int, frozenset[tuple[str, str]]]] = (0, frozenset())


def channel(node: str) -> str:
    """A node's own channel: a fixed-size identifier whatever characters its name has."""
    return "trimaran_n_" + hashlib.sha1(node.encode()).hexdigest()[:24]


class ClusterNode:
    def __init__(
        self,
        settings: ClusterSettings,
        *,
        name: str,
        storage: Storage,
        broker: Broker,
        claims_as: str,
        statement_timeout_s: float,
    ) -> None:
        self.settings = settings
        self.name = name
        self.storage = storage
        self.broker = broker
        self.claims_as = claims_as
        self.statement_timeout_s = statement_timeout_s
        self.address = settings.address or socket.gethostname()
        self.incarnation = secrets.token_hex(8)
        self.table = RouteTable(name)
        self.channel = channel(name)
        self.timeout_ms = int(settings.node_timeout_s * 1000)
        # What the next flush sends.
        self._forwards: dict[str, list[bytes]] = {}
        self._queued = 0
        self._route_changes: dict[str, bool] = {}
        self._released: set[str] = set()
        self._control: list[tuple[str, str, str]] = []  # (channel, kind, body)
        self._wake = anyio.Event()
        self._sequence = 0
        self._sender: Sender | None = None
        self._hand_over: HandOver | None = None
        self._handed: dict[str, anyio.Event] = {}
        self._group: TaskGroup | None = None
        # Counters for the admin API and metrics.
        self.forwarded = 0
        self.received = 0
        self.dropped = 0
        self.takeovers = 0

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        engine = self.storage.engine
        try:
            released = await anyio.to_thread.run_sync(
                cluster_store.register,
                engine,
                self.name,
                self.incarnation,
                self.claims_as,
                self.address,
                self.timeout_ms,
            )
        except cluster_store.NodeNameTaken as exc:
            raise ConfigError(str(exc)) from None
        if released:
            log.warning(
                "cluster: the earlier %s had stopped answering; its routes and sessions released", self.name
            )
        url = conninfo(engine)
        sender = await connect(url, self.statement_timeout_s, name=f"trimaran {self.name} send")
        self._sender = Sender(sender)
        router = self.broker.router
        for key in router.routes():
            self._route_changed(key, True)
        router.on_route = self._route_changed
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                await group.start(self._listen, name="cluster listen")
                group.start_soon(self._flush_loop, name="cluster flush")
                group.start_soon(self._heartbeat_loop, name="cluster heartbeat")
                self.broker.forwarder = self
                log.info(
                    "cluster: node %s joined (%d other nodes with routes, heartbeat %.1f s, time-out %.1f s)",
                    self.name,
                    len([n for n in self.table.nodes() if n != self.name]),
                    self.settings.heartbeat_s,
                    self.settings.node_timeout_s,
                )
                task_status.started()
        finally:
            with anyio.CancelScope(shield=True):
                await sender.close()

    async def leave(self) -> None:
        """A clean shutdown: stop forwarding, send what is queued, remove this node's row and routes
        (its session holds stay: this node restores those sessions when it starts again)."""
        self.broker.forwarder = None
        self.broker.router.on_route = None
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.statement_timeout_s):
            await self._flush()
            await anyio.to_thread.run_sync(
                cluster_store.leave, self.storage.engine, self.name, self.incarnation
            )
            if self._sender is not None:
                await self._sender.notify(BROADCAST, notice_text(LEFT, self._next(), self.name))
        log.info("cluster: node %s left", self.name)

    # -- the deck's Forwarder port --------------------------------------------------------------

    def forward(self, message: Message) -> tuple[int, frozenset[tuple[str, str]]]:
        targets = self.table.targets(message.topic)
        if not targets.nodes or message.topic.startswith("$SYS/"):
            return _NOTHING
        if self._queued >= MAX_PENDING:
            self.dropped += 1
            return _NOTHING
        try:
            plain: bytes | None = None
            for node, shares in targets.nodes.items():
                if shares:
                    record = encode_forward(message, shares)
                else:
                    if plain is None:
                        plain = encode_forward(message)
                    record = plain
                pending = self._forwards.get(node)
                if pending is None:
                    self._forwards[node] = [record]
                else:
                    pending.append(record)
                self._queued += 1
        except (TypeError, ValueError) as exc:  # a property no JSON can hold
            self.dropped += 1
            log.warning("cluster: a message to %r cannot be forwarded: %s", message.topic, first_line(exc))
            return _NOTHING
        self.forwarded += 1
        self._wake.set()
        return len(targets.nodes), targets.elsewhere

    def retained_written(self, topics: list[str]) -> None:
        if topics:
            for body in pack_lines(self.name + "\n", topics):
                self._control.append((BROADCAST, RETAINED, body))
            self._wake.set()

    def _route_changed(self, key: str, added: bool) -> None:
        if added:
            self.table.add(self.name, key)
        else:
            self.table.remove(self.name, key)
        self._route_changes[key] = added
        self._wake.set()

    # -- the deck's SessionHolders port --------------------------------------------------------

    async def owned(self, client_ids: list[str]) -> set[str]:
        return await anyio.to_thread.run_sync(
            cluster_store.owned_sessions, self.storage.engine, self.name, client_ids
        )

    async def acquire(self, client_id: str) -> bool:
        engine = self.storage.engine
        holder, mine = await anyio.to_thread.run_sync(
            cluster_store.session_holder, engine, client_id, self.name, self.timeout_ms
        )
        if holder is None:
            return not mine
        self.takeovers += 1
        handed = self._handed[client_id] = anyio.Event()
        self._control.append((channel(holder), TAKE, f"{client_id}\t{self.name}"))
        self._wake.set()
        with anyio.move_on_after(self.settings.takeover_timeout_s) as waiting:
            await handed.wait()
        if waiting.cancelled_caught:
            log.warning(
                "cluster: node %s did not hand over session %r within %.1f s; taking it as stored",
                holder,
                client_id,
                self.settings.takeover_timeout_s,
            )
        self._handed.pop(client_id, None)
        await anyio.to_thread.run_sync(cluster_store.hold_session, engine, client_id, self.name)
        log.info("cluster: session %r taken over from node %s", client_id, holder)
        return True

    def released(self, client_id: str) -> None:
        self._released.add(client_id)
        self._wake.set()

    def held(self, client_id: str) -> None:
        self._released.discard(client_id)

    def serve(self, hand_over: HandOver) -> None:
        self._hand_over = hand_over

    async def _give(self, client_id: str, requester: str) -> None:
        try:
            if self._hand_over is not None:
                await self._hand_over(client_id)
        except Exception:
            log.exception("cluster: handing session %r over to node %s failed", client_id, requester)
        self._control.append((channel(requester), HANDED, client_id))
        self._wake.set()

    # -- sending --------------------------------------------------------------------------------

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence

    def _take(self) -> Flush:
        """Everything queued since the last flush, as one flush."""
        flush = Flush(self.name)
        if self._route_changes:
            changes, self._route_changes = self._route_changes, {}
            lines = []
            for key, added in changes.items():
                (flush.routes_added if added else flush.routes_removed).append(key)
                lines.append(("+" if added else "-") + key)
            for body in pack_lines(self.name + "\n", lines):
                flush.notices.append((BROADCAST, notice_text(ROUTES, self._next(), body)))
        if self._released:
            flush.sessions_released = list(self._released)
            self._released.clear()
        for target, kind, body in self._control:
            flush.notices.append((target, notice_text(kind, self._next(), body)))
        self._control.clear()
        if self._forwards:
            forwards, self._forwards = self._forwards, {}
            self._queued = 0
            for node, records in forwards.items():
                target = channel(node)
                for notice in pack(records):
                    if notice.body is not None:
                        flush.notices.append((target, notice_text(FORWARD, self._next(), notice.body)))
                    else:
                        assert notice.spill is not None
                        flush.spills.append((node, notice.spill))
                        flush.notices.append((target, None))
        return flush

    async def _flush(self) -> None:
        flush = self._take()
        if not flush or self._sender is None:
            return
        try:
            await self._sender.send(flush, lambda row: notice_text(SPILLED, self._next(), str(row)))
        except (psycopg.Error, OSError) as exc:
            lost = sum(1 for _, text in flush.notices if text is None or text[0] == FORWARD)
            self.dropped += lost
            # Route changes and releases are states: keep them for the next flush (newer ones win).
            for key in flush.routes_added:
                self._route_changes.setdefault(key, True)
            for key in flush.routes_removed:
                self._route_changes.setdefault(key, False)
            self._released.update(flush.sessions_released)
            log.error(
                "cluster: sending to the other nodes failed (%d forward notices lost): %s",
                lost,
                first_line(exc),
            )
            await self._reconnect_sender()

    async def _reconnect_sender(self) -> None:
        assert self._sender is not None
        await self._sender.connection.close()
        while True:
            await anyio.sleep(RECONNECT_S)
            try:
                self._sender = Sender(
                    await connect(
                        conninfo(self.storage.engine),
                        self.statement_timeout_s,
                        name=f"trimaran {self.name} send",
                    )
                )
                return
            except (psycopg.Error, OSError) as exc:
                log.warning("cluster: PostgreSQL still unreachable: %s", first_line(exc))

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._flush()

    # -- receiving ------------------------------------------------------------------------------

    async def _listen(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        url = conninfo(self.storage.engine)
        started = False
        while True:
            try:
                connection = await connect(url, self.statement_timeout_s, name=f"trimaran {self.name} listen")
            except (psycopg.Error, OSError) as exc:
                if not started:
                    raise
                log.warning("cluster: cannot listen again yet: %s", first_line(exc))
                await anyio.sleep(RECONNECT_S)
                continue
            try:
                await listen(connection, [self.channel, BROADCAST])
                await self._reload_routes()  # after LISTEN: no change falls between the two
                if not started:
                    started = True
                    task_status.started()
                else:  # retained changes announced while we were not listening
                    await self._reload_retained()
                async for sent in received(connection):
                    await self._received(*sent)
            except (psycopg.Error, OSError) as exc:
                log.warning("cluster: the listening connection failed, listening again: %s", first_line(exc))
                await anyio.sleep(RECONNECT_S)
            finally:
                with anyio.CancelScope(shield=True):
                    await connection.close()

    async def _reload_routes(self) -> None:
        routes = await anyio.to_thread.run_sync(cluster_store.load_routes, self.storage.engine)
        for node in self.table.nodes():
            if node != self.name and node not in routes:
                self.table.drop_node(node)
        for node, keys in routes.items():
            if node != self.name:
                self.table.replace(node, keys)

    async def _reload_retained(self) -> None:
        stored = await anyio.to_thread.run_sync(cluster_store.load_retained, self.storage.engine, None)
        retained = self.broker.retained
        for message in retained.messages():
            if message.topic not in stored and not message.topic.startswith("$SYS/"):
                retained.replace(message.topic, None)
        for topic, value in stored.items():
            retained.replace(topic, value)

    async def _received(self, target: str, text: str) -> None:
        try:
            kind, _, body = parse_notice(text)
            await self._act(kind, body)
        except (ValueError, KeyError) as exc:  # not from a node of this version: said, not fatal
            log.warning("cluster: unreadable notice on %s (%s): %r", target, exc, text[:80])

    async def _act(self, kind: str, body: str) -> None:
        if kind == FORWARD:
            self._deliver(unpack_inline(body))
        elif kind == SPILLED:
            rows = await anyio.to_thread.run_sync(cluster_store.take_spill, self.storage.engine, [int(body)])
            for batch in rows.values():
                self._deliver(batch)
        elif kind == ROUTES:
            node, _, lines = body.partition("\n")
            if node != self.name:
                for line in lines.split("\n"):
                    if line[:1] == "+":
                        self.table.add(node, line[1:])
                    elif line[:1] == "-":
                        self.table.remove(node, line[1:])
        elif kind == RETAINED:
            node, _, lines = body.partition("\n")
            if node != self.name:
                topics = lines.split("\n")
                found = await anyio.to_thread.run_sync(
                    cluster_store.load_retained, self.storage.engine, topics
                )
                for topic, message in found.items():
                    self.broker.retained.replace(topic, message)
        elif kind == TAKE:
            client_id, _, requester = body.partition("\t")
            assert self._group is not None
            self._group.start_soon(self._give, client_id, requester)
        elif kind == HANDED:
            handed = self._handed.get(body)
            if handed is not None:
                handed.set()
        elif kind == LEFT and body != self.name:
            self.table.drop_node(body)

    def _deliver(self, batch: bytes) -> None:
        broker = self.broker
        try:
            for message, shares in decode_batch(batch):
                self.received += 1
                try:
                    broker.deliver_forwarded(message, shares)
                except Exception:  # one subscriber's bug must not cut this node off the others
                    log.exception("cluster: delivering a forwarded message to %r failed", message.topic)
        except (ValueError, KeyError) as exc:
            log.error("cluster: a damaged forward batch was dropped: %s", exc)

    # -- membership -----------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        engine = self.storage.engine
        while True:
            await anyio.sleep(self.settings.heartbeat_s)
            try:
                alive = await anyio.to_thread.run_sync(
                    cluster_store.heartbeat, engine, self.name, self.incarnation
                )
                if not alive:
                    await self._rejoin()
                dead = await anyio.to_thread.run_sync(cluster_store.reap, engine, self.timeout_ms)
            except Exception as exc:
                log.error("cluster: heartbeat failed: %s", first_line(exc))
                continue
            for node in dead:
                log.warning(
                    "cluster: node %s missed its heartbeat for %.1f s: routes, sessions and claims released",
                    node,
                    self.settings.node_timeout_s,
                )
                self.table.drop_node(node)
                self._control.append((BROADCAST, LEFT, node))
                self._wake.set()

    async def _rejoin(self) -> None:
        """Our row was reaped (this node stalled past the time-out): register again and publish
        every route anew. Sessions released meanwhile stay with whoever took them."""
        log.error("cluster: node %s was declared dead by the others; joining again", self.name)
        await anyio.to_thread.run_sync(
            cluster_store.register,
            self.storage.engine,
            self.name,
            self.incarnation,
            self.claims_as,
            self.address,
            self.timeout_ms,
        )
        for key in self.broker.router.routes():
            self._route_changes[key] = True
        self._wake.set()

    # -- operations -----------------------------------------------------------------------------

    async def describe(self) -> dict[str, Any]:
        """Every node with its state, for ``GET /api/v1/cluster``."""
        rows = await anyio.to_thread.run_sync(cluster_store.nodes, self.storage.engine)
        now = int(time.time() * 1000)
        return {
            "node": self.name,
            "forwarded": self.forwarded,
            "received": self.received,
            "dropped": self.dropped,
            "takeovers": self.takeovers,
            "nodes": [
                {
                    "name": row.name,
                    "state": "alive" if now - row.heartbeat_at < self.timeout_ms else "dead",
                    "address": row.address,
                    "started_at": row.started_at,
                    "last_heartbeat": row.heartbeat_at,
                    "routes": row.routes,
                    "self": row.name == self.name,
                }
                for row in rows
            ],
        }
