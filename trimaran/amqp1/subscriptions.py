"""Durable and shared topic subscriptions the way JMS clients name them (Qpid JMS
``createDurableSubscriber``, ``createSharedDurableConsumer``, ``createSharedConsumer``).

A receiver on a topic address whose source asks for ``durable`` (configuration or unsettled-state)
with ``expiry-policy never``, or carries the ``shared`` capability, subscribes a queue to the
topic instead of itself: the subscription is a ``$queue/`` work queue (durable for a durable
subscription) fed by the router, so messages published while no receiver is attached wait in it
whatever protocol published them, and each receiver is a consumer of that queue.

Its name, as Qpid JMS makes it:

- not shared: the container id and the link name (the JMS client id and subscription name);
- shared: the link name up to the first ``|`` (Qpid JMS adds ``|2``, ``|3`` ... for further
  consumers on a connection, ``|global`` without a client id, ``|volatile`` when not durable), with
  the container id, or without it when the source carries the ``global`` capability.

The queue is ``jms:<container id or global>:<name>`` in the connection's vhost (characters a queue
name cannot hold become ``_``). A durable subscription ends with a detach that says ``closed``
(JMS unsubscribe), a shared non-durable one when its last receiver goes. A durable receiver that
attaches again with another topic or selector replaces the subscription (as JMS says), unless
another receiver is attached to it.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Final

from trimaran.amqp1.performatives import Source
from trimaran.amqp1.selection import SELECTOR_FILTER, find_selector
from trimaran.amqp1.types import Described, Symbol
from trimaran.queue.policy import QueueError
from trimaran.vhosts import describe, split_key

if TYPE_CHECKING:
    from trimaran.broker.message import Message
    from trimaran.broker.router import Delivery
    from trimaran.queue.groups import Selects
    from trimaran.queue.manager import QueueManager

log = logging.getLogger(__name__)

SHARED: Final = Symbol("shared")
GLOBAL: Final = Symbol("global")
EXPIRY_NEVER: Final = Symbol("never")
PREFIX: Final = "jms:"
#: The durable subscriptions, kept in the database's meta table (one small JSON map, written when
#: one is made or removed) so that a restart subscribes their queues to their topics again.
META_KEY: Final = "amqp1.durable-subscriptions"


def _clean(text: str) -> str:
    return "".join("_" if c in "/+#\x00" else c for c in text)


def subscription_queue(container_id: str, link_name: str, capabilities: Any, vhost_prefix: str = "") -> str:
    """The queue key of the subscription a topic receiver names (see the module docstring)."""
    caps = {str(c) for c in capabilities or ()}
    if SHARED in caps:
        name = link_name.split("|", 1)[0]
        scope = "global" if GLOBAL in caps else container_id
    else:
        name, scope = link_name, container_id
    return f"{vhost_prefix}{PREFIX}{_clean(scope)}:{_clean(name)}"


def unsubscribe_candidates(container_id: str, link_name: str, vhost_prefix: str = "") -> list[str]:
    """The subscriptions a link without a source (Qpid JMS's unsubscribe) may name, most
    specific first: the container's own by the whole link name, shared by the name before
    ``|``, then a global one."""
    names = [
        subscription_queue(container_id, link_name, (), vhost_prefix),
        subscription_queue(container_id, link_name, (SHARED,), vhost_prefix),
        subscription_queue(container_id, link_name, (SHARED, GLOBAL), vhost_prefix),
    ]
    return list(dict.fromkeys(names))


def saved(subscriptions: list[Subscription]) -> str:
    """The durable ones as the meta table keeps them: queue -> what the attach asked for."""
    rows: dict[str, Any] = {}
    for sub in subscriptions:
        if not sub.durable:
            continue
        source = sub.source
        selector = find_selector(source.filter)
        rows[sub.queue] = {
            "address": source.address,
            "topic": sub.topic,
            "durable": int(source.durable),
            "capabilities": [str(c) for c in source.capabilities or ()],
            "shared": sub.shared,
            "selector": None if selector is None else [str(selector[0]), str(selector[1].value)],
        }
    return json.dumps(rows, sort_keys=True)


def loaded(text: str | None) -> dict[str, tuple[Source, str, bool, str | None]]:
    """:func:`saved`'s map read back: queue -> (its source, topic, shared, selector text)."""
    if not text:
        return {}
    out: dict[str, tuple[Source, str, bool, str | None]] = {}
    for queue, row in json.loads(text).items():
        selector = row.get("selector")
        source = Source(
            address=row["address"],
            durable=int(row["durable"]),
            expiry_policy=EXPIRY_NEVER,
            capabilities=[Symbol(c) for c in row["capabilities"]],
            filter=None
            if selector is None
            else {Symbol(selector[0]): Described(SELECTOR_FILTER, selector[1])},
        )
        out[queue] = (source, row["topic"], bool(row["shared"]), None if selector is None else selector[1])
    return out


class Subscription:
    """One topic subscription: the router's subscriber that appends what it selects to the
    subscription's queue, and the receivers consuming that queue."""

    __slots__ = ("durable", "links", "manager", "queue", "selector", "selects", "shared", "source", "topic")

    def __init__(
        self,
        manager: QueueManager,
        queue: str,
        topic: str,
        *,
        durable: bool,
        shared: bool,
        selector: str | None,
        selects: Selects | None,
        source: Any,
    ) -> None:
        self.manager = manager
        self.queue = queue
        self.topic = topic  # the router filter it is subscribed with
        self.durable = durable
        self.shared = shared
        self.selector = selector  # its text: another one asked of a durable subscription replaces it
        self.selects = selects
        self.source = source  # the source it was made with: the answer to a sourceless attach
        self.links: set[object] = set()  # its receivers (links.QueueOut, which imports this module)

    @property
    def id(self) -> str:
        return f"amqp1-subscription:{self.queue}"

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        """A router match: into the queue (without a publisher to confirm to)."""
        selects = self.selects
        if selects is not None and not selects(message):
            return
        if message.retain:
            message = message.copy_with(retain=False)
        try:
            self.manager.publish_nowait(self.queue, message)
        except QueueError as exc:
            topic = split_key(message.topic)[1]
            log.info(
                "amqp1: the subscription %s dropped a message of topic %r: %s",
                describe(self.queue),
                topic,
                exc,
            )
