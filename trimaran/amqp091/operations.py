"""The exchange, queue, basic, confirm and tx methods of a channel, RabbitMQ-style, in one vhost.

One ``Operations`` per vhost (``tenants.Tenant``): its exchanges are the vhost's; a queue the
client names is the key ``prefix + name`` in the queue manager (trimaran/vhosts.py), and what
goes back to the client (declare-ok, reply texts) is its own name again.

Each method either answers (``send_method``) or raises :class:`~trimaran.amqp091.spec.ProtocolError`
/ :class:`~trimaran.amqp091.exchanges.ExchangeError`, which the front end turns into a channel or
connection exception with RabbitMQ's reply code and text.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio
import anyio.to_thread

from trimaran.amqp091 import spec
from trimaran.amqp091.access import check_server_named, own_topic_binding
from trimaran.amqp091.channels import ChannelState, Consumer, Getter
from trimaran.amqp091.exchanges import Binding, ExchangeError, ExchangeRegistry
from trimaran.amqp091.ports import FrontEnd
from trimaran.amqp091.queues import (
    QueueMeta,
    RouterBinding,
    policy_from_arguments,
    stream_start,
)
from trimaran.broker.router import SubscriptionOptions
from trimaran.queue.policy import QueueError
from trimaran.selector import SelectorError
from trimaran.topics import TopicError, binding_key_to_filter
from trimaran.vhosts import describe, is_reserved, split_key

if TYPE_CHECKING:
    from trimaran.amqp091.conn import Amqp091Conn, Pending
    from trimaran.amqp091.durable import DurableExchanges
    from trimaran.amqp091.properties import BasicProperties
    from trimaran.queue.groups import Selects
    from trimaran.queue.journal import Receipt
    from trimaran.queue.manager import QueueManager
    from trimaran.security.guard import Security

log = logging.getLogger(__name__)

#: Direct reply-to: consume here, publish with reply_to set to it; replies go to
#: ``REPLY_TO + "." + token`` on the default exchange.
REPLY_TO: Final = "amq.rabbitmq.reply-to"
REPLY_PREFIX: Final = REPLY_TO + "."


def _error(code: int, text: str, method: spec.Method) -> spec.ProtocolError:
    return spec.ProtocolError(code, text, class_id=method.CLASS_ID, method_id=method.METHOD_ID)


def _rs(queue: str) -> str:
    """RabbitMQ's name of a queue in a reply text, from its key."""
    vhost, name = split_key(queue)
    return f"queue '{name}' in vhost '{vhost}'"


def _locked(queue: str) -> str:
    return (
        f"cannot obtain exclusive access to locked {_rs(queue)}. It could be originally declared on "
        "another connection or the exclusive property value does not match that of the original "
        "declaration."
    )


