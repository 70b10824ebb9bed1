"""Acknowledgements that leave in arrival order, each once its commit is done.

A publisher's acknowledgement of a durable publish (MQTT PUBACK/PUBREC, AMQP 0.9.1 confirm, AMQP
1.0 disposition) is sent only after the commit, and in the order the publishes arrived: a client
reads an acknowledgement as "this one and, in the order I sent them, the ones before" (0.9.1's
``multiple``, 1.0's ranges, MQTT's in-order PUBACK rule). Commits can finish out of order (a
publish to an in-memory queue is done at once, one to a durable queue after the group commit), so
each hull queues its entries here and, after a commit, sends what :meth:`InOrder.ready` returns. What
an entry carries and how it is sent is the hull's; the ordering is this module's, once.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar


class Settling(Protocol):
    """An entry: ``done`` once everything it waits for is committed (or has failed)."""

    @property
    def done(self) -> bool: ...


E = TypeVar("E", bound=Settling)


class InOrder(Generic[E]):
    """Entries in arrival order; :meth:`ready` takes the done ones at the head, all at once."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: deque[E] = deque()

    def add(self, entry: E) -> E:
        self._entries.append(entry)
        return entry

    def remove(self, entry: E) -> None:
        """An entry that will never be acknowledged (refused before it was routed): nothing after
        it waits for it."""
        self._entries.remove(entry)

    def head_done(self) -> bool:
        """Whether :meth:`ready` would yield something now."""
        entries = self._entries
        return bool(entries) and entries[0].done

    def ready(self) -> list[E]:
        """Take the done entries at the head, oldest first; an entry not yet done holds back every
        one behind it. One call a batch: entries a caller adds while acting on these (already done)
        are the next call's, which the hull's own "acks due" flag brings about."""
        entries = self._entries
        count = 0
        for entry in entries:
            if not entry.done:
                break
            count += 1
        if count == len(entries):  # all done, the common case: no call per entry
            taken = list(entries)
            entries.clear()
            return taken
        popleft = entries.popleft
        return [popleft() for _ in range(count)]

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)
