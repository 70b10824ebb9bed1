"""AMQP 0-9-1 exchanges and bindings of one virtual host, and routing through them, RabbitMQ-style.

Pure and synchronous (standard library only); not thread-safe: it lives on the event loop. The
handler checks queues (they belong to the queue manager), persists changes with
``amqp091.durable`` and turns an :class:`ExchangeError` into a channel or connection exception.

Model
-----
An :class:`ExchangeRegistry` holds :class:`Exchange` records and :class:`Binding` facts. A binding goes
from a source exchange to a queue or to another exchange (exchange-to-exchange bindings). Binding
arguments are stored frozen (:func:`freeze_arguments`) so that a binding is hashable and two binds with
equal arguments are the same binding, as in RabbitMQ.

Routing
-------
:meth:`ExchangeRegistry.route` walks from the published-to exchange through exchange-to-exchange
bindings (each exchange visited once, so cycles are harmless) and returns the queue names reached.
Per exchange type:

- direct: a dict from routing key to destinations;
- fanout: one set of destinations;
- topic: a trie of binding-key words (``*`` one word, ``#`` zero or more words; words split on ``.``;
  the empty key has zero words), with a bounded per-exchange cache of routing key -> destinations;
- headers: each binding's arguments compiled once (``x-match`` all / any / all-with-x / any-with-x;
  ``x-`` arguments ignored unless ``*-with-x``; a void (``None``) value matches the header's presence).

The default exchange ``""`` has no binding rows: key ``q`` or ``$queue/q`` routes to queue ``q``
(the handler checks the queue exists). An exchange listed in ``router_backed`` (``amq.topic``, the
shared MQTT router) is not matched here: :attr:`RouteResult.to_router` is set and the handler publishes
into the router, where it keeps one subscription per binding of that exchange (queues and exchanges).
An exchange whose ``alternate-exchange`` argument names an existing exchange passes a message that
matched no binding of its own on to that exchange.

Cascades
--------
Removing bindings (unbind, exchange deletion, queue deletion) auto-deletes each ``auto_delete``
exchange whose last binding *as a source* went away, recursively. After every :meth:`delete`,
:meth:`unbind` and :meth:`remove_queue`, :attr:`last_removed_bindings` lists every binding the call
removed and :attr:`last_auto_deleted` every exchange it auto-deleted, so the handler can persist them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "BUILTIN_EXCHANGES",
    "DEFAULT_EXCHANGE",
    "EXCHANGE_TYPES",
    "Binding",
    "DestinationKind",
    "Exchange",
    "ExchangeError",
    "ExchangeRegistry",
    "FrozenTable",
    "RouteResult",
    "freeze_arguments",
    "split_topic",
    "thaw_arguments",
    "topic_key_matches",
]

ACCESS_REFUSED: Final = 403
NOT_FOUND: Final = 404
PRECONDITION_FAILED: Final = 406
COMMAND_INVALID: Final = 503
NOT_ALLOWED: Final = 530

_CODE_NAMES: Final = {
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    COMMAND_INVALID: "COMMAND_INVALID",
    NOT_ALLOWED: "NOT_ALLOWED",
}

DEFAULT_EXCHANGE: Final = ""
EXCHANGE_TYPES: Final = frozenset({"direct", "fanout", "topic", "headers"})
#: The exchanges every virtual host has (besides the default one), all durable.
BUILTIN_EXCHANGES: Final = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}
QUEUE_PREFIX: Final = "$queue/"
TOPIC_CACHE_SIZE: Final = 4096
_X_MATCH_MODES: Final = ("all", "any", "all-with-x", "any-with-x")

DestinationKind = Literal["queue", "exchange"]


class ExchangeError(Exception):
    """A declare/delete/bind/unbind/route refused, RabbitMQ-style.

    ``text`` is the whole reply text (``"NOT_FOUND - no exchange 'x' in vhost '/'"``); ``reason`` is
    the part after the code's name, which is what ``spec.ProtocolError`` wants (it adds the name).
    """

    def __init__(self, reply_code: int, reason: str) -> None:
        self.reply_code = reply_code
        self.reason = reason
        self.text = f"{_CODE_NAMES[reply_code]} - {reason}"
        super().__init__(self.text)


# --------------------------------------------------------------------------------------------
# Arguments in a hashable form


class FrozenTable(tuple[tuple[str, object], ...]):
    """A field table frozen for hashing: ``(key, frozen value)`` pairs sorted by key."""

    __slots__ = ()


FrozenArgs = tuple[tuple[str, object], ...]


def freeze_value(value: object) -> object:
    """Tables become :class:`FrozenTable`, arrays tuples, byte buffers ``bytes``; scalars stay."""
    if isinstance(value, dict):
        return FrozenTable(sorted((str(k), freeze_value(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(freeze_value(v) for v in value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def freeze_arguments(arguments: Mapping[str, object] | None) -> FrozenTable:
    if not arguments:
        return FrozenTable()
    return FrozenTable(sorted((str(k), freeze_value(v)) for k, v in arguments.items()))


def thaw_value(value: object) -> object:
    if isinstance(value, FrozenTable):
        return {k: thaw_value(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw_value(v) for v in value]
    return value


def thaw_arguments(frozen: FrozenArgs) -> dict[str, object]:
    return {k: thaw_value(v) for k, v in frozen}


# --------------------------------------------------------------------------------------------
# Records


@dataclass(slots=True)
class Exchange:
    name: str
    type: str  # one of EXCHANGE_TYPES
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Binding:
    source: str
    destination: str
    destination_kind: DestinationKind
    routing_key: str
    arguments: FrozenArgs = ()

    def arguments_dict(self) -> dict[str, object]:
        return thaw_arguments(self.arguments)


@dataclass(slots=True)
class RouteResult:
    queues: set[str]
    #: The message must also be published into the shared router (a router-backed exchange was reached).
    to_router: bool = False


# --------------------------------------------------------------------------------------------
# Matchers, one per exchange


class _Dests:
    """Destinations of the bindings that share a match condition, counted (several bindings may differ
    only in arguments or key and share a destination)."""

    __slots__ = ("exchanges", "queues")

    def __init__(self) -> None:
        self.queues: dict[str, int] = {}
        self.exchanges: dict[str, int] = {}

    def add(self, binding: Binding) -> None:
        table = self.queues if binding.destination_kind == "queue" else self.exchanges
        table[binding.destination] = table.get(binding.destination, 0) + 1

    def remove(self, binding: Binding) -> None:
        table = self.queues if binding.destination_kind == "queue" else self.exchanges
        count = table[binding.destination] - 1
        if count:
            table[binding.destination] = count
        else:
            del table[binding.destination]

    def __bool__(self) -> bool:
        return bool(self.queues or self.exchanges)


_NOTHING: Final[tuple[tuple[str, ...], tuple[str, ...]]] = ((), ())


class _Matcher:
    def add(self, binding: Binding) -> None:
        raise NotImplementedError

    def remove(self, binding: Binding) -> None:
        raise NotImplementedError

    def match(
        self, routing_key: str, headers: Mapping[str, object] | None
    ) -> tuple[Collection[str], Collection[str]]:
        """(queues, exchanges) the message goes to."""
        raise NotImplementedError


class _DirectMatcher(_Matcher):
    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: dict[str, _Dests] = {}

    def add(self, binding: Binding) -> None:
        dests = self.keys.get(binding.routing_key)
        if dests is None:
            dests = self.keys[binding.routing_key] = _Dests()
        dests.add(binding)

    def remove(self, binding: Binding) -> None:
        dests = self.keys[binding.routing_key]
        dests.remove(binding)
        if not dests:
            del self.keys[binding.routing_key]

    def match(
        self, routing_key: str, headers: Mapping[str, object] | None
    ) -> tuple[Collection[str], Collection[str]]:
        dests = self.keys.get(routing_key)
        if dests is None:
            return _NOTHING
        return dests.queues, dests.exchanges


class _FanoutMatcher(_Matcher):
    __slots__ = ("dests",)

    def __init__(self) -> None:
        self.dests = _Dests()

    def add(self, binding: Binding) -> None:
        self.dests.add(binding)

    def remove(self, binding: Binding) -> None:
        self.dests.remove(binding)

    def match(
        self, routing_key: str, headers: Mapping[str, object] | None
    ) -> tuple[Collection[str], Collection[str]]:
        return self.dests.queues, self.dests.exchanges


def split_topic(key: str) -> list[str]:
    """RabbitMQ's word split: ``""`` has no words, ``"a."`` has two (``"a"`` and ``""``)."""
    return key.split(".") if key else []


