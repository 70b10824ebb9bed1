"""The subscription router: which subscribers get a message published to a topic.

Pure and synchronous; not thread-safe (it lives on the event loop). Protocol-neutral: a subscriber is
any hashable object with an ``id`` (an MQTT session, an AMQP 0.9.1 queue binding, an AMQP 1.0 link);
the front end keeps whatever it needs in :attr:`SubscriptionOptions.tag`.

Structure
---------
A trie keyed by topic level. ``+`` and ``#`` are ordinary child keys, so matching a topic with ``n``
levels visits at most the nodes reachable by literal, ``+`` and ``#`` edges. Each node keeps its
non-shared subscriptions (``subscriber -> Subscription``) and its share groups (``group -> _ShareGroup``).
A branch that holds one plain subscription and nothing else (a device's own ``devices/<id>/+`` under a
shared ``devices``) is held as that Subscription, in its parent's dict of children: it is opened into
levels when a second subscription needs one of them.

Matching
--------
:meth:`Router.match` returns one :class:`Delivery` per subscriber with at least one matching non-shared
subscription (overlapping subscriptions aggregated: max QoS, every subscription identifier, retain as
published if any asks for it) and one per matching share group (a member chosen round-robin).

Results are cached per topic in a bounded FIFO cache. A subscription change to a filter without
wildcards drops that one topic's entry; a change to a wildcard filter clears the cache. A cache entry
holds the aggregated deliveries for an anonymous publisher plus the matched share groups; per call,
only two cheap steps remain: No Local (a lookup in a small set of subscriber ids, with the filtered
result memoised per publisher in the entry) and the round-robin pick of each share group (each
member its own Delivery). A cache hit without share groups allocates nothing: it returns
the entry's tuple.

Topics passed to :meth:`Router.match` must be valid topic names (the front end validates publishes);
an invalid one raises :class:`~trimaran.topics.TopicError` on a cache miss.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar, cast

from trimaran.topics import SHARE_PREFIX, TopicError, validate_topic_filter
from trimaran.vhosts import TENANT, TENANT_LEVELS

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "Delivery",
    "Router",
    "Subscriber",
    "Subscription",
    "SubscriptionOptions",
    "route_key",
]

DEFAULT_CACHE_SIZE: Final = 8192
DEFAULT_CACHE_BYTES: Final = 4 * 1024 * 1024
_ENTRY_OVERHEAD: Final = 200  # an entry's objects and its dict slot, roughly, beyond topic and deliveries
_NO_IDS: Final[frozenset[str]] = frozenset()


class Subscriber(Protocol):
    """What the router needs of a subscriber: hashable, and an id to compare with a publisher's id.

    Two objects with the same ``id`` are still two subscribers (a session taken over by a new
    connection must be moved with :meth:`Router.unsubscribe_all` and re-subscribed).
    """

    @property
    def id(self) -> str: ...

    def __hash__(self) -> int: ...


S = TypeVar("S", bound=Subscriber)


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """Options of one subscription.

    ``retain_handling`` is not used by the router; it is kept so that a session's subscriptions can be
    persisted and listed with everything MQTT 5 gives them. ``tag`` is opaque to the router.
    ``reads``: set when the subscriber may read only some of the topics the filter matches (the
    permission rules): a topic it says no to is left out of the match, and the answer is kept with
    the topic's cached match, so a cache hit asks nothing. None (the default) costs nothing.
    """

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    subscription_identifier: int | None = None
    share_group: str | None = None
    retain_handling: int = 0
    tag: Any = None  # opaque (Any, not object: a compiled dataclass cannot name ``object``)
    reads: Callable[[str], bool] | None = None


class Delivery(Generic[S]):
    """Where one message goes: one subscriber, once.

    ``qos`` is the maximum granted QoS of the matching subscriptions (the front end sends
    ``min(message.qos, delivery.qos)``); ``subscription_identifiers`` lists the distinct identifiers of
    the matching subscriptions in match order; ``retain_as_published`` is true if any matching
    subscription asked for it; ``share_group`` is set for a delivery to a share group member.
    ``subscriptions`` holds the matching subscriptions of a delivery for several; a subscription
    matched alone is its own Delivery (:class:`Subscription`, whose ``subscriptions`` is empty):
    :meth:`matched` gives them either way.

    Deliveries are shared between calls and must not be mutated (compared by identity; a plain
    class, not a dataclass: mypyc cannot build generic dataclasses, its issue 827).
    """

    __slots__ = (
        "qos",
        "retain_as_published",
        "share_group",
        "subscriber",
        "subscription_identifiers",
        "subscriptions",
    )

    def __init__(
        self,
        subscriber: S,
        qos: int,
        subscription_identifiers: tuple[int, ...],
        retain_as_published: bool,
        subscriptions: tuple[Subscription[S], ...],
        share_group: str | None = None,
    ) -> None:
        self.subscriber: Final = subscriber
        self.qos: Final = qos
        self.subscription_identifiers: Final = subscription_identifiers
        self.retain_as_published: Final = retain_as_published
        self.subscriptions: Final = subscriptions
        self.share_group: Final = share_group

    def matched(self) -> tuple[Subscription[S], ...]:
        """The subscriptions this delivery is for (none for one a front end made itself)."""
        return self.subscriptions

    def member(self) -> Subscription[S] | None:
        """The first of them, with no tuple made (a share group's pick: its member's filter)."""
        return self.subscriptions[0] if self.subscriptions else None

    def __repr__(self) -> str:
        return (
            f"Delivery(subscriber={self.subscriber!r}, qos={self.qos!r}, "
            f"subscription_identifiers={self.subscription_identifiers!r}, "
            f"retain_as_published={self.retain_as_published!r}, subscriptions={self.subscriptions!r}, "
            f"share_group={self.share_group!r})"
        )


class Subscription(Delivery[S]):
    """One subscription: who, to what, with which options (compared by identity; not to be changed).

    It is also the Delivery of a message it alone matches (most do): a Delivery of its own and the
    1-tuple of it were 152 bytes of every subscription compiled, its Delivery fields here are 40
    (issue 47). They are its options' (its identifier as a tuple); its ``subscriptions`` is empty.
    """

    __slots__ = ("options", "topic_filter")

    def __init__(self, subscriber: S, topic_filter: str, options: SubscriptionOptions) -> None:
        sid = options.subscription_identifier
        super().__init__(
            subscriber,
            options.qos,
            () if sid is None else (sid,),
            options.retain_as_published,
            (),
            options.share_group,
        )
        self.topic_filter: Final = topic_filter
        self.options: Final = options

    def matched(self) -> tuple[Subscription[S], ...]:
        return (self,)

    def member(self) -> Subscription[S]:
        return self

    def __repr__(self) -> str:
        return (
            f"Subscription(subscriber={self.subscriber!r}, topic_filter={self.topic_filter!r}, "
            f"options={self.options!r})"
        )


def _deliveries(node: _Node | Subscription[Any]) -> list[Subscription[Any]]:
    """The Deliveries of a level's plain (not shared) subscriptions, or of a held branch: each its own."""
    if isinstance(node, Subscription):
        return [node]
    subs = node.subs
    if subs is None:
        return []
    return [subs] if isinstance(subs, Subscription) else list(subs.values())


