"""AMQP 1.0 addresses onto the deck: queues of the queue manager or topics of the router.

The conventions AMQP 1.0 clients already use (Qpid JMS, ActiveMQ Artemis, rhea):

- ``$queue/<q>[/<key>]`` and ``queue://<q>[/<key>]``: queue ``q`` (a sender's key is the routing
  key; a receiver's is a key filter with ``+`` and ``#``);
- ``topic://<t>``: topic ``t`` of the router (a receiver's may hold ``+`` and ``#``);
- any other address: a queue or a topic as the terminus capability ``queue`` / ``topic`` says,
  and without one as the ``amqp1.bare_address`` setting says (a queue by default).

In a vhost other than ``/`` the address names the vhost's own node: :func:`resolve` puts the
connection's vhost prefix in front of the queue or topic (trimaran/vhosts.py), and
:attr:`Address.own_topic` gives the client's own name back (for the rules and for what goes back
to the peer). An address that names ``$vhost/`` keys itself is refused (unauthorized-access).

Pure functions, no I/O: :func:`resolve` raises :class:`AddressError` with the AMQP condition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from trimaran.amqp1.performatives import INVALID_FIELD, UNAUTHORIZED_ACCESS
from trimaran.queue.policy import (
    QUEUE_PREFIX,
    QueueError,
    parse_queue_topic,
    queue_topic,
    validate_queue_name,
)
from trimaran.topics import TopicError, validate_topic_filter, validate_topic_name
from trimaran.vhosts import is_reserved

QUEUE: Final = "queue"
TOPIC: Final = "topic"
QUEUE_SCHEME: Final = "queue://"
TOPIC_SCHEME: Final = "topic://"


class AddressError(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


@dataclass(frozen=True, slots=True)
class Address:
    kind: Literal["queue", "topic"]
    name: str  # queue key, or topic name / filter key (behind the vhost prefix)
    key: str = ""  # queue only: routing key (publish) or key filter (consume)
    cut: int = 0  # the vhost prefix's length: what the client's own names lack
    # Worked out once: a sending link's messages all ask for them.
    is_queue: bool = field(init=False, repr=False, compare=False)
    # The router topic, or the ``$queue/`` topic other protocols use for this queue.
    topic: str = field(init=False, repr=False, compare=False)
    # ``topic`` as the client names it (without the vhost prefix).
    own_topic: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        is_queue = self.kind == QUEUE
        topic = queue_topic(self.name, self.key) if is_queue else self.name
        object.__setattr__(self, "is_queue", is_queue)
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "own_topic", topic[self.cut :])


def _capabilities(caps: Any) -> set[str]:
    if caps is None:
        return set()
    if isinstance(caps, str):
        return {caps}
    if isinstance(caps, Iterable):
        return {str(c) for c in caps}
    return set()


def _queue(text: str, for_receive: bool, vhost_prefix: str) -> Address:
    parsed = parse_queue_topic(vhost_prefix + QUEUE_PREFIX + text)
    if parsed is None:
        raise AddressError(INVALID_FIELD, f"{text!r} is not a valid queue address")
    name, key, control = parsed
    if control is not None:
        raise AddressError(INVALID_FIELD, f"queue control address {text!r} is not a link address")
    if key and for_receive:
        try:
            validate_topic_filter(key)
        except TopicError as exc:
            raise AddressError(INVALID_FIELD, f"bad key filter in {text!r}: {exc}") from None
    elif key and ("+" in key or "#" in key):
        raise AddressError(INVALID_FIELD, f"a routing key cannot hold + or #: {text!r}")
    return Address(QUEUE, name, key, len(vhost_prefix))


def _topic(text: str, for_receive: bool, vhost_prefix: str) -> Address:
    if text.startswith(QUEUE_PREFIX):
        raise AddressError(INVALID_FIELD, f"{text!r} is a queue, not a topic")
    try:
        if for_receive:
            validate_topic_filter(text)
        else:
            validate_topic_name(text)
    except TopicError as exc:
        raise AddressError(INVALID_FIELD, f"bad topic {text!r}: {exc}") from None
    return Address(TOPIC, vhost_prefix + text, "", len(vhost_prefix))


def resolve(
    address: Any, capabilities: Any, *, bare: str = QUEUE, for_receive: bool, vhost_prefix: str = ""
) -> Address:
    """Where ``address`` points in the vhost whose prefix is ``vhost_prefix`` (``""``: ``/``).
    ``for_receive``: the peer consumes from it (a source)."""
    if not isinstance(address, str) or not address:
        raise AddressError(INVALID_FIELD, f"address {address!r} is not a non-empty string")
    text = str(address)
    for scheme in (QUEUE_PREFIX, QUEUE_SCHEME, TOPIC_SCHEME, ""):
        if text.startswith(scheme) and is_reserved(text[len(scheme) :]):
            raise AddressError(UNAUTHORIZED_ACCESS, f"address {text!r} names another vhost's node")
    if text.startswith(QUEUE_PREFIX):
        return _queue(text[len(QUEUE_PREFIX) :], for_receive, vhost_prefix)
    if text.startswith(QUEUE_SCHEME):
        return _queue(text[len(QUEUE_SCHEME) :], for_receive, vhost_prefix)
    if text.startswith(TOPIC_SCHEME):
        return _topic(text[len(TOPIC_SCHEME) :], for_receive, vhost_prefix)
    caps = _capabilities(capabilities)
    kind = QUEUE if QUEUE in caps else TOPIC if TOPIC in caps else bare
    if kind == TOPIC:
        return _topic(text, for_receive, vhost_prefix)
    try:
        validate_queue_name(text)
    except QueueError as exc:
        raise AddressError(INVALID_FIELD, f"{text!r} is not a valid queue name: {exc.detail}") from None
    return Address(QUEUE, vhost_prefix + text, "", len(vhost_prefix))
