"""RabbitMQ's permission model: who may enter which vhost, and what configure / write / read allow.

A permission row (:class:`trimaran.vhosts.Permission`, RabbitMQ's ``set_permissions``) lets one user
enter one vhost and carries three regular expressions, matched against the names of the resources an
operation touches, as RabbitMQ matches them:

- configure: declare (not passive) and delete a queue or an exchange;
- write: publish to an exchange; bind to a queue, or to an exchange as the destination;
- read: consume from or get from a queue, purge it; bind from an exchange (the source).

Each protocol maps its operations onto these (``amqp091/access.py``, ``mqtt/handler.py``,
``amqp1/handler.py``; the table is in docs/security.md). The rules, as RabbitMQ's:

- **No row, no entry**, whatever else the table holds: nobody enters a vhost they have no row for.
  Anonymous clients (and AMQP's default ``guest``/``guest`` login, which is anonymous here) are
  checked under :data:`ANONYMOUS` (``guest``), as RabbitMQ's MQTT plugin checks its anonymous
  clients under its ``default_user``. A fresh install grants ``guest`` ``.* .* .*`` on ``/``
  (RabbitMQ's first start); a new vhost grants nothing.
- A pattern is searched for in the name, as Erlang's ``re:run`` does: ``alice`` matches
  ``bob-alice-q``, ``^alice-.*`` only names starting with ``alice-``. An empty pattern is ``^$``: it
  matches no resource (RabbitMQ's rule).
- The default exchange (``""``) is named ``amq.default`` for the check.

Topic permissions (RabbitMQ's ``set_topic_permissions``): per user, vhost and topic exchange, a write
and a read pattern on routing keys, ``{username}``, ``{vhost}`` and ``{client_id}`` replaced by the
client's (escaped, so that a name stands for itself). A publish through a topic exchange needs its
routing key to match the write pattern, a binding from one its binding key to match the read
pattern; with no topic permission for the exchange, any key will do (RabbitMQ's rule).

Verdicts are kept per ``(user, vhost, access, kind, name)`` (and per key for topic permissions) and
forgotten whenever a permission changes, so a name is matched against a regular expression once; the
hulls keep the last name a connection published to besides, so that a publish on the hot path asks
nothing.

This module is the standard library and the ground floor only: ``guard.Security`` holds one
:class:`Permissions` and persists through :class:`trimaran.vhosts.PermissionStore`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from trimaran.vhosts import DEFAULT_VHOST, Permission, TopicPermission

__all__ = [
    "AMQ_TOPIC",
    "ANONYMOUS",
    "DEFAULT_EXCHANGE",
    "EXCHANGE",
    "QUEUE",
    "TOPIC",
    "PatternError",
    "Permissions",
    "check_pattern",
    "default_rows",
    "expand",
    "pattern_user",
]

#: The user whose permissions anonymous clients have (RabbitMQ's default user).
ANONYMOUS: Final = "guest"
#: The nameless exchange in permissions, as RabbitMQ names it.
DEFAULT_EXCHANGE: Final = "amq.default"
#: The exchange MQTT and AMQP 1.0 topics go through, as in RabbitMQ's plugins.
AMQ_TOPIC: Final = "amq.topic"
QUEUE: Final = "queue"
EXCHANGE: Final = "exchange"
TOPIC: Final = "topic"
CONFIGURE: Final = "configure"
WRITE: Final = "write"
READ: Final = "read"
# Each cache of verdicts (by name, by routing key) forgets them all once it passes 256 KiB: some
# 1,300 names of 40 characters. Exchanges and a fleet's keys come back; a connection's own queue names
# (amq.gen-..., mqtt-subscription-<client id>) never do, and by count (65,536) they held some 15 MB
# that grew with every connection (issue 47).
VERDICT_BYTES: Final = 256 * 1024
# A verdict's key tuple and dict slot (110 B, measured with tracemalloc) and its name's string header
# (49 B); the name's characters come on top.
VERDICT_ENTRY_BYTES: Final = 160


class PatternError(ValueError):
    """A pattern that is not a regular expression (RabbitMQ: ``invalid_regexp``)."""


def check_pattern(pattern: str) -> str:
    """``pattern`` if Python's ``re`` compiles it, else PatternError naming it."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PatternError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
    return pattern