def topic_key_matches(binding_key: str, routing_key: str) -> bool:
    """One binding key against one routing key, with the topic exchange's rules.

    For one-off checks, e.g. a router-backed binding whose key MQTT cannot express (``a.#.b``): the
    handler may subscribe a broader filter and keep only the messages this accepts.
    """
    words = split_topic(routing_key)
    n = len(words)
    reached = {0}  # positions in ``words`` the pattern read so far can end at
    for part in split_topic(binding_key):
        if part == "#":
            reached = set(range(min(reached), n + 1))
        elif part == "*":
            reached = {i + 1 for i in reached if i < n}
        else:
            reached = {i + 1 for i in reached if i < n and words[i] == part}
        if not reached:
            return False
    return n in reached


class _TopicNode:
    __slots__ = ("children", "dests", "hash", "star")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.star: _TopicNode | None = None
        self.hash: _TopicNode | None = None
        self.dests: _Dests | None = None

    def empty(self) -> bool:
        return not self.children and self.star is None and self.hash is None and not self.dests

    def child(self, word: str) -> _TopicNode | None:
        if word == "*":
            return self.star
        if word == "#":
            return self.hash
        return self.children.get(word)

    def make_child(self, word: str) -> _TopicNode:
        node = self.child(word)
        if node is None:
            node = _TopicNode()
            if word == "*":
                self.star = node
            elif word == "#":
                self.hash = node
            else:
                self.children[word] = node
        return node

    def drop_child(self, word: str) -> None:
        if word == "*":
            self.star = None
        elif word == "#":
            self.hash = None
        else:
            del self.children[word]


