"""The durable ``$queue/`` manager: the protocol-neutral core the MQTT and AMQP front ends bind to.

Lifecycle: ``async with manager.running():`` (or ``await manager.start(task_group)`` and later
``await manager.stop()``). ``start`` loads queues, groups, pending entries and un-acked messages
(in pages) from SQL, starts the group-commit writer thread and a timer task in the given task group.

Everything runs on the event loop; the only thread is the writer. Consumers are fed from memory
(every message a queue still holds stays in ``QueueState.messages``); SQL is written, not read, on the
hot path. ``publish`` returns after the commit; deliveries are recorded without waiting (a crash
before their commit only lowers an attempt count); ack, nack, reject, commit and cancel wait for their
commit.
"""

from __future__ import annotations

import heapq
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from trimaran.broker.events import (
    MESSAGE_PUBLISHED,
    QUEUE_ACKED,
    QUEUE_DEAD_LETTERED,
    QUEUE_EXPIRED,
    QUEUE_NACKED,
    QUEUE_REJECTED,
    EventBus,
)
from trimaran.broker.message import Message, now_ms
from trimaran.config import QueuePolicySettings, QueueSettings, StorageSettings
from trimaran.queue.groups import DONE, HELD, WAIT, Entry, Group, QueueState, StoredMessage, policy_dict
from trimaran.queue.outcomes import Ack, Commit, DeadLetter, Outcome, Retry
from trimaran.queue.policy import (
    DEFAULT_GROUP,
    DLQ_PREFIX,
    DLQ_PROPERTIES,
    QueueError,
    backoff_s,
    dead_letter_target,
    expiry_ms,
    filter_matches,
    validate_queue_name,
)
from trimaran.storage import queue_store
from trimaran.storage.disk import DiskWatch
from trimaran.storage.engine import sqlite_file
from trimaran.storage.store import Storage
from trimaran.storage.writer import GroupCommitWriter, Receipt, WriteBatch, WriterError

log = logging.getLogger(__name__)

TICK_S = 0.02  # timer resolution: visibility timeouts, nack backoff
SWEEP_S = 1.0  # TTL expiry and stream retention
SCAN_LIMIT = 10_000  # most messages a filtered consumer scans per take
POLL_MS = 100  # shared mode: how often idle consumers look for messages other nodes published
_SETTLED = {"ack": "acked", "commit": "acked", "nack": "nacked", "reject": "rejected"}  # stats keys


class QueueConsumer(Protocol):
    """Implemented by each front end's connection (or link / channel consumer)."""

    id: str

    def deliver(self, delivery: QueueDelivery) -> None:
        """Synchronous and non-blocking: put the delivery in the outbox."""


class DeadLetterRouter(Protocol):
    """Routes the dead letters of queues with a ``dead_letter_exchange`` (the AMQP 0.9.1 front end
    implements it with its exchanges)."""

    def dead_letter_queues(self, exchange: str, routing_key: str, message: Message) -> list[str]:
        """The queues ``message`` reaches when published to ``exchange`` with ``routing_key`` now."""
        ...


#: Why a message died, in RabbitMQ's words (x-death ``reason``).
DEATH_EXPIRED = "expired"
DEATH_REJECTED = "rejected"
DEATH_LIMIT = "delivery_limit"
DEATH_MAXLEN = "maxlen"


def _death_kind(reason: str) -> str:
    if reason == "max_attempts":
        return DEATH_LIMIT
    if reason in (DEATH_EXPIRED, DEATH_MAXLEN):
        return reason
    return DEATH_REJECTED


def _with_death(message: Message, queue: str, reason: str) -> Message:
    """A copy of ``message`` whose ``extra["deaths"]`` records this death as RabbitMQ's x-death
    does: one entry per (queue, reason), newest first, its count raised on each cycle; the first
    death is kept apart (x-first-death-*). Protocol-neutral: the AMQP 0.9.1 mapping turns it into
    headers."""
    extra = dict(message.extra)
    previous = extra.get("deaths")
    deaths = [dict(d) for d in previous if isinstance(d, dict)] if isinstance(previous, list) else []
    exchange = extra.get("exchange")
    key = extra.get("routing_key")
    for i, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            count = death.get("count")
            death["count"] = (count if isinstance(count, int) else 0) + 1
            deaths.insert(0, deaths.pop(i))
            break
    else:
        death = {
            "queue": queue,
            "reason": reason,
            "count": 1,
            "time": now_ms(),
            "exchange": exchange if isinstance(exchange, str) else "",
            "routing_keys": [key if isinstance(key, str) else queue],
        }
        expiration = extra.get("expiration")
        if isinstance(expiration, str):
            death["original_expiration"] = expiration
        deaths.insert(0, death)
    extra["deaths"] = deaths
    extra.pop("expiration", None)  # a dead letter does not expire by its old TTL
    if "first_death" not in extra:
        extra["first_death"] = {"queue": queue, "reason": reason, "exchange": deaths[0]["exchange"]}
    return message.copy_with(extra=extra, expires_at_ms=None)


@dataclass(slots=True)
class QueueDelivery:
    """One delivery. These fields come from the manager; the publisher's properties cannot change them."""

    message: Message  # message.topic is the original topic
    queue: str
    offset: int
    group: str
    attempt: int
    redelivered: bool
    message_id: str
    failed: int = 0  # earlier deliveries that failed (not released unprocessed): AMQP 1.0 delivery-count

    @property
    def original_topic(self) -> str:
        return self.message.topic

    def headers(self) -> list[tuple[str, str]]:
        """The delivery facts as user properties / headers, for front ends that forward them."""
        return [
            ("x-queue", self.queue),
            ("x-queue-offset", str(self.offset)),
            ("x-queue-group", self.group),
            ("x-queue-attempt", str(self.attempt)),
            ("x-queue-redelivered", "true" if self.redelivered else "false"),
            ("x-queue-message-id", self.message_id),
            ("x-queue-topic", self.message.topic),
        ]


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


@dataclass(slots=True, frozen=True)
class PublishResult:
    queue: str
    offset: int
    message_id: str


@dataclass(slots=True, frozen=True)
class GroupInfo:
    name: str
    cursor: int
    committed: int
    pending: int  # delivered, not settled
    waiting: int  # to be redelivered (nack backoff, timeout, disconnect)
    lag: int  # messages this group has not finished
    consumers: int


@dataclass(slots=True, frozen=True)
class QueueInfo:
    name: str
    mode: str
    durable: bool
    policy: QueuePolicySettings
    depth: int  # messages held
    bytes: int
    pending: int  # delivered and not settled, all groups
    lag: int  # the largest group lag (depth when there is no group yet)
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    dlq: str | None = None
    dlq_depth: int = 0
    stats: dict[str, int] = field(default_factory=dict)


_SETTLE_EVENTS = {"ack": QUEUE_ACKED, "commit": QUEUE_ACKED, "nack": QUEUE_NACKED, "reject": QUEUE_REJECTED}


