"""What the modules below the front end see of it and of a connection: small protocols, so that
``links.py`` and ``conn.py`` import neither ``handler.py`` nor ``conn.py`` above them (imports go
down only). ``handler.Amqp1FrontEnd`` and ``conn.Amqp1Conn`` implement them.

The package's floors, bottom up: the sans-IO codec and machine (``types``, ``codec``,
``performatives``, ``messages``, ``frames``, ``sasl``, ``session``, ``connection``, ``events``),
``addresses``, ``mapping``, this module, ``links``, ``conn``, ``subscribers`` and ``coordinator``,
and ``handler`` on top.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trimaran.amqp1.connection import ServerConnection
    from trimaran.amqp1.session import Link
    from trimaran.broker.core import Broker
    from trimaran.broker.message import Message
    from trimaran.queue.groups import Selects
    from trimaran.queue.manager import QueueManager
    from trimaran.queue.policy import QueueError
    from trimaran.runtime.transport import Conn


class FrontEnd(Protocol):
    """The front end as a connection and its links call it. The connection argument is typed
    ``Any`` here: its class lives above this floor."""

    @property
    def broker(self) -> Broker: ...

    @property
    def outbox_size(self) -> int: ...

    def dispatch(self, conn: Any, event: Any) -> Awaitable[None] | None: ...

    def message(self, conn: Any, event: Any) -> None: ...

    async def finished(self, conn: Any) -> None: ...

    def encode_once(self, message: Message, cut: int = 0) -> bytes: ...

    def dropped(self, message: Message, subscriber: str, reason: str, vhost: str) -> None: ...

    def publish_failed(self, conn: Any, queue: str, exc: QueueError) -> Any: ...

    def stalled(self, conn: Any, out: Any, idle_s: float) -> None: ...


class LinkOwner(Protocol):
    """A connection as its links see it (``conn.Amqp1Conn``)."""

    @property
    def front(self) -> FrontEnd: ...

    @property
    def amqp(self) -> ServerConnection: ...

    @property
    def io(self) -> Conn: ...

    @property
    def container_id(self) -> str: ...

    def refill(self, inlink: Any) -> None: ...


class Desk(Protocol):
    """The front end as the helpers it owns (``subscribers.Subscribers``,
    ``coordinator.TransactionCoordinator``) call back into its attach, detach and transfer
    plumbing. Connections, links and events are typed ``Any``: their classes live above."""

    @property
    def broker(self) -> Broker: ...

    @property
    def queues(self) -> QueueManager | None: ...

    def refuse(self, conn: Any, link: Link, condition: str, description: str) -> None: ...

    def refuse_message(self, conn: Any, event: Any, condition: str, description: str) -> None: ...

    def detached(self, conn: Any, event: Any) -> None: ...

    def attach_outlink(self, conn: Any, link: Link, source: Any) -> Awaitable[None] | None: ...

    def consume(self, out: Any, link: Link, selects: Selects | None = None) -> None: ...

    def subscription_event(self, event_type: str, conn: Any, topic_filter: str, **extra: Any) -> None: ...

    async def release_detached(self, conn: Any, out: Any) -> None: ...
