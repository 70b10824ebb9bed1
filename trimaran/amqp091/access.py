"""AMQP 0.9.1 methods in the permission model: RabbitMQ's patterns, then the rule file.

RabbitMQ's vhost permissions (trimaran/security/permissions.py) come first, checked exactly as
RabbitMQ checks them (:func:`resource_needs`, in RabbitMQ's order): queue.declare (not passive)
configures the queue, and with ``x-dead-letter-exchange`` reads it and writes that exchange;
queue.delete configures it; queue.bind and queue.unbind write the queue and read the exchange;
queue.purge, basic.get and basic.consume read the queue; exchange.declare (not passive) configures
the exchange, and with ``alternate-exchange`` reads it and writes that one; exchange.delete
configures it; exchange.bind and exchange.unbind write the destination and read the source;
basic.publish writes the exchange (``amq.default`` for the nameless one). Passive declares need
nothing. A refusal is 403 ACCESS_REFUSED, ``access to queue 'q' in vhost 'v' refused for user 'u'``.
A server-named queue is checked where its name is made (:func:`check_server_named`), as RabbitMQ
checks ``amq.gen-...``; a name with the reserved ``amq.`` prefix is refused for that reason first.

The rule file (trimaran/security/acl.py) then decides too, both must allow:
Queues are ``$queue/<name>``: queue.declare, bind, unbind, purge and delete need configure on it;
basic.consume and basic.get need read. A binding from ``amq.topic`` also reads the topics its key
names (``a.*`` reads ``a/+``), so it needs read on that filter too: otherwise a queue of one's own
bound to another user's topics would read them. Exchanges other than the built-in ones are configured
as ``$exchange/<name>``; a queue declared with ``x-dead-letter-exchange`` also needs write on that
exchange (``$exchange/amq.default`` for the default one) and read on itself, as in RabbitMQ.
A queue this connection declared exclusive needs no rule: it is its own.
The rules see names as the client spells them, in its vhost; the connection's exclusive queues and a
channel's last queue are keys (``$vhost/<v>/`` in front, trimaran/vhosts.py), compared as keys.
Publishing is checked where it is routed (:func:`check_default_publish`, :func:`publish_targets`,
:func:`check_queue_publish`).

The connection and channel are read through two small protocols (four fields in all), so that the
mapping sits below the connection and the front end, and ``security/`` knows no protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, Protocol

from trimaran.amqp091 import spec
from trimaran.queue.policy import queue_topic
from trimaran.security.guard import (
    CONFIGURE,
    EXCHANGE,
    GUEST,
    QUEUE,
    QUEUE_TOPIC,
    READ,
    WRITE,
    Principal,
    Security,
    queue_of,
)
from trimaran.security.permissions import DEFAULT_EXCHANGE  # amq.default, as RabbitMQ names it
from trimaran.topics import (
    TopicError,
    binding_key_to_filter,
    filter_to_binding_key,
    routing_key_to_topic,
    topic_to_routing_key,
)
from trimaran.vhosts import is_reserved, key_prefix

if TYPE_CHECKING:
    from trimaran.amqp091.exchanges import ExchangeRegistry

REPLY_TO: Final = "amq.rabbitmq.reply-to"
EXCHANGE_PREFIX: Final = "$exchange/"
DEAD_LETTER_EXCHANGE: Final = "x-dead-letter-exchange"
ALTERNATE_EXCHANGE: Final = "alternate-exchange"
ACCESS_REFUSED: Final = spec.ACCESS_REFUSED


#: The methods that name a queue, an exchange or a binding the rules may guard. The others (acks,
#: qos, channel and confirm methods; basic.publish is checked where it is routed) need no rule, and
#: the front end does not ask for them: an ack costs no permission check.
GUARDED: Final[frozenset[type[spec.Method]]] = frozenset(
    {
        spec.QueueDeclare,
        spec.QueueBind,
        spec.QueueUnbind,
        spec.QueuePurge,
        spec.QueueDelete,
        spec.BasicConsume,
        spec.BasicGet,
        spec.ExchangeDeclare,
        spec.ExchangeDelete,
        spec.ExchangeBind,
        spec.ExchangeUnbind,
    }
)


#: The methods whose binding key RabbitMQ's topic permissions read (through a topic exchange).
BINDS: Final = (spec.QueueBind, spec.QueueUnbind, spec.ExchangeBind, spec.ExchangeUnbind)


class Owner(Protocol):
    """A connection (``conn.Amqp091Conn``): who logged in, its vhost's key prefix and the queues
    (keys) it declared exclusive."""

    @property
    def principal(self) -> Principal | None: ...

    @property
    def vhost_prefix(self) -> str: ...

    @property
    def exclusive_queues(self) -> set[str]: ...

    @property
    def virtual_host(self) -> str | None: ...


class Channel(Protocol):
    """A channel (``channels.ChannelState``): the queue (its key) a nameless queue method means."""

    @property
    def last_queue(self) -> str: ...


def exchange_topic(name: str) -> str:
    """An exchange in the rules: ``$exchange/<name>``, the default exchange as ``amq.default``."""
    return EXCHANGE_PREFIX + (name or DEFAULT_EXCHANGE)


def _refusal(conn: Owner, access: str, topic: str, method: spec.Method) -> spec.ProtocolError:
    """403 in RabbitMQ's words: ``access to queue 'q' in vhost '/' refused for user 'u'`` (the
    anonymous login is RabbitMQ's ``guest``); a topic reads as RabbitMQ's topic authorisation."""
    queue = queue_of(topic)
    if queue is not None:
        what = f"queue '{queue}'"
    elif topic.startswith(EXCHANGE_PREFIX):
        what = f"exchange '{topic[len(EXCHANGE_PREFIX) :]}'"
    else:
        key = topic_to_routing_key(topic) if access == WRITE else filter_to_binding_key(topic)
        what = f"topic '{key}' in exchange 'amq.topic'"
    vhost = conn.virtual_host or "/"
    user = conn.principal.user if conn.principal is not None else None
    return spec.ProtocolError(
        ACCESS_REFUSED,
        f"access to {what} in vhost '{vhost}' refused for user '{user or GUEST[0]}'",
        class_id=method.CLASS_ID,
        method_id=method.METHOD_ID,
    )


def _queue(conn: Owner, channel: Channel, name: str) -> str:
    """The queue a method names, as the client names it (a nameless method: the channel's last)."""
    return name or channel.last_queue[len(conn.vhost_prefix) :]


def _exclusive(conn: Owner, name: str) -> bool:
    """Did this connection declare the queue the client calls ``name`` exclusive?"""
    return conn.vhost_prefix + name in conn.exclusive_queues


def _refused(
    security: Security, principal: Principal, access: str, kind: str, name: str, method: spec.Method
) -> spec.ProtocolError:
    """403 ACCESS_REFUSED in RabbitMQ's words for a resource the patterns refuse (logged, counted)."""
    text = security.refuse_resource(principal, access, kind, name)
    return spec.ProtocolError(ACCESS_REFUSED, text, class_id=method.CLASS_ID, method_id=method.METHOD_ID)


def declare_needs(name: str, arguments: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """What RabbitMQ checks for a queue.declare (not passive) of ``name``, in its order."""
    needs = [(CONFIGURE, QUEUE, name)]
    dlx = (arguments or {}).get(DEAD_LETTER_EXCHANGE)
    if isinstance(dlx, str):
        needs += [(READ, QUEUE, name), (WRITE, EXCHANGE, dlx)]
    return needs


def resource_needs(conn: Owner, channel: Channel, method: spec.Method) -> list[tuple[str, str, str]]:
    """``(access, kind, name)`` RabbitMQ's permissions need for ``method``, in the order RabbitMQ
    checks them (empty: nothing to check)."""
    if isinstance(method, spec.QueueDeclare):
        name = method.queue
        if method.passive or not name or name == REPLY_TO or name.startswith("amq."):
            return []  # passive: nothing; server-named: check_server_named; amq.*: refused anyway
        return declare_needs(name, method.arguments)
    if isinstance(method, spec.QueueBind | spec.QueueUnbind):
        return [(WRITE, QUEUE, _queue(conn, channel, method.queue)), (READ, EXCHANGE, method.exchange)]
    if isinstance(method, spec.QueuePurge | spec.BasicGet):
        return [(READ, QUEUE, _queue(conn, channel, method.queue))]
    if isinstance(method, spec.QueueDelete):
        return [(CONFIGURE, QUEUE, _queue(conn, channel, method.queue))]
    if isinstance(method, spec.BasicConsume):
        return [] if method.queue == REPLY_TO else [(READ, QUEUE, _queue(conn, channel, method.queue))]
    if isinstance(method, spec.ExchangeDeclare | spec.ExchangeDelete) and not method.exchange:
        return []  # refused as the default exchange first, as RabbitMQ refuses it
    if isinstance(method, spec.ExchangeDeclare):
        if method.passive:
            return []
        needs = [(CONFIGURE, EXCHANGE, method.exchange)]
        ae = (method.arguments or {}).get(ALTERNATE_EXCHANGE)
        if isinstance(ae, str):
            needs += [(READ, EXCHANGE, method.exchange), (WRITE, EXCHANGE, ae)]
        return needs
    if isinstance(method, spec.ExchangeDelete):
        return [(CONFIGURE, EXCHANGE, method.exchange)]
    if isinstance(method, spec.ExchangeBind | spec.ExchangeUnbind):
        return [(WRITE, EXCHANGE, method.destination), (READ, EXCHANGE, method.source)]
    return []


def check_server_named(
    security: Security, conn: Owner, name: str, method: spec.QueueDeclare
) -> spec.ProtocolError | None:
    """A server-named queue's declare, checked by its made name (``amq.gen-...``) as RabbitMQ does."""
    principal = conn.principal
    if principal is None:
        return None
    for access, kind, resource in declare_needs(name, method.arguments):
        if not security.permits(principal, access, kind, resource):
            return _refused(security, principal, access, kind, resource, method)
    return None


def check_exchange_publish(
    security: Security, principal: Principal, exchange: str, method: spec.Method
) -> None:
    """basic.publish writes its exchange: 403 ACCESS_REFUSED unless the patterns allow it. The
    handler asks only for an exchange other than the one this principal wrote last under the same
    permissions (``Memo.last_exchange``), which this remembers (publish_targets made the memo)."""
    if not security.permits(principal, WRITE, EXCHANGE, exchange):
        raise _refused(security, principal, WRITE, EXCHANGE, exchange, method)
    memo = principal.memo
    if memo is not None and memo.generation == security.generation:  # a verdict of this generation's
        memo.last_exchange = exchange
        memo.keyed = security.has_topic_permissions(principal)


def check_topic_key(
    security: Security,
    principal: Principal,
    exchanges: ExchangeRegistry,
    access: str,
    exchange: str,
    key: str,
    method: spec.Method,
) -> spec.ProtocolError | None:
    """RabbitMQ's topic permissions: a publish (write) or a binding (read) through a topic
    exchange needs its key to match; 403 ACCESS_REFUSED in RabbitMQ's words when it does not."""
    found = exchanges.get(exchange)
    if found is None or found.type != "topic" or security.permits_key(principal, access, exchange, key):
        return None
    text = security.topic_text(principal, exchange, key)
    return spec.ProtocolError(ACCESS_REFUSED, text, class_id=method.CLASS_ID, method_id=method.METHOD_ID)


def method_needs(
    exchanges: ExchangeRegistry, conn: Owner, channel: Channel, method: spec.Method
) -> list[tuple[str, str]]:
    """``(access, topic)`` pairs a method needs, every one of them (empty: nothing to check)."""
    needs: list[tuple[str, str]] = []

    def queue(name: str, access: str) -> None:
        name = _queue(conn, channel, name)
        if name and not _exclusive(conn, name):
            needs.append((access, queue_topic(name)))

    def bound(source: str, key: str) -> None:
        if exchanges.is_router_backed(source):
            with contextlib.suppress(TopicError):  # a bad key: the bind itself refuses it
                needs.append((READ, binding_key_to_filter(key)))

    def exchange(name: str) -> None:
        if name and not name.startswith("amq."):
            needs.append((CONFIGURE, EXCHANGE_PREFIX + name))

    if isinstance(method, spec.QueueDeclare):
        if method.queue and method.queue != REPLY_TO:
            queue(method.queue, READ if method.passive else CONFIGURE)
        dlx = (method.arguments or {}).get(DEAD_LETTER_EXCHANGE)
        if not method.passive and isinstance(dlx, str):
            # Dead letters are published by the server on the declarer's behalf, later and to
            # whatever the exchange routes them to: as RabbitMQ, the declarer must be able to read
            # the queue and write the exchange, or a queue of one's own would post into others'.
            if method.queue:  # a server-named queue is this connection's own
                queue(method.queue, READ)
            needs.append((WRITE, exchange_topic(dlx)))
    elif isinstance(method, spec.QueueBind):
        queue(method.queue, CONFIGURE)
        bound(method.exchange, method.routing_key)
    elif isinstance(method, spec.QueueUnbind | spec.QueuePurge | spec.QueueDelete):
        queue(method.queue, CONFIGURE)
    elif isinstance(method, spec.BasicConsume):
        if method.queue != REPLY_TO:
            queue(method.queue, READ)
    elif isinstance(method, spec.BasicGet):
        queue(method.queue, READ)
    elif isinstance(method, spec.ExchangeDeclare):
        if not method.passive:
            exchange(method.exchange)
    elif isinstance(method, spec.ExchangeDelete):
        exchange(method.exchange)
    elif isinstance(method, spec.ExchangeBind):
        exchange(method.destination)
        bound(method.source, method.routing_key)
    elif isinstance(method, spec.ExchangeUnbind):
        exchange(method.destination)
    return needs


def check_method(
    security: Security,
    exchanges: ExchangeRegistry,
    conn: Owner,
    channel: Channel,
    method: spec.Method,
) -> spec.ProtocolError | None:
    """``403 ACCESS_REFUSED`` for the first thing the rules refuse; None when all is allowed."""
    principal = conn.principal
    if principal is None or type(method) not in GUARDED:
        return None
    for access, kind, name in resource_needs(conn, channel, method):
        if not security.permits(principal, access, kind, name):
            return _refused(security, principal, access, kind, name, method)
    if isinstance(method, BINDS) and security.has_topic_permissions(principal):
        source = method.exchange if isinstance(method, spec.QueueBind | spec.QueueUnbind) else method.source
        refused = check_topic_key(security, principal, exchanges, READ, source, method.routing_key, method)
        if refused is not None:
            return refused
    if isinstance(method, spec.QueueDeclare) and method.passive:
        # A passive declare only asks whether the queue exists: any access to it will do.
        name = _queue(conn, channel, method.queue)
        if not name or name == REPLY_TO or _exclusive(conn, name):
            return None
        topic = queue_topic(name)
        if any(security.allowed(principal, a, topic) for a in (READ, WRITE, CONFIGURE)):
            return None
        security.refused(principal, READ, topic)
        return _refusal(conn, READ, topic, method)
    needs = method_needs(exchanges, conn, channel, method)
    own = own_topic_binding(exchanges, conn, channel, method)
    if own is not None:
        # Mosquitto's rule, as for an MQTT subscription: some topic the key names may be read.
        needs = [(access, topic) for access, topic in needs if (access, topic) != (READ, own)]
        if security.reading(principal, own) is False:
            return _refusal(conn, READ, own, method)
    for access, topic in needs:
        if not security.authorize(principal, access, topic):
            return _refusal(conn, access, topic, method)
    return None


def own_topic_binding(
    exchanges: ExchangeRegistry, conn: Owner, channel: Channel, method: spec.Method
) -> str | None:
    """The filter a queue.bind from ``amq.topic`` reads when the queue is this connection's own
    (exclusive): such a binding lives no longer than the connection, so it is granted when some
    topic it names may be read and each message is checked against the binder's rules. A binding
    to a shared or durable queue outlives its binder: it must be readable whole."""
    if not isinstance(method, spec.QueueBind) or not exchanges.is_router_backed(method.exchange):
        return None
    if not _exclusive(conn, _queue(conn, channel, method.queue)):
        return None
    try:
        return binding_key_to_filter(method.routing_key)
    except TopicError:
        return None


def check_default_publish(
    security: Security, principal: Principal, conn: Owner, key: str, method: spec.Method
) -> None:
    """A basic.publish to the default exchange, which names its queue: ``403 ACCESS_REFUSED`` unless
    the rules let the publisher write it. The handler asks only for a key other than the one this
    principal wrote last under the same rules (``Memo.last_write``), which this remembers (the
    handler made the memo)."""
    if not security.permits(principal, WRITE, EXCHANGE, ""):
        raise _refused(security, principal, WRITE, EXCHANGE, "", method)
    if key and conn.vhost_prefix + key not in conn.exclusive_queues:  # keys: no call on this path
        if key[:1] == "$" and is_reserved(key):
            # Another vhost's key, spelt by a client of '/': refused as the queue it named, in the
            # vhost it is in (never as a topic of amq.topic, which it did not name).
            security.refused(principal, WRITE, QUEUE_TOPIC + key, "names another vhost's queue")
            user = principal.user or GUEST[0]
            raise spec.ProtocolError(
                ACCESS_REFUSED,
                f"access to queue '{key}' in vhost '{conn.virtual_host or '/'}' refused for user '{user}'",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        topic = queue_topic(key)
        if not security.authorize(principal, WRITE, topic):
            raise _refusal(conn, WRITE, topic, method)
        memo = principal.memo
        if memo is not None and memo.generation == security.generation:  # a verdict of this generation's
            memo.last_write = key


def publish_targets(
    security: Security,
    principal: Principal,
    conn: Owner,
    exchanges: ExchangeRegistry,
    exchange: str,
    key: str,
    to_router: bool,
    queues: Iterable[str],
    method: spec.Method,
) -> set[str]:
    """The queues a basic.publish through a named exchange may go to (the default exchange is
    :func:`check_default_publish`'s). ``amq.topic`` names its topic: a refusal there is ``403
    ACCESS_REFUSED``. Other routes reach queues the publisher may not know: those it may not write
    are left out."""
    memo = principal.memo
    if memo is None or memo.generation != security.generation:
        memo = principal.memo_for(security.generation)
    if exchange != memo.last_exchange:
        check_exchange_publish(security, principal, exchange, method)
    if memo.keyed:  # topic permissions name this user: the key of each publish is checked
        refused = check_topic_key(security, principal, exchanges, WRITE, exchange, key, method)
        if refused is not None:
            raise refused
    targets = set(queues)
    if to_router:
        try:
            topic = routing_key_to_topic(key)
        except TopicError:
            topic = ""
        if topic and not security.authorize(principal, WRITE, topic):
            raise _refusal(conn, WRITE, topic, method)
    allowed = set()
    for name in targets:
        # The rules see the queue's name in its vhost, not its key (trimaran/vhosts.py).
        topic = queue_topic(name[len(key_prefix(name)) :] if name[:1] == "$" else name)
        if name in conn.exclusive_queues or security.allowed(principal, WRITE, topic):
            allowed.add(name)
        else:
            security.refused(principal, WRITE, topic, f"routed by exchange {exchange!r}: left out")
    return allowed


def check_queue_publish(
    security: Security,
    principal: Principal,
    conn: Owner,
    name: str,
    topic: str,
    method: spec.Method,
    creates: bool = False,
) -> None:
    """A basic.publish through the default exchange to ``$queue/<name>[/<key>]`` (the cross-protocol
    name) writes that topic, as an MQTT publish to it does: ``403 ACCESS_REFUSED`` when the rules say
    no (a queue this connection declared exclusive is its own). It goes through the default
    exchange: the patterns must let it write ``amq.default``, and configure the queue when the
    publish ``creates`` it (``queues.auto_create``)."""
    if not security.permits(principal, WRITE, EXCHANGE, ""):
        raise _refused(security, principal, WRITE, EXCHANGE, "", method)
    if creates:
        own = name[len(conn.vhost_prefix) :]
        if not security.permits(principal, CONFIGURE, QUEUE, own):
            raise _refused(security, principal, CONFIGURE, QUEUE, own, method)
    if name not in conn.exclusive_queues and not security.authorize(principal, WRITE, topic):
        raise _refusal(conn, WRITE, topic, method)
