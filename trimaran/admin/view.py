"""What the admin side may see of a running server: small protocols, not the whole application.

The application (trimaran/app.py, the composition root) implements :class:`AdminView`; the MQTT hull
implements the deck's :class:`~trimaran.broker.sessions.SessionDirectory`; the queue manager is
reached through :class:`QueueOps`. So the admin API, the management page and their tests depend on
these few operations only, and ``trimaran.admin`` never imports a protocol hull
(tests/admin/test_imports.py says so).

A part that does not exist yet (the server is starting) raises :class:`NotReady`; the API answers 503.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trimaran.admin.webhooks import Webhooks
    from trimaran.broker.clients import ClientRegistry
    from trimaran.broker.message import Message
    from trimaran.broker.router import Subscription
    from trimaran.broker.sessions import SessionDirectory
    from trimaran.config import QueuePolicySettings
    from trimaran.queue.groups import StoredMessage
    from trimaran.queue.manager import PublishResult, QueueInfo
    from trimaran.tenant_limits import TenantLimits
    from trimaran.vhosts import Permission, TopicPermission, VHosts


class NotReady(Exception):
    """The server is starting: the part asked for is not built yet."""


@dataclass(frozen=True, slots=True)
class Readiness:
    ok: bool
    checks: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ServerCounts:
    """The overview's numbers."""

    connections: dict[str, int]  # open connections per protocol
    sessions: int
    subscriptions: int
    retained: int
    queues: int
    messages: dict[str, int]  # received, sent, dropped, routed
    bytes: dict[str, int]  # received, sent


@dataclass(frozen=True, slots=True)
class BridgeStatus:
    """One bridge to another MQTT broker (a ``[[bridges]]`` table) as an operator reads it: the API,
    ``/metrics``, ``trimaran bridges``, the management page."""

    name: str
    kind: str  # bridge (MQTT, a [[bridges]] table) or shovel (AMQP, a [[shovels]] table)
    address: str  # HOST:PORT of the current or last connection (before the first, as configured)
    client_id: str  # the bridge's client id at the remote (a shovel's connection name)
    protocol_version: str  # mqttv311, mqttv50, amqp091 or amqp10, as configured
    vhost: str  # the local vhost it publishes into and subscribes in
    state: str  # connecting, connected, waiting (for the next try) or stopped
    state_for_s: float  # seconds since the state last changed
    last_error: str | None  # why the last connection failed or ended (kept once connected again)
    connects: int  # connections the remote accepted
    sent: int  # outbound messages handed to the remote (QoS 1/2: acknowledged by it)
    received: int  # inbound messages taken here
    dropped: int  # outbound messages not kept (QoS 0 while away, past queue_bytes while away)
    refused: int  # messages refused by the remote (5.0 reason codes) or by a local queue
    in_flight: int  # outbound messages sent and not yet acknowledged by the remote
    backlog_bytes: int  # payload bytes of outbound QoS 1/2 messages queued or in flight
    queue: str  # its outbound queue, as the vhost's clients name it ($bridge.NAME)
    topics: tuple[str, ...]  # the topic lines, as configured (a shovel's: SOURCE -> DESTINATION)


class QueueOps(Protocol):
    """The durable queues' operations an operator uses (the queue manager has them)."""

    @property
    def queues(self) -> Mapping[str, Any]: ...

    def exists(self, name: str) -> bool: ...

    def info(self, name: str) -> QueueInfo: ...

    async def declare(
        self, name: str, policy: QueuePolicySettings | None = None, *, durable: bool = True
    ) -> QueueInfo: ...

    async def delete(self, name: str) -> None: ...

    async def purge(self, name: str) -> int: ...

    def peek(self, name: str, after: int = -1, limit: int = 100) -> list[StoredMessage]: ...

    async def peek_stored(self, name: str, after: int = -1, limit: int = 100) -> list[StoredMessage]:
        """``peek``, and on a shared work queue (each node holds only its claims) its stored rows."""
        ...

    async def redrive(self, name: str, limit: int | None = None) -> int: ...

    async def publish(self, queue: str, message: Message, routing_key: str = "") -> PublishResult: ...


class PermissionOps(Protocol):
    """RabbitMQ's set_permissions: who may enter which vhost and do what there (no row, no entry;
    the security module keeps them and enforces their patterns)."""

    def permissions(self, vhost: str | None = None) -> list[Permission]: ...

    def user_exists(self, name: str) -> bool: ...

    def topic_permissions(self, vhost: str | None = None) -> list[TopicPermission]: ...

    async def set_topic_permission(self, permission: TopicPermission) -> None: ...

    async def clear_topic_permission(self, user: str, vhost: str, exchange: str | None = None) -> int: ...

    async def set_permission(self, permission: Permission) -> None: ...

    async def clear_permission(self, user: str, vhost: str) -> bool: ...


class AdminView(Protocol):
    """The running server as the admin API sees it."""

    @property
    def node(self) -> str: ...

    @property
    def started_at(self) -> float:
        """Epoch seconds."""
        ...

    @property
    def webhooks(self) -> Webhooks | None:
        """The webhook dispatchers (admin's own), once started."""
        ...

    async def readiness(self) -> Readiness:
        """Storage reachable (within its time-out), listeners bound, accepting, writes keeping up."""
        ...

    def counts(self) -> ServerCounts: ...

    def clients(self) -> ClientRegistry:
        """Every protocol's connected clients; each can be kicked."""
        ...

    def subscriptions(self) -> Iterator[Subscription[Any]]:
        """Pub/sub subscriptions of every protocol."""
        ...

    def publish(self, message: Message) -> int:
        """Publish to a pub/sub topic as a client would; returns the subscribers reached."""
        ...

    async def publish_to_queue(self, queue: str, message: Message, routing_key: str) -> PublishResult:
        """Append to a durable queue; returns once committed. Raises QueueError when refused."""
        ...

    def queue_ops(self) -> QueueOps: ...

    def session_directory(self) -> SessionDirectory: ...

    async def cluster_nodes(self) -> dict[str, Any] | None:
        """The nodes sharing this database with their state (``cluster.enabled``); None alone."""
        ...

    def vhost_registry(self) -> VHosts:
        """The vhosts that exist; adding and deleting them persists."""
        ...

    def permission_ops(self) -> PermissionOps: ...

    def tenant_limits(self) -> TenantLimits:
        """The limits per vhost and per user in force; changing them takes effect at once."""
        ...

    def reload_security(self) -> bool:
        """Read the password and rule files again; False (the old ones stay) when one cannot be read."""
        ...

    def bridge_statuses(self) -> list[BridgeStatus]:
        """Each bridge, in the settings' order. Also called off the event loop (OTLP's export thread)."""
        ...

    def restart_bridge(self, name: str) -> bool:
        """Drop the bridge's connection and connect again at once; False: no bridge of that name."""
        ...

    async def reload_bridges(self) -> dict[str, list[str]] | None:
        """The ``[[bridges]]`` read again from the settings, as SIGHUP does: the names ``added``,
        ``removed`` and ``changed``. None: the settings could not be read (the bridges go on)."""
        ...