class _TopicMatcher(_Matcher):
    """A trie of binding keys plus a FIFO cache of routing key -> (queues, exchanges)."""

    __slots__ = ("cache", "root")

    def __init__(self) -> None:
        self.root = _TopicNode()
        self.cache: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def add(self, binding: Binding) -> None:
        node = self.root
        for word in split_topic(binding.routing_key):
            node = node.make_child(word)
        if node.dests is None:
            node.dests = _Dests()
        node.dests.add(binding)
        self.cache.clear()

    def remove(self, binding: Binding) -> None:
        path: list[tuple[_TopicNode, str]] = []
        node = self.root
        for word in split_topic(binding.routing_key):
            path.append((node, word))
            nxt = node.child(word)
            assert nxt is not None, "binding not in the trie"
            node = nxt
        assert node.dests is not None, "binding not in the trie"
        node.dests.remove(binding)
        if not node.dests:
            node.dests = None
        for parent, word in reversed(path):
            if not node.empty():
                break
            parent.drop_child(word)
            node = parent
        self.cache.clear()

    def match(
        self, routing_key: str, headers: Mapping[str, object] | None
    ) -> tuple[Collection[str], Collection[str]]:
        hit = self.cache.get(routing_key)
        if hit is not None:
            return hit
        found: list[_Dests] = []
        words = split_topic(routing_key)
        _collect(self.root, words, 0, len(words), found, set())
        if not found:
            result = _NOTHING
        elif len(found) == 1:
            result = (tuple(found[0].queues), tuple(found[0].exchanges))
        else:
            queues: dict[str, None] = {}
            exchanges: dict[str, None] = {}
            for dests in found:
                queues.update(dict.fromkeys(dests.queues))
                exchanges.update(dict.fromkeys(dests.exchanges))
            result = (tuple(queues), tuple(exchanges))
        if len(self.cache) >= TOPIC_CACHE_SIZE:
            del self.cache[next(iter(self.cache))]
        self.cache[routing_key] = result
        return result


def _collect(
    node: _TopicNode, words: list[str], i: int, n: int, out: list[_Dests], seen: set[tuple[int, int]]
) -> None:
    """Every terminal reached by ``words[i:]`` from ``node``; ``seen`` keeps each (node, position)
    visited once, so patterns like ``#.#.#`` stay linear."""
    mark = (id(node), i)
    if mark in seen:
        return
    seen.add(mark)
    if node.hash is not None:
        for j in range(i, n + 1):
            _collect(node.hash, words, j, n, out, seen)
    if i == n:
        if node.dests:
            out.append(node.dests)
        return
    child = node.children.get(words[i])
    if child is not None:
        _collect(child, words, i + 1, n, out, seen)
    if node.star is not None:
        _collect(node.star, words, i + 1, n, out, seen)


_VOID: Final = object()