def _run_all(callbacks: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for callback in callbacks:
            callback()

    return run


async def _committed(ticket: Receipt | None) -> None:
    """Wait for a submission's commit; a failed write is a :class:`QueueError` ("storage")."""
    if ticket is not None:
        try:
            await ticket.wait()
        except WriterError as exc:
            raise QueueError("storage", str(exc)) from exc


def _stored(row: Any) -> StoredMessage:
    """A ``queue_messages`` row as the manager holds it."""
    message = queue_store.row_message(row)
    return StoredMessage(
        int(row.offset), message, row.routing_key, int(row.published_at), row.expires_at, len(message.payload)
    )


def _held(state: QueueState, offset: int) -> bool:
    """Some group's consumer holds ``offset`` (delivered, not settled)."""
    return any((e := g.entries.get(offset)) is not None and e.state == HELD for g in state.groups.values())


def message_id(queue: str, offset: int) -> str:
    return f"{queue}:{offset}"


def parse_message_id(text: str) -> tuple[str, int]:
    queue, sep, offset = text.rpartition(":")
    if not sep or not queue or not offset.isdigit():
        raise QueueError("bad-message-id", f"{text!r} is not <queue>:<offset>")
    return queue, int(offset)


class ConsumerHandle:
    """What ``consume`` returns: credit, settlement and cancel for one consumer."""

    def __init__(
        self,
        manager: QueueManager,
        queue: QueueState,
        group: Group,
        consumer: QueueConsumer,
        routing_filter: str | None,
        auto_ack: bool,
    ) -> None:
        self.manager = manager
        self.queue = queue
        self.group = group
        self.consumer = consumer
        self.routing_filter = None if routing_filter in (None, "#") else routing_filter
        self.auto_ack = auto_ack
        self.credit = 0
        self.closed = False

    @property
    def queue_name(self) -> str:
        return self.queue.name

    @property
    def group_name(self) -> str:
        return self.group.name

    def add_credit(self, n: int) -> None:
        if n <= 0 or self.closed:
            return
        self.credit += n
        self.manager._dispatch(self.queue, self.group)

    def set_credit(self, n: int) -> None:
        """AMQP 1.0 flow sets the credit rather than adding to it."""
        if self.closed:
            return
        self.credit = max(0, n)
        self.manager._dispatch(self.queue, self.group)

    async def ack(self, offset: int) -> bool:
        return await self.manager._settle(self.queue, self.group, offset, "ack", holder=self)

    async def nack(self, offset: int, delay_s: float | None = None) -> bool:
        return await self.manager._settle(
            self.queue, self.group, offset, "nack", holder=self, delay_s=delay_s
        )

    async def reject(self, offset: int, reason: str = "rejected") -> bool:
        return await self.manager._settle(
            self.queue, self.group, offset, "reject", holder=self, reason=reason
        )

    async def commit(self, offset: int) -> bool:
        return await self.manager._settle(self.queue, self.group, offset, "commit", holder=self)

    def ack_nowait(self, offset: int) -> bool:
        """Ack without waiting for the commit (at-least-once: a crash may redeliver it).

        For front ends whose reader must not stall per ack (MQTT PUBACK, basic.ack, dispositions);
        the ack is in the next group commit, a few milliseconds later.
        """
        return self.manager._settle_now(
            self.queue, self.group, offset, "ack", self, None, None, "", wait=False
        )[0]

    def nack_nowait(self, offset: int, delay_s: float | None = None) -> bool:
        return self.manager._settle_now(
            self.queue, self.group, offset, "nack", self, None, delay_s, "", wait=False
        )[0]

    def reject_nowait(self, offset: int, reason: str = "rejected") -> bool:
        return self.manager._settle_now(
            self.queue, self.group, offset, "reject", self, None, None, reason, wait=False
        )[0]

    def release_nowait(self, offset: int) -> bool:
        """Give back a delivery the consumer never sent (its channel closed as it was handed over):
        the next delivery is not flagged redelivered for it. Set the credit to 0 first, or it comes
        straight back."""
        return self.manager._settle_now(
            self.queue, self.group, offset, "release", self, None, None, "unsent", wait=False
        )[0]

    def settle_nowait(self, offset: int, outcome: Outcome) -> bool:
        """Settle a delivery this handle holds with a typed outcome, without waiting for the commit
        (see :mod:`trimaran.queue.outcomes`). False: the delivery is not this handle's to settle."""
        match outcome:
            case Ack():
                return self.ack_nowait(offset)
            case Retry(delay_s=delay_s, failed=True):
                return self.nack_nowait(offset, delay_s)
            case Retry():
                return self.return_nowait(offset)
            case DeadLetter(reason=reason):
                return self.reject_nowait(offset, reason)
            case Commit(offset=position):
                return self.manager._settle_now(
                    self.queue, self.group, position, "commit", self, None, None, "", wait=False
                )[0]

    def return_nowait(self, offset: int) -> bool:
        """The consumer hands a delivery back unprocessed (AMQP 1.0 ``released``, ``modified``
        without ``delivery-failed``): available again at once, and not a failed attempt (it does not
        count towards ``max_attempts`` nor raise the delivery-count)."""
        return self.manager._settle_now(
            self.queue, self.group, offset, "return", self, None, None, "released", wait=False
        )[0]

    async def cancel(self) -> None:
        await self.manager._cancel(self)


class BrowseHandle:
    """What ``browse`` returns: a copy-mode reader (an AMQP 1.0 ``distribution-mode copy`` link).

    It sees what the queue holds, in offset order, then what arrives; it removes nothing, holds
    nothing, and settles nothing: other consumers get every message as if it were not there.
    """

    def __init__(self, manager: QueueManager, queue: QueueState, consumer: QueueConsumer) -> None:
        self.manager = manager
        self.queue = queue
        self.consumer = consumer
        self.cursor = queue.first_offset()
        self.credit = 0
        self.closed = False

    @property
    def queue_name(self) -> str:
        return self.queue.name

    def set_credit(self, n: int) -> None:
        if self.closed:
            return
        self.credit = max(0, n)
        self.manager._browse(self)

    def add_credit(self, n: int) -> None:
        if n > 0 and not self.closed:
            self.credit += n
            self.manager._browse(self)

    async def cancel(self) -> None:
        self.cancel_nowait()

    def cancel_nowait(self) -> None:
        if self.closed:
            return
        self.closed = True
        browsers = self.queue.browsers
        if self in browsers:
            browsers.remove(self)


class QueueManager:
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
        """``shared=True``: several processes share one PostgreSQL database (see ``_claim``).
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
        self._claiming: set[tuple[QueueState, Group]] = set()
        self._last_renew = 0
        self._last_poll = 0
        self.queues: dict[str, QueueState] = {}
        #: exclusive and temporary queues -> the connection that owns them (see ``consume``)
        self.owners: dict[str, object] = {}
        self.writer = GroupCommitWriter(
            storage.engine,
            commit_interval_ms=storage_settings.commit_interval_ms,
            commit_batch_max=storage_settings.commit_batch_max,
        )
        database = sqlite_file(storage.engine.url)
        self.disk = DiskWatch(None if database is None else database.parent, storage_settings.min_free_bytes)
        self._timed: set[tuple[QueueState, Group]] = set()
        self._dirty: set[QueueState] = set()
        self.writer.batch_done = self._flush_dirty
        self._scope: anyio.CancelScope | None = None
        self._started = False
        self._last_sweep = 0.0
        self.events = events if events is not None else EventBus()  # see trimaran.broker.events
        #: Routes dead letters of queues with a dead_letter_exchange (set by the AMQP 0.9.1 front end).
        self.dead_letter_router: DeadLetterRouter | None = None
        self._restarted: list[tuple[QueueState, Group, int, Entry]] = []

    # -- lifecycle --------------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[QueueManager]:
        async with anyio.create_task_group() as tg:
            await self.start(tg)
            try:
                yield self
            finally:
                with anyio.CancelScope(shield=True):
                    await self.stop()

    async def start(self, task_group: TaskGroup) -> None:
        if self._started:
            return
        self.disk.check()
        loaded = await anyio.to_thread.run_sync(self._load)
        for state in loaded:
            self.queues[state.name] = state
        self.writer.start()
        self._started = True
        if self._restarted:  # record why these will be redelivered, and that they wait now
            batch = WriteBatch()
            now = now_ms()
            for state, group, offset, entry in self._restarted:
                self._released_event(state, group, offset, entry, "restart", now, batch)
                entry.consumer_id = None
                self._pending_row(state, group, offset, entry, batch)
            self._restarted.clear()
            await self._write(batch)
        for declared in self.settings.declare:
            policy = QueuePolicySettings(**declared.model_dump(exclude={"name"}))
            await self.declare(declared.name, policy)
        await task_group.start(self._timers)
        for state in self.queues.values():
            for group in state.groups.values():
                if group.ready or group.delayed:
                    self._timed.add((state, group))

    async def stop(self) -> None:
        if not self._started:
            return
        if self._scope is not None:
            self._scope.cancel()
        with anyio.move_on_after(5):  # claims in flight: let them land, then release them too
            while self._claiming:
                await anyio.sleep(0.002)
        release = WriteBatch()
        now = now_ms()
        for state in self.queues.values():
            for group in state.groups.values():
                for handle in group.consumers:
                    handle.closed = True
                group.consumers.clear()
                if self._is_shared(state):  # hand everything this node holds back to the others
                    for offset, entry in list(group.entries.items()):
                        reason = "disconnect" if entry.state == HELD else entry.reason
                        if entry.state == HELD:
                            self._released_event(state, group, offset, entry, reason, now, release)
                        self._make_available(state, group, offset, entry, reason, now, now, release)
        if not release.empty():
            await self._write(release)
        self._started = False
        await self.writer.stop()

    def _is_shared(self, state: QueueState) -> bool:
        """Work queues of a shared node deliver only what they claimed in the database."""
        return self.shared and state.durable and state.policy.mode == "work"

    def _shared_offsets(self, state: QueueState) -> bool:
        """Every durable queue of a shared node takes offsets from reserved blocks."""
        return self.shared and state.durable

    def _load(self) -> list[QueueState]:
        """In a worker thread: queues, groups, pending entries and messages (paged)."""
        engine = self.storage.engine
        now = now_ms()
        result = []
        for row in queue_store.load_queues(engine):
            policy = QueuePolicySettings(**row["policy"])
            state = QueueState(row["name"], policy, True, row["created_at"])
            state.next_offset = state.high = row["next_offset"]
            if self.shared and policy.mode == "work":  # messages and pending entries come by claims
                result.append(state)
                continue
            for page in queue_store.iter_messages(engine, state.name):
                for m in page:
                    state.add(_stored(m))
            state.high = state.next_offset
            for g in queue_store.load_groups(engine, state.name):
                cursor = int(g.committed) if policy.mode == "stream" else int(g.cursor)
                state.groups[g.group] = Group(state.name, g.group, cursor=cursor, committed=int(g.committed))
            for p in queue_store.load_pending(engine, state.name):
                group = state.groups.get(p.group)
                if group is None:
                    group = state.groups[p.group] = Group(state.name, p.group)
                entry = Entry(p.state, attempts=int(p.attempts), delivered_at=p.delivered_at)
                if p.state == HELD:  # its consumer was on the previous process
                    entry.state = WAIT
                    entry.reason = "restart"
                    entry.available_at = now
                    entry.consumer_id = p.consumer
                    self._restarted.append((state, group, int(p.offset), entry))
                elif p.state == WAIT:
                    entry.available_at = int(p.available_at or now)
                    entry.reason = p.reason or "restart"
                group.entries[int(p.offset)] = entry
                if entry.state == WAIT:
                    if (entry.available_at or 0) <= now:
                        group.make_ready(int(p.offset))
                    else:
                        heapq.heappush(group.delayed, (entry.available_at or 0, int(p.offset), 0))
            result.append(state)
        return result

    # -- queues -----------------------------------------------------------------------------------

    def _policy_for(self, name: str, policy: QueuePolicySettings | None) -> QueuePolicySettings:
        if policy is not None:
            if isinstance(policy, QueuePolicySettings) and type(policy) is not QueuePolicySettings:
                policy = QueuePolicySettings(**policy.model_dump(exclude={"name"}))
            return policy
        if name.startswith(DLQ_PREFIX):
            return self.settings.defaults.model_copy(update={"mode": "work"})
        return self.settings.defaults

    def _declare_now(
        self, name: str, policy: QueuePolicySettings | None, durable: bool, batch: WriteBatch | None
    ) -> QueueState:
        """Create or update a queue in memory; the durable row goes into ``batch``."""
        validate_queue_name(name)
        state = self.queues.get(name)
        if state is not None:
            if policy is not None:
                new = self._policy_for(name, policy)
                if new.mode != state.policy.mode and state.messages:
                    raise QueueError("mode-mismatch", f"queue {name} is a {state.policy.mode} queue")
                if new != state.policy:
                    state.policy = new
                    if state.durable and batch is not None:
                        batch.calls.append(
                            queue_store.upsert_queue(name, new.mode, policy_dict(new), state.created_at)
                        )
            return state
        pol = self._policy_for(name, policy)
        state = QueueState(name, pol, durable, now_ms())
        self.queues[name] = state
        if durable and batch is not None:
            batch.calls.append(queue_store.upsert_queue(name, pol.mode, policy_dict(pol), state.created_at))
        log.info("queue %s declared (%s, %s)", name, pol.mode, "durable" if durable else "in memory")
        return state

    async def declare(
        self, name: str, policy: QueuePolicySettings | None = None, *, durable: bool = True
    ) -> QueueInfo:
        """Create a queue, or update its policy. Idempotent."""
        batch = WriteBatch()
        self._declare_now(name, policy, durable, batch)
        await self._write(batch)
        return self.info(name)

    async def delete(self, name: str) -> None:
        self.owners.pop(name, None)
        state = self.queues.pop(name, None)
        if state is None:
            return
        state.deleted = True
        for browser in state.browsers:
            browser.closed = True
        state.browsers.clear()
        for group in state.groups.values():
            for handle in group.consumers:
                handle.closed = True
            group.consumers.clear()
            self._timed.discard((state, group))
        if state.durable:
            batch = WriteBatch()
            batch.calls.append(queue_store.delete_queue(name))
            batch.events.append(
                queue_store.event_row(now_ms(), name, "purged", node=self.node, reason="delete")
            )
            await self._write(batch)

    async def purge(self, name: str) -> int:
        """Remove every message (and pending entry); returns how many were removed."""
        state = self._get(name)
        count = len(state.messages)
        state.messages.clear()
        state.bytes = 0
        state.expiring = 0
        for group in state.groups.values():
            group.entries.clear()
            group.ready.clear()
            group.delayed.clear()
            group.timeouts.clear()
            group.cursor = max(group.cursor, state.high)
        if state.durable:
            batch = WriteBatch()
            batch.calls.append(queue_store.purge_queue(name))
            batch.events.append(
                queue_store.event_row(now_ms(), name, "purged", node=self.node, reason=f"count={count}")
            )
            for group in state.groups.values():
                self._group_row(state, group, batch)
            await self._write(batch)
        return count

    def exists(self, name: str) -> bool:
        return name in self.queues

    def ready_count(self, name: str, group: str = DEFAULT_GROUP) -> int:
        """Messages ``group`` could be handed now: not held by a consumer (delivered, unsettled),
        not finished. RabbitMQ's message_count (queue.declare-ok, basic.get-ok). A stream, or a
        group not made yet: every message the queue holds."""
        state = self.queues.get(name)
        if state is None:
            return 0
        grp = state.groups.get(group)
        messages = state.messages
        if grp is None or state.mode != "work":
            return len(messages)
        entries = grp.entries
        if len(state.groups) == 1:
            # One group: what it finished below its cursor is gone from the queue already, so only
            # its entries (held, or acked out of order) are not ready.
            busy = sum(1 for o, e in entries.items() if e.state != WAIT and o in messages)
            return len(messages) - busy
        ready = 0
        for offset in messages:
            if grp.is_done(offset):
                continue
            entry = entries.get(offset)
            if entry is None or entry.state == WAIT:
                ready += 1
        return ready

    def peek(self, name: str, after: int = -1, limit: int = 100) -> list[StoredMessage]:
        """Up to ``limit`` messages the queue holds past offset ``after``, in offset order, without
        delivering or changing anything (the admin API's view of a queue)."""
        state = self._get(name)
        if self._is_shared(state):
            raise QueueError("unsupported", "a shared work queue holds only its claims in memory")
        out: list[StoredMessage] = []
        for offset, stored in state.messages.items():
            if offset > after:
                out.append(stored)
                if len(out) >= limit:
                    break
        return out

    async def redrive(self, name: str, limit: int | None = None) -> int:
        """Move the dead letters that came from ``name`` back to it, as new messages at its tail,
        in one transaction; returns how many moved. Letters a DLQ consumer holds stay where they are."""
        state = self._get(name)
        source_name = dead_letter_target(name, state.policy)
        source = self.queues.get(source_name) if source_name else None
        if source is None or source is state:
            return 0
        if self._shared_offsets(state) or self._shared_offsets(source):
            raise QueueError("unsupported", "redrive is not available on shared queues")
        now = now_ms()
        batch = WriteBatch()
        moved: list[StoredMessage] = []
        for offset, stored in list(source.messages.items()):
            if limit is not None and len(moved) >= limit:
                break
            origin = next((v for k, v in stored.message.user_properties if k == "x-dead-letter-queue"), None)
            if origin != name or _held(source, offset):
                continue
            props = [(k, v) for k, v in stored.message.user_properties if k not in DLQ_PROPERTIES]
            message = stored.message.copy_with(user_properties=props)
            new_offset = state.next_offset
            state.next_offset += 1
            expires = expiry_ms(state.policy, now, None)
            if state.durable:
                batch.messages.append(
                    queue_store.message_row(name, new_offset, message, stored.routing_key, now, expires)
                )
                batch.queue_next[name] = new_offset + 1
                self._event(state, batch, now, "published", offset=new_offset,
                            reason=f"redrive from {source.name}:{offset}")  # fmt: skip
            state.stats["published"] += 1
            self._remove(source, offset, "redriven", f"-> {name}:{new_offset}", now, batch)
            moved.append(StoredMessage(new_offset, message, stored.routing_key, now, expires, stored.size))

        def appended() -> None:
            for stored in moved:
                self._appended(state, stored)

        if moved:
            await self._write(batch, appended)
            log.info("queue %s: %d dead letters moved back from %s", name, len(moved), source.name)
        return len(moved)

    def _get(self, name: str) -> QueueState:
        state = self.queues.get(name)
        if state is None:
            raise QueueError("no-queue", f"queue {name} does not exist")
        return state

    def _get_or_create(self, name: str, batch: WriteBatch) -> QueueState:
        state = self.queues.get(name)
        if state is not None:
            return state
        if not self.settings.auto_create:
            raise QueueError("no-queue", f"queue {name} does not exist and auto_create is off")
        return self._declare_now(name, None, True, batch)

    def info(self, name: str) -> QueueInfo:
        state = self._get(name)
        groups = {}
        for group in state.groups.values():
            groups[group.name] = GroupInfo(
                group.name,
                group.cursor,
                group.committed,
                group.held(),
                group.waiting(),
                self._lag(state, group),
                len(group.consumers),
            )
        target = dead_letter_target(name, state.policy)
        dlq = self.queues.get(target) if target else None
        return QueueInfo(
            name=name,
            mode=state.mode,
            durable=state.durable,
            policy=state.policy,
            depth=len(state.messages),
            bytes=state.bytes,
            pending=sum(g.pending for g in groups.values()),
            lag=max((g.lag for g in groups.values()), default=len(state.messages)),
            groups=groups,
            dlq=target,
            dlq_depth=len(dlq.messages) if dlq is not None else 0,
            stats=dict(state.stats),
        )

    def _lag(self, state: QueueState, group: Group) -> int:
        if state.mode == "stream":
            return sum(1 for o in state.messages if o >= group.committed)
        return sum(1 for o in state.messages if not group.is_done(o))

    # -- publish ----------------------------------------------------------------------------------

    async def publish(self, queue: str, message: Message, routing_key: str = "") -> PublishResult:
        """Append a message; returns once it is committed. Raises :class:`QueueError` when refused."""
        state, message, batch = self._accept(queue, message)
        if self._shared_offsets(state):
            offset = await self._reserve(state)
        else:
            offset = state.next_offset
            state.next_offset += 1
        stored, result = self._stage(state, message, routing_key, offset, batch)
        if not state.durable:
            return result
        state.inflight += 1
        try:
            await self._write(batch, lambda: self._published(state, stored))
        finally:
            state.inflight -= 1
        return result

    def publish_nowait(
        self,
        queue: str,
        message: Message,
        routing_key: str = "",
        done: Callable[[PublishResult, QueueError | None], None] | None = None,
    ) -> Receipt | None:
        """``publish`` without a task per message, for front ends that must not stall per publish.

        ``done(result, error)`` runs on the loop once the message is committed (``error``: the write
        failed); without ``done``, the returned writer ticket can be awaited instead (with it, the
        ticket has no event: no wake-up object per message). ``None``: an in-memory queue, where
        the message is appended (and ``done`` has run) already. Refusals raise :class:`QueueError` at
        once; so does a durable queue on a shared node (reason ``shared``: its offsets come from an
        awaited reservation, use ``publish``).
        """
        state, message, batch = self._accept(queue, message)
        if self._shared_offsets(state):
            raise QueueError("shared", "publish_nowait is not available for a shared node's durable queue")
        offset = state.next_offset
        state.next_offset += 1
        stored, result = self._stage(state, message, routing_key, offset, batch)
        if not state.durable:
            if done is not None:
                done(result, None)
            return None
        state.inflight += 1

        def committed() -> None:
            self._published(state, stored)

        def finished(_results: list[Any]) -> None:
            state.inflight -= 1  # on failure too, or max-length accounting would drift
            if done is not None:
                error = ticket.error
                done(result, None if error is None else QueueError("storage", str(error)))

        try:
            ticket = self.writer.submit(batch, wait=done is None, on_commit=committed, on_results=finished)
        except WriterError as exc:
            state.inflight -= 1
            raise QueueError("storage", str(exc)) from exc
        return ticket

    def _accept(self, queue: str, message: Message) -> tuple[QueueState, Message, WriteBatch]:
        """A publish's checks (and overflow drops): the queue, the message to store, the batch so far."""
        if not self._started:
            raise QueueError("stopped", "the queue manager is not running")
        if message.retain:
            raise QueueError("retain", "a queue message cannot be retained")
        batch = WriteBatch()
        state = self._get_or_create(queue, batch)
        if not batch.empty():
            # An auto-created queue's row goes ahead on its own: a refused publish must not lose it.
            self.writer.submit(batch)
            batch = WriteBatch()
        if state.deleted:
            raise QueueError("no-queue", f"queue {queue} was deleted")
        if state.durable and self.disk.low:
            self.disk.refused += 1
            state.stats["refused"] += 1
            raise QueueError(
                "disk-full",
                f"queue {queue}: disk free is below storage.min_free_bytes ({self.disk.free} left)",
            )
        if not self._is_shared(state):  # shared: this node does not see the whole queue
            try:
                self._check_limits(state, len(message.payload), batch)
            except QueueError:
                if state.policy.overflow == "reject-dead-letter":
                    self._letter_refused(state, message)
                raise
        if message.user_properties and any(k in RESERVED_PROPERTIES for k, _ in message.user_properties):
            message = message.copy_with(
                user_properties=[(k, v) for k, v in message.user_properties if k not in RESERVED_PROPERTIES]
            )
        return state, message, batch

    def _stage(
        self, state: QueueState, message: Message, routing_key: str, offset: int, batch: WriteBatch
    ) -> tuple[StoredMessage, PublishResult]:
        """The message at ``offset``: in memory at once when not durable, else its rows in ``batch``."""
        queue = state.name
        now = now_ms()
        stored = StoredMessage(
            offset, message, routing_key, now, expiry_ms(state.policy, now, message.expires_at_ms),
            len(message.payload),
        )  # fmt: skip
        state.stats["published"] += 1
        result = PublishResult(queue, offset, message_id(queue, offset))
        if not state.durable:
            self._published(state, stored)
            self._flush_dirty()
            return stored, result
        batch.messages.append(
            queue_store.message_row(queue, offset, message, routing_key, now, stored.expires_at)
        )
        if not self._shared_offsets(state):
            batch.queue_next[queue] = offset + 1
        self._event(state, batch, now, "published", offset=offset, consumer=message.publisher_id)
        return stored, result

    async def _reserve(self, state: QueueState) -> int:
        """Shared mode: offsets come from blocks reserved in the queue row (one UPDATE per block)."""
        while state.block_next >= state.block_end:
            if state.reserving is None:
                state.reserving = anyio.Event()
                done = state.reserving
                try:
                    batch = WriteBatch(calls=[queue_store.reserve_offsets(state.name, self.claim_batch)])
                    first = int((await self._write(batch))[0])
                    state.block_next, state.block_end = first, first + self.claim_batch
                finally:
                    state.reserving = None
                    done.set()
            else:
                await state.reserving.wait()
        offset = state.block_next
        state.block_next += 1
        return offset

    def _check_limits(self, state: QueueState, size: int, batch: WriteBatch) -> None:
        policy = state.policy
        max_n, max_b = policy.max_length, policy.max_length_bytes
        if max_n is None and max_b is None:
            return
        over_n = max_n is not None and len(state.messages) + state.inflight + 1 > max_n
        over_b = max_b is not None and state.bytes + size > max_b
        if not (over_n or over_b):
            return
        if policy.overflow != "drop-oldest" or (max_b is not None and size > max_b):
            state.stats["refused"] += 1
            raise QueueError("full", f"queue {state.name} is full")
        now = now_ms()
        # Dropped from the head; with a dead-letter exchange they are dead-lettered (reason maxlen),
        # each drop and its letter in one batch of their own, ahead of the publish.
        routed = policy.dead_letter_exchange is not None
        letters = WriteBatch()
        after: list[Callable[[], None]] = []
        while state.messages and (
            (max_n is not None and len(state.messages) + state.inflight + 1 > max_n)
            or (max_b is not None and state.bytes + size > max_b)
        ):
            oldest, stored = next(iter(state.messages.items()))
            targets = self._dead_letter_targets(state, stored, DEATH_MAXLEN) if routed else []
            if not targets:
                self._remove(state, oldest, "dropped", "overflow", now, batch)
                state.stats["dropped"] += 1
                continue
            where = ",".join(t for t, _ in targets)
            self._remove(state, oldest, "dropped", f"overflow -> {where}", now, letters)
            state.stats["dropped"] += 1
            state.stats["dead_lettered"] += 1
            self._letter(state, None, stored, 0, DEATH_MAXLEN, targets, now, letters, after)
        if after or not letters.empty():
            self._submit(letters, after, wait=False)

    def _letter_refused(self, state: QueueState, message: Message) -> None:
        """A publish refused by a full queue with overflow ``reject-dead-letter``: the message is
        dead-lettered (reason maxlen) through the queue's dead-letter exchange, as RabbitMQ's
        reject-publish-dlx does; the publisher is still refused."""
        now = now_ms()
        stored = StoredMessage(-1, message, "", now, None, len(message.payload))
        targets = self._dead_letter_targets(state, stored, DEATH_MAXLEN)
        if not targets:
            return
        batch = WriteBatch()
        after: list[Callable[[], None]] = []
        state.stats["dead_lettered"] += 1
        self._letter(state, None, stored, 0, DEATH_MAXLEN, targets, now, batch, after)
        self._submit(batch, after, wait=False)

    def _published(self, state: QueueState, stored: StoredMessage) -> None:
        """A publish is in (committed, for a durable queue): make it deliverable and say so."""
        self._appended(state, stored)
        if self.events.publishing:
            self.events.message(MESSAGE_PUBLISHED, stored.message, queue=state.name, offset=stored.offset)

    def _appended(self, state: QueueState, stored: StoredMessage) -> None:
        """On the loop, in offset order, once the message is committed: make it deliverable."""
        if state.deleted:
            return
        if not self._is_shared(state):  # shared: the message comes back by a claim
            state.add(stored)
        # Deliveries once per committed batch, not per message: the writer calls _flush_dirty.
        self._dirty.add(state)

    def _flush_dirty(self) -> None:
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = set()
        for state in dirty:
            for browser in list(state.browsers):
                self._browse(browser)
            for group in state.groups.values():
                if group.consumers:
                    if self._is_shared(state):
                        self._claim(state, group)
                    else:
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
    ) -> ConsumerHandle:
        """Attach a consumer. It receives nothing until the front end gives it credit.

        ``start`` (new groups of work queues; any group of a stream): ``"first"``, ``"last"``,
        ``"next"``, an offset (int or digits), or ``"timestamp:<epoch ms>"``. A stream group with
        no ``start`` resumes at its committed offset (new stream groups start at ``next``); a new work
        group starts at the oldest message the queue holds.

        ``owner``: the connection asking. An exclusive or temporary queue (``owners``) is consumed
        only by the connection that owns it, whatever its protocol ("locked" for the others).
        """
        if not self._started:
            raise QueueError("stopped", "the queue manager is not running")
        self._check_owner(queue, owner)
        batch = WriteBatch()
        state = self._get_or_create(queue, batch)
        name = group or DEFAULT_GROUP
        grp = state.groups.get(name)
        if grp is None:
            default = "next" if state.mode == "stream" else "first"
            position = self._position(state, start if start is not None else default)
            grp = state.groups[name] = Group(state.name, name, cursor=position, committed=position)
            self._group_row(state, grp, batch)
        elif state.mode == "stream" and not grp.consumers:
            # The group's first consumer again: what was delivered but not committed is read again,
            # as after a restart.
            grp.cursor = self._position(state, start) if start is not None else grp.committed
        handle = ConsumerHandle(self, state, grp, consumer, routing_filter, auto_ack)
        grp.consumers.append(handle)
        if state.durable and not batch.empty():
            self.writer.submit(batch)
        return handle

    def _check_owner(self, queue: str, owner: object) -> None:
        held_by = self.owners.get(queue)
        if held_by is not None and held_by is not owner:
            raise QueueError("locked", f"queue {queue} is exclusive to another connection")

    def browse(self, queue: str, consumer: QueueConsumer, *, owner: object = None) -> BrowseHandle:
        """Attach a browser: it receives copies of what the queue holds (from the oldest) and of
        what arrives, as credit allows, and changes nothing. Not for a shared node's work queues
        (this node holds only its claims). ``owner``: as for :meth:`consume`, an exclusive or
        temporary queue is read only by the connection that owns it."""
        if not self._started:
            raise QueueError("stopped", "the queue manager is not running")
        self._check_owner(queue, owner)
        batch = WriteBatch()
        state = self._get_or_create(queue, batch)
        if state.durable and not batch.empty():
            self.writer.submit(batch)
        if self._is_shared(state):
            raise QueueError("unsupported", "a shared work queue holds only its claims in memory")
        handle = BrowseHandle(self, state, consumer)
        state.browsers.append(handle)
        return handle

    def _browse(self, handle: BrowseHandle) -> None:
        """Hand a browser copies of the messages past its cursor while it has credit."""
        state = handle.queue
        if state.deleted:
            handle.closed = True
            return
        messages = state.messages
        now = now_ms()
        offset = max(handle.cursor, state.first_offset()) if messages else handle.cursor
        high = state.high
        out: list[QueueDelivery] = []
        while handle.credit > 0 and offset < high and not handle.closed:
            stored = messages.get(offset)
            offset += 1
            if stored is None or self._expired(stored, now):
                continue
            handle.credit -= 1
            out.append(
                QueueDelivery(stored.message, state.name, stored.offset, "$browse", 1, False,
                              message_id(state.name, stored.offset))
            )  # fmt: skip
        handle.cursor = max(handle.cursor, offset)
        for delivery in out:
            try:
                handle.consumer.deliver(delivery)
            except Exception:
                log.exception("browser %s failed to take a delivery", handle.consumer.id)

    def _position(self, state: QueueState, start: str | int) -> int:
        if isinstance(start, int):
            return max(start, 0)
        text = start.strip().lower()
        if text == "first":
            return state.first_offset()
        if text == "last":
            return max(state.first_offset(), state.high - 1)
        if text == "next":
            return state.high
        if text.isdigit():
            return int(text)
        if text.startswith(("timestamp:", "@")):
            ts = int(text.split(":", 1)[1] if ":" in text else text[1:])
            for offset, stored in state.messages.items():
                if stored.published_at >= ts:
                    return offset
            return state.high
        raise QueueError("bad-start", f"unknown start position {start!r}")

    # -- dispatch ---------------------------------------------------------------------------------

    def _dispatch(self, state: QueueState, group: Group) -> None:
        if group.busy:
            group.again = True
            return
        if not group.consumers or state.deleted or not self._started:
            return
        group.busy = True
        batch = WriteBatch()
        after: list[Callable[[], None]] = []  # dead letters of expired messages, once committed
        now = now_ms()
        # Handed to the consumers only after the batch is submitted: a consumer that settles from
        # within deliver() submits its rows after the delivery's, never before them.
        out: list[tuple[ConsumerHandle, QueueDelivery]] = []
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
                    if state.mode == "stream":
                        stored = self._take_stream(state, group, handle, now, batch, after)
                        entry = None
                    else:
                        taken = self._take_work(state, group, handle, now, batch, after)
                        if taken is None:
                            continue
                        stored, entry = taken
                    if stored is None:
                        continue
                    out.append((handle, self._deliver(state, group, handle, stored, entry, now, batch)))
                    group.rr = start + i + 1
                    progressed = True
                if not progressed and not group.again:
                    break
        finally:
            group.busy = False
            if after:
                self._submit(batch, after, wait=False)
            elif state.durable and not batch.empty():
                self.writer.submit(batch)
            for handle, delivery in out:
                try:
                    handle.consumer.deliver(delivery)
                except Exception:
                    log.exception("consumer %s failed to take a delivery", handle.consumer.id)
        if self._is_shared(state) and not group.ready and any(h.credit > 0 for h in group.consumers):
            self._claim(state, group)

    def _expired(self, stored: StoredMessage, now: int) -> bool:
        return stored.expires_at is not None and now >= stored.expires_at

    def _take_work(
        self,
        state: QueueState,
        group: Group,
        handle: ConsumerHandle,
        now: int,
        batch: WriteBatch,
        after: list[Callable[[], None]],
    ) -> tuple[StoredMessage, Entry | None] | None:
        messages = state.messages
        flt = handle.routing_filter
        if group.ready:
            for offset in list(group.ready):
                stored = messages.get(offset)
                if stored is None:
                    group.unready(offset)
                    if group.entries.pop(offset, None) is not None:
                        self._pending_gone(state, group, offset, batch)
                    continue
                if self._expired(stored, now):
                    self._expire(state, offset, now, batch, after)
                    continue
                if flt is not None and not filter_matches(flt, stored.routing_key):
                    continue
                group.unready(offset)
                return stored, group.entries.get(offset)
        if self._is_shared(state):
            return None  # only claimed messages
        offset = group.cursor
        high = state.high
        entries = group.entries
        scanned = 0
        while offset < high:
            stored = messages.get(offset)
            if stored is None or offset in entries:
                if offset == group.cursor:
                    self._advance(state, group, offset + 1, batch)
                offset += 1
                continue
            if self._expired(stored, now):
                self._expire(state, offset, now, batch, after)
                continue
            if flt is None or filter_matches(flt, stored.routing_key):
                if offset == group.cursor:
                    self._advance(state, group, offset + 1, batch)
                return stored, None
            offset += 1
            scanned += 1
            if scanned >= SCAN_LIMIT:
                break
        return None

    def _advance(self, state: QueueState, group: Group, to: int, batch: WriteBatch) -> None:
        """Move a work group's cursor, retiring 'done' entries it passes and the run of them right
        after it; the group row gets the final cursor (a row short of it would, after a restart,
        deliver again what was acked out of order)."""
        old = group.cursor
        group.cursor = to
        for offset in range(old, to):
            self._retire(state, group, offset, batch)
        while group.cursor < state.high and self._retire(state, group, group.cursor, batch):
            group.cursor += 1
        self._group_row(state, group, batch)

    def _retire(self, state: QueueState, group: Group, offset: int, batch: WriteBatch) -> bool:
        """Drop a 'done' entry the cursor has reached; False when ``offset`` has none."""
        entry = group.entries.get(offset)
        if entry is None or entry.state != DONE:
            return False
        del group.entries[offset]
        self._pending_gone(state, group, offset, batch)
        self._maybe_release(state, offset, batch)
        return True

    def _take_stream(
        self,
        state: QueueState,
        group: Group,
        handle: ConsumerHandle,
        now: int,
        batch: WriteBatch,
        after: list[Callable[[], None]],
    ) -> StoredMessage | None:
        messages = state.messages
        flt = handle.routing_filter
        offset = max(group.cursor, state.first_offset()) if messages else group.cursor
        high = state.high
        while offset < high:
            stored = messages.get(offset)
            offset += 1
            if stored is None:
                continue
            if self._expired(stored, now):
                self._expire(state, stored.offset, now, batch, after)
                continue
            if flt is None or filter_matches(flt, stored.routing_key):
                group.cursor = offset
                return stored
        group.cursor = max(group.cursor, offset)
        return None

    def _deliver(
        self,
        state: QueueState,
        group: Group,
        handle: ConsumerHandle,
        stored: StoredMessage,
        entry: Entry | None,
        now: int,
        batch: WriteBatch,
    ) -> QueueDelivery:
        """Record a delivery in memory and in ``batch``; the caller hands it to the consumer."""
        offset = stored.offset
        attempt = entry.attempts + 1 if entry is not None else 1
        reason = entry.reason if entry is not None else "first"
        cid = handle.consumer.id
        stats = state.stats
        stats["delivered"] += 1
        if attempt > 1:
            stats["redelivered"] += 1
        self._event(state, batch, now, "delivered", group=group, offset=offset,
                    consumer=cid, attempt=attempt, reason=reason)  # fmt: skip
        if state.mode == "stream":
            if handle.auto_ack:
                self._commit_stream(state, group, offset + 1, now, batch, cid)
        elif handle.auto_ack:
            stats["acked"] += 1
            if offset >= group.cursor:
                group.entries[offset] = Entry(DONE, attempts=attempt)
                self._pending_row(state, group, offset, group.entries[offset], batch)
            elif entry is not None:
                del group.entries[offset]
                self._pending_gone(state, group, offset, batch)
            self._event(state, batch, now, "acked", group=group, offset=offset,
                        consumer=cid, attempt=attempt, reason="auto")  # fmt: skip
            self._maybe_release(state, offset, batch)
        else:
            if entry is None:
                entry = Entry(HELD)
            entry.state = HELD
            entry.attempts = attempt
            entry.holder = handle
            entry.consumer_id = cid
            entry.delivered_at = now
            entry.available_at = None
            entry.token += 1
            group.entries[offset] = entry
            deadline = now + int(state.policy.visibility_timeout_s * 1000)
            heapq.heappush(group.timeouts, (deadline, offset, entry.token))
            self._timed.add((state, group))
            self._pending_row(state, group, offset, entry, batch)
        handle.credit -= 1
        unsent = entry.unsent if entry is not None else 0
        returned = entry.returned if entry is not None else 0
        return QueueDelivery(
            stored.message,
            state.name,
            offset,
            group.name,
            attempt,
            attempt - unsent > 1,
            message_id(state.name, offset),
            attempt - 1 - unsent - returned,
        )

    # -- state rows -------------------------------------------------------------------------------

    def _event(
        self,
        state: QueueState,
        batch: WriteBatch,
        now: int,
        kind: str,
        *,
        group: Group | None = None,
        offset: int | None = None,
        consumer: str | None = None,
        attempt: int | None = None,
        reason: str | None = None,
    ) -> None:
        """An audit row in ``queue_events`` for a durable queue (in-memory queues keep none)."""
        if state.durable:
            batch.events.append(
                queue_store.event_row(
                    now, state.name, kind, group=None if group is None else group.name, offset=offset,
                    consumer=consumer, node=self.node, attempt=attempt, reason=reason,
                )
            )  # fmt: skip

    def _pending_gone(self, state: QueueState, group: Group, offset: int, batch: WriteBatch) -> None:
        """The entry's row goes (an in-memory queue has none: its batch stays empty)."""
        if state.durable:
            batch.pending[(state.name, group.name, offset)] = None

    def _pending_row(
        self, state: QueueState, group: Group, offset: int, entry: Entry, batch: WriteBatch
    ) -> None:
        if not state.durable:
            return
        batch.pending[(state.name, group.name, offset)] = {
            "queue": state.name,
            "group": group.name,
            "offset": offset,
            "state": entry.state,
            "consumer": entry.consumer_id if entry.state == HELD else None,
            "node": self.node if entry.state != WAIT else None,
            "delivered_at": entry.delivered_at,
            "attempts": entry.attempts,
            "available_at": entry.available_at,
            "lease_until": now_ms() + self.lease_ms if self.shared and entry.state == HELD else None,
            "reason": entry.reason if entry.state == WAIT else None,
        }

    def _group_row(self, state: QueueState, group: Group, batch: WriteBatch) -> None:
        if not state.durable or self.shared:  # shared: claims create the row, cursors are unused
            return
        batch.groups[(state.name, group.name)] = {
            "queue": state.name,
            "group": group.name,
            "cursor": group.cursor,
            "committed": group.committed,
            "updated_at": now_ms(),
        }

    def _maybe_release(self, state: QueueState, offset: int, batch: WriteBatch) -> None:
        """Work mode: drop a message every group has finished."""
        if state.mode != "work" or offset not in state.messages:
            return
        for group in state.groups.values():
            if not group.is_done(offset):
                return
        state.remove(offset)
        if state.durable:
            batch.message_deletes.append((state.name, offset))

    def _remove(
        self, state: QueueState, offset: int, kind: str, reason: str, now: int, batch: WriteBatch
    ) -> None:
        """Remove a message from the queue and every group (expired, dropped): one event."""
        if state.remove(offset) is None:
            return
        for group in state.groups.values():
            if group.entries.pop(offset, None) is not None:
                group.unready(offset)
                self._pending_gone(state, group, offset, batch)
        if kind == "expired":
            state.stats["expired"] += 1
            log.info("queue %s: message %d expired", state.name, offset)
            if self.events.wants(QUEUE_EXPIRED):
                self.events.queue(QUEUE_EXPIRED, state.name, offset=offset, reason=reason)
        if state.durable:
            batch.message_deletes.append((state.name, offset))
        self._event(state, batch, now, kind, offset=offset, reason=reason)

    # -- settlement -------------------------------------------------------------------------------

    async def _settle(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        action: str,
        *,
        holder: ConsumerHandle | None = None,
        consumer_id: str | None = None,
        delay_s: float | None = None,
        reason: str = "rejected",
    ) -> bool:
        """Settle and wait until the change is committed."""
        ok, ticket = self._settle_now(
            state, group, offset, action, holder, consumer_id, delay_s, reason, wait=True
        )
        await _committed(ticket)
        return ok

    def _submit(
        self, batch: WriteBatch, after: list[Callable[[], None]] | None, wait: bool
    ) -> Receipt | None:
        """A batch with rows goes to the writer and ``after`` runs once they are committed; with
        nothing to write, ``after`` runs now. ``None``: nothing to wait for.

        Whatever queue the settlement came from: a batch holds durable queues' rows only (in-memory
        queues add none), and an in-memory queue's dead letter in a durable dead-letter queue is such
        a row. Deciding by the source queue's durability would keep that dead letter in memory only."""
        if not batch.empty():
            return self.writer.submit(batch, wait=wait, on_commit=_run_all(after) if after else None)
        for f in after or ():
            f()
        self._flush_dirty()
        return None

    def _settle_now(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        action: str,
        holder: ConsumerHandle | None,
        consumer_id: str | None,
        delay_s: float | None,
        reason: str,
        *,
        wait: bool,
    ) -> tuple[bool, Receipt | None]:
        """Apply a settlement in memory and hand its rows to the writer (no await)."""
        now = now_ms()
        batch = WriteBatch()
        after: list[Callable[[], None]] = []
        if state.mode == "stream":
            if action == "nack":
                return False, None
            consumer = holder.consumer.id if holder else consumer_id
            if action == "reject":
                state.stats["rejected"] += 1
                if self.events.wants(QUEUE_REJECTED):
                    self.events.queue(QUEUE_REJECTED, state.name, group=group.name, offset=offset,
                                      consumer=consumer, reason=reason)  # fmt: skip
                self._event(state, batch, now, "rejected", group=group, offset=offset,
                            consumer=consumer, reason=reason)  # fmt: skip
            self._commit_stream(state, group, offset + 1, now, batch, consumer)
            return True, self._submit(batch, None, wait)
        entry = group.entries.get(offset)
        if entry is None or entry.state != HELD:
            return False, None
        if holder is not None and entry.holder is not holder:
            return False, None
        if consumer_id is not None and entry.consumer_id != consumer_id:
            return False, None
        cid = entry.consumer_id
        if action in ("release", "return"):
            # The journal shows the delivery and its release and numbers the next one on, but it is
            # not a failed attempt: "release" (never sent) is not flagged redelivered either;
            # "return" (handed back unprocessed, AMQP 1.0 released) leaves the delivery-count.
            self._released_event(state, group, offset, entry, reason, now, batch)
            if action == "release":
                entry.unsent += 1
            else:
                entry.returned += 1
            self._make_available(state, group, offset, entry, reason, now, now, batch)
            ticket = self._submit(batch, after, wait)
            self._dispatch(state, group)
            return True, ticket
        if action in _SETTLED:
            state.stats[_SETTLED[action]] += 1
        if self.events.wants(_SETTLE_EVENTS.get(action, "")):
            why = reason if action == "reject" else None
            self.events.queue(_SETTLE_EVENTS[action], state.name, group=group.name, offset=offset,
                              consumer=cid, attempt=entry.attempts, reason=why)  # fmt: skip
        if action in ("ack", "commit"):
            self._finish(state, group, offset, entry, batch)
            self._event(
                state, batch, now, "acked", group=group, offset=offset, consumer=cid, attempt=entry.attempts
            )
        elif action == "nack":
            if entry.failed() >= state.policy.max_attempts:
                self._event(state, batch, now, "nacked", group=group, offset=offset, consumer=cid,
                            attempt=entry.attempts, reason="max_attempts")  # fmt: skip
                self._dead_letter(state, group, offset, entry, "max_attempts", now, batch, after)
            else:
                delay = backoff_s(state.policy, entry.failed()) if delay_s is None else max(0.0, delay_s)
                delay_ms = int(delay * 1000)
                self._make_available(state, group, offset, entry, "nack", now + delay_ms, now, batch)
                self._event(state, batch, now, "nacked", group=group, offset=offset, consumer=cid,
                            attempt=entry.attempts, reason=f"delay_ms={delay_ms}")  # fmt: skip
        elif action == "reject":
            self._event(state, batch, now, "rejected", group=group, offset=offset, consumer=cid,
                        attempt=entry.attempts, reason=reason)  # fmt: skip
            self._dead_letter(state, group, offset, entry, reason, now, batch, after)
        else:
            raise QueueError("bad-action", action)
        ticket = self._submit(batch, after, wait)
        if action == "nack":
            self._dispatch(state, group)
        return True, ticket

    def _finish(self, state: QueueState, group: Group, offset: int, entry: Entry, batch: WriteBatch) -> None:
        """The group is done with ``offset`` (acked or dead-lettered)."""
        if self._is_shared(state):  # a 'done' marker; the compaction deletes finished messages
            entry.state = DONE
            entry.holder = None
            self._pending_row(state, group, offset, entry, batch)
            del group.entries[offset]
            self._forget(state, offset)
            return
        if offset >= group.cursor:
            entry.state = DONE
            entry.holder = None
            self._pending_row(state, group, offset, entry, batch)
        else:
            del group.entries[offset]
            self._pending_gone(state, group, offset, batch)
            self._maybe_release(state, offset, batch)

    def _make_available(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        entry: Entry,
        reason: str,
        at: int,
        now: int,
        batch: WriteBatch,
    ) -> None:
        entry.state = WAIT
        entry.holder = None
        entry.reason = reason
        entry.available_at = at
        entry.token += 1
        if self._is_shared(state):  # released to every node: claimed again when available
            self._pending_row(state, group, offset, entry, batch)
            del group.entries[offset]
            group.unready(offset)
            self._forget(state, offset)
            return
        if at <= now:
            group.make_ready(offset)
        else:
            heapq.heappush(group.delayed, (at, offset, entry.token))
            self._timed.add((state, group))
        self._pending_row(state, group, offset, entry, batch)

    def _dead_letter(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        entry: Entry,
        reason: str,
        now: int,
        batch: WriteBatch,
        after: list[Callable[[], None]],
    ) -> None:
        stored = state.messages.get(offset)
        self._finish(state, group, offset, entry, batch)
        if stored is None:
            return
        state.stats["dead_lettered"] += 1
        targets = self._dead_letter_targets(state, stored, reason)
        if self.events.wants(QUEUE_DEAD_LETTERED):
            self.events.queue(QUEUE_DEAD_LETTERED, state.name, group=group.name, offset=offset,
                              attempt=entry.attempts, reason=reason,
                              dead_letter_queue=targets[0][0] if targets else None)  # fmt: skip
        if not targets:
            self._event(state, batch, now, "dropped", group=group, offset=offset, attempt=entry.attempts,
                        reason=f"no dead-letter queue: {reason}")  # fmt: skip
            return
        self._letter(state, group.name, stored, entry.attempts, reason, targets, now, batch, after)

    def _expire(
        self, state: QueueState, offset: int, now: int, batch: WriteBatch, after: list[Callable[[], None]]
    ) -> None:
        """A message's time is up: removed, and dead-lettered (reason ``expired``) when the queue
        routes its dead letters through an exchange, as RabbitMQ does with x-dead-letter-exchange."""
        stored = state.messages.get(offset)
        targets = (
            self._dead_letter_targets(state, stored, "expired")
            if stored is not None and state.policy.dead_letter_exchange is not None
            else []
        )
        where = ",".join(t for t, _ in targets)
        self._remove(state, offset, "expired", f"ttl -> {where}" if targets else "ttl", now, batch)
        if stored is not None and targets:
            state.stats["dead_lettered"] += 1
            self._letter(state, None, stored, 0, "expired", targets, now, batch, after)

    def _dead_letter_targets(
        self, state: QueueState, stored: StoredMessage, reason: str
    ) -> list[tuple[str, Message]]:
        """Where a dead letter of ``state`` goes, each with the message as that queue gets it.

        A queue with a dead-letter exchange (AMQP 0.9.1) has it routed through that exchange now,
        with the message's headers and the dead-letter routing key (or its own); bindings made
        since the queue was declared count, and a fanout exchange reaches every bound queue.
        Otherwise the policy's dead-letter queue (by default ``$dlq/<queue>``; never the queue
        itself)."""
        policy = state.policy
        death = _death_kind(reason)
        message = _with_death(stored.message, state.name, death)
        exchange = policy.dead_letter_exchange
        if exchange is None:
            target = dead_letter_target(state.name, policy)
            if target is None or target == state.name:
                return []
            return [(target, message)]
        router = self.dead_letter_router
        if router is None:
            return []
        extra = message.extra
        original = extra.get("routing_key")
        key = policy.dead_letter_routing_key
        if key is None:
            key = original if isinstance(original, str) else state.name
        extra["exchange"] = exchange
        extra["routing_key"] = key
        queues = router.dead_letter_queues(exchange, key, message)
        if death == "expired":
            # An expiry cycle with no rejection in it would go round for ever: RabbitMQ drops it.
            deaths = extra.get("deaths")
            previous = deaths[1:] if isinstance(deaths, list) else []
            looped = {d.get("queue") for d in previous if isinstance(d, dict) and d.get("reason") == death}
            queues = [q for q in queues if q != state.name and q not in looped]
        return [(q, message) for q in queues]

    def _letter(
        self,
        state: QueueState,
        group: str | None,
        stored: StoredMessage,
        attempts: int,
        reason: str,
        targets: list[tuple[str, Message]],
        now: int,
        batch: WriteBatch,
        after: list[Callable[[], None]],
    ) -> None:
        """Append the dead letter of ``stored`` to each target queue (created if missing)."""
        offset = stored.offset
        original = stored.message
        history = {
            "queue": state.name,
            "topic": original.topic,
            "group": group,
            "offset": offset,
            "attempts": attempts,
            "reason": reason,
            "time": now,
        }
        props = [(k, v) for k, v in original.user_properties if k not in DLQ_PROPERTIES]
        props += [
            ("x-dead-letter-queue", state.name),
            ("x-dead-letter-topic", original.topic),
            ("x-dead-letter-group", group or ""),
            ("x-dead-letter-attempts", str(attempts)),
            ("x-dead-letter-reason", reason),
            ("x-dead-letter-time", str(now)),
        ]
        grp = state.groups.get(group) if group is not None else None
        where: list[str] = []
        for target, message in targets:
            extra = dict(message.extra)
            previous = extra.get("dead_letter_history")
            extra["dead_letter_history"] = [*(previous if isinstance(previous, list) else []), history]
            copy = message.copy_with(user_properties=props, extra=extra, expires_at_ms=None)
            dlq = self.queues.get(target)
            if dlq is None:
                dlq = self._declare_now(target, None, state.durable, batch)
            if self._shared_offsets(dlq):
                row = queue_store.message_row(target, 0, copy, stored.routing_key, now, None)
                published = queue_store.event_row(
                    now, target, "published", node=self.node, reason=f"dead_letter from {state.name}:{offset}"
                )
                batch.calls.append(queue_store.append_reserving(row, published))
                where.append(target)
                if self._is_shared(dlq):  # wakes its consumers' claims
                    after.append(partial(self._appended, dlq, StoredMessage(-1, copy, "", now, None, 0)))
                continue
            d_offset = dlq.next_offset
            dlq.next_offset += 1
            d_stored = StoredMessage(
                d_offset, copy, stored.routing_key, now, expiry_ms(dlq.policy, now, None), stored.size
            )
            dlq.stats["published"] += 1
            where.append(f"{target}:{d_offset}")
            if dlq.durable:
                row = queue_store.message_row(
                    target, d_offset, copy, stored.routing_key, now, d_stored.expires_at
                )
                batch.messages.append(row)
                batch.queue_next[target] = d_offset + 1
                self._event(dlq, batch, now, "published", offset=d_offset,
                            reason=f"dead_letter from {state.name}:{offset}")  # fmt: skip
            after.append(partial(self._appended, dlq, d_stored))
        if grp is not None:  # an expiry has its own event (expired), with no group
            self._event(state, batch, now, "dead_lettered", group=grp, offset=offset, attempt=attempts,
                        reason=f"{reason} -> {','.join(where)}")  # fmt: skip

    def _forget(self, state: QueueState, offset: int) -> None:
        """Shared mode: drop a message from memory once no local group entry refers to it."""
        for group in state.groups.values():
            if offset in group.entries:
                return
        state.remove(offset)

    def _claim(self, state: QueueState, group: Group) -> None:
        """Shared mode: claim a batch of messages for this node (one statement batch per claim)."""
        key = (state, group)
        if key in self._claiming or not self._started or state.deleted:
            return
        want = min(self.claim_batch, sum(max(0, h.credit) for h in group.consumers))
        if want <= 0:
            return
        self._claiming.add(key)
        now = now_ms()
        call = queue_store.claim(state.name, group.name, self.node, want, now, now + self.lease_ms)
        self.writer.submit(
            WriteBatch(calls=[call]), on_results=lambda results: self._claimed(state, group, results)
        )

    def _claimed(self, state: QueueState, group: Group, results: list[Any]) -> None:
        self._claiming.discard((state, group))
        rows = results[0] if results else []
        for row, attempts, reason in rows:
            offset = int(row.offset)
            if offset in group.entries:
                continue
            if offset not in state.messages:
                state.add(_stored(row))
            group.entries[offset] = Entry(WAIT, attempts=attempts, reason=reason)
            group.make_ready(offset)
        if rows:
            self._dispatch(state, group)

    def _commit_stream(
        self, state: QueueState, group: Group, to: int, now: int, batch: WriteBatch, cid: str | None
    ) -> None:
        if to <= group.committed:
            return
        group.committed = to
        self._group_row(state, group, batch)
        self._event(state, batch, now, "committed", group=group, offset=to - 1, consumer=cid)

    async def _cancel(self, handle: ConsumerHandle) -> None:
        if handle.closed:
            return
        handle.closed = True
        state, group = handle.queue, handle.group
        if handle in group.consumers:
            group.consumers.remove(handle)
        if state.mode != "work":
            return
        now = now_ms()
        batch = WriteBatch()
        after: list[Callable[[], None]] = []
        for offset, entry in list(group.entries.items()):
            if entry.state == HELD and entry.holder is handle:
                self._redeliver_or_dead_letter(state, group, offset, entry, "disconnect", now, batch, after)
        await _committed(self._submit(batch, after, wait=True))
        self._dispatch(state, group)

    def _redeliver_or_dead_letter(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        entry: Entry,
        reason: str,
        now: int,
        batch: WriteBatch,
        after: list[Callable[[], None]],
    ) -> None:
        self._released_event(state, group, offset, entry, reason, now, batch)
        if entry.failed() >= state.policy.max_attempts:
            self._dead_letter(state, group, offset, entry, "max_attempts", now, batch, after)
        else:
            self._make_available(state, group, offset, entry, reason, now, now, batch)

    def _released_event(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        entry: Entry,
        reason: str,
        now: int,
        batch: WriteBatch,
    ) -> None:
        """A held delivery came back without a settlement (timeout, disconnect, restart): the cause of
        the redelivery or dead-lettering that follows, for the audit."""
        self._event(state, batch, now, "released", group=group, offset=offset, consumer=entry.consumer_id,
                    attempt=entry.attempts, reason=reason)  # fmt: skip

    # -- timers -----------------------------------------------------------------------------------

    async def _timers(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope() as scope:
            self._scope = scope
            task_status.started()
            while True:
                await anyio.sleep(TICK_S)
                try:
                    self._tick()
                except Exception:
                    log.exception("queue timers failed")

    def _tick(self) -> None:
        self.disk.poll()
        now = now_ms()
        for state, group in list(self._timed):
            if state.deleted:
                self._timed.discard((state, group))
                continue
            batch = WriteBatch()
            after: list[Callable[[], None]] = []
            changed = False
            timeouts = group.timeouts
            while timeouts and timeouts[0][0] <= now:
                _, offset, token = heapq.heappop(timeouts)
                entry = group.entries.get(offset)
                if entry is None or entry.state != HELD or entry.token != token:
                    continue
                self._redeliver_or_dead_letter(state, group, offset, entry, "timeout", now, batch, after)
                changed = True
            delayed = group.delayed
            while delayed and delayed[0][0] <= now:
                _, offset, token = heapq.heappop(delayed)
                entry = group.entries.get(offset)
                if entry is None or entry.state != WAIT or (token and entry.token != token):
                    continue
                group.make_ready(offset)
                changed = True
            if not timeouts and not delayed:
                self._timed.discard((state, group))
            self._submit(batch, after, wait=False)
            if changed or group.ready:
                self._dispatch(state, group)
        if self.shared:
            self._shared_tick(now)
        if now - self._last_sweep >= SWEEP_S * 1000:
            self._last_sweep = now
            self._sweep(now)

    def _shared_tick(self, now: int) -> None:
        if now - self._last_poll >= POLL_MS:  # messages published and released by other nodes
            self._last_poll = now
            for state in self.queues.values():
                if self._is_shared(state):
                    for group in state.groups.values():
                        if not group.ready and group.consumers:
                            self._claim(state, group)
        if now - self._last_renew >= self.lease_ms // 3:
            self._last_renew = now
            calls = [queue_store.renew_leases(self.node, now + self.lease_ms)]
            calls += [queue_store.compact_shared(s.name) for s in self.queues.values() if self._is_shared(s)]
            self.writer.submit(WriteBatch(calls=calls))

    def _sweep(self, now: int) -> None:
        """TTL expiry and stream retention."""
        for state in list(self.queues.values()):
            batch = WriteBatch()
            after: list[Callable[[], None]] = []
            if state.expiring:
                for offset, stored in list(state.messages.items()):
                    if stored.expires_at is not None and now >= stored.expires_at:
                        if _held(state, offset):
                            continue  # held by a consumer: settled or timed out first
                        self._expire(state, offset, now, batch, after)
            if state.mode == "stream":
                self._retention(state, now, batch)
            if after:
                self._submit(batch, after, wait=False)
            elif state.durable and not batch.empty():
                self.writer.submit(batch)

    def _retention(self, state: QueueState, now: int, batch: WriteBatch) -> None:
        policy = state.policy
        age, max_bytes, count = policy.retention_age_s, policy.retention_bytes, policy.retention_count
        while state.messages:
            offset, stored = next(iter(state.messages.items()))
            why = None
            if age is not None and now - stored.published_at > age * 1000:
                why = "retention_age"
            elif max_bytes is not None and state.bytes > max_bytes:
                why = "retention_bytes"
            elif count is not None and len(state.messages) > count:
                why = "retention_count"
            if why is None:
                break
            self._remove(state, offset, "dropped", why, now, batch)
            state.stats["dropped"] += 1

    # -- writing ----------------------------------------------------------------------------------

    async def _write(self, batch: WriteBatch, on_commit: Callable[[], Any] | None = None) -> list[Any]:
        if batch.empty():
            if on_commit is not None:
                on_commit()
                self._flush_dirty()
            return []
        try:
            return await self.writer.write(batch, on_commit)
        except WriterError as exc:
            raise QueueError("storage", str(exc)) from exc

    # -- control topics (by message id) -----------------------------------------------------------

    def _locate(self, message_id_text: str, group: str | None) -> tuple[QueueState, Group, int]:
        queue, offset = parse_message_id(message_id_text)
        state = self._get(queue)
        grp = state.groups.get(group or DEFAULT_GROUP)
        if grp is None:
            raise QueueError("no-group", f"queue {queue} has no group {group or DEFAULT_GROUP}")
        return state, grp, offset


async def ack_by_id(
    manager: QueueManager, message_id_text: str, group: str | None = None, consumer_id: str | None = None
) -> bool:
    """``$queue/<q>/$ack`` with the message id as payload. ``consumer_id`` restricts to its holder."""
    state, grp, offset = manager._locate(message_id_text, group)
    return await manager._settle(state, grp, offset, "ack", consumer_id=consumer_id)


async def nack_by_id(
    manager: QueueManager,
    message_id_text: str,
    group: str | None = None,
    consumer_id: str | None = None,
    delay_s: float | None = None,
) -> bool:
    state, grp, offset = manager._locate(message_id_text, group)
    return await manager._settle(state, grp, offset, "nack", consumer_id=consumer_id, delay_s=delay_s)


async def reject_by_id(
    manager: QueueManager,
    message_id_text: str,
    group: str | None = None,
    consumer_id: str | None = None,
    reason: str = "rejected",
) -> bool:
    state, grp, offset = manager._locate(message_id_text, group)
    return await manager._settle(state, grp, offset, "reject", consumer_id=consumer_id, reason=reason)


async def commit_by_id(
    manager: QueueManager, message_id_text: str, group: str | None = None, consumer_id: str | None = None
) -> bool:
    state, grp, offset = manager._locate(message_id_text, group)
    return await manager._settle(state, grp, offset, "commit", consumer_id=consumer_id)


def holder_by_id(
    manager: QueueManager, message_id_text: str, group: str | None = None
) -> ConsumerHandle | None:
    """The consumer that holds a work-queue delivery right now (None: nobody, or a stream)."""
    _state, grp, offset = manager._locate(message_id_text, group)
    entry = grp.entries.get(offset)
    return entry.holder if entry is not None and entry.state == HELD else None


def settle_by_id_now(
    manager: QueueManager,
    action: str,
    message_id_text: str,
    group: str | None = None,
    reason: str = "rejected",
) -> tuple[bool, Receipt | None]:
    """``ack``, ``nack``, ``reject`` or ``commit`` by message id, applied in memory at once (no await).

    For front ends that must apply control messages in the order they read them, relative to the
    protocol's own acks; await the returned ticket (when not None) for the commit.
    """
    state, grp, offset = manager._locate(message_id_text, group)
    return manager._settle_now(state, grp, offset, action, None, None, None, reason, wait=True)
