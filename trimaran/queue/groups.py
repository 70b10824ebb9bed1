"""In-memory state of a queue: its message tail, consumer groups, pending entries and consumers.

Nothing here does I/O. The groups' behaviour is in ``work.py`` and ``stream.py``; they tell a
journal (``journal.py``) each change, and reach past themselves only through ``ports.Host``.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings

# Changes and Receipt at run time, not only for the type checker: compiled by mypyc, the module
# builds WaitingPublish's annotations when it loads.
from trimaran.queue.changes import Changes
from trimaran.storage.writer import Receipt
from trimaran.vhosts import vhost_of

if TYPE_CHECKING:
    from collections.abc import Iterable

    from trimaran.queue.outcomes import Outcome

HELD = "held"  # delivered to a consumer, not settled
WAIT = "wait"  # to be (re)delivered at available_at
DONE = "done"  # acknowledged ahead of the group's cursor (out of order)


@dataclass(slots=True)
class WaitingPublish:
    """A shared node's publish waiting for the node's next block of offsets, in arrival order;
    ``ticket`` stands in for its receipt until it is submitted (``Receipt.standing_in``)."""

    message: Message
    routing_key: str
    changes: Changes | None  # None: made when it is published unclaimed (QueueManager._publish_at)
    done: Callable[..., None] | None  # publish_nowait's: (PublishResult, QueueError | None)
    ticket: Receipt


@dataclass(slots=True, init=False)
class StoredMessage:
    offset: int
    message: Message
    routing_key: str
    published_at: int
    expires_at: int | None
    size: int

    # Written out, as one is built per message: mypyc compiles it, the generated one runs interpreted.
    def __init__(
        self,
        offset: int,
        message: Message,
        routing_key: str,
        published_at: int,
        expires_at: int | None,
        size: int,
    ) -> None:
        self.offset = offset
        self.message = message
        self.routing_key = routing_key
        self.published_at = published_at
        self.expires_at = expires_at
        self.size = size


@dataclass(slots=True, init=False)
class Entry:
    """A work-mode pending entry of one group."""

    state: str
    attempts: int = 0
    holder: Taker | None = None
    consumer_id: str | None = None
    delivered_at: int | None = None
    available_at: int | None = None
    reason: str = "first"  # why it is available again: timeout, nack, disconnect, restart
    token: int = 0  # bumped at each delivery; stale timer items carry an old token
    unsent: int = 0  # deliveries given back unsent (in memory): they do not make a redelivery
    returned: int = 0  # deliveries handed back unprocessed (AMQP 1.0 released): not failed attempts
    # False for a first delivery the journal left without a row (WorkGroup.deliver): there is no
    # row to delete when it is settled
    stored: bool = True

    # Written out, as one is built per message: mypyc compiles it, the generated one runs interpreted.
    def __init__(
        self,
        state: str,
        attempts: int = 0,
        holder: Taker | None = None,
        consumer_id: str | None = None,
        delivered_at: int | None = None,
        available_at: int | None = None,
        reason: str = "first",
        token: int = 0,
        unsent: int = 0,
        returned: int = 0,
        stored: bool = True,
    ) -> None:
        self.state = state
        self.attempts = attempts
        self.holder = holder
        self.consumer_id = consumer_id
        self.delivered_at = delivered_at
        self.available_at = available_at
        self.reason = reason
        self.token = token
        self.unsent = unsent
        self.returned = returned
        self.stored = stored

    def failed(self) -> int:
        """Attempts that count towards ``max_attempts``: deliveries not given back unsent or
        unprocessed (the journal numbers every delivery; this is what the policy counts)."""
        return self.attempts - self.unsent - self.returned


class QueueConsumer(Protocol):
    """Implemented by each front end's connection (or link / channel consumer)."""

    id: str

    def deliver(self, delivery: QueueDelivery) -> None:
        """Synchronous and non-blocking: put the delivery in the outbox."""

    def stalled(self, idle_s: float) -> None:
        """Its queue held publishers and nothing was settled for ``idle_s`` seconds: close it the
        protocol's way (what it holds goes back to the queue), with one log line (``queue/flow.py``)."""


