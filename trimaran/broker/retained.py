"""Retained messages, in memory, indexed by a trie over topic levels.

:meth:`RetainedStore.match` walks the trie with a subscription filter, so ``a/+/c`` touches only the
children of ``a`` and ``a/#`` only the subtree under ``a``. The ``$`` rule applies: a filter starting
with ``+`` or ``#`` does not return topics whose first level starts with ``$``.

Expired messages (``Message.expires_at_ms`` in the past by the store's clock) are never returned; the
lookup that finds one removes it. Persistence belongs to the caller: :meth:`RetainedStore.set` returns
whether the store changed, every change (set, clear, expiry removal, :meth:`RetainedStore.clear`) is
reported to the optional ``on_change(topic, message_or_None)`` listener, and :meth:`RetainedStore.load`
fills the store from storage without reporting anything.

Pure and synchronous; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from trimaran.broker.message import Message, now_ms
from trimaran.topics import validate_topic_filter, validate_topic_name
from trimaran.vhosts import TENANT, TENANT_LEVELS

__all__ = ["ChangeListener", "RetainedStore"]

ChangeListener = Callable[[str, Message | None], None]
"""Called with (topic, new message) on a set and (topic, None) on a removal."""


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Message | None = None


class RetainedStore:
    """Retained messages by topic name."""

    def __init__(
        self,
        clock: Callable[[], int] = now_ms,
        on_change: ChangeListener | None = None,
    ) -> None:
        self._root = _Node()
        self._by_topic: dict[str, Message] = {}
        self._clock = clock
        self.on_change = on_change

    # --- changes -----------------------------------------------------------------------------------

    def set(self, message: Message) -> bool:
        """Retain ``message`` on its topic, or clear the topic if its payload is empty.

        A message that has already expired clears the topic too. Returns True if the store changed
        (always for a non-empty payload; for a clear, only if something was retained there).
        Raises :class:`~trimaran.topics.TopicError` for an invalid topic name.
        """
        topic = message.topic
        validate_topic_name(topic)
        if not message.payload or message.is_expired(self._clock()):
            return self._remove(topic)
        self._store(message)
        if self.on_change is not None:
            self.on_change(topic, message)
        return True

    def replace(self, topic: str, message: Message | None) -> None:
        """Take another writer's value for ``topic`` (a node of the same cluster) without reporting
        it: the change is stored already."""
        if message is None or not message.payload or message.is_expired(self._clock()):
            self._remove(topic, report=False)
        else:
            self._store(message)

    def delete(self, topic: str) -> bool:
        """Remove the retained message of ``topic``; True if there was one."""
        return self._remove(topic)

    def load(self, messages: Iterable[Message]) -> int:
        """Add messages from storage without notifying; skips empty and expired ones. Returns the count."""
        now = self._clock()
        loaded = 0
        for message in messages:
            if not message.payload or message.is_expired(now):
                continue
            self._store(message)
            loaded += 1
        return loaded

    def clear(self) -> None:
        """Remove everything (reported per topic to ``on_change``)."""
        topics = list(self._by_topic)
        self._root = _Node()
        self._by_topic.clear()
        if self.on_change is not None:
            for topic in topics:
                self.on_change(topic, None)

    def purge_expired(self) -> list[str]:
        """Remove every expired message now (a periodic sweep); returns the removed topics."""
        now = self._clock()
        expired = [t for t, m in self._by_topic.items() if m.is_expired(now)]
        for topic in expired:
            self._remove(topic)
        return expired

    def _store(self, message: Message) -> None:
        node = self._root
        for level in message.topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        node.message = message
        self._by_topic[message.topic] = message

    def _remove(self, topic: str, report: bool = True) -> bool:
        if self._by_topic.pop(topic, None) is None:
            return False
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split("/"):
            path.append((node, level))
            node = node.children[level]
        node.message = None
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.message is not None or child.children:
                break
            del parent.children[level]
        if report and self.on_change is not None:
            self.on_change(topic, None)
        return True

    # --- lookups -----------------------------------------------------------------------------------

    def get(self, topic: str) -> Message | None:
        """The retained message of ``topic``, if any and not expired."""
        message = self._by_topic.get(topic)
        if message is not None and message.expires_at_ms is not None and message.is_expired(self._clock()):
            self._remove(topic)
            return None
        return message

    def match(self, topic_filter: str) -> list[Message]:
        """Retained messages whose topic matches the (non-shared) ``topic_filter``, expired ones removed.

        The order is unspecified.
        Raises :class:`~trimaran.topics.TopicError` for an invalid filter.
        """
        validate_topic_filter(topic_filter)
        if "+" not in topic_filter and "#" not in topic_filter:
            message = self.get(topic_filter)  # no wildcard: a direct lookup
            return [] if message is None else [message]
        levels = topic_filter.split("/")
        found: list[Message] = []
        root = self._root
        # Level by level: the frontier holds the nodes matched by the filter's levels so far.
        frontier = [root]
        # The $ rule holds at the tree's first level and at a tenant's (trimaran/vhosts.py).
        top = TENANT_LEVELS if topic_filter.startswith(TENANT) else 0
        for i, level in enumerate(levels):
            if level == "#":
                # Each frontier node itself ('a/#' matches 'a') and its whole subtree.
                for node in frontier:
                    if i != top and node.message is not None:
                        found.append(node.message)
                    self._collect_subtree(node, i == top, found)
                return self._drop_expired(found)
            if level == "+":
                if i == top:
                    frontier = [
                        c for node in frontier for name, c in node.children.items() if name[:1] != "$"
                    ]
                else:
                    frontier = [c for node in frontier for c in node.children.values()]
            else:
                frontier = [c for node in frontier if (c := node.children.get(level)) is not None]
            if not frontier:
                return []
        found = [node.message for node in frontier if node.message is not None]
        return self._drop_expired(found)

    @staticmethod
    def _collect_subtree(node: _Node, skip_dollar: bool, found: list[Message]) -> None:
        if skip_dollar:
            stack = [c for name, c in node.children.items() if not name.startswith("$")]
        else:
            stack = list(node.children.values())
        while stack:
            n = stack.pop()
            if n.message is not None:
                found.append(n.message)
            if n.children:
                stack.extend(n.children.values())

    def _drop_expired(self, found: list[Message]) -> list[Message]:
        now: int | None = None
        for message in found:
            if message.expires_at_ms is not None:
                if now is None:
                    now = self._clock()
                if message.is_expired(now):
                    break
        else:
            return found
        assert now is not None
        kept: list[Message] = []
        for message in found:
            if message.is_expired(now):
                self._remove(message.topic)
            else:
                kept.append(message)
        return kept

    # --- introspection -----------------------------------------------------------------------------

    def count(self) -> int:
        """Number of retained messages (expired ones not yet removed included)."""
        return len(self._by_topic)

    def __len__(self) -> int:
        return len(self._by_topic)

    def __contains__(self, topic: object) -> bool:
        return isinstance(topic, str) and self.get(topic) is not None

    def messages(self) -> Iterator[Message]:
        """Every retained message (a snapshot, so the store may change while iterating)."""
        return iter(list(self._by_topic.values()))
