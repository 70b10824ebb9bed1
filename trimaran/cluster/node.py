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
- Backpressure on forwards: while the forwards queued and in flight (not yet committed) are above
  ``cluster.forward_backpressure_messages`` or ``_bytes``, each forward holds its publisher through
  the node's gate (the runtime's ``flow.Gate``, made by the ``MakeGate`` the app wires in): its
  connection is not read. A successful send that leaves them below half releases it. A failed send
  keeps its forwards for the retry after the reconnect; while PostgreSQL does not answer the
  publishers stay held (told once in the log after ``limits.stalled_consumer_timeout_s``), since
  what they were acknowledged for must still be sent. Past ``MAX_PENDING`` (reached only by what
  held connections had already read, or by publishes no connection made) new forwards are dropped,
  counted as ``cluster_forward`` among the broker's drops.
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
from collections.abc import Callable
from typing import Any, Final, Protocol

import anyio
import anyio.to_thread
import psycopg
from anyio.abc import TaskGroup, TaskStatus

from trimaran.broker.core import Broker
from trimaran.broker.drops import CLUSTER_FORWARD
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
from trimaran.vhosts import vhost_of

log = logging.getLogger(__name__)

BROADCAST: Final = "trimaran_cluster"
# Forwards queued and in flight past which new ones are dropped: a last resort, the publishers are
# held from cluster.forward_backpressure_messages (at most 50,000) on.
MAX_PENDING: Final = 100_000
OFF: Final = 1 << 62  # the marks without a gate (no runtime to hold anyone): never behind
OTHER_NODES: Final = "the other nodes"  # whom a dropped forward was for, in the drops' log line
RECONNECT_S: Final = 1.0
_NOTHING: Final[tuple[int, frozenset[tuple[str, str]]]] = (0, frozenset())


class Gate(Protocol):
    """What holds the publishers of forwards (the runtime's ``flow.Gate``)."""

    @property
    def holding(self) -> bool: ...

    def hold(self) -> None: ...

    def saw(self, mark: int) -> None: ...

    def idle_s(self) -> float: ...

    def release(self) -> None: ...


