"""The AMQP 1.0 transaction coordinator (:mod:`trimaran.amqp1.transactions` says what a
transaction holds): the coordinator link's attach, its declare and discharge messages, the
transfers and dispositions in a transaction, and the commit through ``QueueManager.transact``.
The front end owns one :class:`TransactionCoordinator` and calls it from its transfer and
disposition plumbing; what it needs of the front end is :class:`~trimaran.amqp1.ports.Desk`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trimaran.amqp1.events import DispositionReceived, LinkDetached, MessageReceived
from trimaran.amqp1.links import InLink, QueueOut, disposition_outcome
from trimaran.amqp1.messages import AmqpValue, decode_message
from trimaran.amqp1.performatives import (
    DECODE_ERROR,
    NOT_IMPLEMENTED,
    RCV_FIRST,
    RESOURCE_LIMIT_EXCEEDED,
    ROLE_SENDER,
    Accepted,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Error,
    Rejected,
    TransactionalState,
    from_described,
)
from trimaran.amqp1.session import Link
from trimaran.amqp1.transactions import LOCAL_TRANSACTIONS, ROLLBACK, UNKNOWN_ID, Transaction, Transactions
from trimaran.amqp1.types import DecodeError, Described
from trimaran.queue.outcomes import RELEASED
from trimaran.queue.policy import QueueError

if TYPE_CHECKING:
    from trimaran.amqp1.addresses import Address
    from trimaran.amqp1.conn import Amqp1Conn
    from trimaran.amqp1.ports import Desk
    from trimaran.broker.message import Message

log = logging.getLogger(__name__)


class TransactionCoordinator:
    """The open transactions of each connection that attached a coordinator."""

    def __init__(self, front: Desk, link_credit: int) -> None:
        self.front = front
        self.broker = front.broker
        self.queues = front.queues
        self.link_credit = link_credit
        self.transactions: dict[Amqp1Conn, Transactions] = {}  # connections that declared one

    def finished(self, conn: Amqp1Conn) -> None:
        """The connection ended: its open transactions roll back."""
        txns = self.transactions.pop(conn, None)
        if txns is not None:
            for txn in list(txns.open.values()):
                self.rollback(txn)
            txns.open.clear()

    def coordinator_ended(self, conn: Amqp1Conn, link: Link) -> None:
        """Its coordinator link is gone: what it declared rolls back."""
        txns = self.transactions.get(conn)
        for txn in txns.of_link(link) if txns is not None else ():
            self.rollback(txn)

    def link_ended(self, conn: Amqp1Conn, out: QueueOut) -> None:
        """A queue receiver ended: the transactions it settled in can only roll back."""
        txns = self.transactions.get(conn)
        if txns is not None:
            for txn in txns.open.values():
                txn.link_ended(out)

    def attach(self, conn: Amqp1Conn, link: Link, target: Coordinator) -> None:
        """A sender to the transaction coordinator: local transactions, whatever else it asks for
        (our answer's capabilities say what it got)."""
        if self.queues is None:
            self.front.refuse(conn, link, NOT_IMPLEMENTED, "transactions need the durable queues")
            return
        inlink = InLink(link, None, coordinator=True)
        conn.inlinks[link] = inlink
        self.transactions.setdefault(conn, Transactions())
        conn.amqp.accept_link(
            link,
            target=Coordinator(capabilities=[LOCAL_TRANSACTIONS]),
            rcv_settle_mode=RCV_FIRST,
            initial_credit=0 if conn.publishing_blocked else self.link_credit,
        )

    def control(self, conn: Amqp1Conn, event: MessageReceived, inlink: InLink) -> None:
        """A message to the coordinator: declare or discharge."""
        link, did = event.link, event.delivery_id
        txns = self.transactions.setdefault(conn, Transactions())
        try:
            body = decode_message(event.payload).body
            value = body[0].value if len(body) == 1 and isinstance(body[0], AmqpValue) else None
            if isinstance(value, Described):
                value = from_described(value)
        except DecodeError as exc:
            self.front.refuse_message(conn, event, DECODE_ERROR, f"malformed coordinator message: {exc}")
            conn.refill(inlink)
            return
        state: Any
        if isinstance(value, Declare):
            txn = txns.declare(link)
            log.debug("amqp1: %s declared %r", conn.container_id, txn.txn_id)
            state = Declared(txn_id=txn.txn_id)
        elif isinstance(value, Discharge):
            txn_id = bytes(value.txn_id)
            found = txns.open.pop(txn_id, None)
            if found is None:
                state = Rejected(error=Error(condition=UNKNOWN_ID, description=f"no transaction {txn_id!r}"))
            elif value.fail:
                self.rollback(found)
                state = Accepted()
            else:
                self._commit(conn, event, found)
                conn.refill(inlink)
                return  # answered once it is committed
        else:
            error = Error(condition=DECODE_ERROR, description="the coordinator takes declare and discharge")
            state = Rejected(error=error)
        if not event.settled:
            conn.amqp.settle(link, did, state)
        conn.refill(inlink)

    def in_transaction(
        self, conn: Amqp1Conn, event: MessageReceived, address: Address, message: Message
    ) -> bool:
        """A transfer with a delivery state: kept in its transaction (True), refused when the
        transaction is unknown (True), or an ordinary transfer (False)."""
        state = event.state
        if not isinstance(state, TransactionalState):
            return False
        txns = self.transactions.get(conn)
        txn = txns.open.get(bytes(state.txn_id)) if txns is not None else None
        if txn is None:
            self.front.refuse_message(conn, event, UNKNOWN_ID, f"no transaction {bytes(state.txn_id)!r}")
            return True
        if txn.full():
            self.front.refuse_message(conn, event, RESOURCE_LIMIT_EXCEEDED, txn.doomed or "transaction full")
            return True
        txn.publishes.append((address, message))
        if not event.settled:
            conn.amqp.settle(
                event.link, event.delivery_id, TransactionalState(txn_id=txn.txn_id, outcome=Accepted())
            )
        return True

    def settle(self, conn: Amqp1Conn, event: DispositionReceived, state: TransactionalState) -> None:
        """A receiver's outcome inside a transaction: the queue deliveries stay held by their
        consumers until the discharge says what becomes of them."""
        txns = self.transactions.get(conn)
        txn = txns.open.get(bytes(state.txn_id)) if txns is not None else None
        if txn is None:
            error = Error(condition=UNKNOWN_ID, description=f"no transaction {bytes(state.txn_id)!r}")
            for link in {link for link, _did, _tag in event.deliveries}:
                if link.is_open:
                    conn.amqp.detach_link(link, error)
                    self.front.detached(conn, LinkDetached(link, True, error, False))
            return
        if state.outcome is None:
            return  # no outcome yet
        for link, delivery_id, _tag in event.deliveries:
            out = conn.outlinks.get(link)
            if isinstance(out, QueueOut) and out.handle is not None:
                offset = out.offsets.pop(delivery_id, None)
                if offset is not None:
                    txn.settles.append((out, offset, disposition_outcome(state.outcome, out.id)))
        if not event.settled and event.deliveries:
            conn.amqp.settle_range(event.session, ROLE_SENDER, event.first, event.last, state)

    def _commit(self, conn: Amqp1Conn, event: MessageReceived, txn: Transaction) -> None:
        """Publishes and settlements to the queues as one commit, then the topic messages; the
        discharge is answered once it is in (``amqp:transaction:rollback`` when it cannot be)."""
        link, did = event.link, event.delivery_id

        def done(error: QueueError | None) -> None:
            if error is None:
                for address, message in txn.publishes:
                    if not address.is_queue:
                        self.broker.publish(message)
                state: Any = Accepted()
            else:
                log.info("amqp1: %s: transaction %r rolled back: %s", conn.container_id, txn.txn_id, error)
                self.rollback(txn)
                state = Rejected(error=Error(condition=ROLLBACK, description=f"rolled back: {error}"))
            if not event.settled and link.is_open and not conn.machine.closed:
                conn.amqp.settle(link, did, state)
                conn.io.wake()

        if txn.doomed is not None:
            done(QueueError("released", txn.doomed))
            return
        publishes = [(a.name, m, a.key) for a, m in txn.publishes if a.is_queue]
        settles = [
            (out.handle, offset, outcome) for out, offset, outcome in txn.settles if out.handle is not None
        ]
        if not publishes and not settles:
            done(None)
            return
        assert self.queues is not None
        try:
            self.queues.transact(publishes, settles, done)
        except QueueError as exc:
            done(exc)

    def rollback(self, txn: Transaction) -> None:
        """Drop the publishes; the deliveries go back to their queues at once, not as failures."""
        txn.publishes.clear()
        for out, offset, _outcome in txn.settles:
            handle = out.handle
            if handle is not None and not handle.closed:
                handle.settle_nowait(offset, RELEASED)
        txn.settles.clear()
