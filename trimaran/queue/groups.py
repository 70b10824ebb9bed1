"""In-memory state of a queue: its message tail, consumer groups, pending entries and consumers.

Nothing here does I/O; the manager mutates these objects on the event loop and mirrors each change
to the writer.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings

if TYPE_CHECKING:
    from trimaran.queue.manager import BrowseHandle, ConsumerHandle

HELD = "held"  # delivered to a consumer, not settled
WAIT = "wait"  # to be (re)delivered at available_at
DONE = "done"  # acknowledged ahead of the group's cursor (out of order)


@dataclass(slots=True)
class StoredMessage:
    offset: int
    message: Message
    routing_key: str
    published_at: int
    expires_at: int | None
    size: int


@dataclass(slots=True)
class Entry:
    """A work-mode pending entry of one group."""

    state: str
    attempts: int = 0
    holder: ConsumerHandle | None = None
    consumer_id: str | None = None
    delivered_at: int | None = None
    available_at: int | None = None
    reason: str = "first"  # why it is available again: timeout, nack, disconnect, restart
    token: int = 0  # bumped at each delivery; stale timer items carry an old token
    unsent: int = 0  # deliveries given back unsent (in memory): they do not make a redelivery
    returned: int = 0  # deliveries handed back unprocessed (AMQP 1.0 released): not failed attempts

    def failed(self) -> int:
        """Attempts that count towards ``max_attempts``: deliveries not given back unsent or
        unprocessed (the journal numbers every delivery; this is what the policy counts)."""
        return self.attempts - self.unsent - self.returned


@dataclass(eq=False)
class Group:
    queue: str
    name: str
    cursor: int = 0  # work: first offset never handed out; stream: next offset to read
    committed: int = 0  # stream: first offset not committed
    entries: dict[int, Entry] = field(default_factory=dict)
    ready: list[int] = field(default_factory=list)  # sorted offsets available for redelivery now
    delayed: list[tuple[int, int, int]] = field(default_factory=list)  # heap (available_at, offset, token)
    timeouts: list[tuple[int, int, int]] = field(default_factory=list)  # heap (deadline, offset, token)
    consumers: list[ConsumerHandle] = field(default_factory=list)
    rr: int = 0
    busy: bool = False
    again: bool = False

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

    def is_done(self, offset: int) -> bool:
        if offset >= self.cursor:
            entry = self.entries.get(offset)
            return entry is not None and entry.state == DONE
        return offset not in self.entries

    def held(self) -> int:
        return sum(1 for e in self.entries.values() if e.state == HELD)

    def waiting(self) -> int:
        return sum(1 for e in self.entries.values() if e.state == WAIT)


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
    groups: dict[str, Group] = field(default_factory=dict)
    browsers: list[BrowseHandle] = field(default_factory=list)  # copy-mode readers: remove nothing
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
    block_next: int = 0  # shared mode: offsets reserved for this node
    block_end: int = 0
    reserving: anyio.Event | None = None

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

    def remove(self, offset: int) -> StoredMessage | None:
        stored = self.messages.pop(offset, None)
        if stored is not None:
            self.bytes -= stored.size
            if stored.expires_at is not None:
                self.expiring -= 1
        return stored


def policy_dict(policy: QueuePolicySettings) -> dict[str, Any]:
    return policy.model_dump(mode="json")