def _key(sub: Subscription[S]) -> tuple[str, str | None]:
    """Where a subscriber's subscription is held among its others: its filter and share group."""
    return sub.topic_filter, sub.options.share_group


def _aggregate(subs: list[Subscription[S]]) -> Delivery[S]:
    """One Delivery for a subscriber's matching subscriptions (one alone is its own)."""
    if len(subs) == 1:
        return subs[0]
    qos = 0
    rap = False
    ids: list[int] = []
    for s in subs:
        o = s.options
        if o.qos > qos:
            qos = o.qos
        rap = rap or o.retain_as_published
        sid = o.subscription_identifier
        if sid is not None and sid not in ids:
            ids.append(sid)
    return Delivery(subs[0].subscriber, qos, tuple(ids), rap, tuple(subs), None)


class _ShareGroup(Generic[S]):
    """Members of one ``$share/<name>/<filter>``, in subscription order, and the round-robin cursor."""

    __slots__ = ("deliveries", "members", "name", "next_index")

    def __init__(self, name: str) -> None:
        self.name = name
        self.members: dict[S, Subscription[S]] = {}
        self.deliveries: tuple[Subscription[S], ...] = ()  # the members, each its own Delivery
        self.next_index = 0

    def rebuild(self) -> None:
        self.deliveries = tuple(self.members.values())
        if self.next_index >= len(self.deliveries):
            self.next_index = 0

    def pick(self) -> Subscription[S]:
        i = self.next_index
        deliveries = self.deliveries
        self.next_index = i + 1 if i + 1 < len(deliveries) else 0
        return deliveries[i]


