"""The durable ``$queue/`` manager: the protocol-neutral core the MQTT and AMQP front ends bind to.

Lifecycle: ``async with manager.running():`` (or ``await manager.start(task_group)`` and later
``await manager.stop()``). ``start`` loads queues, groups, pending entries and un-acked messages
(in pages) from SQL, starts the group-commit writer thread and a timer task in the given task group.

Everything runs on the event loop; the only thread is the writer. Consumers are fed from memory
(every message a queue still holds stays in ``QueueState.messages``); SQL is written, not read, on the
hot path. ``publish`` returns after the commit, but a durable work queue's consumers get the message
before it (``QueueManager.early``, RabbitMQ's way); deliveries are recorded without waiting (a crash
before their commit only lowers an attempt count, and the next start flags the messages the dead
process may have sent as redelivered: see ``_mark_running``); ack, nack, reject, commit and cancel
wait for their commit.

This module holds lifecycle, publish, consume, dispatch and the timers. The rest is in rooms of its
own, below it: ``groups.py`` (a queue's state in memory), ``work.py`` and ``stream.py`` (what a group
does: take, settle, retry, commit, retention), ``outcomes.py`` (how a delivery is settled),
``changes.py`` and ``journal.py`` (a unit of changes; its rows and events, the loop turn's publishes,
the commit's :class:`Receipt`: the only room that talks to storage on a publish's way),
``letters.py`` (expiry, drops, dead letters), ``transient.py`` (an in-memory queue's publish,
hand-over and ack, which never reach the journal), ``shared.py`` (claims and leases on a shared
PostgreSQL), ``admin.py`` (purge, peek, redrive, info), ``handles.py`` (what ``consume`` and
``browse`` return), ``ports.py`` (what those rooms see of this one) and ``policy.py`` (the
arithmetic); above it, ``control.py`` (settling by message id). A publish enters this module once:
it works out the offset and the expiry and hands the journal the finished row.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import TaskGroup

from trimaran.alarm import Alarm
from trimaran.broker.events import MESSAGE_PUBLISHED, EventBus
from trimaran.broker.message import Message, now_ms
from trimaran.config import QueuePolicySettings, QueueSettings, StorageSettings
from trimaran.queue import admin, transient
from trimaran.queue.admin import GroupInfo, QueueInfo
from trimaran.queue.changes import Changes
from trimaran.queue.flow import Held, QueueFlow
from trimaran.queue.groups import (
    HELD,
    WAIT,
    Entry,
    Group,
    QueueConsumer,
    QueueDelivery,
    QueueState,
    Selects,
    StoredMessage,
    Taker,
    WaitingPublish,
    expired,
    message_id,
)
from trimaran.queue.handles import BrowseHandle, ConsumerHandle, settle_many_nowait
from trimaran.queue.journal import Journal, Receipt, Turn, committed
from trimaran.queue.letters import Letters
from trimaran.queue.outcomes import Ack, Outcome, Retry
from trimaran.queue.policy import (
    DEFAULT_GROUP,
    DLQ_PROPERTIES,
    QueueError,
    expiry_ms,
    is_dead_letter_queue,
    validate_queue_name,
)
from trimaran.queue.ports import DeadLetterRouter
from trimaran.queue.shared import Claims, stored_row, taken_by, takes_all
from trimaran.queue.stream import StreamGroup, position, retention
from trimaran.queue.work import WorkGroup
from trimaran.storage import queue_store
from trimaran.storage.disk import DiskWatch
from trimaran.storage.engine import sqlite_file
from trimaran.storage.rows import WriteBatch
from trimaran.storage.store import Storage
from trimaran.storage.writer import GroupCommitWriter, WriterError
from trimaran.tenant_limits import TenantLimits
from trimaran.vhosts import describe, split_key

__all__ = [
    "BrowseHandle",
    "ConsumerHandle",
    "DeadLetterRouter",
    "GroupInfo",
    "PublishResult",
    "QueueConsumer",
    "QueueDelivery",
    "QueueInfo",
    "QueueManager",
    "message_id",
    "settle_many_nowait",
]

log = logging.getLogger(__name__)


TICK_MS = 20  # the timers run at most this often (what is due within it is handled together)
SWEEP_S = 1.0  # TTL expiry and stream retention, while there are queues
NEVER = 2**62  # (epoch ms) the timers' wake-up when nothing is due: they sleep until rung

RESERVED_PROPERTIES = frozenset(
    {
        "x-queue",
        "x-queue-offset",
        "x-queue-group",
        "x-queue-attempt",
        "x-queue-redelivered",
        "x-queue-message-id",
        "x-queue-topic",
        *DLQ_PROPERTIES,
    }
)


# Offsets a shared node reserves at once for publishes that do not await (one UPDATE per block; a
# node that stops leaves the rest of its block unused, a gap claims step over).
OFFSET_BLOCK = 1000


@dataclass(slots=True, init=False)
class PublishResult:
    queue: str
    offset: int  # -1: refused before it had one

    # Written out, as one is built per publish: mypyc compiles it, the generated one runs interpreted.
    def __init__(self, queue: str, offset: int) -> None:
        self.queue = queue
        self.offset = offset

    @property
    def message_id(self) -> str:
        """Made when asked (the admin API's answer): publishers over AMQP and MQTT never ask."""
        return message_id(self.queue, self.offset) if self.offset >= 0 else ""


class QueueManager:
    """Implements the groups' :class:`~trimaran.queue.groups.Host` (journal, events, ``remove``,
    ``expire``, ``dead_letter``, ``due``)."""

    def __init__(
        self,
        storage: Storage,
        settings: QueueSettings,
        storage_settings: StorageSettings,
        *,
        node: str | None = None,
        shared: bool = False,
        lease_s: float = 30.0,
        claim_batch: int = 100,
        events: EventBus | None = None,
    ) -> None:
        """``shared=True``: several processes share one PostgreSQL database (see ``shared.py``).
        ``events``: the bus queue events go to (the app passes the broker's); a private one by default."""
        if shared and storage.dialect != "postgresql":
            raise ValueError("shared queues need PostgreSQL")
        self.storage = storage
        self.settings = settings
        self.storage_settings = storage_settings
        self.shared = shared
        if node is None:
            node = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}" if shared else "local"
        self.node = node
        self.lease_ms = int(lease_s * 1000)
        self.claim_batch = claim_batch
        self.queues: dict[str, QueueState] = {}
        #: exclusive and temporary queues -> the connection that owns them (see ``consume``)
        self.owners: dict[str, object] = {}
        self.writer = GroupCommitWriter(
            storage.engine,
            commit_interval_ms=storage_settings.commit_interval_ms,
            commit_batch_max=storage_settings.commit_batch_max,
        )
        self.journal = Journal(self.writer, node, shared=shared, lease_ms=self.lease_ms)
        # After each commit, the writer's batch_done delivers what it made deliverable (set while
        # something is, see appended); so does the journal after a submission with nothing to write.
        self.journal.idle = self._flush_dirty
        self.events = events if events is not None else EventBus()  # see trimaran.broker.events
        self.letters = Letters(self)
        self.claims = Claims(self.journal, lease_ms=self.lease_ms, batch=claim_batch, dispatch=self._dispatch)
        database = sqlite_file(storage.engine.url)
        self.disk = DiskWatch(None if database is None else database.parent, storage_settings.min_free_bytes)
        self._timed: set[Group] = set()
        self._dirty: set[QueueState] = set()
        self._flush_soon = False  # a _flush_now is scheduled for the end of the loop's turn
        self._loop: asyncio.AbstractEventLoop | None = None  # None under trio: flush at once
        #: Runs the end of a turn once the read being acted on is done (the runtime's
        #: ``Runner.after_read``, set by the app), before the loop's flush, so a delivery leaves in
        #: its publish's turn of the loop; None: at the end of the loop's turn.
        self.at_turn_end: Callable[[Callable[[], None]], None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._alarm = Alarm()  # the timers' sleep, rung by what falls due sooner (due, declare)
        self.wake_at = 0  # when the timers wake next (epoch ms; NEVER: when rung)
        self._last_tick = 0
        self._started = False
        self._last_sweep = 0  # epoch ms
        #: Routes dead letters of queues with a dead_letter_exchange (set by the AMQP 0.9.1 front end).
        self.dead_letter_router: DeadLetterRouter | None = None
        self._restarted: list[tuple[WorkGroup, int, Entry]] = []
        self.journal.turn_done = self._turn_done
        #: The vhosts' queue counts and stored-bytes quotas (the app passes the runtime's registry).
        self.limits = TenantLimits()
        #: Backpressure to publishers from queues whose consumers are behind (the app gives it the
        #: runtime's gates; without them no queue holds anyone).
        self.flow = QueueFlow(shared=shared)

    # -- lifecycle --------------------------------------------------------------------------------

    def running(self) -> Running:
        """``async with manager.running():`` started in a task group of its own, stopped on the way out."""
        return Running(self)

    async def start(self, task_group: TaskGroup) -> None:
        if self._started:
            return
        self.disk.check()
        loaded = await anyio.to_thread.run_sync(self._load)
        for state in loaded:
            self.queues[state.name] = state
        self.writer.start()
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._started = self.claims.open = True
        self._last_sweep = now_ms()  # the first sweep a second after the start, as each after it
        if self._restarted:  # record why these will be redelivered, and that they wait now
            ch = Changes()
            now = now_ms()
            for restarted, offset, entry in self._restarted:
                restarted.released_event(offset, entry, "restart", now, ch)
                entry.consumer_id = None
                self.journal.pending(ch, restarted.state, restarted, offset, entry)
            self._restarted.clear()
            await self.journal.write(ch)
        for declared in self.settings.declare:
            policy = QueuePolicySettings(**declared.model_dump(exclude={"name"}))
            await self.declare(declared.name, policy)
        await task_group.start(self._timers)
        for state in self.queues.values():
            for group in state.groups.values():
                if group.ready or group.delayed:
                    self._watch(group)

    async def stop(self) -> None:
        if not self._started:
            return
        self.claims.open = False
        if self._scope is not None:
            self._scope.cancel()
        with anyio.move_on_after(5):  # claims in flight: let them land, then release them too
            while self.claims.claiming:
                await anyio.sleep(0.002)
        release = Changes()
        now = now_ms()
        for state in self.queues.values():
            for group in state.groups.values():
                for handle in group.consumers:
                    handle.closed = True
                group.consumers.clear()
                if self.is_shared(state) and isinstance(group, WorkGroup):
                    # hand everything this node holds back to the others
                    for offset, entry in list(group.entries.items()):
                        reason = "disconnect" if entry.state == HELD else entry.reason
                        if entry.state == HELD:
                            group.released_event(offset, entry, reason, now, release)
                        group.make_available(offset, entry, reason, now, now, release)
        if self.shared:  # its spans of which nothing is left to it (all handed back, or finished)
            release.calls.append(queue_store.drop_spans(self.node))
        if not release.empty():
            await self.journal.write(release)
        self.journal.send_turn()
        self._started = False
        await self.writer.stop()
        key = self._running_key()
        if key is not None:  # everything is written: the next start may trust SQL's delivery records
            await anyio.to_thread.run_sync(self.storage.set_meta, key, "stopped")

    def is_shared(self, state: QueueState) -> bool:
        """Work queues of a shared node deliver only what they claimed in the database."""
        return self.shared and state.durable and state.policy.mode == "work"

    def shared_offsets(self, state: QueueState) -> bool:
        """Every durable queue of a shared node takes offsets from reserved blocks."""
        return self.shared and state.durable

    def _new_group(self, state: QueueState, name: str, cursor: int = 0, committed: int = 0) -> Group:
        if state.policy.mode == "stream":
            return StreamGroup(state, name, self, cursor=cursor, committed=committed)
        return WorkGroup(state, name, self, cursor=cursor, committed=committed, shared=self.is_shared(state))

    def _running_key(self) -> str | None:
        """The ``broker_meta`` key saying this node's queues are live: set at start, cleared by a
        clean stop. Shared nodes have a new id per process and hand their messages back at stop."""
        return None if self.shared else f"queues.running.{self.node}"

    def _mark_running(self) -> bool:
        """In the loading thread: mark this node running; True when its last run did not stop
        cleanly (killed, crashed, power lost), so deliveries it sent may be missing from SQL."""
        key = self._running_key()
        if key is None:
            return False
        unclean = self.storage.get_meta(key) == "running"
        if unclean:
            log.warning("queues: the last run of node %s did not stop cleanly; messages it may have "
                        "delivered are flagged redelivered", self.node)  # fmt: skip
        self.storage.set_meta(key, "running")
        return unclean

    def _load(self) -> list[QueueState]:
        """In a worker thread: queues, groups, pending entries and messages (paged)."""
        engine = self.storage.engine
        now = now_ms()
        result = []
        unclean = self._mark_running()
        for row in queue_store.load_queues(engine):
            policy = QueuePolicySettings(**row["policy"])
            state = QueueState(row["name"], policy, True, row["created_at"])
            state.next_offset = state.high = row["next_offset"]
            if self.shared and policy.mode == "work":  # messages and pending entries come by claims
                result.append(state)
                continue
            for page in queue_store.iter_messages(engine, state.name):
                for m in page:
                    state.add(stored_row(m))
            state.high = state.next_offset
            if unclean and policy.mode == "work":
                state.maybe_seen_below = state.high
            for g in queue_store.load_groups(engine, state.name):
                cursor = int(g.committed) if policy.mode == "stream" else int(g.cursor)
                state.groups[g.group] = self._new_group(state, g.group, cursor, int(g.committed))
            for p in queue_store.load_pending(engine, state.name):
                group = state.groups.get(p.group)
                if group is None:
                    group = state.groups[p.group] = self._new_group(state, p.group)
                entry = Entry(
                    p.state,
                    attempts=int(p.attempts),
                    delivered_at=p.delivered_at,
                    unsent=int(p.unsent),
                    returned=int(p.returned),
                )
                if p.state == HELD:  # its consumer was on the previous process
                    entry.state = WAIT
                    entry.reason = "restart"
                    entry.available_at = now
                    entry.consumer_id = p.consumer
                    if isinstance(group, WorkGroup):
                        self._restarted.append((group, int(p.offset), entry))
                elif p.state == WAIT:
                    entry.available_at = int(p.available_at or now)
                    entry.reason = p.reason or "restart"
                group.entries[int(p.offset)] = entry
                if entry.state == WAIT:
                    if (entry.available_at or 0) <= now:
                        group.make_ready(int(p.offset))
                    else:
                        heapq.heappush(group.delayed, (entry.available_at or 0, int(p.offset), 0))
            alone = next(iter(state.groups.values())) if len(state.groups) == 1 else None
            if isinstance(alone, WorkGroup):  # its held first deliveries had no rows
                self._restarted.extend((alone, offset, entry) for offset, entry in alone.held_at_start(now))
            result.append(state)
        return result

    # -- queues -----------------------------------------------------------------------------------

    def _policy_for(self, name: str, policy: QueuePolicySettings | None) -> QueuePolicySettings:
        if policy is not None:
            if isinstance(policy, QueuePolicySettings) and type(policy) is not QueuePolicySettings:
                policy = QueuePolicySettings(**policy.model_dump(exclude={"name"}))
            return policy
        if is_dead_letter_queue(name):
            return self.settings.defaults.model_copy(update={"mode": "work"})
        return self.settings.defaults

    def declare_now(
        self, name: str, policy: QueuePolicySettings | None, durable: bool, ch: Changes | None
    ) -> QueueState:
        """Create or update a queue in memory; the durable row goes into ``ch``."""
        validate_queue_name(name)
        state = self.queues.get(name)
        if state is not None:
            if policy is not None:
                new = self._policy_for(name, policy)
                if new.mode != state.policy.mode and state.messages:
                    mode = state.policy.mode
                    raise QueueError("mode-mismatch", f"queue {split_key(name)[1]} is a {mode} queue")
                if new != state.policy:
                    regroup = new.mode != state.policy.mode
                    state.policy = new
                    if regroup:
                        self._regroup(state)
                    if ch is not None:
                        self.journal.declared(ch, state)
            return state
        if self.limits.vhosts:
            self._check_queue_count(name)
        pol = self._policy_for(name, policy)
        state = QueueState(name, pol, durable, now_ms())
        self.queues[name] = state
        if len(self.queues) == 1:
            self._alarm.ring()  # the sweeps begin
        if ch is not None:
            self.journal.declared(ch, state)
        # A durable queue is configuration, said once; an in-memory one is often a client's reply
        # queue, one a connection: a fleet of RPC clients would fill the log with them.
        report = log.info if durable else log.debug
        report("%s declared (%s, %s)", describe(name), pol.mode, "durable" if durable else "in memory")
        return state

    def _regroup(self, state: QueueState) -> None:
        """An empty queue changed mode: its groups (and their consumers) become groups of the new kind."""
        for name, old in list(state.groups.items()):
            group = self._new_group(state, name, old.cursor, old.committed)
            group.consumers = old.consumers
            group.rr = old.rr
            for handle in group.consumers:
                if isinstance(handle, ConsumerHandle):
                    handle.group = group
            self._timed.discard(old)
            state.groups[name] = group

    async def declare(
        self, name: str, policy: QueuePolicySettings | None = None, *, durable: bool = True
    ) -> QueueInfo:
        """Create a queue, or update its policy. Idempotent."""
        ch = Changes()
        self.declare_now(name, policy, durable, ch)
        await self.journal.write(ch)
        return self.info(name)

    async def delete(self, name: str) -> None:
        self.owners.pop(name, None)
        state = self.queues.pop(name, None)
        if state is None:
            return
        state.deleted = True
        self.flow.forget(state)
        for browser in state.browsers:
            browser.closed = True
        state.browsers.clear()
        for group in state.groups.values():
            for handle in group.consumers:
                handle.closed = True
            group.consumers.clear()
            self._timed.discard(group)
            group.timed = False
        if state.durable:
            ch = Changes()
            ch.calls.append(queue_store.delete_queue(name))
            self.journal.event(ch, state, now_ms(), "purged", reason="delete")
            await self.journal.write(ch)

    def exists(self, name: str) -> bool:
        return name in self.queues

    def get(self, name: str) -> QueueState:
        state = self.queues.get(name)
        if state is None:
            raise QueueError("no-queue", f"queue {split_key(name)[1]} does not exist")
        return state

    def _get_or_create(self, name: str, ch: Changes) -> QueueState:
        state = self.queues.get(name)
        if state is not None:
            return state
        if not self.settings.auto_create:
            raise QueueError("no-queue", f"queue {split_key(name)[1]} does not exist and auto_create is off")
        return self.declare_now(name, None, True, ch)

    # -- admin (queue/admin.py) -------------------------------------------------------------------

    def info(self, name: str) -> QueueInfo:
        return admin.info(self, name)

    def ready_count(self, name: str, group: str = DEFAULT_GROUP) -> int:
        return admin.ready_count(self, name, group)

    def peek(self, name: str, after: int = -1, limit: int = 100) -> list[StoredMessage]:
        return admin.peek(self, name, after, limit)

    async def peek_stored(self, name: str, after: int = -1, limit: int = 100) -> list[StoredMessage]:
        return await admin.peek_stored(self, name, after, limit)

    async def purge(self, name: str) -> int:
        count = await admin.purge(self, name)
        state = self.queues.get(name)
        if state is not None and state.behind:
            self.flow.look(state)
        return count

    async def redrive(self, name: str, limit: int | None = None) -> int:
        return await admin.redrive(self, name, limit)

    # -- publish ----------------------------------------------------------------------------------

    async def publish(self, queue: str, message: Message, routing_key: str = "") -> PublishResult:
        """Append a message; returns once it is committed. Raises :class:`QueueError` when refused."""
        state, message, ch = self._accept(queue, message)
        if not state.durable:
            return PublishResult(state.name, self._publish_transient(state, message, routing_key))
        if ch is None and not self.is_shared(state):
            offset = state.next_offset
            await committed(self._publish_early(state, message, routing_key, None))
            return PublishResult(state.name, offset)
        if self.shared_offsets(state):
            offset = await self._reserved_offset(state)
        else:
            offset = state.next_offset
            state.next_offset += 1
        await committed(self._publish_at(state, message, routing_key, offset, ch, None))
        return PublishResult(state.name, offset)

    def publish_run(self, queue: str, messages: list[Message], now: int) -> bool:
        """``publish_nowait`` of several messages to one in-memory queue with no length limit or
        vhost quota, the checks made once (a front end's run of publishes, read together). False,
        with nothing done, where the queue is not such a queue: each goes its own way then."""
        state = self.queues.get(queue)
        if (
            state is None
            or state.durable
            or state.deleted
            or not self._started
            or self.limits.vhosts
            or state.policy.max_length is not None
            or state.policy.max_length_bytes is not None
        ):
            return False
        if any([m.user_properties for m in messages]):
            messages = [_without_reserved(m) if m.user_properties else m for m in messages]
        handed = 0
        if not self.events.publishing and not state.browsers:
            handed = transient.hand_over(self, state, messages, "", now)  # straight to a consumer
        for message in messages[handed:]:
            self._publish_transient(state, message, "", now)
        if state.behind:  # behind before the run or left so by it: held (all of it read already)
            self.flow.hold(state, None)
        return True

    def publish_nowait(
        self,
        queue: str,
        message: Message,
        routing_key: str = "",
        done: Callable[[PublishResult, QueueError | None], None] | None = None,
        now: int | None = None,
        held: Held | None = None,
    ) -> Receipt | None:
        """``publish`` without a task per message, for front ends that must not stall per publish.
        ``now``: the time of the publish (epoch ms) when the front end has read it already.
        ``held``: what waits while the queue is behind (``queue/flow.py``) when not the connection
        whose frames are being acted on (an AMQP 1.0 link, slowed by its credit alone).

        ``done(result, error)`` runs on the loop once the message is committed (``error``: the write
        failed); without ``done``, the returned receipt can be awaited instead (with it, the receipt
        has no event: no wake-up object per message). ``None``: an in-memory queue, where the message
        is appended (and ``done`` has run) already. A shared node's publish that waits in memory for
        the node's next block of offsets gets a ticket standing in for its receipt, done after its
        commit all the same (these waits are bounded by the publishers' windows and last one writer
        round). Refusals raise :class:`QueueError` at once; so does a shared node's stream when its
        block of offsets is spent (reason ``shared``: use ``publish``).
        """
        state, message, ch = self._accept(queue, message, held)
        if not state.durable:
            appended = self._publish_transient(state, message, routing_key, now)
            if state.behind:  # this very publish left it behind: held before its credit comes back
                self.flow.hold(state, held)
            if done is not None:
                done(PublishResult(state.name, appended), None)
            return None
        if ch is None and not self.is_shared(state):
            return self._publish_early(state, message, routing_key, done, now)
        if self.shared_offsets(state):
            offset = None if state.awaiting_block else self._block_offset(state)
            if offset is None:
                if not self.is_shared(state):
                    raise QueueError("shared", "a shared node's stream takes its offsets from publish()")
                # In order behind the others waiting for the node's next block of offsets. Its
                # ticket is done once it is committed: a channel's own basic.get waits for it.
                waiting = WaitingPublish(message, routing_key, ch, done, Receipt.standing_in())
                state.awaiting_block.append(waiting)
                return waiting.ticket
        else:
            offset = state.next_offset
            state.next_offset += 1
        return self._publish_at(state, message, routing_key, offset, ch, done)

    def _publish_at(
        self,
        state: QueueState,
        message: Message,
        routing_key: str,
        offset: int,
        ch: Changes | None,
        done: Callable[[PublishResult, QueueError | None], None] | None,
    ) -> Receipt | None:
        """``ch``: None for a shared work queue's publish that has none yet (``_accept``)."""
        left: list[WorkGroup] | None = None
        if self.is_shared(state):
            self.claims.track(state, offset)
            claimers = self.claims.claimers(state, routing_key, message)
            if claimers:  # its own consumers here: delivered before the commit, as on one node
                return self._publish_early(
                    state, message, routing_key, done, offset=offset, claimers=claimers
                )
            left = self.claims.left_unclaimed(state, offset)
        if ch is None:
            ch = Changes()
        stored, result = self._stage(state, message, routing_key, offset, ch)
        if not state.durable:
            if done is not None:
                done(result, None)
            return None
        early = self.early(state)
        if not early:
            state.inflight += 1

        def finished(_results: list[Any]) -> None:
            error = receipt.error
            if early:
                if error is None:
                    self._announce(state, stored)
                else:
                    self._withdraw(state, offset)
            else:
                if left:
                    self.claims.committed_unclaimed(left, offset)
                    if error is None:
                        self.claims.keep(state, stored)
                if error is None:
                    self._published(state, stored)
                state.inflight -= 1  # on failure too, or max-length accounting would drift
            if done is not None:
                done(result, None if error is None else QueueError("storage", str(error)))

        if early:
            # Consumers get it at the end of the turn, after these rows were submitted (a delivery's
            # rows must follow them); scheduled before the submission wakes the writer, so the
            # delivery goes out before the writer's thread competes for the interpreter.
            self._deliverable(state, stored)
        try:
            receipt = self.journal.publish(
                ch,
                state,
                stored,
                next_offset=not self.shared_offsets(state),
                wait=done is None,
                on_results=finished,
            )
        except WriterError as exc:
            if early:
                self._withdraw(state, offset)
            else:
                state.inflight -= 1
            if left:
                self.claims.committed_unclaimed(left, offset)
            raise QueueError("storage", str(exc)) from exc
        return receipt

    def transact(
        self,
        publishes: list[tuple[str, Message, str]],
        settles: list[tuple[ConsumerHandle, int, Outcome]],
        done: Callable[[QueueError | None], None],
        *,
        retry: bool = True,
    ) -> None:
        """A local transaction's work (AMQP 1.0 part 4): its publishes ``(queue, message, routing
        key)`` and its settlements ``(handle, offset, outcome)`` as one change, so the durable
        queues' rows commit in one SQL transaction or not at all. ``done(error)`` runs once it is
        committed. Raises :class:`QueueError` before anything is changed when a publish is refused
        (full, deleted, a shared node's stream) or a settled delivery is no longer its handle's (it
        went back to the queue when its link or connection ended): the transaction cannot commit.

        A shared node's work queue takes the publishes' offsets from the node's block; when the
        block has too few left, the transaction waits for the next one (``_reserve_ahead``) and is
        made then. Its publishes are written unclaimed, for any node's claims."""
        accepted: list[tuple[QueueState, Message, str]] = []
        need: dict[QueueState, int] = {}
        for queue, message, routing_key in publishes:
            state, message, own = self._accept(queue, message)
            if self.shared_offsets(state):
                if not self.is_shared(state):
                    raise QueueError(
                        "unsupported", f"queue {queue}: a shared node's stream takes no transactions"
                    )
                need[state] = need.get(state, 0) + 1
                if need[state] > OFFSET_BLOCK:
                    raise QueueError(
                        "unsupported",
                        f"queue {queue}: a transaction publishes at most {OFFSET_BLOCK} messages "
                        "to a shared node's queue",
                    )
            if own is not None and not own.empty():
                self.journal.submit(own)  # drops for max-length go ahead, as a lone publish's do
            accepted.append((state, message, routing_key))
        short = [state for state, n in need.items() if _offsets_left(state) < n]
        if short:
            if not retry:
                raise QueueError("storage", "no offsets reserved for the transaction's publishes")
            self._after_blocks(short, lambda: self._transact_again(publishes, settles, done))
            return
        for handle, offset, _outcome in settles:
            group = handle.group
            entry = group.entries.get(offset) if isinstance(group, WorkGroup) else None
            if handle.closed or (
                isinstance(group, WorkGroup) and (entry is None or entry.holder is not handle)
            ):
                raise QueueError("released", f"{handle.queue_name}:{offset} went back to the queue")
        ch = Changes()
        now = now_ms()
        early: list[tuple[QueueState, StoredMessage]] = []
        late: list[tuple[QueueState, StoredMessage]] = []
        in_memory = False
        unclaimed: list[tuple[QueueState, list[WorkGroup], StoredMessage]] = []
        for state, message, routing_key in accepted:
            left: list[WorkGroup] = []  # the groups this publish leaves unclaimed (shared)
            if state in need:
                from_block = self._block_offset(state)
                assert from_block is not None  # counted above
                offset = from_block
                self.claims.track(state, offset)
                left = self.claims.left_unclaimed(state, offset)
            else:
                offset = state.next_offset
                state.next_offset = offset + 1
            stored = StoredMessage(
                offset, message, routing_key, now, expiry_ms(state.policy, now, message.expires_at_ms),
                len(message.payload),
            )  # fmt: skip
            state.stats["published"] += 1
            if state in need:
                unclaimed.append((state, left, stored))
            if not state.durable:
                self._published(state, stored)
                in_memory = True
                continue
            self.journal.appended(ch, state, stored)
            self.journal.event(ch, state, now, "published", offset=offset, consumer=message.publisher_id)
            (early if self.early(state) else late).append((state, stored))
        if in_memory:
            self._flush_dirty()
        again: dict[Group, QueueState] = {}
        for handle, offset, outcome in settles:
            if handle.group.settle(offset, outcome, handle, None, now, ch):
                if self.shared:
                    self.claims.finished.add(handle.queue.name)
                if outcome.__class__ is Retry:
                    again[handle.group] = handle.queue
        after = ch.after or []
        for state, stored in early:
            self._deliverable(state, stored)  # as an early queue's lone publish: before the commit
        for state, _stored in late:
            state.inflight += 1

        def committed_now() -> None:
            for f in after:
                f()
            for state, stored in late:
                self._published(state, stored)
            for state, stored in early:
                self._announce(state, stored)

        def finished(_results: list[Any]) -> None:
            error = receipt.error
            for state, groups, stored in unclaimed:
                self.claims.committed_unclaimed(groups, stored.offset)
                if error is None and groups:
                    self.claims.keep(state, stored)  # as a lone publish left unclaimed is
            for state, _stored in late:
                state.inflight -= 1
            if error is not None:
                for state, stored in early:
                    self._withdraw(state, stored.offset)
            done(None if error is None else QueueError("storage", str(error)))

        if ch.empty():  # in-memory queues only: done already
            committed_now()
            done(None)
        else:
            try:
                receipt = self.journal.send(ch, on_commit=committed_now, on_results=finished)
            except WriterError as exc:
                for _state, groups, stored in unclaimed:
                    self.claims.committed_unclaimed(groups, stored.offset)
                for state, _stored in late:
                    state.inflight -= 1
                for state, stored in early:
                    self._withdraw(state, stored.offset)
                done(QueueError("storage", str(exc)))
        for group, state in again.items():
            self._dispatch(state, group)

    def _transact_again(
        self,
        publishes: list[tuple[str, Message, str]],
        settles: list[tuple[ConsumerHandle, int, Outcome]],
        done: Callable[[QueueError | None], None],
    ) -> None:
        """A transaction that waited for blocks of offsets, made now (once: no second wait)."""
        try:
            self.transact(publishes, settles, done, retry=False)
        except QueueError as exc:
            done(exc)

    def _after_blocks(self, states: list[QueueState], then: Callable[[], None]) -> None:
        """Reserve the next block of offsets of each of ``states`` and run ``then`` once every
        reservation is in (or failed)."""
        left = [len(states)]

        def one_in() -> None:
            left[0] -= 1
            if left[0] == 0:
                then()

        for state in states:
            state.after_block.append(one_in)
            self._reserve_ahead(state)  # none ahead (else the block and the next would do)

    def _block_offset(self, state: QueueState) -> int | None:
        """The next offset of this node's reserved block (taking the block reserved ahead when the
        current one is spent), or None; reserves the next block once half of one is used."""
        if state.block_next >= state.block_end and state.block_ahead is not None:
            (state.block_next, state.block_end), state.block_ahead = state.block_ahead, None
        if state.block_end - state.block_next < OFFSET_BLOCK // 2:
            self._reserve_ahead(state)
        if state.block_next >= state.block_end:
            return None
        state.block_next += 1
        return state.block_next - 1

    async def _reserved_offset(self, state: QueueState) -> int:
        """The next offset of this node's block for ``publish``, in order behind the publishes
        waiting for one (``publish_nowait``), waiting for the next reservation while none is left.
        Raises when a reservation it waited for failed."""
        while True:
            self._publish_awaiting(state)  # they were first
            if not state.awaiting_block and (offset := self._block_offset(state)) is not None:
                return offset
            # A spent block has its next reservation in flight (_block_offset started it).
            failures, reserving = state.reserve_failures, state.reserving
            if reserving is None:
                raise QueueError("storage", "no offsets reserved")
            await reserving.wait()
            if state.reserve_failures != failures:
                raise QueueError("storage", "no offsets reserved")

    def _reserve_ahead(self, state: QueueState) -> None:
        """Reserve this node's next block of offsets without awaiting it (the one path that does);
        publishes and transactions waiting for it go on once it is in."""
        if state.reserving is not None or state.block_ahead is not None:
            return
        event = state.reserving = anyio.Event()

        def reserved(results: list[Any]) -> None:
            state.reserving = None
            event.set()
            waiting_tx, state.after_block = state.after_block, []
            try:
                self._reserved(state, results)
            finally:
                for then in waiting_tx:  # transactions waiting for it (_after_blocks)
                    then()

        batch = WriteBatch(calls=[queue_store.reserve_offsets(state.name, OFFSET_BLOCK)])
        self.journal.send(batch, on_results=reserved, ahead=True)

    def _reserved(self, state: QueueState, results: list[Any]) -> None:
        """A block of offsets came in (``results``), or its reservation failed (none)."""
        if results:
            first = int(results[0])
            if state.own_from is None or first != state.own_end:  # another reservation between
                state.own_from = first
            state.own_end = first + OFFSET_BLOCK
            if state.block_next >= state.block_end:
                state.block_next, state.block_end = first, first + OFFSET_BLOCK
            else:
                state.block_ahead = (first, first + OFFSET_BLOCK)
            self._publish_awaiting(state)
        else:  # the reservation failed: so do the publishes that waited for it
            state.reserve_failures += 1
            waiting, state.awaiting_block = state.awaiting_block, deque()
            failed = QueueError("storage", "no offsets reserved")
            for publish in waiting:
                _refuse_waiting(publish, PublishResult(state.name, -1), failed)

    def _publish_awaiting(self, state: QueueState) -> None:
        """Publishes that waited for a block of offsets, in arrival order, while the block lasts."""
        waiting = state.awaiting_block
        while waiting and (offset := self._block_offset(state)) is not None:
            publish = waiting.popleft()
            try:
                receipt = self._publish_at(
                    state, publish.message, publish.routing_key, offset, publish.changes, publish.done
                )
            except QueueError as exc:
                _refuse_waiting(publish, PublishResult(state.name, offset), exc)
                continue
            if receipt is None:
                publish.ticket.settle(None)
            else:
                receipt.then(partial(_settle_as, publish.ticket, receipt))

    def _publish_transient(
        self, state: QueueState, message: Message, routing_key: str, now: int | None = None
    ) -> int:
        """An in-memory queue's publish (``transient.py``): stored, announced and handed to the
        consumers with credit at once; nothing for the journal. Returns its offset."""
        if not self.events.publishing and not state.browsers:
            offset = state.next_offset
            if transient.hand_over(self, state, (message,), routing_key, now):  # straight to a consumer
                return offset
        if now is None:
            now = now_ms()
        stored = transient.append(state, message, routing_key, now)
        if self.events.publishing:
            self._announce(state, stored)
        if state.browsers:
            for browser in list(state.browsers):
                self._browse(browser)
        for group in state.groups.values():
            if group.consumers:
                self._dispatch(state, group, now)
        return stored.offset

    def _publish_early(
        self,
        state: QueueState,
        message: Message,
        routing_key: str,
        done: Callable[[PublishResult, QueueError | None], None] | None,
        now: int | None = None,
        *,
        offset: int | None = None,
        claimers: list[WorkGroup] | None = None,
    ) -> Receipt:
        """A durable early queue's publish (see :meth:`early`): its row, finished here (offset,
        expiry), goes into the journal's turn, committed with the turn's other publishes and confirmed
        (or withdrawn) with them; consumers get it at the end of the turn, after the turn's rows were
        submitted. Returns the turn's receipt. ``now``: the publish's time, when the front end read it.
        A shared node's publish comes with its ``offset`` (from the node's block) and the groups that
        claim it here (``Claims.claimers``): their pending rows join the turn."""
        if offset is None:
            offset = state.next_offset
            state.next_offset = offset + 1
        if now is None:
            now = now_ms()
        # Without a queue TTL, the message's own expiry (what expiry_ms says, without the call).
        policy, expires = state.policy, message.expires_at_ms
        if policy.ttl_s is not None:
            expires = expiry_ms(policy, now, expires)
        stored = StoredMessage(offset, message, routing_key, now, expires, len(message.payload))
        state.stats["published"] += 1
        ticket = self.journal.stage(state, stored, done, next_offset=claimers is None)
        if claimers is not None:
            turn = self.journal.turn
            assert turn is not None
            self.claims.claim_published(state, stored, claimers, turn.changes)
        self._deliverable(state, stored)  # without a loop (trio), this submits the turn at once
        return ticket

    def _accept(
        self, queue: str, message: Message, held: Held | None = None
    ) -> tuple[QueueState, Message, Changes | None]:
        """A publish's checks (and overflow drops): the queue, the message to store, the changes so
        far (None: an early queue's publish, whose row goes into the journal's turn). A queue that
        is behind holds the publisher (``held``, else the connection being acted on) first."""
        if not self._started:
            raise QueueError("stopped", "the queue manager is not running")
        if message.retain:
            raise QueueError("retain", "a queue message cannot be retained")
        state = self.queues.get(queue)
        if state is None:
            declared = Changes()
            state = self._get_or_create(queue, declared)
            if not declared.empty():
                # An auto-created queue's row goes ahead on its own: a refused publish must not lose it.
                self.journal.send(declared)
        if state.deleted:
            raise QueueError("no-queue", f"queue {split_key(queue)[1]} was deleted")
        if state.durable and self.disk.low:
            self.disk.refused += 1
            state.stats["refused"] += 1
            raise QueueError(
                "disk-full",
                f"queue {queue}: disk free is below storage.min_free_bytes ({self.disk.free} left)",
            )
        if self.limits.vhosts:
            self._check_quota(state, len(message.payload))
        policy = state.policy
        limited = policy.max_length is not None or policy.max_length_bytes is not None
        # A turn's publishes to early queues share the journal's turn (Journal.stage); a limited
        # queue's publish keeps its own change, whose drops must follow their dead letters
        # (_check_limits); an in-memory queue's needs none (_publish_transient).
        # A shared work queue's publish makes its change only if it is not claimed as it is
        # published (_publish_at): a claimed one joins the turn too.
        plain = not state.durable or self.early(state) or self.is_shared(state)
        ch = None if not limited and plain else Changes()
        # shared: this node does not see the whole queue
        if ch is not None and limited and not self.is_shared(state):
            try:
                self._check_limits(state, len(message.payload), ch)
            except QueueError:
                if policy.overflow == "reject-dead-letter":
                    letter = Changes()
                    if self.letters.refused(state, message, now_ms(), letter):
                        self.journal.submit(letter)
                raise
        if message.user_properties:
            message = _without_reserved(message)
        if state.behind:  # taken all the same: what was read before the hold still arrives
            self.flow.hold(state, held)
        return state, message, ch

    def _stage(
        self, state: QueueState, message: Message, routing_key: str, offset: int, ch: Changes
    ) -> tuple[StoredMessage, PublishResult]:
        """The message at ``offset``: in memory at once when not durable (a durable one's rows are
        the journal's, :meth:`Journal.publish`)."""
        queue = state.name
        now = now_ms()
        stored = StoredMessage(
            offset, message, routing_key, now, expiry_ms(state.policy, now, message.expires_at_ms),
            len(message.payload),
        )  # fmt: skip
        state.stats["published"] += 1
        result = PublishResult(queue, offset)
        if not state.durable:
            self._published(state, stored)
            self._flush_dirty()
        return stored, result

    def _check_queue_count(self, key: str) -> None:
        """The vhost's queue limit, before a new queue: refused as RabbitMQ does (406 on 0.9.1)."""
        vhost, name = split_key(key)
        limits = self.limits.of_vhost(vhost)
        if limits is None or not limits.max_queues or is_dead_letter_queue(key):
            return  # a dead-letter queue is made when a letter needs it: refusing it would lose it
        count = sum([1 for queue in self.queues.values() if queue.vhost == vhost])
        refusal = self.limits.may_declare_queue(vhost, count, name)
        if refusal is not None:
            raise QueueError("queue-limit", refusal)

    def _check_quota(self, state: QueueState, size: int) -> None:
        """The vhost's stored-bytes quota: a publish beyond it is refused ("full": each hull's
        refusal, PUBACK 0x97, basic.nack, rejected with amqp:resource-limit-exceeded)."""
        vhost = state.vhost
        limits = self.limits.of_vhost(vhost)
        if limits is None or not limits.max_stored_bytes:
            return
        # Summed when asked, and only with a quota: no second count of every queue's bytes to drift;
        # each queue knows its vhost, so the sum is one pass with no call a queue.
        stored = sum([queue.bytes for queue in self.queues.values() if queue.vhost == vhost])
        refusal = self.limits.may_store(vhost, stored, size)
        if refusal is not None:
            state.stats["refused"] += 1
            raise QueueError("full", refusal)

    def _check_limits(self, state: QueueState, size: int, ch: Changes) -> None:
        """Max length and bytes: refuse, or drop the oldest (dead-lettered with a dead-letter
        exchange, each drop and its letter in a commit of their own, ahead of the publish)."""
        policy = state.policy
        max_n, max_b = policy.max_length, policy.max_length_bytes
        over_n = max_n is not None and len(state.messages) + state.inflight + 1 > max_n
        over_b = max_b is not None and state.bytes + size > max_b
        if not (over_n or over_b):
            return
        if policy.overflow != "drop-oldest" or (max_b is not None and size > max_b):
            state.stats["refused"] += 1
            raise QueueError("full", f"queue {split_key(state.name)[1]} is full")
        now = now_ms()
        letters = Changes()
        while state.messages and (
            (max_n is not None and len(state.messages) + state.inflight + 1 > max_n)
            or (max_b is not None and state.bytes + size > max_b)
        ):
            self.letters.overflow(state, next(iter(state.messages.values())), now, ch, letters)
        if letters.after or not letters.empty():
            self.journal.submit(letters)

    def early(self, state: QueueState) -> bool:
        """A durable work queue on a single node delivers a message before its commit, as RabbitMQ
        does a persistent one: the publisher's confirm (PUBACK, basic.ack, disposition) still waits
        for the commit, but the consumer does not wait for the disk. A delivery's rows are submitted
        after the message's, so no commit can record a delivery of a message it does not hold, and a
        message acked before its commit is never written (the writer drops the pair). A crash before
        the commit loses only what no publisher was told is safe. Streams (offsets a consumer keeps
        must never be reused after a crash) and shared nodes (messages come by claims) commit first."""
        return state.durable and not self.shared and state.policy.mode == "work"

    def _published(self, state: QueueState, stored: StoredMessage) -> None:
        """A publish is in (committed, for a durable queue): make it deliverable and say so."""
        self.appended(state, stored)
        self._announce(state, stored)

    def _announce(self, state: QueueState, stored: StoredMessage) -> None:
        if self.events.publishing:
            self.events.message(MESSAGE_PUBLISHED, stored.message, queue=state.name, offset=stored.offset)

    def _deliverable(self, state: QueueState, stored: StoredMessage) -> None:
        """An early message (see :meth:`early`) in memory now; its queue's consumers get it at the end
        of the turn (the read's, see :attr:`at_turn_end`, else the loop's), with whatever else the
        turn publishes (one dispatch, not one each)."""
        self.appended(state, stored)
        self._end_turn_soon()

    def _end_turn_soon(self) -> None:
        """At the end of the turn (the read's or the loop's): submit the journal's turn, then deliver
        what it made deliverable (without a loop, trio: at once)."""
        if not self._flush_soon:
            self._flush_soon = True
            at_turn_end = self.at_turn_end
            loop = self._loop
            if at_turn_end is not None and loop is not None:
                at_turn_end(self._flush_now)
            elif loop is None:
                self._flush_now()
            else:
                loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_soon = False
        self.journal.send_turn()
        self._flush_dirty()

    def _turn_done(self, turn: Turn, _results: list[Any]) -> None:
        """A turn's publishes committed (or failed: its receipt's error): say so to each, in order."""
        error = turn.ticket.error
        failed = None if error is None else QueueError("storage", str(error))
        publishing = self.events.publishing  # asked once a turn, not through _announce a message
        for state, stored, done in turn.publishes:
            if failed is None:
                if publishing:
                    self._announce(state, stored)
            else:
                self._withdraw(state, stored.offset)
            if done is not None:
                done(PublishResult(state.name, stored.offset), failed)

    def _withdraw(self, state: QueueState, offset: int) -> None:
        """An early message whose write failed: the publisher is told, and consumers do not get it
        unless one already has (at least once: it may be published again). A shared node's groups
        drop what they claimed of it and had not handed out. One kept for its consumer is unwritten
        from now on: its delivery, settlement and removal write no row (an ack committed once the
        database is back would name a message the table never had)."""
        if self.is_shared(state):
            for group in state.groups.values():
                entry = group.entries.get(offset)
                if entry is not None and entry.state == WAIT:
                    del group.entries[offset]
                    group.unready(offset)
        if not any(offset in group.entries for group in state.groups.values()):
            state.remove(offset)
        elif offset in state.messages:
            state.unwritten.add(offset)

    def appended(self, state: QueueState, stored: StoredMessage) -> None:
        """On the loop, in offset order, once the message is committed (or submitted, for an early
        queue): make it deliverable."""
        if state.deleted:
            return
        if not self.shared or not self.is_shared(state):  # shared: the message comes back by a claim
            state.add(stored)
        # Deliveries once per committed batch, not per message: the writer calls _flush_dirty.
        dirty = self._dirty
        if not dirty:
            self.writer.batch_done = self._flush_dirty
        dirty.add(state)

    def _flush_dirty(self) -> None:
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = set()
        self.writer.batch_done = None  # until something is deliverable again
        for state in dirty:
            for browser in list(state.browsers):
                self._browse(browser)
            for group in state.groups.values():
                if group.consumers:  # a shared node's dispatch claims when its group runs short
                    self._dispatch(state, group)

    # -- consume ----------------------------------------------------------------------------------

    def consume(
        self,
        queue: str,
        consumer: QueueConsumer,
        *,
        group: str | None = None,
        routing_filter: str | None = None,
        start: str | int | None = None,
        auto_ack: bool = False,
        owner: object = None,
        selects: Selects | None = None,
    ) -> ConsumerHandle:
        """Attach a consumer. It receives nothing until the front end gives it credit.

        ``start`` (new groups of work queues; any group of a stream): ``"first"``, ``"last"``,
        ``"next"``, an offset (int or digits), or ``"timestamp:<epoch ms>"``. A stream group with
        no ``start`` resumes at its committed offset (new stream groups start at ``next``); a new work
        group starts at the oldest message the queue holds.

        ``owner``: the connection asking. An exclusive or temporary queue (``owners``) is consumed
        only by the connection that owns it, whatever its protocol ("locked" for the others).

        ``selects``: a message selector; the consumer gets only the messages it passes, the others
        stay for the group's other consumers.
        """
        if not self._started:
            raise QueueError("stopped", "the queue manager is not running")
        self._check_owner(queue, owner)
        ch = Changes()
        state = self._get_or_create(queue, ch)
        name = group or DEFAULT_GROUP
        grp = state.groups.get(name)
        if grp is None:
            default = "next" if state.mode == "stream" else "first"
            at = position(state, start if start is not None else default)
            grp = state.groups[name] = self._new_group(state, name, at, at)
            self.journal.cursor(ch, state, grp)
            for other in state.groups.values():
                if isinstance(other, WorkGroup) and other is not grp:
                    other.store_held(ch)  # no longer alone: its held deliveries need their rows
        elif isinstance(grp, StreamGroup) and not grp.consumers:
            grp.resume(start)
        handle = ConsumerHandle(self, state, grp, consumer, routing_filter, auto_ack, selects)
        grp.consumers.append(handle)
        if state.behind:
            self.flow.joined(state)
        if state.durable and not ch.empty():
            self.journal.send(ch)
        return handle

    def after_claim(self, handle: ConsumerHandle, done: Callable[[], None]) -> bool:
        """A shared node's work queue: run ``done`` once a claim made for ``handle``'s credit has
        landed and what it claimed is handed out (basic.get waits for it: what the queue holds is
        in the database, not here). False where the queue is in memory: nothing to wait for, and
        ``done`` is not run."""
        state = handle.queue
        if handle.closed or not self.is_shared(state):
            return False
        self.claims.then(state, handle.group, handle, done)
        return True

    def _check_owner(self, queue: str, owner: object) -> None:
        held_by = self.owners.get(queue)
        if held_by is not None and held_by is not owner:
            raise QueueError("locked", f"queue {split_key(queue)[1]} is exclusive to another connection")

    def browse(self, queue: str, consumer: QueueConsumer, *, owner: object = None) -> BrowseHandle:
        """Attach a browser: it receives copies of what the queue holds (from the oldest) and of
        what arrives, as credit allows, and changes nothing (a shared node's work queue: what is
        stored, read from the database). ``owner``: as for :meth:`consume`, an exclusive or
        temporary queue is read only by the connection that owns it."""
        if not self._started:
            raise QueueError("stopped", "the queue manager is not running")
        self._check_owner(queue, owner)
        ch = Changes()
        state = self._get_or_create(queue, ch)
        if state.durable and not ch.empty():
            self.journal.send(ch)
        # A shared node holds only its claims: its browsers read the stored rows from the first.
        handle = BrowseHandle(self, state, consumer, 0 if self.is_shared(state) else state.first_offset())
        state.browsers.append(handle)
        return handle

    def _browse(self, handle: BrowseHandle) -> None:
        """Hand a browser copies of the messages past its cursor while it has credit."""
        state = handle.queue
        if state.deleted:
            handle.closed = True
            return
        if self.is_shared(state):
            self.claims.browse(handle)
            return
        messages = state.messages
        now = now_ms()
        offset = max(handle.cursor, state.first_offset()) if messages else handle.cursor
        high = state.high
        out: list[QueueDelivery] = []
        while handle.credit > 0 and offset < high and not handle.closed:
            stored = messages.get(offset)
            offset += 1
            if stored is None or expired(stored, now):
                continue
            handle.credit -= 1
            out.append(QueueDelivery(stored.message, state.name, stored.offset, "$browse", 1, False))
        handle.cursor = max(handle.cursor, offset)
        for delivery in out:
            try:
                handle.consumer.deliver(delivery)
            except Exception:
                log.exception("browser %s failed to take a delivery", handle.consumer.id)

    # -- dispatch ---------------------------------------------------------------------------------

    def _dispatch(self, state: QueueState, group: Group, now: int | None = None) -> None:
        if group.busy:
            group.again = True
            return
        if not group.consumers or state.deleted or not self._started:
            if state.behind:  # its last consumer went: its publishers go on
                self.flow.look(state)
            return
        if type(group) is WorkGroup:
            # Nothing to hand out (a consumer's credit came back, the queue is drained): what take
            # would say, asked before a change is made. A shared node's groups go on to their claims.
            if group.cursor >= state.high and not group.ready and not (self.shared and state.durable):
                if state.behind:
                    self.flow.look(state)
                return
            if not state.durable and transient.dispatch(self, state, group, now):
                # What the consumers had no credit for may be past the marks (queue/flow.py):
                # comparisons here, the call only near or past them.
                flow = self.flow
                if (
                    state.behind
                    or state.high - group.cursor > flow.high_messages
                    or state.bytes > flow.high_bytes
                ):
                    flow.look(state)
                return  # else the general way goes on from where the transient one stopped
        group.busy = True
        ch = Changes()
        if now is None:
            now = now_ms()
        work = group if isinstance(group, WorkGroup) else None
        stream = group if isinstance(group, StreamGroup) else None
        # Handed to the consumers only after the changes are submitted: a consumer that settles from
        # within deliver() submits its rows after the delivery's, never before them.
        out: list[tuple[Taker, QueueDelivery]] = []
        try:
            while True:
                group.again = False
                progressed = False
                consumers = group.consumers
                n = len(consumers)
                start = group.rr % n if n else 0
                for i in range(n):
                    if i >= len(consumers):
                        break
                    handle = consumers[(start + i) % len(consumers)]
                    if handle.credit <= 0 or handle.closed:
                        continue
                    if work is not None:
                        if not work.ready and work.cursor >= state.high:
                            break  # what take would find: nothing for anyone (the common second round)
                        taken = work.take(handle.routing_filter, now, ch, handle.selects)
                        if taken is None:
                            continue
                        delivery = work.deliver(handle, taken[0], taken[1], now, ch)
                    elif stream is not None:
                        stored = stream.take(handle.routing_filter, now, ch, handle.selects)
                        if stored is None:
                            continue
                        delivery = stream.deliver(handle, stored, now, ch)
                    else:
                        break
                    out.append((handle, delivery))
                    group.rr = start + i + 1
                    progressed = True
                if not progressed and not group.again:
                    break
        finally:
            group.busy = False
            if ch.after:
                self.journal.submit(ch)
            elif state.durable and (out or not ch.empty()):  # a durable delivery has its event
                self.journal.send(ch)
            for consumer_handle, delivery in out:
                try:
                    consumer_handle.consumer.deliver(delivery)
                except Exception:
                    log.exception("consumer %s failed to take a delivery", consumer_handle.consumer.id)
        if work is not None:
            flow = self.flow
            if state.behind or state.high - work.cursor > flow.high_messages or state.bytes > flow.high_bytes:
                flow.look(state)
        if self.shared and self.is_shared(state):
            if any(handle.auto_ack for handle, _ in out):  # their 'done' markers: compacted at the poll
                self.claims.finished.add(state.name)
            if self.claims.due(group):
                self.claims.claim(state, group)

    # -- the groups' Host: what reaches past one group ---------------------------------------------

    def remove(self, state: QueueState, offset: int, kind: str, reason: str, now: int, ch: Changes) -> None:
        self.letters.remove(state, offset, kind, reason, now, ch)

    def expire(self, state: QueueState, offset: int, now: int, ch: Changes) -> None:
        self.letters.expire(state, offset, now, ch)

    def dead_letter(
        self,
        state: QueueState,
        group: Group,
        stored: StoredMessage,
        attempts: int,
        reason: str,
        now: int,
        ch: Changes,
    ) -> None:
        self.letters.dead_letter(state, group, stored, attempts, reason, now, ch)

    def due(self, state: QueueState, group: Group, at: int) -> None:
        """A group's timer is due at ``at``: watch it, and wake the timers early if they sleep past it."""
        self._watch(group)
        if at < self.wake_at:
            self.wake_at = at
            self._alarm.ring()

    def _watch(self, group: Group) -> None:
        group.timed = True
        self._timed.add(group)

    # -- settlement -------------------------------------------------------------------------------

    async def _settle(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        outcome: Outcome,
        *,
        holder: ConsumerHandle | None = None,
        consumer_id: str | None = None,
    ) -> bool:
        """Settle and wait until the change is committed."""
        ok, receipt = self._settle_now(state, group, offset, outcome, holder, consumer_id, True)
        await committed(receipt)
        return ok

    def _settle_now(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        outcome: Outcome,
        holder: ConsumerHandle | None,
        consumer_id: str | None,
        wait: bool,
    ) -> tuple[bool, Receipt | None]:
        """Apply a settlement in memory (the group's) and hand its rows to the writer (no await)."""
        settled, receipt = self._settle_offsets(state, group, (offset,), outcome, holder, consumer_id, wait)
        return settled == 1, receipt

    def _settle_offsets(
        self,
        state: QueueState,
        group: Group,
        offsets: Iterable[int],
        outcome: Outcome,
        holder: ConsumerHandle | None,
        consumer_id: str | None,
        wait: bool,
    ) -> tuple[int, Receipt | None]:
        """Settle each offset with one outcome, all in one change and one submission."""
        if (
            not state.durable
            and outcome.__class__ is Ack
            and holder is not None
            and consumer_id is None
            and type(group) is WorkGroup
        ):
            acked = transient.ack(self, state, group, offsets, holder)
            if acked is not None:
                return acked, None
        if (
            not wait
            and outcome.__class__ is Ack
            and holder is not None
            and consumer_id is None
            and type(group) is WorkGroup
        ):
            # A holder's ack writes rows and runs nothing after its commit: its rows join the
            # turn's one change (journal.turn_changes), so the acks of a read are one submission,
            # sent at the end of the turn or before anything submitted after them.
            turn = self.journal.turn_changes()
            settled = group.settle_all(offsets, outcome, holder, None, now_ms(), turn)
            if self.shared and settled:
                self.claims.finished.add(state.name)  # 'done' markers, if any: compacted at the poll
            if not self._flush_soon:
                self._end_turn_soon()
            return settled, None
        ch = Changes()
        now = now_ms()
        settled = group.settle_all(offsets, outcome, holder, consumer_id, now, ch)
        if not settled:
            return 0, None
        if self.shared:
            self.claims.finished.add(state.name)  # its 'done' markers are compacted at the next poll
        receipt = self.journal.submit(ch, wait=wait)
        if outcome.__class__ is Retry:  # back in the group (a stream: its cursor): offer it again
            self._dispatch(state, group)
        return settled, receipt

    async def _cancel(self, handle: ConsumerHandle) -> None:
        if handle.closed:
            return
        handle.closed = True
        state, group = handle.queue, handle.group
        if handle in group.consumers:
            group.consumers.remove(handle)
        if not isinstance(group, WorkGroup):
            return
        ch = Changes()
        now = now_ms()
        group.cancel(handle, now, ch)
        if self.is_shared(state) and not takes_all(group.consumers):
            # what it claimed ahead that no consumer left here selects is not held here
            group.hand_back_claimed(now, ch, taken_by(group.consumers))
        await committed(self.journal.submit(ch, wait=True))
        self._dispatch(state, group)

    # -- timers -----------------------------------------------------------------------------------

    async def _timers(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sleep until the next thing is due (a visibility time-out, a retry, the TTL and retention
        sweep once a second while there are queues, a shared node's poll and lease renewal, the
        disk watermark's next measurement); ``due`` wakes it early. Nothing due: until rung."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            task_status.started()
            while True:
                now = now_ms()
                wake = max(self._next_due(now), self._last_tick + TICK_MS)
                self.wake_at = wake
                if wake > now:
                    await self._alarm.sleep(None if wake >= NEVER else (wake - now) / 1000)
                else:
                    await anyio.lowlevel.checkpoint()
                try:
                    self._tick()
                except Exception:
                    log.exception("queue timers failed")

    def _next_due(self, now: int) -> int:
        due = self._last_sweep + int(SWEEP_S * 1000) if self.queues else NEVER
        disk = self.disk.wait_s(time.monotonic())
        if disk is not None:
            due = min(due, now + int(disk * 1000))
        for group in self._timed:
            at = group.next_due()
            if at is not None and at < due:
                due = at
        if self.shared:
            due = min(due, self.claims.next_due())
        return due

    def _tick(self) -> None:
        self.disk.poll()
        now = self._last_tick = now_ms()
        for group in list(self._timed):
            state = group.state
            if state.deleted or not isinstance(group, WorkGroup):
                self._timed.discard(group)
                group.timed = False
                continue
            ch = Changes()
            changed = group.run_due(now, ch)
            if not group.timeouts and not group.delayed:
                self._timed.discard(group)
                group.timed = False
            self.journal.submit(ch)
            if changed or group.ready:
                self._dispatch(state, group)
        if self.shared:
            self.claims.tick(now, [s for s in self.queues.values() if self.is_shared(s)])
        if now - self._last_sweep >= SWEEP_S * 1000:
            self._last_sweep = now
            self._sweep(now)

    def _sweep(self, now: int) -> None:
        """TTL expiry and stream retention; unwritten offsets of messages gone are let go."""
        for state in list(self.queues.values()):
            if state.unwritten:
                state.unwritten = {offset for offset in state.unwritten if offset in state.messages}
            ch = Changes()
            if state.expiring:
                for offset, stored in list(state.messages.items()):
                    if stored.expires_at is not None and now >= stored.expires_at:
                        if state.held(offset):
                            continue  # held by a consumer: settled or timed out first
                        self.letters.expire(state, offset, now, ch)
            if state.mode == "stream":
                retention(state, self, now, ch)
            if ch.after:
                self.journal.submit(ch)
            elif state.durable and not ch.empty():
                self.journal.send(ch)
            if state.behind:  # what expired is no longer waiting
                self.flow.look(state)


def _offsets_left(state: QueueState) -> int:
    """Offsets left to a shared node in its block of ``state`` and the one reserved ahead."""
    ahead = state.block_ahead
    return max(0, state.block_end - state.block_next) + (0 if ahead is None else ahead[1] - ahead[0])


def _refuse_waiting(publish: WaitingPublish, result: PublishResult, error: QueueError) -> None:
    """A publish that waited for its offset failed: its publisher and its ticket hear so."""
    if publish.done is not None:
        publish.done(result, error)
    publish.ticket.settle(error)


def _settle_as(ticket: Receipt, receipt: Receipt) -> None:
    """A publish that waited for its offset is committed (or failed): so is its ticket."""
    ticket.settle(receipt.error)


class Running:
    """What :meth:`QueueManager.running` returns: a class, not an ``asynccontextmanager``, because
    mypyc compiles no async generator."""

    __slots__ = ("manager", "tasks")

    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager
        self.tasks: TaskGroup | None = None

    async def __aenter__(self) -> QueueManager:
        tasks = self.tasks = anyio.create_task_group()
        await tasks.__aenter__()
        try:
            await self.manager.start(tasks)
        except BaseException as error:
            await tasks.__aexit__(type(error), error, error.__traceback__)
            raise
        return self.manager

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> bool | None:
        tasks = self.tasks
        assert tasks is not None
        try:
            with anyio.CancelScope(shield=True):
                await self.manager.stop()
        except BaseException as failed:
            await tasks.__aexit__(type(failed), failed, failed.__traceback__)
            raise
        return await tasks.__aexit__(kind, error, trace)


def _without_reserved(message: Message) -> Message:
    """``message`` without the user properties a queue keeps for itself (a publisher cannot set
    them), itself when it has none of them."""
    props = message.user_properties
    if not any(k in RESERVED_PROPERTIES for k, _ in props):
        return message
    return message.copy_with(user_properties=[(k, v) for k, v in props if k not in RESERVED_PROPERTIES])
