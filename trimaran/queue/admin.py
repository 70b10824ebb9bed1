"""What operators do to a queue rather than consumers: purge, peek, redrive, and its numbers.

The admin API, the management page, the metrics and AMQP 0.9.1's ``message_count`` read these; the
manager's methods of the same names delegate here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trimaran.broker.message import now_ms
from trimaran.config import QueuePolicySettings
from trimaran.queue.changes import Changes
from trimaran.queue.groups import WAIT, StoredMessage
from trimaran.queue.policy import DEFAULT_GROUP, DLQ_PROPERTIES, QueueError, dead_letter_target, expiry_ms
from trimaran.queue.shared import stored_row
from trimaran.storage import queue_store
from trimaran.storage.rows import WriteBatch
from trimaran.vhosts import describe, split_key

if TYPE_CHECKING:
    from trimaran.queue.ports import Queues

log = logging.getLogger(__name__)


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


def info(manager: Queues, name: str) -> QueueInfo:
    state = manager.get(name)
    groups = {}
    for group in state.groups.values():
        groups[group.name] = GroupInfo(
            group.name,
            group.cursor,
            group.committed,
            group.held(),
            group.waiting(),
            group.lag(),
            len(group.consumers),
        )
    target = dead_letter_target(name, state.policy)
    dlq = manager.queues.get(target) if target else None
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


def ready_count(manager: Queues, name: str, group: str = DEFAULT_GROUP) -> int:
    """Messages ``group`` could be handed now: not held by a consumer (delivered, unsettled), not
    finished. RabbitMQ's message_count (queue.declare-ok, basic.get-ok). A stream, or a group not
    made yet: every message the queue holds."""
    state = manager.queues.get(name)
    if state is None:
        return 0
    grp = state.groups.get(group)
    messages = state.messages
    if grp is None or state.mode != "work":
        return len(messages)
    entries = grp.entries
    if len(state.groups) == 1:
        # One group: what it finished below its cursor is gone from the queue already, so only its
        # entries (held, or acked out of order) are not ready.
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


def peek(manager: Queues, name: str, after: int = -1, limit: int = 100) -> list[StoredMessage]:
    """Up to ``limit`` messages the queue holds past offset ``after``, in offset order, without
    delivering or changing anything. From memory: a shared work queue, whose node holds only its
    claims, is refused (``peek_stored`` reads its rows)."""
    state = manager.get(name)
    if manager.is_shared(state):
        raise QueueError("unsupported", "a shared work queue holds only its claims in memory")
    out: list[StoredMessage] = []
    for offset, stored in state.messages.items():
        if offset > after:
            out.append(stored)
            if len(out) >= limit:
                break
    return out


async def peek_stored(manager: Queues, name: str, after: int = -1, limit: int = 100) -> list[StoredMessage]:
    """``peek`` for every queue. A shared work queue (each node holds only its claims) is read from
    its stored rows: what some group has not finished and has not expired, in offset order, claimed
    by no one (``queue_store.peek_stored``). The read goes through the writer, as a browser's does
    (``Claims.browse``): it follows this node's own writes (an ack settled before is not shown) and
    the event loop does not wait on the database. Offsets come from each node's blocks, so a page
    shows what is stored when it is read: a later publish of another node may take an offset below
    the cursor of a page already read. Any other queue: ``peek``, from memory."""
    state = manager.get(name)
    if not manager.is_shared(state):
        return peek(manager, name, after, limit)
    call = queue_store.peek_stored(name, after, limit, now_ms())
    results = await manager.journal.write(WriteBatch(calls=[call]))
    return [stored_row(row) for row in results[0]] if results else []


async def purge(manager: Queues, name: str) -> int:
    """Remove every message (and pending entry); returns how many were removed."""
    state = manager.get(name)
    count = len(state.messages)
    state.messages.clear()
    state.bytes = 0
    state.expiring = 0
    for group in state.groups.values():
        group.clear()
        group.cursor = max(group.cursor, state.high)
    if state.durable:
        journal = manager.journal
        ch = Changes()
        ch.calls.append(queue_store.purge_queue(name))
        journal.event(ch, state, now_ms(), "purged", reason=f"count={count}")
        for group in state.groups.values():
            journal.cursor(ch, state, group)
        await journal.write(ch)
    return count


async def redrive(manager: Queues, name: str, limit: int | None = None) -> int:
    """Move the dead letters that came from ``name`` back to it, as new messages at its tail, in one
    transaction; returns how many moved. Letters a DLQ consumer holds stay where they are."""
    state = manager.get(name)
    source_name = dead_letter_target(name, state.policy)
    source = manager.queues.get(source_name) if source_name else None
    if source is None or source is state:
        return 0
    if manager.shared_offsets(state) or manager.shared_offsets(source):
        raise QueueError("unsupported", "redrive is not available on shared queues")
    journal = manager.journal
    now = now_ms()
    ch = Changes()
    moved: list[StoredMessage] = []
    own = split_key(name)[1]  # dead letters name their queue as its clients do (letters.py)
    for offset, stored in list(source.messages.items()):
        if limit is not None and len(moved) >= limit:
            break
        origin = next((v for k, v in stored.message.user_properties if k == "x-dead-letter-queue"), None)
        if origin not in (name, own) or source.held(offset):
            continue
        props = [(k, v) for k, v in stored.message.user_properties if k not in DLQ_PROPERTIES]
        message = stored.message.copy_with(user_properties=props)
        new_offset = state.next_offset
        state.next_offset += 1
        expires = expiry_ms(state.policy, now, None)
        again = StoredMessage(new_offset, message, stored.routing_key, now, expires, stored.size)
        journal.appended(ch, state, again)
        journal.event(
            ch, state, now, "published", offset=new_offset, reason=f"redrive from {source.name}:{offset}"
        )
        state.stats["published"] += 1
        manager.remove(source, offset, "redriven", f"-> {name}:{new_offset}", now, ch)
        moved.append(again)

    def appended() -> None:
        for again in moved:
            manager.appended(state, again)

    if moved:
        await journal.write(ch, appended)
        log.info("%s: %d dead letters moved back from %s", describe(name), len(moved), describe(source.name))
    return len(moved)