class _Node:
    """One trie level, named ``level``. ``subs`` holds its non-shared subscriptions (each its own
    Delivery).

    Each dict is made by its first entry: a level mostly has children or subscribers, not both,
    and seldom a share group. An empty dict is 64 bytes, and a client subscribed to a filter of its
    own (``devices/<id>/+``) has a level or two of its own (issue #47). Not generic (its
    subscribers are typed Any): compiled, a class with Generic among its bases gets a __dict__ and
    a __weakref__ slot, 16 bytes of each level."""

    __slots__ = ("children", "groups", "level", "no_local", "subs")

    def __init__(self, level: str = "") -> None:
        self.level = level
        # A level's only child is held as itself (its ``level`` names it): the dict of one entry
        # was some 200 bytes of each device's own filter. The dict is made by the second. In the
        # dict, a branch with one plain subscription and nothing else is that Subscription: two
        # levels of 80 bytes each of every device subscribed to ``devices/<id>/+`` (issue 47).
        self.children: dict[str, _Node | Subscription[Any]] | _Node | None = None
        # A level's only subscriber is held as its Subscription alone (a device's own filter): its
        # dict would be some 150 bytes more. The dict is made by the second.
        self.subs: dict[Any, Subscription[Any]] | Subscription[Any] | None = None
        self.groups: dict[str, _ShareGroup[Any]] | None = None  # dropped again with its last group
        self.no_local = 0  # how many of ``subs`` have No Local


def _child(node: _Node, level: str) -> _Node | Subscription[Any] | None:
    """``node``'s child named ``level``, if it has one: a level, or a branch held as its subscription."""
    children = node.children
    if children is None:
        return None
    if isinstance(children, _Node):
        return children if children.level == level else None
    return children.get(level)


def _opened(held: Subscription[Any], depth: int, name: str) -> _Node:
    """A branch held as its subscription, as levels: from the filter's level ``depth`` (``name``)
    down, the last holding the subscription."""
    levels = held.topic_filter.split("/")
    top = node = _Node(name)
    for level in levels[depth + 1 :]:
        child = node.children = _Node(level)
        node = child
    node.subs = held
    if held.options.no_local:
        node.no_local = 1
    return top


def _rest_matches(held: Subscription[Any], levels: list[str], depth: int, tenant: int) -> bool:
    """Whether a branch held as its subscription, whose name matched the topic's level ``depth``,
    matches the topic's ``levels`` below it (``tenant``: a level that ``+`` and ``#`` do not match)."""
    wanted = held.topic_filter.split("/")
    last = len(levels)
    for i in range(depth + 1, len(wanted)):
        w = wanted[i]
        if w == "#":  # this level and all below, or none ('sport/#' matches 'sport')
            return i != tenant
        if i == last or (w == "+" and i == tenant) or (w != "+" and w != levels[i]):
            return False
    return len(wanted) == last