#: A consumer's message selector (a JMS selector compiled by its hull): True takes the message;
#: the ones it leaves stay for the group's other consumers.
Selects = Callable[[Message], bool]


class Taker(Protocol):
    """A consumer as the groups see it (the manager's ``ConsumerHandle``)."""

    consumer: QueueConsumer
    routing_filter: str | None
    selects: Selects | None
    auto_ack: bool
    credit: int
    closed: bool


@dataclass(slots=True, init=False)
class QueueDelivery:
    """One delivery. These fields come from the manager; the publisher's properties cannot change them."""

    message: Message  # message.topic is the original topic
    queue: str
    offset: int
    group: str
    attempt: int
    redelivered: bool
    failed: int = 0  # earlier deliveries that failed (not released unprocessed): AMQP 1.0 delivery-count

    # Written out, as one is built per message: mypyc compiles it, the generated one runs interpreted.
    def __init__(
        self,
        message: Message,
        queue: str,
        offset: int,
        group: str,
        attempt: int,
        redelivered: bool,
        failed: int = 0,
    ) -> None:
        self.message = message
        self.queue = queue
        self.offset = offset
        self.group = group
        self.attempt = attempt
        self.redelivered = redelivered
        self.failed = failed

    @property
    def message_id(self) -> str:
        """Made when asked (MQTT's delivery tag, the forwarded headers): AMQP 0.9.1 never asks."""
        return message_id(self.queue, self.offset)

    @property
    def original_topic(self) -> str:
        return self.message.topic

    def headers(self, cut: int = 0) -> list[tuple[str, str]]:
        """The delivery facts as user properties / headers, for front ends that forward them; names
        without their first ``cut`` characters (the consumer's vhost prefix: trimaran/vhosts.py)."""
        return [
            ("x-queue", self.queue[cut:]),
            ("x-queue-offset", str(self.offset)),
            ("x-queue-group", self.group),
            ("x-queue-attempt", str(self.attempt)),
            ("x-queue-redelivered", "true" if self.redelivered else "false"),
            ("x-queue-message-id", self.message_id[cut:]),
            ("x-queue-topic", self.message.topic[cut:]),
        ]


def message_id(queue: str, offset: int) -> str:
    return f"{queue}:{offset}"


def expired(stored: StoredMessage, now: int) -> bool:
    return stored.expires_at is not None and now >= stored.expires_at