#: ``stalled(idle_s)`` as the gate asks it (``flow.Stalled``): True to keep holding.
Stalled = Callable[[float], bool]
#: Makes the node's gate, given what it asks when it sees no progress (the app's: the runtime's Gate).
MakeGate = Callable[[Stalled], Gate]


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
        make_gate: MakeGate | None = None,
        stalled_timeout_s: float = 30.0,
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
        # What the next flush sends: forward records per node, counted and in bytes.
        self._forwards: dict[str, list[bytes]] = {}
        self._queued = 0
        self._queued_bytes = 0
        # The forwards of the flush in flight: kept until it commits, put back in front if it fails.
        self._sending: dict[str, list[bytes]] = {}
        self._sending_count = 0
        self._sending_bytes = 0
        # Backpressure: above the high marks (queued and in flight) each forward holds its publisher.
        self._gate = make_gate(self._stalled) if make_gate is not None else None
        self.high_messages = settings.forward_backpressure_messages if make_gate is not None else OFF
        self.high_bytes = settings.forward_backpressure_bytes if make_gate is not None else OFF
        self.stalled_timeout_s = stalled_timeout_s
        self.behind = False
        self._stall_told = False
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
        self.sent = 0  # forward records committed (the gate's progress mark)
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
        self._let_go()
        log.info("cluster: node %s left", self.name)

    # -- the deck's Forwarder port --------------------------------------------------------------

    def forward(self, message: Message) -> tuple[int, frozenset[tuple[str, str]]]:
        targets = self.table.targets(message.topic)
        if not targets.nodes or message.topic.startswith("$SYS/"):
            return _NOTHING
        if self._queued + self._sending_count >= MAX_PENDING:
            self._drop(message)
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
                self._queued_bytes += len(record)
        except (TypeError, ValueError) as exc:  # a property no JSON can hold
            self._drop(message)
            log.warning("cluster: a message to %r cannot be forwarded: %s", message.topic, first_line(exc))
            return _NOTHING
        self.forwarded += 1
        if (
            self.behind
            or self._queued + self._sending_count > self.high_messages
            or self._queued_bytes + self._sending_bytes > self.high_bytes
        ):
            self._hold()
        self._wake.set()
        return len(targets.nodes), targets.elsewhere

    def _drop(self, message: Message) -> None:
        self.dropped += 1
        self.broker.stats.drops.drop(CLUSTER_FORWARD, vhost_of(message.topic), OTHER_NODES)

    def _hold(self) -> None:
        """The forwards not yet sent are above a high mark: the publisher acted on waits for them."""
        gate = self._gate
        if gate is None:
            return
        if not self.behind:
            self.behind = True
            log.debug(
                "cluster: %d forwards (%d bytes) not yet sent to the other nodes: their publishers are held",
                self._queued + self._sending_count,
                self._queued_bytes + self._sending_bytes,
            )
        gate.hold()

    def _let_go(self) -> None:
        self.behind = False
        self._stall_told = False
        if self._gate is not None:
            self._gate.release()

    def _stalled(self, idle_s: float) -> bool:
        """The gate has held publishers a while (``flow.Stalled``): a send that commits is progress.
        Without one for ``stalled_timeout_s`` PostgreSQL does not answer (the sender reconnects every
        second): say so once, and keep holding. Letting the publishers go would only fill the buffer
        to its last-resort bound and drop what they were acknowledged for."""
        gate = self._gate
        assert gate is not None
        gate.saw(self.sent)
        idle_s = gate.idle_s()
        if idle_s >= self.stalled_timeout_s and not self._stall_told:
            self._stall_told = True
            log.warning(
                "cluster: no forward was sent to the other nodes for %.0f s (%d waiting); their "
                "publishers stay held until PostgreSQL takes them",
                idle_s,
                self._queued + self._sending_count,
            )
        return True

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
            self._sending = forwards
            self._sending_count, self._sending_bytes = self._queued, self._queued_bytes
            self._queued = self._queued_bytes = 0
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
        if self._sender is None:
            return
        flush = self._take()
        if not flush:
            return
        try:
            await self._sender.send(flush, lambda row: notice_text(SPILLED, self._next(), str(row)))
        except (psycopg.Error, OSError) as exc:
            kept = self._sending_count
            self._requeue()
            # Route changes and releases are states: keep them for the next flush (newer ones win).
            for key in flush.routes_added:
                self._route_changes.setdefault(key, True)
            for key in flush.routes_removed:
                self._route_changes.setdefault(key, False)
            self._released.update(flush.sessions_released)
            states = (FORWARD, ROUTES)  # kept above; the other notices (control) are lost
            lost = sum(1 for _, text in flush.notices if text is not None and text[0] not in states)
            log.error(
                "cluster: sending to the other nodes failed (%d forwards kept for the retry, %d other "
                "notices lost): %s",
                kept,
                lost,
                first_line(exc),
            )
            await self._reconnect_sender()
            self._wake.set()  # the retry, at once
            return
        self._sent()

    def _sent(self) -> None:
        """The flush committed: its forwards are on their way; below half of both marks (what was
        queued meanwhile), the publishers held for them are read again."""
        self.sent += self._sending_count
        self._sending = {}
        self._sending_count = self._sending_bytes = 0
        if self.behind and (
            self._queued <= self.high_messages >> 1 and self._queued_bytes <= self.high_bytes >> 1
        ):
            self._let_go()

    def _requeue(self) -> None:
        """The flush failed: its forwards go back in front of those queued since, in order per node."""
        for node, records in self._sending.items():
            later = self._forwards.get(node)
            self._forwards[node] = records + later if later else records
        self._queued += self._sending_count
        self._queued_bytes += self._sending_bytes
        self._sending = {}
        self._sending_count = self._sending_bytes = 0

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
            "waiting": self._queued + self._sending_count,
            "holding": self.behind,
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