def pattern_user(user: str | None) -> str:
    """The user a connection's permissions are looked up under (anonymous: :data:`ANONYMOUS`)."""
    return ANONYMOUS if user is None else user


#: The pattern of "every name" (RabbitMQ's default user's): answered without a search or a verdict.
EVERYTHING: Final = ".*"


def _compiled(pattern: str) -> re.Pattern[str] | None:
    """``pattern`` compiled; None for :data:`EVERYTHING`, which every name matches. A connection's
    own queue names (``mqtt-subscription-<client id>qos1``, ``amq.gen-...``) are new each time: under
    ``.*`` a search and a remembered verdict for each were a tenth of a reconnect (issue 47)."""
    if pattern == EVERYTHING:
        return None
    # RabbitMQ: an empty pattern means ^$ (which no resource name matches).
    return re.compile(pattern or "^$")


class Permissions:
    """The permission table in memory: rows by ``(user, vhost)``, their compiled patterns, and the
    verdicts given so far. ``generation`` grows with every change (the hulls' caches compare it)."""

    def __init__(self, rows: Iterable[Permission] = ()) -> None:
        self._topics: dict[tuple[str, str, str], TopicPermission] = {}
        #: (user, vhost) with a topic permission: the hulls ask about keys only for these
        self.topic_users: set[tuple[str, str]] = set()
        self._rows: dict[tuple[str, str], Permission] = {}
        self._patterns: dict[tuple[str, str], dict[str, re.Pattern[str] | None]] = {}
        self._verdicts: dict[tuple[str, str, str, str, str], bool] = {}
        self._key_verdicts: dict[tuple[str, str, str, str, str, str], bool] = {}
        self._verdicts_size = self._key_verdicts_size = 0  # bytes, as VERDICT_ENTRY_BYTES counts them
        self.verdict_bytes = VERDICT_BYTES  # each cache's bound (tests make it small)
        self.generation = 0
        self.replace(rows)

    # -- the table ----------------------------------------------------------------------------------

    def replace(self, rows: Iterable[Permission]) -> None:
        """Every row at once (loaded from the store)."""
        self._rows = {}
        self._patterns = {}
        for row in rows:
            self._put(row)
        self._changed()

    def set(self, row: Permission) -> None:
        self._put(row)
        self._changed()

    def clear(self, user: str, vhost: str) -> bool:
        if self._rows.pop((user, vhost), None) is None:
            return False
        del self._patterns[(user, vhost)]
        self._changed()
        return True

    def forget_vhost(self, vhost: str) -> None:
        for key in [k for k in self._rows if k[1] == vhost]:
            del self._rows[key]
            del self._patterns[key]
        for topic_key in [k for k in self._topics if k[1] == vhost]:
            del self._topics[topic_key]
        self._topics_changed()

    # -- topic permissions --------------------------------------------------------------------------

    def replace_topics(self, rows: Iterable[TopicPermission]) -> None:
        self._topics = {(t.user, t.vhost, t.exchange): t for t in rows}
        self._topics_changed()

    def set_topic(self, row: TopicPermission) -> None:
        self._topics[(row.user, row.vhost, row.exchange)] = row
        self._topics_changed()

    def clear_topic(self, user: str, vhost: str, exchange: str | None = None) -> int:
        """Take ``user``'s topic permissions for ``exchange`` (every exchange: None) of ``vhost``
        away; how many there were."""
        gone = [k for k in self._topics if k[:2] == (user, vhost) and (exchange is None or k[2] == exchange)]
        for key in gone:
            del self._topics[key]
        self._topics_changed()
        return len(gone)

    def topic_rows(self, vhost: str | None = None) -> list[TopicPermission]:
        picked = [t for t in self._topics.values() if vhost is None or t.vhost == vhost]
        return sorted(picked, key=lambda t: (t.vhost, t.user, t.exchange))

    def _topics_changed(self) -> None:
        self.topic_users = {(t.user, t.vhost) for t in self._topics.values()}
        self._changed()

    def allows_key(
        self, user: str | None, vhost: str, access: str, exchange: str, key: str, client_id: str = ""
    ) -> bool:
        """May ``user`` publish (write) or bind (read) with routing key ``key`` through the topic
        exchange ``exchange``? Yes when no topic permission names that exchange for the user."""
        who = pattern_user(user)
        verdict_key = (who, vhost, access, exchange, client_id, key)
        verdict = self._key_verdicts.get(verdict_key)
        if verdict is None:
            row = self._topics.get((who, vhost, exchange))
            if row is None:
                verdict = True
            else:
                pattern = row.write if access == WRITE else row.read
                expanded = expand(pattern, who, vhost, client_id)
                verdict = re.search(expanded or "^$", key) is not None
            size = self._key_verdicts_size + VERDICT_ENTRY_BYTES + len(key) + len(client_id)
            if size > self.verdict_bytes:
                self._key_verdicts = {}
                size = VERDICT_ENTRY_BYTES + len(key) + len(client_id)
            self._key_verdicts_size = size
            self._key_verdicts[verdict_key] = verdict
        return verdict

    def get(self, user: str, vhost: str) -> Permission | None:
        return self._rows.get((user, vhost))

    def rows(self, vhost: str | None = None) -> list[Permission]:
        """Every row (of ``vhost``), by vhost and user."""
        picked = [p for p in self._rows.values() if vhost is None or p.vhost == vhost]
        return sorted(picked, key=lambda p: (p.vhost, p.user))

    def __len__(self) -> int:
        return len(self._rows)

    def _put(self, row: Permission) -> None:
        self._rows[(row.user, row.vhost)] = row
        self._patterns[(row.user, row.vhost)] = {
            CONFIGURE: _compiled(row.configure),
            WRITE: _compiled(row.write),
            READ: _compiled(row.read),
        }

    def _changed(self) -> None:
        self._verdicts = {}
        self._key_verdicts = {}
        self._verdicts_size = self._key_verdicts_size = 0
        self.generation += 1

    # -- the questions ------------------------------------------------------------------------------

    def may_enter(self, user: str | None, vhost: str) -> bool:
        """Has ``user`` (None: anonymous) a row for ``vhost``? No row, no entry."""
        return (pattern_user(user), vhost) in self._rows

    def allows(self, user: str | None, vhost: str, access: str, kind: str, name: str) -> bool:
        """May ``user`` ``access`` (configure, write, read) the ``kind`` (queue, exchange) ``name`` in
        ``vhost``? No row: no. The exchange ``""`` is ``amq.default``."""
        who = pattern_user(user)
        patterns = self._patterns.get((who, vhost))
        if patterns is None:
            return False
        pattern = patterns[access]
        if pattern is None:
            return True  # .*
        key = (who, vhost, access, kind, name)
        verdict = self._verdicts.get(key)
        if verdict is None:
            if kind == EXCHANGE and not name:
                name = DEFAULT_EXCHANGE
            verdict = pattern.search(name) is not None
            size = self._verdicts_size + VERDICT_ENTRY_BYTES + len(name)
            if size > self.verdict_bytes:
                self._verdicts = {}
                size = VERDICT_ENTRY_BYTES + len(name)
            self._verdicts_size = size
            self._verdicts[key] = verdict
        return verdict


def expand(pattern: str, user: str, vhost: str, client_id: str) -> str:
    """A topic permission's pattern with RabbitMQ's variables replaced, each value escaped."""
    if "{" not in pattern:
        return pattern
    for name, value in (("{username}", user), ("{vhost}", vhost), ("{client_id}", client_id)):
        pattern = pattern.replace(name, re.escape(value))
    return pattern


def default_rows() -> list[Permission]:
    """What a fresh install grants: ``guest`` (and so anonymous clients) everything on ``/``."""
    return [Permission(ANONYMOUS, DEFAULT_VHOST, ".*", ".*", ".*")]
