"""What ``consume`` and ``browse`` return: a consumer's handle (credit, settlement, cancel) and a
browser's, and the settling of several handles' deliveries at once.

Below the manager: a handle reaches the manager through :class:`Consuming`, which
:class:`~trimaran.queue.manager.QueueManager` implements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from trimaran.queue.outcomes import ACK, RELEASED, UNSENT, Ack, Commit, DeadLetter, Outcome, Retry

if TYPE_CHECKING:
    from trimaran.queue.groups import Group, QueueConsumer, QueueState, Selects
    from trimaran.queue.journal import Receipt

__all__ = ["BrowseHandle", "ConsumerHandle", "Consuming", "settle_many_nowait"]


class Consuming(Protocol):
    """The manager as a consumer's or a browser's handle calls it: its own
    dispatch, settlement and cancel, which the handles only pass on."""

    def _dispatch(self, state: QueueState, group: Group) -> None: ...

    def _browse(self, handle: BrowseHandle) -> None: ...

    async def _settle(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        outcome: Outcome,
        *,
        holder: ConsumerHandle | None = None,
        consumer_id: str | None = None,
    ) -> bool: ...

    def _settle_now(
        self,
        state: QueueState,
        group: Group,
        offset: int,
        outcome: Outcome,
        holder: ConsumerHandle | None,
        consumer_id: str | None,
        wait: bool,
    ) -> tuple[bool, Receipt | None]: ...

    def _settle_offsets(
        self,
        state: QueueState,
        group: Group,
        offsets: Iterable[int],
        outcome: Outcome,
        holder: ConsumerHandle | None,
        consumer_id: str | None,
        wait: bool,
    ) -> tuple[int, Receipt | None]: ...

    async def _cancel(self, handle: ConsumerHandle) -> None: ...

    def after_claim(self, handle: ConsumerHandle, done: Callable[[], None]) -> bool: ...


class ConsumerHandle:
    """What ``consume`` returns: credit, settlement and cancel for one consumer."""

    def __init__(
        self,
        manager: Consuming,
        queue: QueueState,
        group: Group,
        consumer: QueueConsumer,
        routing_filter: str | None,
        auto_ack: bool,
        selects: Selects | None = None,
    ) -> None:
        self.manager = manager
        self.queue = queue
        self.group = group
        self.consumer = consumer
        self.routing_filter = None if routing_filter in (None, "#") else routing_filter
        self.selects = selects  # a message selector: the messages it passes over stay for others
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

    async def settle(self, offset: int, outcome: Outcome) -> bool:
        """Settle a delivery this handle holds and wait until the change is committed."""
        return await self.manager._settle(self.queue, self.group, offset, outcome, holder=self)

    def when_claimed(self, done: Callable[[], None]) -> None:
        """Run ``done`` once what the credit asks for is handed out: on a shared node's work queue,
        once a claim made for the credit has landed (what the queue holds is in the database: an
        AMQP 1.0 drain answers after it), elsewhere at once."""
        if not self.manager.after_claim(self, done):
            done()

    def settle_nowait(self, offset: int, outcome: Outcome) -> bool:
        """Settle a delivery this handle holds with a typed outcome, without waiting for the commit
        (at-least-once: a crash may redeliver it; see :mod:`trimaran.queue.outcomes`). For front ends
        whose reader must not stall per settlement (PUBACK, basic.ack, dispositions): it is in the
        next group commit. False: the delivery is not this handle's to settle."""
        return self.manager._settle_now(self.queue, self.group, offset, outcome, self, None, False)[0]

    def settle_all_nowait(self, offsets: list[int], outcome: Outcome) -> int:
        """``settle_nowait`` for several deliveries with one outcome (basic.ack with ``multiple``,
        a disposition range): one change and one submission for all. Returns how many it settled."""
        return self.manager._settle_offsets(self.queue, self.group, offsets, outcome, self, None, False)[0]

    async def ack(self, offset: int) -> bool:
        return await self.settle(offset, ACK)

    async def nack(self, offset: int, delay_s: float | None = None) -> bool:
        return await self.settle(offset, Retry(delay_s))

    async def reject(self, offset: int, reason: str = "rejected") -> bool:
        return await self.settle(offset, DeadLetter(reason))

    async def commit(self, offset: int) -> bool:
        return await self.settle(offset, Commit(offset))

    def ack_nowait(self, offset: int) -> bool:
        return self.manager._settle_now(self.queue, self.group, offset, ACK, self, None, False)[0]

    def nack_nowait(self, offset: int, delay_s: float | None = None) -> bool:
        return self.manager._settle_now(self.queue, self.group, offset, Retry(delay_s), self, None, False)[0]

    def reject_nowait(self, offset: int, reason: str = "rejected") -> bool:
        return self.manager._settle_now(
            self.queue, self.group, offset, DeadLetter(reason), self, None, False
        )[0]

    def release_nowait(self, offset: int) -> bool:
        """Give back a delivery the consumer never sent (its channel closed as it was handed over):
        the next delivery is not flagged redelivered for it. Set the credit to 0 first, or it comes
        straight back."""
        return self.manager._settle_now(self.queue, self.group, offset, UNSENT, self, None, False)[0]

    def return_nowait(self, offset: int) -> bool:
        """The consumer hands a delivery back unprocessed (AMQP 1.0 ``released``): available again at
        once, and not a failed attempt."""
        return self.manager._settle_now(self.queue, self.group, offset, RELEASED, self, None, False)[0]

    async def cancel(self) -> None:
        await self.manager._cancel(self)