@dataclass(frozen=True, slots=True)
class _HeadersSpec:
    match_all: bool
    #: (header name, wanted value or _VOID for presence only)
    items: tuple[tuple[str, object], ...]


def _compile_headers(arguments: FrozenArgs) -> _HeadersSpec:
    mode = "all"
    for key, value in arguments:
        if key == "x-match" and isinstance(value, str) and value in _X_MATCH_MODES:
            mode = value
    with_x = mode.endswith("-with-x")
    items = tuple(
        (key, _VOID if value is None else value)
        for key, value in arguments
        if key != "x-match" and (with_x or not key.startswith("x-"))
    )
    return _HeadersSpec(mode.startswith("all"), items)


def _same_value(header: object, wanted: object) -> bool:
    if isinstance(wanted, tuple):
        return freeze_value(header) == wanted
    if isinstance(header, bool) is not isinstance(wanted, bool):
        return False  # an AMQP boolean is not the integer 1
    return header == wanted


def headers_match(spec: _HeadersSpec, headers: Mapping[str, object]) -> bool:
    if spec.match_all:
        for key, wanted in spec.items:
            if key not in headers:
                return False
            if wanted is not _VOID and not _same_value(headers[key], wanted):
                return False
        return True
    for key, wanted in spec.items:
        if key in headers and (wanted is _VOID or _same_value(headers[key], wanted)):
            return True
    return False


class _HeadersMatcher(_Matcher):
    __slots__ = ("specs",)

    def __init__(self) -> None:
        self.specs: dict[Binding, _HeadersSpec] = {}

    def add(self, binding: Binding) -> None:
        self.specs[binding] = _compile_headers(binding.arguments)

    def remove(self, binding: Binding) -> None:
        del self.specs[binding]

    def match(
        self, routing_key: str, headers: Mapping[str, object] | None
    ) -> tuple[Collection[str], Collection[str]]:
        table: Mapping[str, object] = headers or {}
        queues: list[str] = []
        exchanges: list[str] = []
        for binding, spec in self.specs.items():
            if headers_match(spec, table):
                (queues if binding.destination_kind == "queue" else exchanges).append(binding.destination)
        return queues, exchanges


_MATCHERS: Final[dict[str, type[_Matcher]]] = {
    "direct": _DirectMatcher,
    "fanout": _FanoutMatcher,
    "topic": _TopicMatcher,
    "headers": _HeadersMatcher,
}


class _Entry:
    """An exchange with its bindings as a source, indexed for routing."""

    __slots__ = ("alternate", "bindings", "exchange", "matcher")

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.matcher: _Matcher = _MATCHERS[exchange.type]()
        self.bindings: dict[Binding, None] = {}
        ae = exchange.arguments.get("alternate-exchange")
        self.alternate: str | None = ae if isinstance(ae, str) else None


# --------------------------------------------------------------------------------------------
# Error texts (RabbitMQ's wording)


def _quote(value: object) -> str:
    if isinstance(value, bool):
        return "'true'" if value else "'false'"
    return f"'{value}'"


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


def _erlang_binary(value: str) -> str:
    """How RabbitMQ's ``~tp`` prints a binary: ``<<"foo">>``."""
    return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'


# --------------------------------------------------------------------------------------------
# The registry


