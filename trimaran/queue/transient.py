"""Transient queues' own path: a non-durable work queue's publish, hand-over and ack, in memory.

A queue declared non-durable (RabbitMQ's classic transient queue) holds its messages in its
:class:`~trimaran.queue.groups.QueueState` and its deliveries in its group's entries, as every queue
does, so purge, peek, info, TTL, max-length, dead letters, requeue, basic.get, cancel and close see
it as they see any queue. What it never needs is what only makes a durable queue durable: no
:class:`~trimaran.queue.changes.Changes`, no journal rows or events, no writer, no receipt. This
room is the path a transient message takes on the way through, one call each way:

- :func:`hand_over`: the plain publish, whole: an empty queue's next consumer takes the message at
  once (an auto-ack consumer's is never stored); a run of publishes, each in turn.
- :func:`append`: the message stored at the next offset (its expiry worked out once).
- :func:`dispatch`: the messages past the group's cursor handed to the consumers with credit, in
  round robin, each recorded as a held delivery (or done at once for an auto-ack consumer).
- :func:`ack`: held deliveries acknowledged by their holder: the entry and the message go.

Each returns False (or None) where the case is not the plain one (a routing filter or a selector, a
message waiting to come back, a gap, an expired message, an entry ahead of the cursor, several
groups for an ack); the manager then takes its general way, which writes nothing for an in-memory
queue either. Nothing here waits or imports the manager; it reaches it through ``ports.Host``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from trimaran.broker.events import QUEUE_ACKED
from trimaran.broker.message import Message, now_ms
from trimaran.queue.changes import Changes
from trimaran.queue.groups import HELD, Entry, QueueDelivery, QueueState, StoredMessage, Taker
from trimaran.queue.handles import ConsumerHandle
from trimaran.queue.policy import expiry_ms
from trimaran.queue.ports import Host
from trimaran.queue.work import WorkGroup

log = logging.getLogger(__name__)


def append(state: QueueState, message: Message, routing_key: str, now: int) -> StoredMessage:
    """Store ``message`` at the queue's next offset; the caller makes it deliverable."""
    offset = state.next_offset
    state.next_offset = offset + 1
    expires = message.expires_at_ms
    if expires is not None or state.policy.ttl_s is not None:
        expires = expiry_ms(state.policy, now, expires)
    stored = StoredMessage(offset, message, routing_key, now, expires, len(message.payload))
    state.stats["published"] += 1
    state.add(stored)
    return stored


def hand_over(
    host: Host, state: QueueState, messages: Sequence[Message], routing_key: str, now: int | None
) -> int:
    """The plain publish done whole, for each of ``messages`` in turn while the case holds: the
    queue has nothing waiting, its one group's next consumer in turn has credit and no filter or
    selector, and the message never expires. Each goes straight to that consumer at the next
    offset; an auto-ack consumer's is never stored at all (``append`` + ``dispatch`` would store
    it and drop it again at once), another's is stored and held as ``dispatch`` holds it. Returns
    how many went (the first ones): the caller appends and dispatches the rest. A front end's run
    of publishes (read together) asks the queue's questions once."""
    groups = state.groups
    if state.policy.ttl_s is not None or len(groups) != 1:
        return 0  # (another group would still want the message)
    (group,) = groups.values()
    if type(group) is not WorkGroup:
        return 0
    entries = group.entries
    stats = state.stats
    handed = 0
    for message in messages:
        consumers = group.consumers  # (a delivery may have closed a consumer)
        offset = state.next_offset
        if (
            state.high != offset
            or group.busy
            or group.ready
            or group.cursor != offset
            or message.expires_at_ms is not None
            or offset in entries
        ):
            break
        n = len(consumers)
        rr = group.rr
        handle = None
        for i in range(n):
            candidate = consumers[(rr + i) % n]
            if type(candidate) is not ConsumerHandle:  # the manager's own, read as such: no protocol lookups
                break
            if candidate.credit > 0 and not candidate.closed:
                if candidate.routing_filter is None and candidate.selects is None:
                    handle = candidate
                    rr += i
                break
        if handle is None:
            break
        stats["published"] += 1
        stats["delivered"] += 1
        if handle.auto_ack:
            state.next_offset = state.high = offset + 1
            stats["acked"] += 1
        else:
            if now is None:
                now = now_ms()
            state.next_offset = offset + 1
            state.add(StoredMessage(offset, message, routing_key, now, None, len(message.payload)))
            entries[offset] = Entry(HELD, 1, handle, handle.consumer.id, now, token=1, stored=False)
            # its visibility time-out, as dispatch times it
            deadline = now + int(state.policy.visibility_timeout_s * 1000)
            group.timeouts.push(deadline, offset, 1)
            if not group.timed or deadline < host.wake_at:
                host.due(state, group, deadline)
        group.cursor = offset + 1
        group.rr = rr + 1
        handle.credit -= 1
        handed += 1
        try:
            handle.consumer.deliver(QueueDelivery(message, state.name, offset, group.name, 1, False))
        except Exception:
            log.exception("consumer %s failed to take a delivery", handle.consumer.id)
    return handed


