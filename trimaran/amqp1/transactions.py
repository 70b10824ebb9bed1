"""AMQP 1.0 local transactions (part 4): what a connection's open transactions hold.

A sender link to the ``coordinator`` target declares transactions (``declare`` -> ``declared``
with a new id) and discharges them (``discharge``: commit, or roll back with ``fail``). Until the
discharge, a transfer whose state is ``transactional-state`` is kept here, not published, and a
disposition in a transaction keeps its queue delivery held by its consumer. A commit hands the
publishes and settlements to the queue manager as one change (one SQL transaction:
``QueueManager.transact``) and then publishes the topic messages; a rollback drops the publishes
and gives the deliveries back to their queues at once, not counted as failed attempts. A
transaction whose coordinator link or connection ends is rolled back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from trimaran.amqp1.types import Symbol

if TYPE_CHECKING:
    from trimaran.amqp1.addresses import Address
    from trimaran.amqp1.links import QueueOut
    from trimaran.amqp1.session import Link
    from trimaran.broker.message import Message
    from trimaran.queue.outcomes import Outcome

LOCAL_TRANSACTIONS: Final = Symbol("amqp:local-transactions")
UNKNOWN_ID: Final = Symbol("amqp:transaction:unknown-id")
ROLLBACK: Final = Symbol("amqp:transaction:rollback")
#: Publishes and settlements one transaction may hold in memory until its discharge; past it the
#: transfer is rejected (``amqp:resource-limit-exceeded``) and the transaction can only roll back.
MAX_WORK: Final = 10_000


class Transaction:
    """One declared transaction: its publishes and settlements, applied only when it commits."""

    __slots__ = ("coordinator", "doomed", "publishes", "settles", "txn_id")

    def __init__(self, txn_id: bytes, coordinator: Link) -> None:
        self.txn_id = txn_id
        self.coordinator = coordinator  # the link that declared it: its end rolls it back
        self.publishes: list[tuple[Address, Message]] = []
        self.settles: list[tuple[QueueOut, int, Outcome]] = []  # (link, queue offset, outcome)
        self.doomed: str | None = None  # why it can no longer commit

    def full(self) -> bool:
        """No room for more work: the transaction is doomed (said once)."""
        if len(self.publishes) + len(self.settles) < MAX_WORK:
            return False
        self.doomed = f"more than {MAX_WORK} messages in one transaction"
        return True

    def link_ended(self, out: QueueOut) -> None:
        """``out`` ended: the deliveries it settled in this transaction went back to their queue
        with it, so the transaction can only roll back."""
        if any(link is out for link, _offset, _outcome in self.settles):
            self.settles = [s for s in self.settles if s[0] is not out]
            self.doomed = f"deliveries it acknowledged on {out.id} went back to the queue when the link ended"


class Transactions:
    """A connection's open transactions, by id."""

    __slots__ = ("_next", "open")

    def __init__(self) -> None:
        self.open: dict[bytes, Transaction] = {}
        self._next = 0

    def declare(self, coordinator: Link) -> Transaction:
        self._next += 1
        txn = Transaction(b"txn-%d" % self._next, coordinator)
        self.open[txn.txn_id] = txn
        return txn

    def of_link(self, coordinator: Link) -> list[Transaction]:
        """The transactions ``coordinator`` declared and has not discharged (taken away)."""
        ended = [txn for txn in self.open.values() if txn.coordinator is coordinator]
        for txn in ended:
            del self.open[txn.txn_id]
        return ended