class ExchangeRegistry:
    """The exchanges and bindings of one virtual host."""

    def __init__(self, vhost: str = "/", router_backed: frozenset[str] = frozenset({"amq.topic"})) -> None:
        self.vhost = vhost
        self.router_backed = router_backed
        self._entries: dict[str, _Entry] = {}
        #: Every binding, each mapped to itself (so a lookup by an equal value finds the stored one).
        self._bindings: dict[Binding, Binding] = {}
        self._by_destination: dict[tuple[str, str], dict[Binding, None]] = {}
        #: Every binding the last delete / unbind / remove_queue call removed, cascades included.
        self.last_removed_bindings: list[Binding] = []
        #: Every exchange the last delete / unbind / remove_queue call auto-deleted.
        self.last_auto_deleted: list[Exchange] = []
        #: Moves with every change of exchanges or bindings: what a connection keeps of its routes
        #: (Amqp091Conn.routes) holds while it has not moved.
        self.generation = 0
        self._entries[DEFAULT_EXCHANGE] = _Entry(Exchange(DEFAULT_EXCHANGE, "direct", durable=True))
        for name, type_ in BUILTIN_EXCHANGES.items():
            self._entries[name] = _Entry(Exchange(name, type_, durable=True))

    # -- texts ------------------------------------------------------------------------------------

    def _rs(self, name: str, kind: str = "exchange") -> str:
        return f"{kind} '{name}' in vhost '{self.vhost}'"

    def _not_found(self, name: str, kind: str = "exchange") -> ExchangeError:
        return ExchangeError(NOT_FOUND, f"no {self._rs(name, kind)}")

    @staticmethod
    def _default_refused() -> ExchangeError:
        return ExchangeError(ACCESS_REFUSED, "operation not permitted on the default exchange")

    # -- queries ----------------------------------------------------------------------------------

    def get(self, name: str) -> Exchange | None:
        entry = self._entries.get(name)
        return entry.exchange if entry is not None else None

    def is_router_backed(self, name: str) -> bool:
        return name in self.router_backed

    def exchanges(self) -> list[Exchange]:
        return [entry.exchange for entry in self._entries.values()]

    def bindings(self) -> list[Binding]:
        return list(self._bindings)

    def bindings_for_source(self, name: str) -> list[Binding]:
        entry = self._entries.get(name)
        return list(entry.bindings) if entry is not None else []

    def bindings_for_destination(self, name: str, kind: DestinationKind) -> list[Binding]:
        return list(self._by_destination.get((kind, name), ()))

    def check_publish(self, name: str) -> Exchange:
        """The exchange a basic.publish names: 404 if missing, 403 if internal."""
        entry = self._entries.get(name)
        if entry is None:
            raise self._not_found(name)
        if entry.exchange.internal:
            raise ExchangeError(ACCESS_REFUSED, f"cannot publish to internal {self._rs(name)}")
        return entry.exchange

    # -- exchanges --------------------------------------------------------------------------------

    def declare(
        self,
        name: str,
        type: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, object] | None = None,
    ) -> tuple[Exchange, bool]:
        """exchange.declare; returns the exchange and whether it was created now."""
        if passive:
            if name == DEFAULT_EXCHANGE:
                raise self._default_refused()
            entry = self._entries.get(name)
            if entry is None:
                raise self._not_found(name)
            return entry.exchange, False
        if type not in EXCHANGE_TYPES:
            raise ExchangeError(COMMAND_INVALID, f"invalid exchange type '{type}'")
        if name == DEFAULT_EXCHANGE:
            raise self._default_refused()
        args = dict(arguments or {})
        entry = self._entries.get(name)
        if entry is None:
            if name.startswith("amq."):
                raise ExchangeError(
                    ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'"
                )
            ae = args.get("alternate-exchange")
            if ae is not None and not isinstance(ae, str):
                raise ExchangeError(
                    PRECONDITION_FAILED,
                    f"Invalid type '{_type_name(ae)}' for alternate-exchange, expected longstr",
                )
            exchange = Exchange(name, type, durable, auto_delete, internal, args)
            self._entries[name] = _Entry(exchange)
            self.generation += 1
            return exchange, True
        current = entry.exchange
        for key, received, existing in (
            ("type", type, current.type),
            ("durable", durable, current.durable),
            ("auto_delete", auto_delete, current.auto_delete),
            ("internal", internal, current.internal),
        ):
            if received != existing:
                raise ExchangeError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{key}' for {self._rs(name)}: "
                    f"received {_quote(received)} but current is {_quote(existing)}",
                )
        self._check_argument(name, "alternate-exchange", args, current.arguments)
        return current, False

    def _check_argument(
        self, name: str, key: str, received: Mapping[str, object], current: Mapping[str, object]
    ) -> None:
        new = received.get(key, _VOID)
        old = current.get(key, _VOID)
        if new is _VOID and old is _VOID:
            return
        if new is not _VOID and old is not _VOID and _type_name(new) == _type_name(old) and new == old:
            return

        def show(value: object) -> str:
            if value is _VOID:
                return "none"
            return f"the value '{value}' of type '{_type_name(value)}'"

        raise ExchangeError(
            PRECONDITION_FAILED,
            f"inequivalent arg '{key}' for {self._rs(name)}: received {show(new)} but current is {show(old)}",
        )

    def delete(self, name: str, *, if_unused: bool = False) -> Exchange | None:
        """exchange.delete; returns the deleted exchange, ``None`` if there was none (not an error)."""
        self.last_removed_bindings = []
        self.last_auto_deleted = []
        if name == DEFAULT_EXCHANGE:
            raise self._default_refused()
        if name.startswith("amq."):
            raise ExchangeError(ACCESS_REFUSED, f"deletion of system {self._rs(name)} not allowed")
        entry = self._entries.get(name)
        if entry is None:
            return None
        if if_unused and entry.bindings:
            raise ExchangeError(PRECONDITION_FAILED, f"{self._rs(name)} in use")
        self._drop_exchange(entry)
        return entry.exchange

    def _drop_exchange(self, entry: _Entry) -> None:
        name = entry.exchange.name
        del self._entries[name]
        self.generation += 1
        removed = list(entry.bindings)
        removed.extend(self._by_destination.get(("exchange", name), ()))
        self._remove_bindings(removed)

    # -- bindings ---------------------------------------------------------------------------------

    def _make_binding(
        self,
        source: str,
        destination: str,
        kind: DestinationKind,
        routing_key: str,
        arguments: Mapping[str, object] | None,
    ) -> tuple[Binding, _Entry]:
        if source == DEFAULT_EXCHANGE or (kind == "exchange" and destination == DEFAULT_EXCHANGE):
            raise self._default_refused()
        if kind not in ("queue", "exchange"):
            raise ValueError(f"destination kind {kind!r}")
        entry = self._entries.get(source)
        if entry is None:
            raise self._not_found(source)
        if kind == "exchange" and destination not in self._entries:
            raise self._not_found(destination)
        return Binding(source, destination, kind, routing_key, freeze_arguments(arguments)), entry

    def bind(
        self,
        source: str,
        destination: str,
        kind: DestinationKind,
        routing_key: str,
        arguments: Mapping[str, object] | None = None,
    ) -> tuple[Binding, bool]:
        """queue.bind / exchange.bind; returns the binding and whether it is new."""
        binding, entry = self._make_binding(source, destination, kind, routing_key, arguments)
        existing = self._bindings.get(binding)
        if existing is not None:
            return existing, False
        if entry.exchange.type == "headers":
            self._validate_headers_binding(arguments or {})
        self._add_binding(binding, entry)
        return binding, True

    @staticmethod
    def _validate_headers_binding(arguments: Mapping[str, object]) -> None:
        if "x-match" not in arguments:
            return
        mode = arguments["x-match"]
        if isinstance(mode, bytes | bytearray):
            mode = bytes(mode).decode("utf-8", "surrogateescape")
        if isinstance(mode, str):
            if mode in _X_MATCH_MODES:
                return
            raise ExchangeError(
                PRECONDITION_FAILED,
                f"Invalid x-match field value {_erlang_binary(mode)}; "
                "expected all, any, all-with-x, or any-with-x",
            )
        raise ExchangeError(
            PRECONDITION_FAILED,
            f"Invalid x-match field type {_type_name(mode)} (value {mode!r}); expected longstr",
        )

    def _add_binding(self, binding: Binding, entry: _Entry) -> None:
        self.generation += 1
        self._bindings[binding] = binding
        entry.bindings[binding] = None
        entry.matcher.add(binding)
        key = (binding.destination_kind, binding.destination)
        by_dest = self._by_destination.get(key)
        if by_dest is None:
            by_dest = self._by_destination[key] = {}
        by_dest[binding] = None

    def unbind(
        self,
        source: str,
        destination: str,
        kind: DestinationKind,
        routing_key: str,
        arguments: Mapping[str, object] | None = None,
    ) -> Binding | None:
        """queue.unbind / exchange.unbind; returns the removed binding, ``None`` if there was none."""
        self.last_removed_bindings = []
        self.last_auto_deleted = []
        probe, _ = self._make_binding(source, destination, kind, routing_key, arguments)
        binding = self._bindings.get(probe)
        if binding is None:
            return None
        self._remove_bindings([binding])
        return binding

    def remove_queue(self, queue: str) -> list[Binding]:
        """The queue was deleted: drop every binding to it (auto-deleting sources left unbound)."""
        self.last_removed_bindings = []
        self.last_auto_deleted = []
        self._remove_bindings(list(self._by_destination.get(("queue", queue), ())))
        return [
            b for b in self.last_removed_bindings if b.destination_kind == "queue" and b.destination == queue
        ]

    def _remove_bindings(self, bindings: list[Binding]) -> None:
        """Remove ``bindings``, then auto-delete the sources they left without bindings, recursively."""
        self.generation += 1
        pending = bindings
        while pending:
            sources: dict[str, None] = {}
            for binding in pending:
                if self._bindings.pop(binding, None) is None:
                    continue  # removed twice in one cascade (source and destination both deleted)
                self.last_removed_bindings.append(binding)
                key = (binding.destination_kind, binding.destination)
                by_dest = self._by_destination[key]
                del by_dest[binding]
                if not by_dest:
                    del self._by_destination[key]
                entry = self._entries.get(binding.source)
                if entry is not None and binding in entry.bindings:
                    del entry.bindings[binding]
                    entry.matcher.remove(binding)
                    sources[binding.source] = None
                # else: the source is being deleted, its matcher goes with it.
            pending = []
            for source in sources:
                entry = self._entries.get(source)
                if entry is not None and entry.exchange.auto_delete and not entry.bindings:
                    del self._entries[source]
                    self.last_auto_deleted.append(entry.exchange)
                    pending.extend(self._by_destination.get(("exchange", source), ()))

    # -- restore ----------------------------------------------------------------------------------

    def restore(self, exchanges: Iterable[Exchange], bindings: Iterable[Binding]) -> list[Binding]:
        """Load saved state at start: exchanges first, then bindings (no auto-delete runs). Returns the
        bindings skipped because a source or destination exchange is missing or the binding is invalid."""
        self.generation += 1
        for exchange in exchanges:
            if exchange.name == DEFAULT_EXCHANGE or exchange.type not in EXCHANGE_TYPES:
                continue
            old = self._entries.get(exchange.name)
            entry = _Entry(exchange)
            if old is not None:
                for binding in old.bindings:
                    entry.bindings[binding] = None
                    entry.matcher.add(binding)
            self._entries[exchange.name] = entry
        skipped: list[Binding] = []
        for binding in bindings:
            source = self._entries.get(binding.source)
            if (
                source is None
                or binding.source == DEFAULT_EXCHANGE
                or (binding.destination_kind == "exchange" and binding.destination not in self._entries)
            ):
                skipped.append(binding)
                continue
            if binding not in self._bindings:
                self._add_binding(binding, source)
        return skipped

    # -- routing ----------------------------------------------------------------------------------

    def route(
        self, exchange: str, routing_key: str, headers: Mapping[str, object] | None = None
    ) -> RouteResult:
        """The queues a message published to ``exchange`` reaches (404 if the exchange is missing).

        Internal exchanges are not refused here (messages reach them through bindings): the handler calls
        :meth:`check_publish` for a basic.publish.
        """
        if exchange == DEFAULT_EXCHANGE:
            return RouteResult({_default_queue(routing_key)})
        entry = self._entries.get(exchange)
        if entry is None:
            raise self._not_found(exchange)
        if exchange in self.router_backed:
            return RouteResult(set(), True)
        queues, exchanges = entry.matcher.match(routing_key, headers)
        if not exchanges and (queues or entry.alternate is None):
            return RouteResult(set(queues))  # the common case: no exchange-to-exchange hop
        result = RouteResult(set())
        seen = {exchange}
        todo: list[str] = []
        _visit(entry, queues, exchanges, seen, todo, result)
        while todo:
            name = todo.pop()
            if name == DEFAULT_EXCHANGE:  # reachable only as an alternate exchange
                result.queues.add(_default_queue(routing_key))
                continue
            nxt = self._entries.get(name)
            if nxt is None:
                continue  # an alternate exchange that does not exist (RabbitMQ ignores it too)
            if name in self.router_backed:
                result.to_router = True
                continue
            queues, exchanges = nxt.matcher.match(routing_key, headers)
            _visit(nxt, queues, exchanges, seen, todo, result)
        return result


def _default_queue(routing_key: str) -> str:
    """The queue the default exchange routes a key to: ``q`` or ``$queue/q`` -> ``q``."""
    return routing_key.removeprefix(QUEUE_PREFIX)


def _visit(
    entry: _Entry,
    queues: Collection[str],
    exchanges: Collection[str],
    seen: set[str],
    todo: list[str],
    result: RouteResult,
) -> None:
    """Take one exchange's matches; queue the exchanges to visit next (its alternate if it matched none)."""
    result.queues.update(queues)
    nexts: Collection[str] = exchanges
    if not exchanges and not queues and entry.alternate is not None:
        nexts = (entry.alternate,)
    for name in nexts:
        if name not in seen:
            seen.add(name)
            todo.append(name)
