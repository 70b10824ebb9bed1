"""What the modules below the front end see of it and of a connection: small protocols, so that
``channels.py``, ``conn.py`` and ``queues.py`` import neither ``handler.py`` nor ``conn.py`` above
them (imports go down only). ``handler.Amqp091FrontEnd`` and ``conn.Amqp091Conn`` implement them.

The package's floors, bottom up: the sans-IO codec and machine (``errors``, ``fields``, ``spec``,
``properties``, ``frames``, ``connection``, ``events``, ``channel``, ``exchanges``), ``mapping``,
this module, ``channels``, ``conn``, ``queues``, ``access``, ``durable``, ``operations`` and
``handler`` on top.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trimaran.amqp091.connection import ServerConnection
    from trimaran.broker.core import Broker
    from trimaran.broker.message import Message
    from trimaran.runtime.transport import Conn


class FrontEnd(Protocol):
    """The front end as a connection, its channels and the router bindings call it. The
    connection and binding arguments are typed ``Any`` here: their classes live above this floor."""

    @property
    def broker(self) -> Broker: ...

    def on_event(self, conn: Any, event: Any) -> Awaitable[None] | None: ...

    def content(self, conn: Any, event: Any) -> None: ...

    def content_run(self, conn: Any, event: Any) -> None: ...

    async def finish(self, conn: Any) -> None: ...

    def deliver_from_router(self, binding: Any, message: Message) -> None: ...

    def stalled(self, conn: Any, consumer: Any, idle_s: float) -> None: ...


class ChannelOwner(Protocol):
    """A connection as its channels see it (``conn.Amqp091Conn``)."""

    @property
    def io(self) -> Conn: ...

    @property
    def name(self) -> str: ...

    @property
    def amqp(self) -> ServerConnection: ...

    @property
    def front(self) -> FrontEnd: ...

    @property
    def written_hooks(self) -> set[Any]: ...

    def wake(self) -> None: ...

    def release(self, consumer: Any) -> None: ...
