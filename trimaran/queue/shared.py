"""Shared mode: several server processes serve the same work queues from one PostgreSQL database.

No node holds a shared work queue whole. Each claims batches of available messages for its
consumers (``FOR UPDATE SKIP LOCKED``: two nodes never claim the same row) and holds them under a
lease it renews; what it is done with is marked done (a compaction deletes what every group
finished), what it hands back is released to every node, and a node that dies hands its claims back
when their leases run out. Offsets of a shared node's durable queues come from blocks reserved in the
queue row, one UPDATE per block, so appends from several nodes never collide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from trimaran.broker.message import now_ms
from trimaran.queue.groups import WAIT, Entry, Group, QueueState, StoredMessage
from trimaran.queue.journal import Journal
from trimaran.storage import queue_store
from trimaran.storage.rows import WriteBatch

if TYPE_CHECKING:
    pass


POLL_MS = 100  # how often idle consumers look for messages other nodes published or released


def stored_row(row: Any) -> StoredMessage:
    """A ``queue_messages`` row as the manager holds it."""
    message = queue_store.row_message(row)
    return StoredMessage(
        int(row.offset), message, row.routing_key, int(row.published_at), row.expires_at, len(message.payload)
    )


class Claims:
    """This node's claims, leases and offset blocks. ``dispatch(state, group)`` hands newly claimed
    messages to the group's consumers."""

    def __init__(
        self, journal: Journal, *, lease_ms: int, batch: int, dispatch: Callable[[QueueState, Group], None]
    ) -> None:
        self.journal = journal
        self.lease_ms = lease_ms
        self.batch = batch
        self.dispatch = dispatch
        self.claiming: set[Group] = set()  # one claim in flight per group
        self.last_renew = 0
        self.last_poll = 0
        self.open = False  # claims are made only while the manager runs
        # Queues this node settled something of since the last poll: their 'done' markers are
        # compacted at the next poll, so a claim's scan never walks far past finished messages.
        self.finished: set[str] = set()

    def low(self, group: Group) -> bool:
        """Few claimed messages left to hand out: time to claim the next batch."""
        return len(group.ready) < self.batch // 4

    def claim(self, state: QueueState, group: Group) -> None:
        """Claim a batch for this node, in one statement, while its consumers have credit: up to
        ``batch`` messages ready here. Claiming only the credit of the moment (a few messages after
        each PUBACK) made every claim pay the scan and the commit for a handful, ~250 msg/s."""
        if group in self.claiming or not self.open or state.deleted:
            return
        if not any(h.credit > 0 for h in group.consumers):
            return
        want = self.batch - len(group.ready)
        if want <= 0:
            return
        self.claiming.add(group)
        now = now_ms()
        call = queue_store.claim(state.name, group.name, self.journal.node, want, now, now + self.lease_ms)
        self.journal.send(
            WriteBatch(calls=[call]), on_results=lambda results: self._claimed(state, group, results)
        )

    def _claimed(self, state: QueueState, group: Group, results: list[Any]) -> None:
        self.claiming.discard(group)
        rows = results[0] if results else []
        for row, attempts, reason in rows:
            offset = int(row.offset)
            if offset in group.entries:
                continue
            if offset not in state.messages:
                state.add(stored_row(row))
            group.entries[offset] = Entry(WAIT, attempts=attempts, reason=reason)
            group.make_ready(offset)
        if rows:
            self.dispatch(state, group)

    async def reserve(self, state: QueueState) -> int:
        """The next offset of ``state`` from this node's block (reserving a new block when spent)."""
        while state.block_next >= state.block_end:
            if state.reserving is None:
                state.reserving = anyio.Event()
                done = state.reserving
                try:
                    batch = WriteBatch(calls=[queue_store.reserve_offsets(state.name, self.batch)])
                    first = int((await self.journal.write(batch))[0])
                    state.block_next, state.block_end = first, first + self.batch
                finally:
                    state.reserving = None
                    done.set()
            else:
                await state.reserving.wait()
        offset = state.block_next
        state.block_next += 1
        return offset

    def next_due(self) -> int:
        """When :meth:`tick` has work next (epoch ms)."""
        return min(self.last_poll + POLL_MS, self.last_renew + self.lease_ms // 3)

    def tick(self, now: int, queues: list[QueueState]) -> None:
        """Poll for what other nodes published or released; renew leases and compact."""
        if now - self.last_poll >= POLL_MS:
            self.last_poll = now
            if self.finished:
                names, self.finished = self.finished, set()
                self.journal.send(WriteBatch(calls=[queue_store.compact_shared(n) for n in sorted(names)]))
            for state in queues:
                for group in state.groups.values():
                    if not group.ready and group.consumers:
                        self.claim(state, group)
        if now - self.last_renew >= self.lease_ms // 3:
            self.last_renew = now
            calls = [queue_store.renew_leases(self.journal.node, now + self.lease_ms)]
            calls += [queue_store.compact_shared(s.name) for s in queues]
            self.journal.send(WriteBatch(calls=calls))