def _prune(path: list[_Node]) -> None:
    """Drop the levels of a branch, bottom-up, while they hold nothing (``path[0]`` is the root)."""
    for depth in range(len(path) - 1, 0, -1):
        child = path[depth]
        if child.subs or child.groups or child.children:
            break
        parent = path[depth - 1]
        children = parent.children
        if isinstance(children, dict):
            del children[child.level]
            if not children:
                parent.children = None
        else:
            parent.children = None


class _Entry(Generic[S]):
    """A cached match for one topic."""

    __slots__ = ("by_publisher", "deliveries", "groups", "no_local_ids")

    def __init__(
        self,
        deliveries: tuple[Delivery[S], ...],
        groups: tuple[_ShareGroup[S], ...],
        no_local_ids: frozenset[str],
    ) -> None:
        self.deliveries = deliveries
        self.groups = groups
        self.no_local_ids = no_local_ids
        self.by_publisher: dict[str, tuple[Delivery[S], ...]] = {}

    def for_publisher(self, publisher_id: str) -> tuple[Delivery[S], ...]:
        """Deliveries without the subscriptions that No Local excludes for this publisher."""
        cached = self.by_publisher.get(publisher_id)
        if cached is not None:
            return cached
        out: list[Delivery[S]] = []
        for d in self.deliveries:
            if d.subscriber.id != publisher_id:
                out.append(d)
                continue
            subs = d.matched()
            kept = [s for s in subs if not s.options.no_local]
            if not kept:
                continue
            out.append(d if len(kept) == len(subs) else _aggregate(kept))
        result = tuple(out)
        self.by_publisher[publisher_id] = result
        return result


def _readable(topic: str, deliveries: Sequence[Delivery[S]]) -> list[Delivery[S]]:
    """The deliveries without the subscriptions whose subscriber may not read ``topic``."""
    out: list[Delivery[S]] = []
    for d in deliveries:
        subs = d.matched()
        kept = [s for s in subs if s.options.reads is None or s.options.reads(topic)]
        if len(kept) == len(subs):
            out.append(d)
        elif kept:
            out.append(_aggregate(kept))
    return out


def route_key(topic_filter: str, group: str | None) -> str:
    """A route's name: the filter, or ``$share/<group>/<filter>`` for a share group."""
    return topic_filter if group is None else f"{SHARE_PREFIX}{group}/{topic_filter}"


def _weight(topic: str, entry: _Entry[Any]) -> int:
    """What a cached match counts against the cache's byte bound."""
    return len(topic) + 8 * (len(entry.deliveries) + len(entry.groups)) + _ENTRY_OVERHEAD


