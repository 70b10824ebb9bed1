"""One MQTT network connection as the runtime's hull: the machine, the runtime's I/O handle, and the
session endpoint and queue bindings it serves while connected."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from trimaran.broker.message import PROTOCOL_MQTT
from trimaran.mqtt.connection import ServerConnection
from trimaran.mqtt.packets import Publish, PublishRun
from trimaran.mqtt.queues import ConnQueues, MqttQueues, QueueEndpoint, send_acks
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.runtime.machine import Machine
from trimaran.runtime.transport import Conn, Hull
from trimaran.vhosts import prefix

if TYPE_CHECKING:
    from trimaran.security.guard import Principal

log = logging.getLogger(__name__)

#: The session endpoint a connection serves: ``handler.MqttEndpoint``, above this module.
E = TypeVar("E", bound=QueueEndpoint)


class FrontEnd(Generic[E]):
    """The front end as a connection calls it (``handler.MqttFrontEnd``, above this module). A base
    class rather than a Protocol: compiled, a connection calls its methods directly, where a
    Protocol's method was looked up by name at every call (every read's PUBLISHes)."""

    queues: MqttQueues | None
    endpoints: dict[str, E]
    # QoS 1/2 messages (bytes) queued for one connected subscriber above which its publishers are
    # held (handler.MqttEndpoint.deliver); they go on below half of each.
    backpressure_messages: int
    backpressure_bytes: int
    # The server stops (MqttConn.shutdown): the connections it closes publish no will. The front
    # end's, not a flag of every connection: a shutdown closes them all (8 bytes each, issue 47).
    shutting_down: bool

    def publish_received(self, conn: MqttConn, publish: Publish) -> None:
        raise NotImplementedError

    def run_received(self, conn: MqttConn, run: PublishRun) -> None:
        raise NotImplementedError

    def handle(self, conn: MqttConn, event: object) -> Awaitable[None] | None:
        raise NotImplementedError


class MqttConn(Hull):
    """The connection, and the client the broker's registry lists while it is logged in
    (``broker.clients.Client``: its id, user and vhost are those of its session and login)."""

    __slots__ = (
        "_queue_bindings",
        "endpoint",
        "front",
        "io",
        "mqtt",
        "principal",
        "serial",
        "since_ms",
        "slot",
    )

    def __init__(
        self, front: FrontEnd[Any], mqtt: ServerConnection, io: Conn, machine: Machine | None = None
    ):
        self.front = front
        self.mqtt = mqtt
        # What the runtime feeds: the MQTT machine itself, or a WebSocket machine around it.
        self.machine = mqtt if machine is None else machine
        self.io = io
        # The session it serves (``handler.MqttEndpoint``, above this module; None before its login
        # and after a takeover). Any, not a type variable: compiled, a generic class gets a __dict__
        # and a weak-reference slot, 16 bytes of every connection (issue 47). Its readers in the
        # handler name its type (``endpoint: MqttEndpoint | None = conn.endpoint``).
        self.endpoint: Any = None
        # Who logged in, once it remembers a check (the front end's _who: most never do); the
        # login's user and vhost are the runtime connection's.
        self.principal: Principal | None = None
        self._queue_bindings: ConnQueues | None = None  # made when the connection first uses a queue
        self.serial = 0  # its number in the client registry: 0 until its login was accepted
        self.since_ms = 0
        self.slot = -1  # its index in the registry's list, -1 when not in it

    # -- the client registry's Client ------------------------------------------------------------------

    @property
    def peer(self) -> str:
        return self.io.peer

    @property
    def client_id(self) -> str:
        """The session's key: its client id behind its vhost's prefix (made when asked, and the
        same after the connection left its session: a handover's events name it)."""
        return prefix(self.io.vhost) + self.mqtt.client_id

    @property
    def protocol(self) -> str:
        return PROTOCOL_MQTT

    @property
    def user(self) -> str | None:
        return self.io.user

    @property
    def vhost(self) -> str:
        return self.io.vhost

    def kick(self) -> None:
        """An operator closes the connection (admin API): DISCONNECT 0x98 where the protocol has it."""
        log.info("mqtt: client %r disconnected by an administrator", self.client_id)
        self.close(ReasonCode.ADMINISTRATIVE_ACTION, "disconnected by an administrator")

    @property
    def queue_bindings(self) -> ConnQueues:
        """This connection's queue subscriptions, deliveries and pending acks; most connections never
        touch a queue, so an idle one carries none of it."""
        bindings = self._queue_bindings
        if bindings is None:
            bindings = self._queue_bindings = ConnQueues()
        return bindings

    @property
    def uses_queues(self) -> bool:
        return self._queue_bindings is not None

    # -- the runtime's Hull --------------------------------------------------------------------------

    def handle(self, event: object) -> Awaitable[None] | None:
        if type(event) is PublishRun:  # the hot paths, one call shorter
            self.front.run_received(self, event)
            return None
        if type(event) is Publish:
            self.front.publish_received(self, event)
            return None
        return self.front.handle(self, event)

    def quiet(self) -> bool:
        # (A WebSocket machine around the MQTT one is always flushed: it frames what it sends.)
        return self.machine is self.mqtt and self._queue_bindings is None and self.mqtt.quiet

    def before_write(self) -> None:
        bindings = self._queue_bindings
        if bindings is not None and bindings.acks_due:
            send_acks(self)  # the queue publishes committed since the last write

    def written(self) -> None:
        queues = self.front.queues
        if queues is not None and self._queue_bindings is not None:
            queues.after_events(self)  # queue credit given back once per batch, not per packet
            queues.after_write(self)

    def shutdown(self) -> None:
        """The server stops: 5.0 clients get DISCONNECT 0x8B; wills are not published."""
        self.front.shutting_down = True
        self.mqtt.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")

    def blocked(self, on: bool, why: str) -> None:
        """MQTT has no way to say so: the runtime simply stops reading the socket."""

    def behind(self) -> int | None:
        """The session's queue above half its high-water mark: the count of messages it has taken
        from the queue so far (its progress), else None."""
        session = self.mqtt.session
        if session is None:
            return None
        queue = session.queue
        front = self.front
        if queue.over(front.backpressure_messages >> 1, front.backpressure_bytes >> 1):
            return queue.first_seq
        return None

    def stalled(self, idle_s: float) -> None:
        """It took nothing while its publishers waited: it goes (a persistent session keeps what it
        had queued, up to its offline bound from then on), and they go on."""
        session = self.mqtt.session
        queued = 0 if session is None else len(session.queue)
        log.warning(
            "mqtt: %s (%s) took no message for %.0f s with %d queued for it; disconnected so that its "
            "publishers go on (limits.stalled_consumer_timeout_s)",
            self.mqtt.client_id,
            self.peer,
            idle_s,
            queued,
        )
        self.close(ReasonCode.QUOTA_EXCEEDED, "took no message while its publishers waited")

    def finish(self) -> Callable[[], Coroutine[Any, Any, None]] | None:
        queues = self.front.queues
        if queues is not None and self._queue_bindings is not None:
            return partial(queues.detach, self)
        return None  # a connection that never consumed from a queue holds nothing to give back

    # -- what the front end and the queues call ------------------------------------------------------

    def wake(self) -> None:
        self.io.wake()

    def spawn(self, job: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Run a coroutine for this connection in the runtime's task group."""
        self.io.spawn(job)

    def close(self, reason_code: int, reason: str) -> None:
        """Server-initiated close: DISCONNECT (5.0) after what is queued, then the socket."""
        self.mqtt.disconnect(reason_code, reason)
        self.io.pump()