class Group:
    """What both kinds of consumer group have: a cursor, consumers and their round robin, and
    (work mode) pending entries. :class:`~trimaran.queue.work.WorkGroup` and
    :class:`~trimaran.queue.stream.StreamGroup` add the behaviour."""

    def __init__(self, state: QueueState, name: str, *, cursor: int = 0, committed: int = 0) -> None:
        self.state = state
        self.name = name
        self.cursor = cursor  # work: first offset never handed out; stream: next offset to read
        self.committed = committed  # stream: first offset not committed
        self.entries: dict[int, Entry] = {}
        self.ready: list[int] = []  # sorted offsets available for redelivery now
        self.delayed: list[tuple[int, int, int]] = []  # heap (available_at, offset, token)
        self.timeouts = Deadlines()  # visibility time-outs of held deliveries
        self.consumers: list[Taker] = []
        self.rr = 0
        self.busy = False
        self.again = False
        self.timed = False  # the manager's timers watch this group (``Host.due`` was called)

    @property
    def queue(self) -> str:
        return self.state.name

    def make_ready(self, offset: int) -> None:
        ready = self.ready
        if not ready or ready[-1] < offset:
            ready.append(offset)
        else:
            i = bisect.bisect_left(ready, offset)
            if i == len(ready) or ready[i] != offset:
                ready.insert(i, offset)

    def unready(self, offset: int) -> None:
        ready = self.ready
        i = bisect.bisect_left(ready, offset)
        if i < len(ready) and ready[i] == offset:
            del ready[i]

    def settle(
        self,
        offset: int,
        outcome: Outcome,
        holder: Taker | None,
        consumer_id: str | None,
        now: int,
        ch: Changes,
    ) -> bool:
        """Settle the delivery of ``offset`` with ``outcome`` (the kind of group says how)."""
        raise NotImplementedError

    def settle_all(
        self,
        offsets: Iterable[int],
        outcome: Outcome,
        holder: Taker | None,
        consumer_id: str | None,
        now: int,
        ch: Changes,
    ) -> int:
        """:meth:`settle` for each of ``offsets`` with one outcome; returns how many it settled."""
        return sum(1 for o in offsets if self.settle(o, outcome, holder, consumer_id, now, ch))

    def is_done(self, offset: int) -> bool:
        if offset >= self.cursor:
            entry = self.entries.get(offset)
            return entry is not None and entry.state == DONE
        return offset not in self.entries

    def held(self) -> int:
        return sum(1 for e in self.entries.values() if e.state == HELD)

    def waiting(self) -> int:
        return sum(1 for e in self.entries.values() if e.state == WAIT)

    def lag(self) -> int:
        """Messages this group has not finished."""
        return sum(1 for o in self.state.messages if not self.is_done(o))

    def next_due(self) -> int | None:
        """The earliest timer of this group (epoch ms), or None."""
        first, delayed = self.timeouts.first(), self.delayed
        if first is not None:
            if delayed and delayed[0][0] < first:
                return delayed[0][0]
            return first
        return delayed[0][0] if delayed else None

    def clear(self) -> None:
        """Purged: nothing pending, nothing timed."""
        self.entries.clear()
        self.ready.clear()
        self.delayed.clear()
        self.timeouts.clear()


class Deadlines:
    """Visibility time-outs of held deliveries as (deadline, offset, token), earliest first.

    Deliveries are timed in the order they are made, with the queue's one time-out, so deadlines
    nearly always come in order: those go on a FIFO, O(1) in and out; only one earlier than the
    last (the time-out was shortened) goes on a heap. A settled delivery's item is not looked for:
    it is skipped when due (its entry's token moved on), or dropped when the stale items
    outnumber the live ones (:meth:`compact`). A heap of every delivery of the last time-out was
    the rate times the time-out in items (900,000 at 30k msg/s and 30 s), each push and pop a
    walk of its depth."""

    __slots__ = ("fifo", "heap")

    def __init__(self) -> None:
        self.fifo: deque[tuple[int, int, int]] = deque()
        self.heap: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self.fifo) + len(self.heap)

    def push(self, deadline: int, offset: int, token: int) -> None:
        fifo = self.fifo
        if not fifo or deadline >= fifo[-1][0]:
            fifo.append((deadline, offset, token))
        else:
            heapq.heappush(self.heap, (deadline, offset, token))

    def first(self) -> int | None:
        fifo, heap = self.fifo, self.heap
        if fifo and (not heap or fifo[0][0] <= heap[0][0]):
            return fifo[0][0]
        return heap[0][0] if heap else None

    def pop_due(self, now: int) -> list[tuple[int, int]]:
        """(offset, token) of every item due at ``now``, removed."""
        due = []
        fifo, heap = self.fifo, self.heap
        while fifo and fifo[0][0] <= now:
            _, offset, token = fifo.popleft()
            due.append((offset, token))
        while heap and heap[0][0] <= now:
            _, offset, token = heapq.heappop(heap)
            due.append((offset, token))
        return due

    def compact(self, entries: dict[int, Entry]) -> None:
        """Keep only the items that still stand for a held delivery of ``entries`` (its state held,
        its token the item's). Comprehensions, not a predicate: no call per item (a compaction
        walks every stale item of the last time-out)."""
        get = entries.get
        self.fifo = deque(
            [i for i in self.fifo if (e := get(i[1])) is not None and e.state == HELD and e.token == i[2]]
        )
        heap = [i for i in self.heap if (e := get(i[1])) is not None and e.state == HELD and e.token == i[2]]
        heapq.heapify(heap)
        self.heap = heap

    def clear(self) -> None:
        self.fifo.clear()
        self.heap.clear()


