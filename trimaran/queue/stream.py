"""Stream-mode consumer groups: every group reads the whole log from its own position.

A stream removes nothing when it is read: a :class:`StreamGroup` has a read cursor and a committed
offset (where a new consumer of the group resumes, and what survives a restart). A consumer settles
with :class:`~trimaran.queue.outcomes.Commit` (its position moves past an offset),
:class:`~trimaran.queue.outcomes.Ack` (past the delivery's own offset) or
:class:`~trimaran.queue.outcomes.DeadLetter` (recorded as rejected, and committed past: a stream
does not dead-letter); a failed :class:`~trimaran.queue.outcomes.Retry` is refused, as there is
nothing to redeliver from. Messages leave only by :func:`retention` (age, bytes, count) or expiry.
Nothing here waits, writes or imports the manager: changes go to the journal in the caller's
:class:`Changes`.
"""

from __future__ import annotations

from trimaran.broker.events import QUEUE_REJECTED
from trimaran.queue.changes import Changes
from trimaran.queue.groups import (
    Group,
    QueueDelivery,
    QueueState,
    Selects,
    StoredMessage,
    Taker,
    expired,
)
from trimaran.queue.outcomes import Commit, DeadLetter, Outcome, Retry
from trimaran.queue.policy import QueueError, filter_matches
from trimaran.queue.ports import Host


def position(state: QueueState, start: str | int) -> int:
    """Where a group starts: ``first``, ``last``, ``next``, an offset (int or digits), or
    ``timestamp:<epoch ms>`` (``@<ms>``): the first message published at or after it."""
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


class StreamGroup(Group):
    mode = "stream"

    def __init__(
        self, state: QueueState, name: str, host: Host, *, cursor: int = 0, committed: int = 0
    ) -> None:
        super().__init__(state, name, cursor=cursor, committed=committed)
        self.host = host
        self.journal = host.journal

    def take(
        self, routing_filter: str | None, now: int, ch: Changes, selects: Selects | None = None
    ) -> StoredMessage | None:
        """The next message past the read cursor that matches ``routing_filter`` and ``selects``
        (the group reads past the others: a stream keeps them for the other groups)."""
        state = self.state
        messages = state.messages
        offset = max(self.cursor, state.first_offset()) if messages else self.cursor
        high = state.high
        while offset < high:
            stored = messages.get(offset)
            offset += 1
            if stored is None:
                continue
            if expired(stored, now):
                self.host.expire(state, stored.offset, now, ch)
                continue
            if (routing_filter is None or filter_matches(routing_filter, stored.routing_key)) and (
                selects is None or selects(stored.message)
            ):
                self.cursor = offset
                return stored
        self.cursor = max(self.cursor, offset)
        return None

    def deliver(self, handle: Taker, stored: StoredMessage, now: int, ch: Changes) -> QueueDelivery:
        """Record a delivery (an auto-ack consumer commits past it at once)."""
        state = self.state
        offset = stored.offset
        cid = handle.consumer.id
        state.stats["delivered"] += 1
        self.journal.event(ch, state, now, "delivered", group=self, offset=offset, consumer=cid, attempt=1,
                           reason="first")  # fmt: skip
        if handle.auto_ack:
            self.commit(offset + 1, now, ch, cid)
        handle.credit -= 1
        return QueueDelivery(stored.message, state.name, offset, self.name, 1, False)

    def settle(
        self,
        offset: int,
        outcome: Outcome,
        holder: Taker | None,
        consumer_id: str | None,
        now: int,
        ch: Changes,
    ) -> bool:
        """Commit past ``offset`` (a :class:`Commit` carries its own). False for a failed retry.
        A delivery handed back unprocessed (released, or never put on the wire as its channel
        closed) commits nothing: the group reads on from it again, at least once as ever."""
        if isinstance(outcome, Retry):
            if outcome.failed:
                return False
            if offset < self.cursor:
                self.cursor = max(offset, self.committed)
            return True
        consumer = holder.consumer.id if holder is not None else consumer_id
        if isinstance(outcome, DeadLetter):
            state = self.state
            state.stats["rejected"] += 1
            events = self.host.events
            if events.wants(QUEUE_REJECTED):
                events.queue(QUEUE_REJECTED, state.name, group=self.name, offset=offset, consumer=consumer,
                             reason=outcome.reason)  # fmt: skip
            self.journal.event(ch, state, now, "rejected", group=self, offset=offset, consumer=consumer,
                               reason=outcome.reason)  # fmt: skip
        elif isinstance(outcome, Commit):
            offset = outcome.offset
        self.commit(offset + 1, now, ch, consumer)
        return True

    def commit(self, to: int, now: int, ch: Changes, consumer: str | None) -> None:
        """The group's committed position moves to ``to`` (never back)."""
        if to <= self.committed:
            return
        self.committed = to
        self.journal.cursor(ch, self.state, self)
        self.journal.event(ch, self.state, now, "committed", group=self, offset=to - 1, consumer=consumer)

    def resume(self, start: str | int | None) -> None:
        """The group's first consumer again: what was delivered but not committed is read again, as
        after a restart (or from ``start``)."""
        self.cursor = position(self.state, start) if start is not None else self.committed

    def lag(self) -> int:
        return sum(1 for o in self.state.messages if o >= self.committed)


def retention(state: QueueState, host: Host, now: int, ch: Changes) -> None:
    """Drop messages from the head past the stream's age, bytes or count limit."""
    policy = state.policy
    age, max_bytes, count = policy.retention_age_s, policy.retention_bytes, policy.retention_count
    if age is None and max_bytes is None and count is None:
        return
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
        host.remove(state, offset, "dropped", why, now, ch)
        state.stats["dropped"] += 1
