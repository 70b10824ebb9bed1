"""The deck: the one topic router and retained store every front end publishes into.

``Broker.publish`` is synchronous and never blocks: each matching subscriber gets the message in
its own bounded outbox (``Endpoint.deliver``). Retained changes are written behind, a batch per
transaction, as Mosquitto persists retained messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from trimaran import __version__
from trimaran.broker.clients import ClientRegistry
from trimaran.broker.events import MESSAGE_PUBLISHED, EventBus
from trimaran.broker.message import Message, now_ms
from trimaran.broker.presence import Presence
from trimaran.broker.retained import RetainedStore
from trimaran.broker.router import Delivery, Router
from trimaran.broker.stats import Stats
from trimaran.errors import first_line
from trimaran.vhosts import DEFAULT_VHOST, TENANT, VHosts, prefix, split_key, vhost_of

log = logging.getLogger(__name__)

RETAINED_FLUSH_DELAY = 0.05  # gather retained changes this long before one transaction
RETAINED_RETRY_FIRST = 0.1  # a failed retained write is kept and retried after this, doubling
RETAINED_RETRY_MAX = 5.0


class RetainedPersistence(Protocol):
    """Where retained messages are kept across restarts: the deck's port, which storage implements
    (trimaran.storage.mqtt_store.MqttStore), so the deck never imports storage."""

    def load_retained(self) -> list[Message]: ...

    def write_retained(self, changes: Mapping[str, Message | None]) -> None:
        """One transaction; ``None`` deletes."""
        ...


class Endpoint(Protocol):
    """A subscriber of any protocol: an MQTT session, an AMQP queue binding, an AMQP 1.0 link."""

    @property
    def id(self) -> str: ...

    def __hash__(self) -> int: ...

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        """Take the message into a bounded outbox; never block (drop and count when full)."""


class Forwarder(Protocol):
    """The deck's port to other nodes (trimaran.cluster implements it; app.py wires it).

    ``forward`` hands a publish to every other node with a matching route, without blocking, and
    returns how many nodes it went to and the share groups ``(group, filter)`` another node serves
    this time (the publishing node then skips its own members of those groups, so a shared message
    reaches one member cluster-wide).
    """

    def forward(self, message: Message) -> tuple[int, frozenset[tuple[str, str]]]: ...

    def retained_written(self, topics: list[str]) -> None:
        """Retained changes to these topics were committed: other nodes reload them."""


class TenantFigures(Protocol):
    """Each vhost's figures the deck does not hold (app.py joins the runtime's and the queues'):
    ``vhost -> {$SYS topic: value}``, for the vhosts other than ``/``."""

    def __call__(self) -> Mapping[str, Mapping[str, int]]: ...


class Broker:
    def __init__(
        self,
        store: RetainedPersistence | None = None,
        *,
        sys_interval: float = 10.0,
        node_name: str | None = None,
        vhosts: VHosts | None = None,
    ) -> None:
        # Which vhosts exist (hulls ask at login); keys carry the vhost (trimaran/vhosts.py), so the
        # router and retained store below are shared by all of them without meeting across them.
        self.vhosts = vhosts if vhosts is not None else VHosts()
        self.router: Router[Any] = Router()
        self.clients = ClientRegistry()
        self.retained = RetainedStore(on_change=self._retained_changed)
        self.stats = Stats()
        self.events = EventBus()  # webhooks listen here; every front end emits into it
        self.presence = Presence(self.clients, self.stats, self.events)
        self.store = store
        self.sys_interval = sys_interval
        self.node_name = node_name  # $SYS/broker/node: each node of a cluster publishes its own $SYS
        self.started_at = time.monotonic()
        self._retained_changes: dict[str, Message | None] = {}
        self._retained_dirty = anyio.Event()
        # A retained write that failed is kept and retried; these say so in /metrics and /readyz.
        self.retained_write_failures = 0
        self.retained_write_error: str | None = None  # the last failure, until a write succeeds
        self.forwarder: Forwarder | None = None  # set when this node is one of several
        self.tenant_figures: TenantFigures | None = None  # a tenant's traffic and queues, for its $SYS
        # More of the broker's own $SYS topics, from below the deck (the runtime's flow control),
        # read at publish time: topic -> value.
        self.sys_figures: Callable[[], dict[str, int]] | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Load retained messages, then write retained changes behind and publish $SYS."""
        if self.store is not None:
            loaded = await anyio.to_thread.run_sync(self.store.load_retained)
            self.retained.load(loaded)
            log.info("loaded %d retained messages", len(loaded))
        async with anyio.create_task_group() as tg:
            if self.store is not None:
                tg.start_soon(self._write_retained_behind)
            if self.sys_interval > 0:
                tg.start_soon(self._publish_sys)
            task_status.started()

    async def flush(self) -> None:
        """Write every retained change still in memory (behind, and at shutdown).

        On failure the changes stay in memory (a change made meanwhile is newer and wins) and the
        error is raised: the writer behind retries them, never forgets them."""
        if self.store is None or not self._retained_changes:
            return
        changes, self._retained_changes = self._retained_changes, {}
        try:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.store.write_retained, changes)
        except BaseException:
            changes.update(self._retained_changes)
            self._retained_changes = changes
            raise
        if self.retained_write_error is not None:
            log.info("retained messages written again after %d failed writes", self.retained_write_failures)
            self.retained_write_error = None
        if self.forwarder is not None:
            self.forwarder.retained_written(list(changes))

    @property
    def retained_unwritten(self) -> int:
        """Retained changes in memory not yet written."""
        return len(self._retained_changes)

    async def _write_retained_behind(self) -> None:
        retry = RETAINED_RETRY_FIRST
        while True:
            await self._retained_dirty.wait()
            self._retained_dirty = anyio.Event()
            await anyio.sleep(RETAINED_FLUSH_DELAY)
            try:
                await self.flush()
            except Exception as exc:
                self.retained_write_failures += 1
                first = self.retained_write_error is None
                self.retained_write_error = first_line(exc)
                log.error(
                    "writing %d retained changes failed, kept in memory and retried in %.1f s: %s",
                    len(self._retained_changes),
                    retry,
                    self.retained_write_error,
                    exc_info=first,  # the whole story once, then one line per retry
                )
                self._retained_dirty.set()
                await anyio.sleep(retry)
                retry = min(retry * 2, RETAINED_RETRY_MAX)
            else:
                retry = RETAINED_RETRY_FIRST

    # -- publish ----------------------------------------------------------------------------------

    def publish(self, message: Message) -> int:
        """Route a pub/sub message to every matching subscriber; returns how many got it (another
        node it was forwarded to counts as one: AMQP 0.9.1's mandatory flag asks whether anyone did)."""
        if message.retain:
            self.retained.set(message)
        deliveries = self.router.match(message.topic, message.publisher_id)
        nodes = 0
        if self.forwarder is not None:
            nodes, elsewhere = self.forwarder.forward(message)
            if elsewhere:
                deliveries = [d for d in deliveries if _share_key(d) not in elsewhere]
        for delivery in deliveries:
            delivery.subscriber.deliver(message, delivery)
        self.stats.publish_routed += 1
        if self.events.publishing:
            self.events.message(MESSAGE_PUBLISHED, message, subscribers=len(deliveries))
        return len(deliveries) + nodes

    def route_run(self, topic: str, publisher_id: str, count: int) -> Sequence[Delivery[Any]] | None:
        """Where ``count`` messages to ``topic`` from one publisher go, matched once (a hull's run
        of plain messages: not retained, no expiry, no properties), counted as routed. None when each
        must take :meth:`publish` on its own: other nodes are told of each, or the event bus
        listens for each. Deliveries of a share group are this match's pick, for the run's first
        message: :meth:`deliver_each` picks again for the others."""
        if self.forwarder is not None or self.events.publishing:
            return None
        self.stats.publish_routed += count
        return self.router.match(topic, publisher_id)

    def deliver_each(self, messages: list[Message], deliveries: list[Delivery[Any]]) -> None:
        """A routed run's messages (:meth:`route_run`) to the ``deliveries`` that did not take it
        whole, one message at a time as :meth:`publish` would: a share group's member is picked
        again for each message after the first."""
        plain = [d for d in deliveries if d.share_group is None]
        shared = len(plain) < len(deliveries)
        for i, message in enumerate(messages):
            if i and shared:
                picked = self.router.match(message.topic, message.publisher_id)
                deliveries = plain + [d for d in picked if d.share_group is not None]
            for delivery in deliveries:
                delivery.subscriber.deliver(message, delivery)

    def deliver_forwarded(self, message: Message, shares: frozenset[tuple[str, str]]) -> int:
        """A publish another node forwarded: delivered to this node's subscribers only (never
        forwarded again, never retained here: the publishing node wrote it), and to this node's
        members of only the share groups ``shares`` names."""
        deliveries = self.router.match(message.topic, message.publisher_id)
        count = 0
        for delivery in deliveries:
            if delivery.share_group is None or _share_key(delivery) in shares:
                delivery.subscriber.deliver(message, delivery)
                count += 1
        return count

    def _retained_changed(self, topic: str, message: Message | None) -> None:
        """The store's own account of a change (set, clear, expiry) is what gets written."""
        if topic[:1] == "$" and split_key(topic)[1].startswith("$SYS/"):
            return  # $SYS values (a tenant's too) are rebuilt at every start, never stored
        self._retained_changes[topic] = message
        self._retained_dirty.set()

    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    # -- $SYS -------------------------------------------------------------------------------------

    def sys_values(self) -> dict[str, str]:
        stats = self.stats
        node = {} if self.node_name is None else {"$SYS/broker/node": self.node_name}
        by_reason: dict[str, int] = {}
        for (reason, _vhost), n in stats.drops.counts.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
        dropped = {f"$SYS/broker/messages/dropped/{why}": str(n) for why, n in sorted(by_reason.items())}
        return {
            **node,
            "$SYS/broker/version": f"trimaran {__version__}",
            "$SYS/broker/uptime": f"{int(self.uptime())} seconds",
            "$SYS/broker/clients/connected": str(stats.clients_connected),
            "$SYS/broker/clients/maximum": str(stats.clients_maximum),
            "$SYS/broker/clients/total": str(stats.clients_total),
            "$SYS/broker/messages/received": str(stats.messages_received),
            "$SYS/broker/messages/sent": str(stats.messages_sent),
            "$SYS/broker/messages/dropped": str(stats.messages_dropped),
            **dropped,
            "$SYS/broker/bytes/received": str(stats.bytes_received),
            "$SYS/broker/bytes/sent": str(stats.bytes_sent),
            "$SYS/broker/subscriptions/count": str(self.router.count()),
            "$SYS/broker/retained messages/count": str(self.retained.count() - self._tenant_retained()[1]),
            **({t: str(n) for t, n in self.sys_figures().items()} if self.sys_figures is not None else {}),
        }

    def tenant_sys_values(self) -> dict[str, dict[str, str]]:
        """Each vhost's own ``$SYS`` (but ``/``'s, which :meth:`sys_values` gives for the whole
        broker): its clients, traffic, subscriptions, retained messages and queues, counted from the
        registry, the router, the retained store and :attr:`tenant_figures` at publish time, so no
        message pays for them. Keyed by vhost (those with a client connected); the topics as its
        clients see them."""
        tenants = [v for v in self.vhosts.names() if v != DEFAULT_VHOST]
        if not tenants:
            return {}
        clients = dict.fromkeys(tenants, 0)
        for client in self.clients:
            if client.vhost in clients:
                clients[client.vhost] += 1
        # A vhost with no client has nobody to tell (its retained values wait for the next tick
        # after one connects): idle tenants cost a tick nothing but this count.
        tenants = [v for v in tenants if clients[v]]
        if not tenants:
            return {}
        subscriptions = _count_by_vhost(s.topic_filter for s in self.router.iter_subscriptions())
        retained = self._tenant_retained()[0]
        figures = self.tenant_figures() if self.tenant_figures is not None else {}
        uptime = f"{int(self.uptime())} seconds"
        values: dict[str, dict[str, str]] = {}
        for vhost in tenants:
            mine = {
                "$SYS/broker/version": f"trimaran {__version__}",
                "$SYS/broker/uptime": uptime,
                "$SYS/broker/clients/connected": str(clients[vhost]),
                "$SYS/broker/subscriptions/count": str(subscriptions.get(vhost, 0)),
                "$SYS/broker/retained messages/count": str(retained.get(vhost, 0)),
            }
            for topic, value in figures.get(vhost, {}).items():
                mine[topic] = str(value)
            values[vhost] = mine
        return values

    def _tenant_retained(self) -> tuple[dict[str, int], int]:
        """The tenants' retained messages by vhost, and how many tenant $SYS values the store holds
        beside them (left out of every count, ``/``'s too, which counted none before tenants had any)."""
        counts: dict[str, int] = {}
        sys_values = 0
        if any(vhost != DEFAULT_VHOST for vhost in self.vhosts.names()):
            for message in self.retained.messages():
                if message.topic.startswith(TENANT):
                    vhost, name = split_key(message.topic)
                    if name.startswith("$SYS/"):
                        sys_values += 1
                    else:
                        counts[vhost] = counts.get(vhost, 0) + 1
        return counts, sys_values

    def publish_sys(self) -> None:
        now = now_ms()
        for topic, value in self.sys_values().items():
            self._publish_sys_value(topic, value, now)
        for vhost, values in self.tenant_sys_values().items():
            key_prefix = prefix(vhost)  # the tenant's $SYS, behind its prefix (trimaran/vhosts.py)
            for topic, value in values.items():
                self._publish_sys_value(key_prefix + topic, value, now)

    def _publish_sys_value(self, topic: str, value: str, now: int) -> None:
        payload = value.encode()
        held = self.retained.get(topic)
        if held is not None and held.payload == payload:
            return  # unchanged: published when it changes, as Mosquitto's $SYS is
        message = Message(topic, payload, retain=True, created_at_ms=now)
        self.retained.set(message)
        for delivery in self.router.match(topic):
            delivery.subscriber.deliver(message, delivery)

    async def _publish_sys(self) -> None:
        while True:
            self.publish_sys()
            await anyio.sleep(self.sys_interval)


def _share_key(delivery: Delivery[Any]) -> tuple[str, str] | None:
    group = delivery.share_group
    member = delivery.member()
    return None if group is None or member is None else (group, member.topic_filter)


def _count_by_vhost(keys: Iterable[str]) -> dict[str, int]:
    """How many of ``keys`` each vhost but ``/`` holds."""
    counts: dict[str, int] = {}
    for key in keys:
        if key.startswith(TENANT):
            vhost = vhost_of(key)
            counts[vhost] = counts.get(vhost, 0) + 1
    return counts