@dataclass(eq=False)
class QueueState:
    name: str
    policy: QueuePolicySettings
    durable: bool
    created_at: int
    next_offset: int = 0  # next offset to allocate
    high: int = 0  # one past the highest offset in ``messages``
    messages: dict[int, StoredMessage] = field(default_factory=dict)  # ascending offsets
    bytes: int = 0
    inflight: int = 0  # publishes allocated but not committed yet
    groups: dict[str, Group] = field(default_factory=dict)  # all of the queue's mode
    browsers: list[Any] = field(default_factory=list)  # the manager's BrowseHandles: remove nothing
    deleted: bool = False
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "published": 0,
            "dropped": 0,
            "expired": 0,
            "refused": 0,
            "dead_lettered": 0,
            "delivered": 0,
            "redelivered": 0,
            "acked": 0,
            "nacked": 0,
            "rejected": 0,
        }
    )
    expiring: int = 0  # messages in ``messages`` with an expiry (0: the sweep skips this queue)
    # After an unclean stop: offsets below this may have been sent before the crash with their
    # delivery never committed (deliveries are recorded without waiting), so a first delivery of one
    # is flagged redelivered; a false flag must mean "never seen" (RabbitMQ's guarantee).
    maybe_seen_below: int = 0
    block_next: int = 0  # shared mode: offsets reserved for this node
    block_end: int = 0
    block_ahead: tuple[int, int] | None = None  # the next block, reserved before this one is spent
    # shared: where this node's run of blocks starts, no other reservation between them (None: no
    # block yet), and where it ends: every offset in [own_from, own_end) was this node's to use
    own_from: int | None = None
    own_end: int = 0
    awaiting_block: deque[WaitingPublish] = field(default_factory=deque)  # shared: for the next block
    reserving: anyio.Event | None = None
    # shared: this node's committed publishes left unclaimed, kept (bounded, Claims.keep) so that
    # its own claim of them reads no row back
    unclaimed: dict[int, StoredMessage] = field(default_factory=dict)
    unclaimed_bytes: int = 0
    reserve_failures: int = 0  # reservations that failed (a publish awaiting one stops at the first)
    # shared: what runs once the reservation in flight is in or failed (transactions waiting)
    after_block: list[Callable[[], None]] = field(default_factory=list)
    # A consumer is behind on it: each publish holds its publisher (queue/flow.py sets and clears it)
    behind: bool = False
    # Early messages whose write failed while a consumer held them (QueueManager._withdraw): kept
    # for that consumer, but no row of theirs is written, as the table never had the message. An
    # offset stays past its removal (the settle that removes it journals after), until the sweep.
    unwritten: set[int] = field(default_factory=set)
    vhost: str = field(init=False)  # the vhost its key names (trimaran/vhosts.py), read once

    def __post_init__(self) -> None:
        self.vhost = vhost_of(self.name)

    @property
    def mode(self) -> str:
        return self.policy.mode

    def first_offset(self) -> int:
        for offset in self.messages:
            return offset
        return self.high

    def add(self, stored: StoredMessage) -> None:
        self.messages[stored.offset] = stored
        self.bytes += stored.size
        if stored.offset >= self.high:
            self.high = stored.offset + 1
        if stored.expires_at is not None:
            self.expiring += 1

    def held(self, offset: int) -> bool:
        """Some group's consumer holds ``offset`` (delivered, not settled)."""
        return any((e := g.entries.get(offset)) is not None and e.state == HELD for g in self.groups.values())

    def forget(self, offset: int) -> None:
        """Shared mode: drop a message from memory once no local group entry refers to it."""
        for group in self.groups.values():
            if offset in group.entries:
                return
        self.remove(offset)

    def remove(self, offset: int) -> StoredMessage | None:
        stored = self.messages.pop(offset, None)
        if stored is not None:
            self.bytes -= stored.size
            if stored.expires_at is not None:
                self.expiring -= 1
        return stored


def policy_dict(policy: QueuePolicySettings) -> dict[str, Any]:
    return policy.model_dump(mode="json")
