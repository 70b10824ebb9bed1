"""The receivers of durable and shared topic subscriptions (:mod:`trimaran.amqp1.subscriptions`
says what they are and how they are named): their attach, their end and the subscriptions kept
across a restart. The front end owns one :class:`Subscribers` and calls it from its attach and
detach plumbing; what it needs of the front end is :class:`~trimaran.amqp1.ports.Desk`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from trimaran.amqp1.addresses import QUEUE, TOPIC, Address
from trimaran.amqp1.links import QueueOut
from trimaran.amqp1.performatives import INVALID_FIELD, NOT_FOUND, RCV_FIRST, RESOURCE_LOCKED, Source
from trimaran.amqp1.selection import parse_selector, selecting
from trimaran.amqp1.session import Link, LinkState
from trimaran.amqp1.subscriptions import (
    EXPIRY_NEVER,
    GLOBAL,
    META_KEY,
    SHARED,
    Subscription,
    loaded,
    saved,
    subscription_queue,
    unsubscribe_candidates,
)
from trimaran.amqp1.types import Described, Symbol
from trimaran.broker.events import SUBSCRIPTION_CREATED
from trimaran.broker.router import SubscriptionOptions
from trimaran.queue.groups import Selects
from trimaran.queue.policy import QueueError
from trimaran.selector import SelectorError
from trimaran.vhosts import describe

if TYPE_CHECKING:
    from trimaran.amqp1.conn import Amqp1Conn
    from trimaran.amqp1.ports import Desk
    from trimaran.queue.groups import Selects

log = logging.getLogger(__name__)


class Subscribers:
    """The durable and shared subscriptions of the AMQP 1.0 front end, by queue key, and the
    receivers attached to them."""

    def __init__(self, front: Desk) -> None:
        self.front = front
        self.broker = front.broker
        self.queues = front.queues
        self.subscriptions: dict[str, Subscription] = {}  # durable and shared, by queue key
        self._ending: dict[str, anyio.Event] = {}  # subscriptions whose queue is being deleted

    def forget_vhost(self, vhost_prefix: str) -> None:
        """A vhost is deleted: its subscriptions stop (their queues go with the vhost's)."""
        for sub in [s for q, s in self.subscriptions.items() if vhost_prefix and q.startswith(vhost_prefix)]:
            self.drop(sub)
            self._ending.pop(sub.queue, None)

    async def attach(
        self,
        conn: Amqp1Conn,
        link: Link,
        source: Source,
        address: Address,
        settled: bool,
        selector: tuple[Any, Described] | None,
        selects: Selects | None,
    ) -> None:
        """A receiver of a durable or shared subscription: a consumer of the subscription's queue,
        which the router feeds whether or not a receiver is attached."""
        assert self.queues is not None
        caps = {str(c) for c in source.capabilities or ()}
        durable = source.durable in (1, 2) and source.expiry_policy == EXPIRY_NEVER
        shared = SHARED in caps
        queue = subscription_queue(conn.container_id, link.name, caps, conn.vhost_prefix)
        text = None if selector is None else str(selector[1].value)
        ending = self._ending.get(queue)
        if ending is not None:
            await ending.wait()  # the one unsubscribed just now is gone first
        sub = self.subscriptions.get(queue)
        if sub is not None and (sub.topic != address.name or sub.selector != text):
            if sub.links:
                self.front.refuse(
                    conn,
                    link,
                    RESOURCE_LOCKED,
                    f"subscription {queue} is attached with another topic or selector",
                )
                return
            await self.end(sub)  # JMS: another topic or selector is a new subscription
            sub = self.subscriptions.get(queue)
        if sub is None:
            await self.queues.declare(queue, durable=durable)
            sub = self.subscriptions.get(queue)  # another attach may have made it meanwhile
            if sub is None:
                sub = self._start(queue, address.name, durable, shared, text, selects, source)
                if durable:
                    await self._save()
                self.front.subscription_event(
                    SUBSCRIPTION_CREATED, conn, address.name, qos=1, link=link.name, queue=queue
                )
        if link.state is not LinkState.ATTACH_RECEIVED or conn.machine.closed:
            # The peer gave up meanwhile: a durable subscription stays, as after a detach.
            if not sub.links and not sub.durable:
                await self.end(sub)
            return
        if sub.links and not sub.shared:
            self.front.refuse(conn, link, RESOURCE_LOCKED, f"subscription {queue} has a receiver already")
            return
        out = QueueOut(conn, link, Address(QUEUE, queue, "", address.cut), settled)
        out.subscription = sub
        conn.outlinks[link] = out
        try:
            self.front.consume(out, link)  # the subscription selects what goes into its queue
        except QueueError as exc:
            conn.outlinks.pop(link, None)
            self.front.refuse(conn, link, NOT_FOUND if exc.reason == "no-queue" else INVALID_FIELD, str(exc))
            return
        sub.links.add(out)
        caps_back: list[str] = [Symbol(TOPIC), *(Symbol(c) for c in (SHARED, GLOBAL) if c in caps)]
        applied = None if selector is None else {selector[0]: selector[1]}
        answer = replace(source, capabilities=caps_back, filter=applied, distribution_mode=None)
        conn.amqp.accept_link(link, source=answer, rcv_settle_mode=RCV_FIRST)
        out.on_flow(link.drain)

    def _start(
        self,
        queue: str,
        topic: str,
        durable: bool,
        shared: bool,
        selector: str | None,
        selects: Selects | None,
        source: Any,
    ) -> Subscription:
        """A subscription made (at attach) or restored (at start): kept, and fed by the topic."""
        assert self.queues is not None
        sub = Subscription(
            self.queues,
            queue,
            topic,
            durable=durable,
            shared=shared,
            selector=selector,
            selects=selects,
            source=source,
        )
        self.subscriptions[queue] = sub
        self.broker.router.subscribe(sub, topic, SubscriptionOptions(qos=1))
        return sub

    async def _save(self) -> None:
        """Write the durable subscriptions to the meta table (a restart subscribes them again)."""
        assert self.queues is not None
        text = saved(list(self.subscriptions.values()))
        try:
            await anyio.to_thread.run_sync(self.queues.storage.set_meta, META_KEY, text)
        except Exception as exc:  # the subscription works; only a restart would forget it
            log.warning("amqp1: could not save the durable subscriptions: %s", exc)

    async def restore(self) -> None:
        """At start: the durable subscriptions whose queues the manager loaded are fed again, so
        what is published before their receivers come back is kept."""
        if self.queues is None or self.queues.shared:
            return  # several nodes: each would feed the queue from every publish (see docs/amqp1.md)
        text = await anyio.to_thread.run_sync(self.queues.storage.get_meta, META_KEY)
        try:
            kept = loaded(text)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("amqp1: the saved durable subscriptions cannot be read, none restored: %s", exc)
            return
        for queue, (source, topic, shared, selector) in kept.items():
            if queue in self.subscriptions or not self.queues.exists(queue):
                continue
            try:
                selects = None if selector is None else selecting(parse_selector(selector))
            except SelectorError as exc:
                log.warning("amqp1: the subscription %s not restored: %s", describe(queue), exc)
                continue
            self._start(queue, topic, True, shared, selector, selects, source)
        if self.subscriptions:
            log.info("amqp1: restored %d durable subscriptions", len(self.subscriptions))

    def attach_existing(self, conn: Amqp1Conn, link: Link) -> Awaitable[None] | None:
        """A receiver without a source names an existing subscription by its link name (Qpid JMS
        attaches so to unsubscribe, then detaches with ``closed``): it attaches to it as it is."""
        for queue in unsubscribe_candidates(conn.container_id, link.name, conn.vhost_prefix):
            sub = self.subscriptions.get(queue)
            if sub is not None:
                return self.front.attach_outlink(conn, link, sub.source)
        self.front.refuse(conn, link, NOT_FOUND, f"no subscription named {link.name!r}")
        return None

    def drop(self, sub: Subscription) -> anyio.Event | None:
        """Unsubscribe at once: no longer found, no longer fed. Its queue is deleted by
        :meth:`end` (an attach of the same name waits for that)."""
        if self.subscriptions.get(sub.queue) is not sub:
            return None
        del self.subscriptions[sub.queue]
        self.broker.router.unsubscribe_all(sub)
        ending = self._ending[sub.queue] = anyio.Event()
        return ending

    async def end(self, sub: Subscription, ending: anyio.Event | None = None) -> None:
        """Unsubscribe and delete its queue."""
        if ending is None:
            ending = self.drop(sub)
            if ending is None:
                return
        try:
            assert self.queues is not None
            await self.queues.delete(sub.queue)
            if sub.durable:
                await self._save()
            log.debug("amqp1: the subscription %s removed", describe(sub.queue))
        finally:
            if self._ending.get(sub.queue) is ending:
                del self._ending[sub.queue]
            ending.set()

    def leave(self, out: QueueOut, unsubscribe: bool) -> anyio.Event | None:
        """``out`` is gone: the subscription ends when it was the last receiver and the peer closed
        the link (a durable one: JMS unsubscribe) or it was not durable."""
        sub = out.subscription
        if sub is None:
            return None
        sub.links.discard(out)
        if not sub.links and (unsubscribe or not sub.durable):
            return self.drop(sub)
        return None

    async def release_and_end(self, conn: Amqp1Conn, out: QueueOut, ending: anyio.Event | None) -> None:
        await self.front.release_detached(conn, out)  # its consumer first, then the queue
        if ending is not None and out.subscription is not None:
            await self.end(out.subscription, ending)
