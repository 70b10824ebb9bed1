"""Which nodes want a publish: every node's routes, matched like subscriptions (sans-IO).

Each node's routes are the filters its subscribers hold (``$share/<group>/<filter>`` for a share
group), a filter once per node. The table reuses the deck's router with one subscriber per node, so
matching, the ``$`` rule, the per-topic cache and the round-robin pick of a share group's member are
the same as for local subscribers: a share group spread over several nodes takes turns between them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trimaran.broker.router import Router, SubscriptionOptions
from trimaran.topics import TopicError, split_shared


@dataclass(frozen=True, slots=True)
class NodeRef:
    """One node as the route table's subscriber (compared by name)."""

    id: str


@dataclass(slots=True)
class Targets:
    """Where one publish goes: each other node with the share groups it serves this time, and the
    share groups this node leaves to others."""

    nodes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    elsewhere: frozenset[tuple[str, str]] = frozenset()


_NOWHERE = Targets()


class RouteTable:
    def __init__(self, me: str) -> None:
        self.me = me
        self._router: Router[NodeRef] = Router()
        self._nodes: dict[str, NodeRef] = {}
        self._routes: dict[str, set[str]] = {}

    def add(self, node: str, key: str) -> bool:
        """Add a route; False if the node held it already or the filter is not one."""
        held = self._routes.setdefault(node, set())
        if key in held:
            return False
        try:
            group, topic_filter = split_shared(key)
            ref = self._nodes.setdefault(node, NodeRef(node))
            self._router.subscribe(ref, topic_filter, SubscriptionOptions(share_group=group))
        except (TopicError, ValueError):
            return False
        held.add(key)
        return True

    def remove(self, node: str, key: str) -> bool:
        held = self._routes.get(node)
        if held is None or key not in held:
            return False
        held.discard(key)
        group, topic_filter = split_shared(key)
        self._router.unsubscribe(self._nodes[node], topic_filter, group)
        return True

    def drop_node(self, node: str) -> int:
        """Forget every route of ``node`` (it left or died); returns how many."""
        self._routes.pop(node, None)
        ref = self._nodes.pop(node, None)
        return 0 if ref is None else self._router.unsubscribe_all(ref)

    def replace(self, node: str, keys: Iterable[str]) -> None:
        """Make ``node``'s routes exactly ``keys`` (a reload from the table)."""
        wanted = set(keys)
        for key in self._routes.get(node, set()) - wanted:
            self.remove(node, key)
        for key in wanted - self._routes.get(node, set()):
            self.add(node, key)

    def nodes(self) -> list[str]:
        return [node for node, held in self._routes.items() if held]

    def count(self, node: str) -> int:
        return len(self._routes.get(node, ()))

    def targets(self, topic: str, publisher_id: str | None = None) -> Targets:
        """Where a publish to ``topic`` goes besides this node's own subscribers."""
        deliveries = self._router.match(topic)
        if not deliveries:
            return _NOWHERE
        me = self.me
        nodes: dict[str, list[tuple[str, str]]] = {}
        elsewhere: list[tuple[str, str]] = []
        for d in deliveries:
            node = d.subscriber.id
            group = d.share_group
            if group is None:
                if node != me:
                    nodes.setdefault(node, [])
                continue
            member = d.member()
            assert member is not None  # a share group's pick is one of its members
            key = (group, member.topic_filter)
            if node != me:
                nodes.setdefault(node, []).append(key)
                elsewhere.append(key)
        if not nodes:
            return _NOWHERE
        return Targets(nodes, frozenset(elsewhere))