def _argument(value: object) -> object:
    """A queue argument for comparison: text whether it came as bytes or str, numbers as numbers."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    return int(value)


class Host(FrontEnd, Protocol):
    """The front end (``handler.Amqp091FrontEnd``) as these operations see it: the vhost's queues,
    consumers, bindings and exchanges, and the publish path."""

    @property
    def store(self) -> DurableExchanges | None: ...

    @property
    def manager(self) -> QueueManager: ...

    @property
    def exchanges(self) -> ExchangeRegistry: ...

    @property
    def meta(self) -> dict[str, QueueMeta]: ...

    @property
    def consumers(self) -> dict[str, set[Consumer]]: ...

    @property
    def router_bindings(self) -> dict[tuple[str, str], RouterBinding]: ...

    @property
    def vhost(self) -> str: ...

    @property
    def prefix(self) -> str: ...

    @property
    def security(self) -> Security: ...

    @property
    def reply_to(self) -> dict[str, ChannelState]: ...

    @property
    def selecting(self) -> Callable[[str], Selects] | None: ...

    def watch_expiry(self) -> None:
        """A queue with ``x-expires`` was declared: the housekeeping looks at it from now on."""

    def publish(
        self,
        conn: Amqp091Conn,
        channel: ChannelState,
        method: spec.BasicPublish,
        props: BasicProperties,
        body: bytes,
        entry: Pending | None = None,
        encoded: bytes | None = None,
    ) -> None: ...

    def forget_consumer(self, consumer: Consumer) -> None: ...

    def forget_reply_to(self, channel: ChannelState) -> None: ...


class Operations:
    def __init__(self, front: Host) -> None:
        self.front = front
        self.manager = front.manager
        self.exchanges = front.exchanges
        # Methods answered at once: handled inside the event, nothing waits.
        self.at_once: dict[type[spec.Method], Any] = {
            spec.BasicQos: self.basic_qos,
            spec.BasicConsume: self.basic_consume,
            spec.BasicGet: self.basic_get,
            spec.BasicAck: self.basic_ack,
            spec.BasicNack: self.basic_nack,
            spec.BasicReject: self.basic_reject,
            spec.BasicRecover: self.basic_recover,
            spec.BasicRecoverAsync: self.basic_recover,
            spec.ConfirmSelect: self.confirm_select,
            spec.TxSelect: self.tx_select,
            spec.TxCommit: self.tx_commit,
            spec.TxRollback: self.tx_rollback,
        }
        # Methods that wait (a commit, a queue manager call): the connection's later frames wait too.
        self.waiting: dict[type[spec.Method], Any] = {
            spec.ExchangeDeclare: self.exchange_declare,
            spec.ExchangeDelete: self.exchange_delete,
            spec.ExchangeBind: self.exchange_bind,
            spec.ExchangeUnbind: self.exchange_unbind,
            spec.QueueDeclare: self.queue_declare,
            spec.QueueBind: self.queue_bind,
            spec.QueueUnbind: self.queue_unbind,
            spec.QueuePurge: self.queue_purge,
            spec.QueueDelete: self.queue_delete,
            spec.BasicCancel: self.basic_cancel,
        }

    async def _store(self, call: Callable[[], None]) -> None:
        """Persist a change to durable exchanges or bindings (one transaction, on a worker thread)."""
        if self.front.store is not None:
            await anyio.to_thread.run_sync(call)

    async def _removed(self, deleted: str | None = None) -> None:
        """After a registry call that removed bindings (unbind, exchange or queue deletion, and the
        auto-deletes they cascade to): drop their router subscriptions and the router endpoints of the
        exchanges gone, then forget them in SQL. ``deleted``: the exchange the call deleted, if any."""
        front = self.front
        router = front.broker.router
        for binding in self.exchanges.last_removed_bindings:
            if not self.exchanges.is_router_backed(binding.source):
                continue
            endpoint = front.router_bindings.get((binding.destination_kind, binding.destination))
            if endpoint is None or self._still_bound(binding):
                continue
            try:
                router.unsubscribe(endpoint, front.prefix + binding_key_to_filter(binding.routing_key))
            except TopicError:
                continue
        gone = [e.name for e in self.exchanges.last_auto_deleted]
        if deleted is not None:
            gone.insert(0, deleted)
        for name in gone:
            endpoint = front.router_bindings.pop(("exchange", name), None)
            if endpoint is not None:
                router.unsubscribe_all(endpoint)
        # A binding is stored when both its ends are durable: an in-memory queue's never were.
        removed = [b for b in self.exchanges.last_removed_bindings if not self._in_memory_queue(b)]
        store = front.store
        if store is not None and (removed or gone):
            await self._store(lambda: store.forget(removed, gone))

    def _still_bound(self, removed: Binding) -> bool:
        """Whether another router-backed binding (same key, other arguments) keeps the subscription."""
        return any(
            b.routing_key == removed.routing_key and self.exchanges.is_router_backed(b.source)
            for b in self.exchanges.bindings_for_destination(removed.destination, removed.destination_kind)
        )

    def _in_memory_queue(self, binding: Binding) -> bool:
        """Whether ``binding`` leads to a queue known (still) to be in memory only."""
        if binding.destination_kind != "queue":
            return False
        state = self.manager.queues.get(binding.destination)
        return state is not None and not state.durable

    def _durable_end(self, kind: str, name: str) -> bool:
        if kind == "queue":
            state = self.manager.queues.get(name)
            return state is not None and state.durable
        exchange = self.exchanges.get(name)
        return exchange is not None and exchange.durable

    @staticmethod
    def _reply(conn: Amqp091Conn, channel: ChannelState, reply: spec.Method, no_wait: bool = False) -> None:
        if not no_wait:
            conn.amqp.send_method(channel.number, reply)

    # -- restore and housekeeping -------------------------------------------------------------------

    async def restore(self) -> None:
        """Durable exchanges and bindings from SQL; durable queues the manager loaded are AMQP queues
        too (durable, not exclusive)."""
        store = self.front.store
        if store is not None:
            exchanges, bindings = await anyio.to_thread.run_sync(store.load)
            skipped = self.exchanges.restore(exchanges, bindings)
            for binding in self.exchanges.bindings():
                self._subscribe(binding)
            log.info(
                "amqp091: restored %d exchanges and %d bindings (%d skipped)",
                len(exchanges),
                len(bindings) - len(skipped),
                len(skipped),
            )
        vhost = self.front.vhost
        for name, state in self.manager.queues.items():
            if state.durable and name not in self.front.meta and split_key(name)[0] == vhost:
                self.front.meta[name] = QueueMeta(name, True, unused_since=time.monotonic())

    async def expire_queues(self, now: float) -> None:
        vhost = self.front.vhost
        for meta in list(self.front.meta.values()):
            if meta.expires_ms is None or self.front.consumers.get(meta.name):
                continue
            if split_key(meta.name)[0] != vhost:  # another vhost's operations expire it
                continue
            if now - meta.unused_since >= meta.expires_ms / 1000:
                log.info("amqp091: %s expired (x-expires)", describe(meta.name))
                await self.delete_queue(meta.name)

    async def auto_delete_queues(self, names: set[str]) -> None:
        for name in names:
            meta = self.front.meta.get(name)
            if (
                meta is not None
                and meta.auto_delete
                and meta.had_consumer
                and not self.front.consumers.get(name)
            ):
                await self.delete_queue(name)

    async def delete_queue(self, name: str) -> None:
        front = self.front
        meta = front.meta.pop(name, None)
        for consumer in list(front.consumers.pop(name, ())):
            channel = consumer.channel
            if channel.consumers.get(consumer.tag) is consumer:
                del channel.consumers[consumer.tag]
                caps = channel.conn.amqp.client_capabilities
                if caps.get("consumer_cancel_notify") is True and not channel.closed:
                    channel.conn.amqp.send_method(channel.number, spec.BasicCancel(consumer.tag, True))
                    channel.conn.wake()
            for tag, (holder, _) in list(channel.unacked.items()):
                if holder is consumer:
                    del channel.unacked[tag]
        if meta is not None and meta.exclusive_owner is not None:
            meta.exclusive_owner.exclusive_queues.discard(name)
        self.exchanges.remove_queue(name)
        endpoint = front.router_bindings.pop(("queue", name), None)
        if endpoint is not None:
            front.broker.router.unsubscribe_all(endpoint)
        await self._removed()
        await self.manager.delete(name)

    # -- checks -----------------------------------------------------------------------------------

    def _queue_name(self, channel: ChannelState, name: str, method: spec.Method) -> str:
        """The key of the queue the client names (``""``: the channel's last declared queue)."""
        if name:
            return self._key(name, method)
        if not channel.last_queue:
            raise _error(spec.NOT_FOUND, "no previously declared queue", method)
        return channel.last_queue

    def _key(self, name: str, method: spec.Method) -> str:
        """The queue manager's key for a name in this vhost; a name that would be another vhost's
        key is refused (403)."""
        if is_reserved(name):
            raise _error(
                spec.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix '$vhost'", method
            )
        return self.front.prefix + name

    def _existing(self, conn: Amqp091Conn, name: str, method: spec.Method) -> QueueMeta:
        state = self.manager.queues.get(name)
        if state is None:
            raise _error(spec.NOT_FOUND, f"no {_rs(name)}", method)
        meta = self.front.meta.get(name)
        if meta is None:  # a queue made outside AMQP (MQTT $queue/, config)
            meta = self.front.meta[name] = QueueMeta(name, state.durable)
        self._check_exclusive(conn, meta, method)
        return meta

    @staticmethod
    def _check_exclusive(conn: Amqp091Conn, meta: QueueMeta, method: spec.Method) -> None:
        if meta.exclusive_owner is not None and meta.exclusive_owner is not conn:
            raise _error(spec.RESOURCE_LOCKED, _locked(meta.name), method)

    def _counts(self, name: str) -> tuple[int, int]:
        """(ready messages, consumers), as RabbitMQ counts them: unacknowledged deliveries are
        not in message_count."""
        return self.manager.ready_count(name), len(self.front.consumers.get(name, ()))

    # -- exchanges --------------------------------------------------------------------------------

    async def exchange_declare(
        self, conn: Amqp091Conn, channel: ChannelState, m: spec.ExchangeDeclare
    ) -> None:
        exchange, created = self.exchanges.declare(
            m.exchange,
            m.type,
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments,
        )
        store = self.front.store
        if created and exchange.durable and store is not None:
            await self._store(lambda: store.save_exchange(exchange))
        self._reply(conn, channel, spec.ExchangeDeclareOk(), m.no_wait)

    async def exchange_delete(self, conn: Amqp091Conn, channel: ChannelState, m: spec.ExchangeDelete) -> None:
        deleted = self.exchanges.delete(m.exchange, if_unused=m.if_unused)
        await self._removed(None if deleted is None else m.exchange)
        self._reply(conn, channel, spec.ExchangeDeleteOk(), m.no_wait)

    async def exchange_bind(self, conn: Amqp091Conn, channel: ChannelState, m: spec.ExchangeBind) -> None:
        if self.exchanges.get(m.destination) is None:
            raise _error(spec.NOT_FOUND, f"no exchange '{m.destination}' in vhost '{self.front.vhost}'", m)
        await self._bind(m.source, "exchange", m.destination, m.routing_key, m.arguments, m)
        self._reply(conn, channel, spec.ExchangeBindOk(), m.no_wait)

    async def exchange_unbind(self, conn: Amqp091Conn, channel: ChannelState, m: spec.ExchangeUnbind) -> None:
        await self._unbind(m.source, "exchange", m.destination, m.routing_key, m.arguments)
        self._reply(conn, channel, spec.ExchangeUnbindOk(), m.no_wait)

    async def _bind(
        self,
        source: str,
        kind: str,
        destination: str,
        key: str,
        arguments: dict[str, Any],
        m: spec.Method,
        reads: Callable[[str], bool] | None = None,
    ) -> None:
        if self.exchanges.is_router_backed(source):
            try:
                binding_key_to_filter(key)
            except TopicError as exc:
                raise _error(spec.PRECONDITION_FAILED, f"binding key {key!r}: {exc}", m) from None
        binding, new = self.exchanges.bind(source, destination, kind, key, arguments)  # type: ignore[arg-type]
        if not new:
            return
        self._subscribe(binding, reads)
        store = self.front.store
        if (
            store is not None
            and self._durable_end("exchange", source)
            and self._durable_end(kind, destination)
        ):
            await self._store(lambda: store.save_binding(binding))

    def _subscribe(self, binding: Binding, reads: Callable[[str], bool] | None = None) -> None:
        """A binding from amq.topic is a router subscription of its destination (``reads``: the
        binder may read only some of its topics, :func:`access.own_topic_binding`)."""
        if not self.exchanges.is_router_backed(binding.source):
            return
        try:
            topic_filter = self.front.prefix + binding_key_to_filter(binding.routing_key)
        except TopicError:
            return
        front = self.front
        where = (binding.destination_kind, binding.destination)
        endpoint = front.router_bindings.get(where)
        if endpoint is None:
            endpoint = front.router_bindings[where] = RouterBinding(front, *where)
        front.broker.router.subscribe(endpoint, topic_filter, SubscriptionOptions(qos=1, reads=reads))

    async def _unbind(
        self, source: str, kind: str, destination: str, key: str, arguments: dict[str, Any]
    ) -> None:
        try:
            self.exchanges.unbind(source, destination, kind, key, arguments)  # type: ignore[arg-type]
        except ExchangeError as exc:
            if exc.reply_code != spec.NOT_FOUND:
                raise
            # A missing source or destination has no binding to remove: unbind-ok, as RabbitMQ
            # answers (clients unbind in clean-ups after an auto-delete removed the queue).
            return
        await self._removed()

    # -- queues -----------------------------------------------------------------------------------

    async def queue_declare(self, conn: Amqp091Conn, channel: ChannelState, m: spec.QueueDeclare) -> None:
        front = self.front
        own = m.queue or f"amq.gen-{secrets.token_urlsafe(16)}"
        if not m.queue and not m.passive:
            refused = check_server_named(front.security, conn, own, m)  # by its made name, as RabbitMQ
            if refused is not None:
                raise refused
        if own == REPLY_TO and m.passive:  # the direct reply-to pseudo-queue exists, always empty
            self._reply(conn, channel, spec.QueueDeclareOk(own, 0, 0), m.no_wait)
            return
        name = self._key(own, m)
        if m.queue.startswith("amq.") and not m.passive:
            raise _error(spec.ACCESS_REFUSED, f"queue name '{m.queue}' contains reserved prefix 'amq.*'", m)
        if self.manager.exists(name):
            meta = self._existing(conn, name, m)
            if not m.passive:
                self._check_equivalent(meta, m)
            meta.unused_since = time.monotonic()
        else:
            if m.passive:
                raise _error(spec.NOT_FOUND, f"no {_rs(name)}", m)
            policy = policy_from_arguments(name, m.arguments, self.manager.settings.defaults)
            in_sql = m.durable and not m.exclusive and not m.auto_delete
            try:
                await self.manager.declare(name, policy, durable=in_sql)
            except QueueError as exc:
                # The vhost's queue limit in RabbitMQ's words; other refusals keep their reason word.
                why = exc.detail if exc.reason == "queue-limit" else str(exc)
                raise _error(spec.PRECONDITION_FAILED, f"cannot declare {_rs(name)}: {why}", m) from None
            expires = m.arguments.get("x-expires")
            meta = front.meta[name] = QueueMeta(
                name,
                m.durable,
                exclusive_owner=conn if m.exclusive else None,
                auto_delete=m.auto_delete,
                expires_ms=expires if isinstance(expires, int) and not isinstance(expires, bool) else None,
                arguments=dict(m.arguments),
                unused_since=time.monotonic(),
                declared=True,
            )
            if meta.expires_ms is not None:
                front.watch_expiry()
            if m.exclusive:
                conn.exclusive_queues.add(name)
                self.manager.owners[name] = conn  # no other connection consumes it, whatever protocol
        channel.last_queue = name
        depth, consumers = self._counts(name)
        self._reply(conn, channel, spec.QueueDeclareOk(own, depth, consumers), m.no_wait)

    def _check_equivalent(self, meta: QueueMeta, m: spec.QueueDeclare) -> None:
        """RabbitMQ's rule for redeclaring a queue: the same exclusive flag (405 RESOURCE_LOCKED,
        from the owning connection too), else the same durable, auto_delete and arguments (406
        PRECONDITION_FAILED naming the first that differs). Arguments and auto_delete are known only
        for queues declared over AMQP since the start."""
        if (meta.exclusive_owner is not None) != m.exclusive:
            raise _error(spec.RESOURCE_LOCKED, _locked(meta.name), m)
        if meta.durable != m.durable:
            raise self._inequivalent(meta.name, "durable", m.durable, meta.durable, m)
        if not meta.declared:
            return
        if meta.auto_delete != m.auto_delete:
            raise self._inequivalent(meta.name, "auto_delete", m.auto_delete, meta.auto_delete, m)
        for key in sorted(set(meta.arguments) | set(m.arguments)):
            got, have = _argument(m.arguments.get(key)), _argument(meta.arguments.get(key))
            if got != have:
                raise self._inequivalent(meta.name, key, got, have, m)

    @staticmethod
    def _inequivalent(name: str, arg: str, got: object, have: object, m: spec.Method) -> spec.ProtocolError:
        def shown(value: object) -> str:
            return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

        text = f"received '{shown(got)}' but current is '{shown(have)}'"
        return _error(spec.PRECONDITION_FAILED, f"inequivalent arg '{arg}' for {_rs(name)}: {text}", m)

    async def queue_bind(self, conn: Amqp091Conn, channel: ChannelState, m: spec.QueueBind) -> None:
        name = self._queue_name(channel, m.queue, m)
        self._existing(conn, name, m)
        reads = None
        own = own_topic_binding(self.exchanges, conn, channel, m)
        if own is not None and conn.principal is not None:
            grant = self.front.security.reading(conn.principal, own, len(self.front.prefix))  # not False
            reads = None if isinstance(grant, bool) else grant
        await self._bind(m.exchange, "queue", name, m.routing_key, m.arguments, m, reads)
        self._reply(conn, channel, spec.QueueBindOk(), m.no_wait)

    async def queue_unbind(self, conn: Amqp091Conn, channel: ChannelState, m: spec.QueueUnbind) -> None:
        name = self._queue_name(channel, m.queue, m)
        if self.manager.exists(name):
            self._existing(conn, name, m)
            await self._unbind(m.exchange, "queue", name, m.routing_key, m.arguments)
        self._reply(conn, channel, spec.QueueUnbindOk())

    async def queue_purge(self, conn: Amqp091Conn, channel: ChannelState, m: spec.QueuePurge) -> None:
        name = self._queue_name(channel, m.queue, m)
        self._existing(conn, name, m)
        count = await self.manager.purge(name)
        self._reply(conn, channel, spec.QueuePurgeOk(count), m.no_wait)

    async def queue_delete(self, conn: Amqp091Conn, channel: ChannelState, m: spec.QueueDelete) -> None:
        name = self._queue_name(channel, m.queue, m)
        if not self.manager.exists(name):
            self._reply(conn, channel, spec.QueueDeleteOk(0), m.no_wait)
            return
        self._existing(conn, name, m)
        depth, consumers = self._counts(name)
        if m.if_unused and consumers:
            raise _error(spec.PRECONDITION_FAILED, f"{_rs(name)} in use", m)
        if m.if_empty and depth:
            raise _error(spec.PRECONDITION_FAILED, f"{_rs(name)} not empty", m)
        await self.delete_queue(name)
        self._reply(conn, channel, spec.QueueDeleteOk(depth), m.no_wait)

    # -- basic ------------------------------------------------------------------------------------

    def basic_qos(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicQos) -> None:
        if m.prefetch_size:
            raise _error(spec.NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", m)
        if m.global_:
            channel.global_prefetch = m.prefetch_count
            channel.refill_all()
        else:
            channel.prefetch = m.prefetch_count
        self._reply(conn, channel, spec.BasicQosOk())

    def basic_consume(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicConsume) -> None:
        front = self.front
        if m.queue == REPLY_TO:
            self._reply_consumer(conn, channel, m)
            return
        name = self._queue_name(channel, m.queue, m)
        meta = self._existing(conn, name, m)
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in channel.consumers:
            raise spec.ProtocolError(
                spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", class_id=60, method_id=20
            )
        others = front.consumers.get(name, set())
        if any(c.exclusive for c in others) or (m.exclusive and others):
            raise _error(spec.ACCESS_REFUSED, f"{_rs(name)} in exclusive use", m)
        group = m.arguments.get("x-consumer-group")
        if isinstance(group, bytes):
            group = group.decode("utf-8", "replace")
        selects = self._selects(m)
        consumer = Consumer(
            channel, tag, name, no_ack=m.no_ack, prefetch=channel.prefetch, exclusive=m.exclusive
        )
        try:
            consumer.handle = self.manager.consume(
                name,
                consumer,
                group=group if isinstance(group, str) and group else None,
                start=stream_start(m.arguments.get("x-stream-offset")),
                auto_ack=m.no_ack,
                owner=conn,
                selects=selects,
            )
        except QueueError as exc:
            raise _error(spec.PRECONDITION_FAILED, f"cannot consume from {_rs(name)}: {exc}", m) from None
        channel.consumers[tag] = consumer
        front.consumers.setdefault(name, set()).add(consumer)
        meta.had_consumer = True
        self._reply(conn, channel, spec.BasicConsumeOk(tag), m.no_wait)
        channel.refill(consumer)  # deliveries start after consume-ok

    def _selects(self, m: spec.BasicConsume) -> Selects | None:
        """The consume argument ``x-selector``: a JMS message selector (as on AMQP 1.0 receivers),
        parsed once here. The consumer gets only the messages it selects; the others stay on the
        queue for its other consumers."""
        text = m.arguments.get("x-selector")
        if text is None:
            return None
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if not isinstance(text, str):
            raise _error(spec.PRECONDITION_FAILED, f"invalid arg 'x-selector' for consumer: {text!r}", m)
        if self.front.selecting is None:
            raise _error(spec.NOT_IMPLEMENTED, "x-selector is not available on this server", m)
        try:
            return self.front.selecting(text)
        except SelectorError as unparsed:
            wrong = f"invalid arg 'x-selector': {unparsed} in {text!r}"
            raise _error(spec.PRECONDITION_FAILED, wrong, m) from None

    def _reply_consumer(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicConsume) -> None:
        """basic.consume on the direct reply-to pseudo-queue: replies to this channel's requests are
        delivered straight to it, with no queue (RabbitMQ's rules: no-ack only, one per channel)."""
        if not m.no_ack:
            raise _error(spec.PRECONDITION_FAILED, "reply consumer cannot acknowledge", m)
        if channel.reply_token is not None:
            raise _error(spec.PRECONDITION_FAILED, "reply consumer already set", m)
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if tag in channel.consumers:
            raise _error(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", m)
        token = secrets.token_urlsafe(18)
        channel.reply_tag, channel.reply_token = tag, token
        self.front.reply_to[token] = channel
        self._reply(conn, channel, spec.BasicConsumeOk(tag), m.no_wait)

    async def basic_cancel(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicCancel) -> None:
        if channel.reply_token is not None and m.consumer_tag == channel.reply_tag:
            self.front.forget_reply_to(channel)
            self._reply(conn, channel, spec.BasicCancelOk(m.consumer_tag), m.no_wait)
            return
        consumer = channel.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            self.front.forget_consumer(consumer)
            consumer.cancelled = True
            if consumer.handle is not None:
                if consumer.unacked:
                    consumer.handle.set_credit(0)  # its unacked deliveries may still be acked
                else:
                    await consumer.handle.cancel()
        self._reply(conn, channel, spec.BasicCancelOk(m.consumer_tag), m.no_wait)
        if consumer is not None:
            await self.auto_delete_queues({consumer.queue})

    def basic_get(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicGet) -> Awaitable[None] | None:
        """basic.get-ok or get-empty. Behind the channel's own uncommitted durable publishes it waits
        for their commit first (RabbitMQ orders a channel's publish and get); the connection's later
        frames wait with it."""
        pending = channel.last_write
        if pending is not None:
            if not pending.done:
                return self._get_after(conn, channel, m, pending)
            channel.last_write = None
        return self._get(conn, channel, m)

    async def _get_after(
        self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicGet, pending: Receipt
    ) -> None:
        committed = anyio.Event()
        pending.then(committed.set)
        await committed.wait()
        if channel.last_write is pending:
            channel.last_write = None
        if not channel.closed and not conn.machine.closed:
            claiming = self._get(conn, channel, m)
            if claiming is not None:
                await claiming

    def _get(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicGet) -> Awaitable[None] | None:
        name = self._queue_name(channel, m.queue, m)
        meta = self._existing(conn, name, m)
        meta.unused_since = time.monotonic()
        getter = channel.getters.get((name, m.no_ack))
        if getter is None or getter.handle is None or getter.handle.closed:
            getter = Getter(channel, name, m.no_ack)
            try:
                getter.handle = self.manager.consume(name, getter, auto_ack=m.no_ack, owner=conn)
            except QueueError as exc:
                raise _error(spec.PRECONDITION_FAILED, f"cannot get from {_rs(name)}: {exc}", m) from None
            channel.getters[(name, m.no_ack)] = getter
        channel.offer(getter)
        handle = getter.handle
        if getter.got is None and handle is not None:
            # A shared node holds only what it claimed: the get waits for a claim made for it,
            # as RabbitMQ's get sees the whole queue (the connection's later frames wait too).
            claimed = anyio.Event()
            if self.manager.after_claim(handle, claimed.set):
                return self._get_claimed(conn, channel, getter, name, claimed)
        self._answer_get(conn, channel, getter, name)
        return None

    async def _get_claimed(
        self, conn: Amqp091Conn, channel: ChannelState, getter: Getter, name: str, claimed: anyio.Event
    ) -> None:
        await claimed.wait()
        if not channel.closed and not conn.machine.closed:
            self._answer_get(conn, channel, getter, name)

    def _answer_get(self, conn: Amqp091Conn, channel: ChannelState, getter: Getter, name: str) -> None:
        if not channel.answer(getter, lambda: self._counts(name)[0]):
            self._reply(conn, channel, spec.BasicGetEmpty())

    def basic_ack(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicAck) -> None:
        if channel.tx:
            self._settle(channel, m.delivery_tag, m.multiple, "ack", False)
        else:
            channel.settle(m.delivery_tag, m.multiple, "ack")

    def basic_nack(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicNack) -> None:
        self._settle(channel, m.delivery_tag, m.multiple, "nack", m.requeue)

    def basic_reject(self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicReject) -> None:
        self._settle(channel, m.delivery_tag, False, "reject", m.requeue)

    @staticmethod
    def _settle(channel: ChannelState, tag: int, multiple: bool, action: str, requeue: bool) -> None:
        if channel.tx:
            if not multiple and tag not in channel.unacked:  # an unknown tag fails at once
                channel.settle(tag, multiple, action, requeue)
            channel.tx_acks.append(lambda: channel.settle(tag, multiple, action, requeue))
            return
        channel.settle(tag, multiple, action, requeue)

    def basic_recover(
        self, conn: Amqp091Conn, channel: ChannelState, m: spec.BasicRecover | spec.BasicRecoverAsync
    ) -> None:
        channel.recover()
        if isinstance(m, spec.BasicRecover):
            self._reply(conn, channel, spec.BasicRecoverOk())

    # -- confirm and tx ---------------------------------------------------------------------------

    def confirm_select(self, conn: Amqp091Conn, channel: ChannelState, m: spec.ConfirmSelect) -> None:
        if channel.tx:
            raise _error(spec.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", m)
        channel.confirm = True
        self._reply(conn, channel, spec.ConfirmSelectOk(), m.no_wait)

    def tx_select(self, conn: Amqp091Conn, channel: ChannelState, m: spec.TxSelect) -> None:
        if channel.confirm:
            raise _error(spec.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", m)
        channel.tx = True
        self._reply(conn, channel, spec.TxSelectOk())

    def tx_commit(self, conn: Amqp091Conn, channel: ChannelState, m: spec.TxCommit) -> None:
        if not channel.tx:
            raise _error(spec.PRECONDITION_FAILED, "channel is not transactional", m)
        publishes, channel.tx_publishes = channel.tx_publishes, []
        acks, channel.tx_acks = channel.tx_acks, []
        entry = conn.begin_confirm(channel, 0, spec.TxCommitOk())
        try:
            for method, props, body in publishes:
                self.front.publish(conn, channel, method, props, body, entry)
        except spec.ProtocolError:
            conn.drop_confirm(entry)  # the channel closes; its commit-ok will never be sent
            raise
        for settle in acks:
            try:
                settle()
            except spec.ProtocolError:
                continue  # settled meanwhile (basic.recover, a cancelled queue)
        entry.sealed()

    def tx_rollback(self, conn: Amqp091Conn, channel: ChannelState, m: spec.TxRollback) -> None:
        if not channel.tx:
            raise _error(spec.PRECONDITION_FAILED, "channel is not transactional", m)
        channel.tx_publishes = []
        channel.tx_acks = []  # the deliveries stay unacknowledged
        self._reply(conn, channel, spec.TxRollbackOk())