def dispatch(host: Host, state: QueueState, group: WorkGroup, now: int | None = None) -> bool:
    """Hand the messages past ``group``'s cursor to its consumers with credit. False: it met what
    is not the plain case and stopped there (what it handed out stays handed out); the caller's
    general dispatch goes on from that point."""
    messages = state.messages
    high = state.high
    cursor = group.cursor
    if group.ready or cursor >= high:
        return not group.ready  # nothing new (a credit refill on an empty queue), or redeliveries
    consumers = group.consumers
    n = len(consumers)
    if now is None:
        now = now_ms()
    entries = group.entries
    alone = len(state.groups) == 1
    timeout_ms = int(state.policy.visibility_timeout_s * 1000)
    timeouts = group.timeouts
    stats = state.stats
    name, group_name = state.name, group.name
    rr = group.rr
    plain = True
    out: list[tuple[Taker, QueueDelivery]] = []
    group.busy = True
    try:
        while cursor < high:
            handle = None
            for i in range(n):
                candidate = consumers[(rr + i) % n]
                if candidate.credit > 0 and not candidate.closed:
                    handle = candidate
                    break
            if handle is None:
                break
            stored = messages.get(cursor)
            if (
                stored is None
                or cursor in entries
                or (stored.expires_at is not None and now >= stored.expires_at)
                or handle.routing_filter is not None
                or handle.selects is not None
                or (handle.auto_ack and not alone)
            ):
                plain = False
                break
            rr += i + 1
            offset = cursor
            cursor += 1
            group.cursor = cursor
            stats["delivered"] += 1
            if handle.auto_ack:
                stats["acked"] += 1
                state.remove(offset)  # the queue's only group is done with it
            else:
                cid = handle.consumer.id
                entries[offset] = Entry(HELD, 1, handle, cid, now, token=1, stored=False)
                # its visibility time-out (RabbitMQ's consumer_timeout), as WorkGroup.deliver times it
                deadline = now + timeout_ms
                timeouts.push(deadline, offset, 1)
                if not group.timed or deadline < host.wake_at:
                    host.due(state, group, deadline)
            handle.credit -= 1
            # attempt 1 and never redelivered: a transient queue does not outlive its process
            out.append((handle, QueueDelivery(stored.message, name, offset, group_name, 1, False)))
    finally:
        group.rr = rr
        group.busy = False
    if not alone and len(timeouts.fifo) > 2 * len(entries) + 1024:  # settled the general way
        timeouts.compact(entries)
    for taker, delivery in out:
        try:
            taker.consumer.deliver(delivery)
        except Exception:
            log.exception("consumer %s failed to take a delivery", taker.consumer.id)
    return plain


def ack(host: Host, state: QueueState, group: WorkGroup, offsets: Iterable[int], holder: Taker) -> int | None:
    """Acknowledge the held deliveries of ``offsets`` that ``holder`` holds; how many it acked.
    None: the queue has several groups (a message stays for the others: the general way)."""
    if len(state.groups) != 1:
        return None
    entries = group.entries
    cursor = group.cursor
    events = host.events
    told = events.wants(QUEUE_ACKED)
    ahead: Changes | None = None
    n = 0
    for offset in offsets:
        entry = entries.get(offset)
        if entry is None or entry.state != HELD or entry.holder is not holder:
            continue
        n += 1
        if told:
            events.queue(QUEUE_ACKED, state.name, group=group.name, offset=offset, consumer=entry.consumer_id,
                         attempt=entry.attempts, reason=None)  # fmt: skip
        if offset < cursor:
            del entries[offset]
            state.remove(offset)
        else:  # handed out past the cursor (a filtered consumer): 'done' until the cursor passes
            if ahead is None:
                ahead = Changes()
            group.finish(offset, entry, ahead)
    state.stats["acked"] += n
    # Acks come in delivery order: the time-outs of what they settled leave the front of the queue
    # of deadlines now, rather than wait there half an hour (or for a compaction) for nothing.
    fifo = group.timeouts.fifo
    while fifo:
        _deadline, offset, token = fifo[0]
        entry = entries.get(offset)
        if entry is not None and entry.state == HELD and entry.token == token:
            break
        fifo.popleft()
    if len(fifo) > 2 * len(entries) + 1024:  # behind a delivery held long: mostly settled ones
        group.timeouts.compact(entries)
    return n