class Router(Generic[S]):
    """Subscription trie with ``+``/``#`` wildcards, share groups, the ``$`` rule and a match cache."""

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._root: _Node = _Node()
        # Each subscriber's subscriptions by (filter, share group); one alone is held as itself (a
        # dict and its key would be some 300 bytes of every device subscribed to a filter of its own).
        self._by_subscriber: dict[S, Subscription[S] | dict[tuple[str, str | None], Subscription[S]]] = {}
        self._count = 0
        self._checked = 0  # subscriptions with ``reads``: while none, matches ask nothing
        self._cache: OrderedDict[str, _Entry[S]] = OrderedDict()
        self._cache_size = max(0, cache_size)
        # Bounded in bytes too: topics may be 64 KB long, and 8,192 of those would be half a GB.
        self._cache_bytes = max(0, cache_bytes)
        self._cached_bytes = 0
        # Misses only: a hit counter would allocate a new int per publish once past 256.
        self.cache_misses = 0
        # Routes: each filter (``$share/<group>/<filter>`` for a share group) with how many
        # subscriptions hold it; ``on_route(key, added)`` hears when one appears or goes (a cluster
        # node tells the others which publishes it wants). Counted only while it listens: else
        # routes() counts them when asked, and a device's own filter is not in a dict twice (25 to
        # 50 bytes of each subscription as the table fills; issue 47).
        self._routes: dict[str, int] | None = None
        self._on_route: Callable[[str, bool], None] | None = None

    # --- changes -----------------------------------------------------------------------------------

    def subscribe(self, subscriber: S, topic_filter: str, options: SubscriptionOptions) -> bool:
        """Add or replace ``subscriber``'s subscription to ``topic_filter`` (in ``options.share_group``).

        ``topic_filter`` is the plain filter: a front end splits ``$share/<group>/<filter>`` with
        :func:`~trimaran.topics.split_shared` and passes the group in the options. Returns True
        if the subscription is new, False if it replaced one (MQTT 5 Retain Handling 1 needs this).
        Raises :class:`~trimaran.topics.TopicError` for an invalid filter and ``ValueError``
        for No Local on a shared subscription (a protocol error in MQTT 5) or a QoS outside 0..2.
        """
        validate_topic_filter(topic_filter)
        if topic_filter.startswith(SHARE_PREFIX):
            raise TopicError("pass $share/<group>/<filter> split: group in the options, plain filter")
        group = options.share_group
        if group is not None:
            if not group or "/" in group or "+" in group or "#" in group:
                raise TopicError(f"invalid share name {group!r}")
            if options.no_local:
                raise ValueError("No Local cannot be set on a shared subscription")
            if options.reads is not None:
                raise ValueError("a shared subscription is read whole or not at all (no reads)")
        if not 0 <= options.qos <= 2:
            raise ValueError(f"qos must be 0, 1 or 2, not {options.qos!r}")

        sub = Subscription(subscriber, topic_filter, options)
        if options.reads is not None:
            self._checked += 1
        found = self._place(topic_filter.split("/"), sub if group is None else None)
        if not isinstance(found, _Node):  # held as a branch of its own, or replacing the one held
            is_new = found is None
            if found is not None and found.options.reads is not None:
                self._checked -= 1
        elif group is None:
            node = found
            subs = node.subs
            if isinstance(subs, Subscription) and subs.subscriber != subscriber:
                subs = node.subs = {subs.subscriber: subs}  # a second subscriber: the dict
            old = subs.get(subscriber) if isinstance(subs, dict) else subs
            is_new = old is None
            if old is not None and old.options.no_local:
                node.no_local -= 1
            if old is not None and old.options.reads is not None:
                self._checked -= 1
            if isinstance(subs, dict):
                subs[subscriber] = sub
            else:
                node.subs = sub
            if options.no_local:
                node.no_local += 1
        else:
            node = found
            groups = node.groups
            if groups is None:
                groups = node.groups = {}
            share = groups.get(group)
            if share is None:
                share = groups[group] = _ShareGroup(group)
            is_new = subscriber not in share.members
            share.members[subscriber] = sub  # a replaced member keeps its place in the rotation
            share.rebuild()

        mine = self._by_subscriber.get(subscriber)
        if mine is None or (isinstance(mine, Subscription) and _key(mine) == (topic_filter, group)):
            self._by_subscriber[subscriber] = sub
        elif isinstance(mine, Subscription):
            self._by_subscriber[subscriber] = {_key(mine): mine, (topic_filter, group): sub}
        else:
            mine[(topic_filter, group)] = sub
        if is_new:
            self._count += 1
            if self._routes is not None:
                self._route_up(topic_filter, group)
        self._invalidate(topic_filter)
        return is_new

    def _place(self, levels: list[str], sub: Subscription[S] | None) -> _Node | Subscription[S] | None:
        """Walk to the trie level of a filter's ``levels``, making the levels missing, and return it.

        A branch held as its subscription on the way is opened into levels. Given a plain ``sub``,
        the walk ends where the filter's branch is new, with the branch held as ``sub`` (None is
        returned), or where it finds the branch held as ``sub``'s own subscription: ``sub`` takes
        its place, and the one replaced is returned.
        """
        node = self._root
        for depth, level in enumerate(levels):
            children = node.children
            if children is None:
                child = node.children = _Node(level)
            elif isinstance(children, _Node):
                if children.level == level:
                    child = children
                elif sub is not None:  # a second child: the dict, with the new branch held
                    node.children = {children.level: children, level: sub}
                    return None
                else:
                    child = _Node(level)
                    node.children = {children.level: children, level: child}
            else:
                found = children.get(level)
                if found is None:
                    if sub is not None:
                        children[level] = sub
                        return None
                    found = children[level] = _Node(level)
                elif isinstance(found, Subscription):
                    if (
                        sub is not None
                        and found.subscriber == sub.subscriber
                        and found.topic_filter == sub.topic_filter
                    ):
                        children[level] = sub
                        return cast("Subscription[S]", found)
                    # Keyed again by ``level``, the opened level's own name: one string, not two.
                    del children[level]
                    found = children[level] = _opened(found, depth, level)
                child = found
            node = child
        return node

    def unsubscribe(self, subscriber: S, topic_filter: str, share_group: str | None = None) -> bool:
        """Remove one subscription; True if it existed."""
        mine = self._by_subscriber.get(subscriber)
        key = (topic_filter, share_group)
        if isinstance(mine, Subscription):
            if _key(mine) != key:
                return False
            del self._by_subscriber[subscriber]
        elif mine is None or mine.pop(key, None) is None:
            return False
        elif not mine:
            del self._by_subscriber[subscriber]
        self._remove_from_trie(subscriber, topic_filter, share_group)
        self._count -= 1
        if self._routes is not None:
            self._route_down(topic_filter, share_group)
        self._invalidate(topic_filter)
        return True

    def unsubscribe_all(self, subscriber: S) -> int:
        """Remove every subscription of ``subscriber``; returns how many there were."""
        mine = self._by_subscriber.pop(subscriber, None)
        if not mine:
            return 0
        keys = [_key(mine)] if isinstance(mine, Subscription) else list(mine)
        for topic_filter, group in keys:
            self._remove_from_trie(subscriber, topic_filter, group)
            if self._routes is not None:
                self._route_down(topic_filter, group)
            self._invalidate(topic_filter)
        self._count -= len(keys)
        return len(keys)

    @property
    def on_route(self) -> Callable[[str, bool], None] | None:
        """Hears ``(route, True)`` when a route appears and ``(route, False)`` when it goes."""
        return self._on_route

    @on_route.setter
    def on_route(self, listener: Callable[[str, bool], None] | None) -> None:
        self._on_route = listener
        self._routes = None if listener is None else self._count_routes()

    def _count_routes(self) -> dict[str, int]:
        routes: dict[str, int] = {}
        for sub in self.iter_subscriptions():
            key = route_key(sub.topic_filter, sub.options.share_group)
            routes[key] = routes.get(key, 0) + 1
        return routes

    def _route_up(self, topic_filter: str, group: str | None) -> None:
        routes = self._routes
        assert routes is not None and self._on_route is not None  # counted while it listens
        key = route_key(topic_filter, group)
        held = routes.get(key, 0)
        routes[key] = held + 1
        if not held:
            self._on_route(key, True)

    def _route_down(self, topic_filter: str, group: str | None) -> None:
        routes = self._routes
        assert routes is not None and self._on_route is not None
        key = route_key(topic_filter, group)
        held = routes.pop(key, 0) - 1
        if held > 0:
            routes[key] = held
        else:
            self._on_route(key, False)

    def routes(self) -> list[str]:
        """Every route this router holds (a filter once, share groups as ``$share/<group>/<filter>``)."""
        return list(self._count_routes() if self._routes is None else self._routes)

    def forget_matches(self) -> None:
        """Empty the match cache: the permission rules changed, and with them what ``reads`` says."""
        self._cache.clear()
        self._cached_bytes = 0

    def _invalidate(self, topic_filter: str) -> None:
        """Drop the cached matches a change to ``topic_filter`` can affect.

        A filter without wildcards matches only the topic spelled the same, so only that entry goes
        (devices subscribing to their own ``devices/<id>/cmd`` do not empty the cache for everyone);
        a wildcard filter empties the cache.
        """
        if "+" in topic_filter or "#" in topic_filter:
            self._cache.clear()
            self._cached_bytes = 0
        else:
            entry = self._cache.pop(topic_filter, None)
            if entry is not None:
                self._cached_bytes -= _weight(topic_filter, entry)

    def _remove_from_trie(self, subscriber: S, topic_filter: str, group: str | None) -> None:
        # The subscription is there (its subscriber's index says so): so is each dict on its way.
        path: list[_Node] = [self._root]
        node = self._root
        held: Subscription[Any] | None = None
        for level in topic_filter.split("/"):
            child = _child(node, level)
            assert child is not None
            if isinstance(child, Subscription):  # the branch held as this subscription
                held = child
                children = node.children
                assert group is None and held.subscriber == subscriber and isinstance(children, dict)
                del children[level]
                if not children:
                    node.children = None
                break
            path.append(child)
            node = child
        if held is not None:
            options = held.options
        elif group is None:
            subs = node.subs
            assert subs is not None
            if isinstance(subs, Subscription):
                node.subs = None
                options = subs.options
            else:
                options = subs.pop(subscriber).options
                if not subs:
                    node.subs = None
            if options.no_local:
                node.no_local -= 1
        else:
            groups = node.groups
            assert groups is not None
            share = groups[group]
            options = share.members.pop(subscriber).options
            if share.members:
                share.rebuild()
            else:
                del groups[group]
                if not groups:
                    node.groups = None
        if options.reads is not None:
            self._checked -= 1
        _prune(path)

    # --- matching ----------------------------------------------------------------------------------

    def match(self, topic: str, publisher_id: str | None = None) -> Sequence[Delivery[S]]:
        """Deliveries for a message published to ``topic`` by ``publisher_id`` (for No Local).

        Without share groups this is the cached tuple itself, not a copy: callers must not change it.
        """
        entry = self._cache.get(topic)
        if entry is None:
            self.cache_misses += 1
            entry = self._build(topic)
        deliveries = entry.deliveries
        if publisher_id is not None and publisher_id in entry.no_local_ids:
            deliveries = entry.for_publisher(publisher_id)
        if not entry.groups:
            return deliveries
        out = list(deliveries)
        for share in entry.groups:
            out.append(share.pick())
        return out

    def _build(self, topic: str) -> _Entry[S]:
        if not topic or "+" in topic or "#" in topic:
            raise TopicError(f"not a valid topic name: {topic!r}")
        nodes = self._collect(topic)

        deliveries: Sequence[Delivery[S]]
        groups: list[_ShareGroup[S]] = []
        no_local: set[str] = set()
        for node in nodes:
            if isinstance(node, Subscription):
                if node.options.no_local:
                    no_local.add(node.subscriber.id)
                continue
            if node.no_local and node.subs:
                for sub in _deliveries(node):
                    if sub.options.no_local:
                        no_local.add(sub.subscriber.id)
            if node.groups:
                groups.extend(node.groups.values())
        if len(nodes) == 1:
            deliveries = _deliveries(nodes[0])
        else:
            # One Delivery per subscriber: merge the subscribers that several matching filters share.
            per_subscriber: dict[S, Subscription[S] | list[Subscription[S]]] = {}
            merged = False
            for node in nodes:
                for sub in _deliveries(node):
                    found = per_subscriber.setdefault(sub.subscriber, sub)
                    if found is sub:
                        continue
                    merged = True
                    if isinstance(found, Subscription):
                        per_subscriber[sub.subscriber] = [found, sub]
                    else:
                        found.append(sub)
            if merged:
                deliveries = [
                    found if isinstance(found, Subscription) else _aggregate(found)
                    for found in per_subscriber.values()
                ]
            else:
                deliveries = list(cast("dict[S, Subscription[S]]", per_subscriber).values())

        if self._checked:
            deliveries = _readable(topic, deliveries)
        entry = _Entry(tuple(deliveries), tuple(groups), frozenset(no_local) if no_local else _NO_IDS)
        cache = self._cache
        weight = _weight(topic, entry)
        if self._cache_size and weight <= self._cache_bytes:
            while cache and (
                len(cache) >= self._cache_size or self._cached_bytes + weight > self._cache_bytes
            ):
                old_topic, old = cache.popitem(last=False)
                self._cached_bytes -= _weight(old_topic, old)
            cache[topic] = entry
            self._cached_bytes += weight
        return entry

    def _collect(self, topic: str) -> list[_Node | Subscription[S]]:
        """Trie nodes and held branches whose filter matches ``topic`` (each at most once)."""
        found: list[_Node | Subscription[S]] = []
        levels = topic.split("/")
        frontier = [self._root]
        # '+' and '#' do not match a first level starting with '$' ($SYS, $queue ...): the tree's
        # first level, and a tenant's first level (trimaran/vhosts.py: $vhost/<v>/$SYS/x) too.
        shielded = 0 if topic[0] == "$" else -1
        tenant = -1
        if shielded == 0 and len(levels) > TENANT_LEVELS and levels[TENANT_LEVELS][:1] == "$":
            tenant = TENANT_LEVELS if topic.startswith(TENANT) else -1
        for depth, level in enumerate(levels):
            nxt: list[_Node] = []
            guarded = depth in (shielded, tenant)
            for node in frontier:
                children = node.children
                if children is None:
                    continue
                if isinstance(children, _Node):  # its only child
                    name = children.level
                    if name == level or (not guarded and name == "+"):
                        nxt.append(children)
                    elif not guarded and name == "#":
                        found.append(children)
                    continue
                # '#' here matches this level and everything below; '+' matches this level.
                if not guarded:
                    wild = children.get("#")
                    if wild is not None:
                        found.append(wild)
                    wild = children.get("+")
                    if isinstance(wild, _Node):
                        nxt.append(wild)
                    elif wild is not None and _rest_matches(wild, levels, depth, tenant):
                        found.append(wild)
                child = children.get(level)
                if isinstance(child, _Node):
                    nxt.append(child)
                elif child is not None and _rest_matches(child, levels, depth, tenant):
                    found.append(child)
            if not nxt:
                return found
            frontier = nxt
        for node in frontier:
            found.append(node)
            # 'sport/#' also matches 'sport' itself.
            wild = _child(node, "#")
            if wild is not None:
                found.append(wild)
        return found

    # --- introspection -----------------------------------------------------------------------------

    def count(self) -> int:
        """Number of subscriptions (shared ones included)."""
        return self._count

    def subscriber_count(self) -> int:
        """Number of distinct subscribers with at least one subscription."""
        return len(self._by_subscriber)

    def subscriptions_of(self, subscriber: S) -> list[Subscription[S]]:
        """``subscriber``'s subscriptions, in subscription order."""
        mine = self._by_subscriber.get(subscriber)
        if mine is None:
            return []
        return [mine] if isinstance(mine, Subscription) else list(mine.values())

    def iter_subscriptions(self) -> Iterator[Subscription[S]]:
        """Every subscription, grouped by subscriber (do not change the router while iterating)."""
        for mine in self._by_subscriber.values():
            if isinstance(mine, Subscription):
                yield mine
            else:
                yield from mine.values()

    def share_members(self, group: str, topic_filter: str) -> list[Subscription[S]]:
        """Members of ``$share/<group>/<topic_filter>`` in rotation order (empty if none)."""
        node = self._root
        for level in topic_filter.split("/"):
            child = _child(node, level)
            if not isinstance(child, _Node):  # none, or a branch held as a plain subscription
                return []
            node = child
        share = None if node.groups is None else node.groups.get(group)
        return [] if share is None else list(share.members.values())

    def cache_len(self) -> int:
        """Number of topics currently cached (for metrics)."""
        return len(self._cache)
