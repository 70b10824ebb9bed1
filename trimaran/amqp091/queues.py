"""AMQP 0.9.1 queues on the queue manager: declare arguments -> policy, and router-backed bindings.

A queue declared over AMQP is a queue of the manager (DESIGN.md): durable ones are its SQL queues,
exclusive, auto-delete and non-durable ones live in memory. The RabbitMQ arguments map onto
:class:`~trimaran.config.QueuePolicySettings`:

=============================  ==================================================================
x-message-ttl (ms)             ``ttl_s``
x-max-length / -bytes          ``max_length`` / ``max_length_bytes``
x-overflow                     ``overflow``: drop-head (the default) -> drop-oldest (dead-lettered
                               with reason maxlen when there is a dead-letter exchange),
                               reject-publish -> reject, reject-publish-dlx -> reject-dead-letter
                               (refused, and dead-lettered with reason maxlen)
x-dead-letter-exchange / -key  ``dead_letter_exchange`` / ``dead_letter_routing_key``: rejected,
                               expired and over-the-limit messages are routed through the exchange
                               when they die (bindings made later count), with RabbitMQ's x-death;
                               no dead-letter exchange -> they are dropped, as in RabbitMQ
x-queue-type                   classic, quorum -> work; stream -> stream
x-delivery-limit               ``max_attempts`` (default: unlimited, as for a classic queue)
x-expires (ms)                 kept by the front end: the queue is deleted after that long unused
=============================  ==================================================================

Requeue (nack/reject with requeue) is immediate, as in RabbitMQ: no backoff.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trimaran.amqp091.fields import FieldTable, Timestamp
from trimaran.amqp091.spec import PRECONDITION_FAILED, ProtocolError
from trimaran.broker.message import Message
from trimaran.broker.router import Delivery
from trimaran.config import QueuePolicySettings

if TYPE_CHECKING:
    from trimaran.amqp091.conn import Amqp091Conn
    from trimaran.amqp091.ports import FrontEnd

log = logging.getLogger(__name__)

#: A classic queue has no delivery limit; the manager needs one.
UNLIMITED_ATTEMPTS = 1_000_000_000
#: RabbitMQ's consumer_timeout (30 min) is the closest thing it has to a visibility timeout.
CONSUMER_TIMEOUT_S = 1800.0

QUEUE_TYPES = {"classic": "work", "quorum": "work", "stream": "stream"}
OVERFLOW = {
    "drop-head": "drop-oldest",
    "reject-publish": "reject",
    "reject-publish-dlx": "reject-dead-letter",
}


@dataclass(slots=True)
class QueueMeta:
    """What RabbitMQ knows of a queue and the manager does not."""

    name: str
    durable: bool
    exclusive_owner: Amqp091Conn | None = None  # the connection of an exclusive queue
    auto_delete: bool = False
    expires_ms: int | None = None
    arguments: FieldTable = field(default_factory=dict)
    had_consumer: bool = False
    unused_since: float = 0.0  # monotonic, for x-expires
    declared: bool = False  # declared over AMQP in this process: its arguments are known


def _int_arg(queue: str, name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProtocolError(
            PRECONDITION_FAILED,
            f"invalid arg '{name}' for queue '{queue}' in vhost '/': "
            f"{value!r} is not an integer >= {minimum}",
            class_id=50,
            method_id=10,
        )
    return int(value)


def _str_arg(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def policy_from_arguments(
    queue: str, arguments: FieldTable, defaults: QueuePolicySettings
) -> QueuePolicySettings:
    """The manager policy for a queue.declare's arguments (406 for a value RabbitMQ refuses)."""
    update: dict[str, Any] = {
        "max_attempts": UNLIMITED_ATTEMPTS,
        "backoff_initial_s": 0.0,
        "backoff_max_s": 0.0,
        "visibility_timeout_s": CONSUMER_TIMEOUT_S,
        "dead_letter": "none",
        "overflow": "drop-oldest",  # RabbitMQ's default x-overflow: drop-head
        "dead_letter_exchange": None,
        "dead_letter_routing_key": None,
    }
    dead_letter = dead_letter_arguments(arguments)
    if dead_letter is not None:
        update["dead_letter_exchange"], update["dead_letter_routing_key"] = dead_letter
    kind = _str_arg(arguments.get("x-queue-type", "classic"))
    if kind not in QUEUE_TYPES:
        raise ProtocolError(
            PRECONDITION_FAILED,
            f"invalid arg 'x-queue-type' for queue '{queue}' in vhost '/': {kind!r} "
            "is not classic, quorum or stream",
            class_id=50,
            method_id=10,
        )
    update["mode"] = QUEUE_TYPES[kind]
    if "x-message-ttl" in arguments:
        update["ttl_s"] = max(_int_arg(queue, "x-message-ttl", arguments["x-message-ttl"]), 1) / 1000
    if "x-max-length" in arguments:
        update["max_length"] = max(1, _int_arg(queue, "x-max-length", arguments["x-max-length"]))
    if "x-max-length-bytes" in arguments:
        update["max_length_bytes"] = max(
            1, _int_arg(queue, "x-max-length-bytes", arguments["x-max-length-bytes"])
        )
    if "x-delivery-limit" in arguments:
        update["max_attempts"] = 1 + _int_arg(queue, "x-delivery-limit", arguments["x-delivery-limit"])
    if "x-overflow" in arguments:
        overflow = _str_arg(arguments["x-overflow"])
        if overflow not in OVERFLOW:
            raise ProtocolError(
                PRECONDITION_FAILED,
                f"invalid arg 'x-overflow' for queue '{queue}' in vhost '/': {overflow!r}",
                class_id=50,
                method_id=10,
            )
        update["overflow"] = OVERFLOW[overflow]
    if "x-expires" in arguments:
        _int_arg(queue, "x-expires", arguments["x-expires"], 1)
    return defaults.model_copy(update=update)


def dead_letter_arguments(arguments: FieldTable) -> tuple[str, str | None] | None:
    """(exchange, routing key or None) from x-dead-letter-exchange / -routing-key, if set."""
    if "x-dead-letter-exchange" not in arguments:
        return None
    exchange = _str_arg(arguments["x-dead-letter-exchange"]) or ""
    key = _str_arg(arguments.get("x-dead-letter-routing-key"))
    return exchange, key


def stream_start(value: object) -> str | int | None:
    """x-stream-offset: first, last, next, an offset, or a timestamp (seconds) -> manager start."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if isinstance(value, Timestamp):
            return f"timestamp:{int(value) * 1000}"
        return value
    if hasattr(value, "timestamp"):
        return f"timestamp:{int(value.timestamp() * 1000)}"
    return None


class RouterBinding:
    """The router's subscriber for one queue (or exchange) bound to ``amq.topic``.

    ``deliver`` is synchronous: it appends to the queue with ``publish_nowait``; while an AMQP
    publisher waits for a confirm, the front end collects the commit tickets so that the confirm
    leaves only after the commit.
    """

    __slots__ = ("destination", "front", "kind")

    def __init__(self, front: FrontEnd, kind: str, destination: str) -> None:
        self.front = front
        self.kind = kind
        self.destination = destination

    @property
    def id(self) -> str:
        return f"amqp091-binding:{self.kind}:{self.destination}"

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        self.front.deliver_from_router(self, message)