class BrowseHandle:
    """What ``browse`` returns: a copy-mode reader (an AMQP 1.0 ``distribution-mode copy`` link).

    It sees what the queue holds, in offset order, then what arrives; it removes nothing, holds
    nothing, and settles nothing: other consumers get every message as if it were not there. A
    shared node's work queue is read from the database (``shared.py``), a page at a time.
    """

    def __init__(self, manager: Consuming, queue: QueueState, consumer: QueueConsumer, cursor: int) -> None:
        self.manager = manager
        self.queue = queue
        self.consumer = consumer
        self.cursor = cursor
        self.credit = 0
        self.closed = False
        self.reading = False  # shared: a read of the stored rows is in flight
        self.read: list[Callable[[], None]] = []  # what waits for it (when_read)

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

    def when_read(self, done: Callable[[], None]) -> None:
        """Run ``done`` once what the credit asks for is read (at once unless a read of the stored
        rows is in flight): an AMQP 1.0 drain answers after it."""
        if self.reading:
            self.read.append(done)
        else:
            done()

    def was_read(self) -> None:
        """The reads are over (the credit is spent, the stored rows read to the end, or closed)."""
        waiting, self.read = self.read, []
        for done in waiting:
            done()

    async def cancel(self) -> None:
        self.cancel_nowait()

    def cancel_nowait(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.was_read()
        browsers = self.queue.browsers
        if self in browsers:
            browsers.remove(self)


def settle_many_nowait(settlements: Iterable[tuple[ConsumerHandle, int, Outcome]]) -> None:
    """Settle deliveries of several handles and outcomes (a read's PUBACKs, basic.ack with
    ``multiple``) with one settle per handle and outcome, not one per delivery. Every ``Ack`` is
    alike, so an ack is keyed by its handle alone: hashing the frozen dataclass is a Python call."""
    batches: dict[tuple[int, Outcome | None], tuple[ConsumerHandle, list[int], Outcome]] = {}
    for handle, offset, outcome in settlements:
        key = (id(handle), None if outcome.__class__ is Ack else outcome)
        batch = batches.get(key)
        if batch is None:
            batches[key] = (handle, [offset], outcome)
        else:
            batch[1].append(offset)
    for handle, offsets, outcome in batches.values():
        handle.settle_all_nowait(offsets, outcome)
