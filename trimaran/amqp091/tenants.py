"""One AMQP 0.9.1 virtual host as the front end holds it: its exchanges, bindings and operations.

Each vhost has its own :class:`~trimaran.amqp091.exchanges.ExchangeRegistry` (RabbitMQ's
exchanges and bindings are per vhost; durable ones are saved and restored under the vhost's name),
its own router endpoints for ``amq.topic`` bindings, and an :class:`Operations` that works on
them. Queues stay in the one queue manager under their keys, the client's name behind the vhost's
prefix (trimaran/vhosts.py), so the manager, the queue metadata and the consumers need no vhost of
their own. A connection's tenant is chosen at ``connection.open``; ``/`` is the front end's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from trimaran.amqp091.durable import DurableExchanges
from trimaran.amqp091.exchanges import ExchangeRegistry
from trimaran.amqp091.operations import Operations
from trimaran.amqp091.queues import RouterBinding
from trimaran.vhosts import prefix

if TYPE_CHECKING:
    from trimaran.amqp091 import spec
    from trimaran.amqp091.channels import ChannelState, Consumer
    from trimaran.amqp091.conn import Amqp091Conn, Pending
    from trimaran.amqp091.properties import BasicProperties
    from trimaran.amqp091.queues import QueueMeta
    from trimaran.broker.core import Broker
    from trimaran.broker.message import Message
    from trimaran.queue.groups import Selects
    from trimaran.queue.manager import QueueManager
    from trimaran.security.guard import Security
    from trimaran.storage.amqp_store import AmqpStore


class Front(Protocol):
    """The front end (``handler.Amqp091FrontEnd``) as its vhosts see it."""

    @property
    def broker(self) -> Broker: ...

    @property
    def manager(self) -> QueueManager: ...

    @property
    def amqp_store(self) -> AmqpStore | None: ...

    @property
    def meta(self) -> dict[str, QueueMeta]: ...

    @property
    def consumers(self) -> dict[str, set[Consumer]]: ...

    @property
    def reply_to(self) -> dict[str, ChannelState]: ...

    @property
    def security(self) -> Security: ...

    @property
    def selecting(self) -> Callable[[str], Selects] | None: ...

    def on_event(self, conn: Any, event: Any) -> Awaitable[None] | None: ...

    def content(self, conn: Any, event: Any) -> None: ...

    def content_run(self, conn: Any, event: Any) -> None: ...

    async def finish(self, conn: Any) -> None: ...

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

    def watch_expiry(self) -> None: ...

    def deliver_from_router(self, binding: Any, message: Message, tenant: Any = None) -> None: ...

    def stalled(self, conn: Any, consumer: Any, idle_s: float) -> None: ...


class Tenant:
    """One vhost: ``exchanges``, ``router_bindings`` and ``store`` of its own, the rest the front
    end's (:class:`~trimaran.amqp091.operations.Host`)."""

    def __init__(self, front: Front, vhost: str) -> None:
        self.front = front
        self.vhost = vhost
        self.prefix = prefix(vhost)  # in front of its queue keys and amq.topic topics
        self.exchanges = ExchangeRegistry(vhost)
        self.router_bindings: dict[tuple[str, str], RouterBinding] = {}
        amqp_store = front.amqp_store
        self.store = DurableExchanges(amqp_store, vhost) if amqp_store is not None else None
        self.ops = Operations(self)

    @property
    def broker(self) -> Broker:
        return self.front.broker

    @property
    def manager(self) -> QueueManager:
        return self.front.manager

    @property
    def meta(self) -> dict[str, QueueMeta]:
        return self.front.meta

    @property
    def consumers(self) -> dict[str, set[Consumer]]:
        return self.front.consumers

    @property
    def reply_to(self) -> dict[str, ChannelState]:
        return self.front.reply_to

    @property
    def security(self) -> Security:
        return self.front.security

    @property
    def selecting(self) -> Callable[[str], Selects] | None:
        return self.front.selecting

    def on_event(self, conn: Any, event: Any) -> Awaitable[None] | None:
        return self.front.on_event(conn, event)

    def content(self, conn: Any, event: Any) -> None:
        self.front.content(conn, event)

    def content_run(self, conn: Any, event: Any) -> None:
        self.front.content_run(conn, event)

    async def finish(self, conn: Any) -> None:
        await self.front.finish(conn)

    def publish(
        self,
        conn: Amqp091Conn,
        channel: ChannelState,
        method: spec.BasicPublish,
        props: BasicProperties,
        body: bytes,
        entry: Pending | None = None,
        encoded: bytes | None = None,
    ) -> None:
        self.front.publish(conn, channel, method, props, body, entry, encoded)

    def forget_consumer(self, consumer: Consumer) -> None:
        self.front.forget_consumer(consumer)

    def forget_reply_to(self, channel: ChannelState) -> None:
        self.front.forget_reply_to(channel)

    def watch_expiry(self) -> None:
        self.front.watch_expiry()

    def deliver_from_router(self, binding: Any, message: Message) -> None:
        """A router match for one of this vhost's ``amq.topic`` bindings."""
        self.front.deliver_from_router(binding, message, self)

    def stalled(self, conn: Any, consumer: Any, idle_s: float) -> None:
        self.front.stalled(conn, consumer, idle_s)
