"""Limits per virtual host and per user: what each may hold, how fast each may publish.

A vhost may cap its open connections, its queues and the bytes its queues store; a user may cap its
connections and the messages and bytes a second it publishes. Nothing here loses data: over a
count or a quota the caller refuses the protocol's way (CONNACK 0x97, ``530 NOT_ALLOWED``, ``406
PRECONDITION_FAILED``, ``amqp:resource-limit-exceeded``); over a rate the runtime stops reading the
connection until the user's token buckets refill (``Rate.charge`` says for how long), as RabbitMQ's
credit flow and EMQX's rate limits do.

``TenantLimits`` is the one registry: the settings fill it, the admin API changes it at run time,
the runtime and the queue manager ask it, telemetry reads its counts. The first time a limit bites
for a vhost or user it says so in one log line; later bites are only counted. Pure: standard library
only, and ``now`` comes from the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)

# What each counter in ``TenantLimits.bites`` is called (the metrics' ``limit`` label).
CONNECTIONS = "connections"  # a vhost's connections
USER_CONNECTIONS = "user_connections"
QUEUES = "queues"
STORED_BYTES = "stored_bytes"
RATE = "rate"  # a publisher's reading paused by its user's rate

# What a stored change is about (LimitStore's kinds).
VHOST, USER, DEFAULT_USER = "vhost", "user", "default_user"


@dataclass(slots=True)
class VhostLimits:
    """0 is no limit."""

    max_connections: int = 0
    max_queues: int = 0
    max_stored_bytes: int = 0

    def any(self) -> bool:
        return bool(self.max_connections or self.max_queues or self.max_stored_bytes)


@dataclass(slots=True)
class UserLimits:
    """0 is no limit. The rates are shared by all of the user's connections."""

    max_connections: int = 0
    max_messages_per_s: float = 0.0
    max_bytes_per_s: float = 0.0

    def any(self) -> bool:
        return bool(self.max_connections or self.max_messages_per_s or self.max_bytes_per_s)

    def rated(self) -> bool:
        return bool(self.max_messages_per_s or self.max_bytes_per_s)


class Rate:
    """One user's two token buckets (messages and bytes a second, a second's worth of burst).

    The runtime charges what a read brought in after acting on it, so a bucket may go into debt;
    while it is in debt the user's connections are not read."""

    __slots__ = ("at", "bytes", "bytes_per_s", "messages", "messages_per_s")

    def __init__(self, limits: UserLimits, now: float) -> None:
        self.messages_per_s = self.messages = limits.max_messages_per_s
        self.bytes_per_s = self.bytes = limits.max_bytes_per_s
        self.at = now

    def retune(self, limits: UserLimits) -> None:
        """New rates: what is in the buckets (or owed) is kept, up to the new burst."""
        self.messages_per_s = limits.max_messages_per_s
        self.bytes_per_s = limits.max_bytes_per_s
        self.messages = min(self.messages, self.messages_per_s)
        self.bytes = min(self.bytes, self.bytes_per_s)

    def charge(self, messages: int, size: int, now: float) -> float:
        """Take ``messages`` and ``size`` bytes; the seconds to wait before reading again (0: go on)."""
        elapsed = now - self.at
        self.at = now
        wait = 0.0
        rate = self.messages_per_s
        if rate:
            tokens = min(rate, self.messages + elapsed * rate) - messages
            self.messages = tokens
            if tokens < 0:
                wait = -tokens / rate
        rate = self.bytes_per_s
        if rate:
            tokens = min(rate, self.bytes + elapsed * rate) - size
            self.bytes = tokens
            if tokens < 0:
                wait = max(wait, -tokens / rate)
        return wait


class LimitStore(Protocol):
    """Where the changes made at run time are kept (``trimaran.storage.limit_store`` implements it):
    ``(kind, name, limits)`` rows, ``limits`` None for a vhost's or user's limits cleared."""

    def load_limits(self) -> list[tuple[str, str, dict[str, Any] | None]]: ...

    async def save_limits(self, kind: str, name: str, limits: dict[str, Any] | None) -> None: ...


L = TypeVar("L", VhostLimits, UserLimits)


def _limits_from(kind: type[L], values: dict[str, Any]) -> L:
    """A stored row's limits (a field it does not know, from a later release, is left out)."""
    known = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in values.items() if k in known})


class TenantLimits:
    """The limits in force, the counts they are checked against, and how often each bit."""

    def __init__(
        self,
        vhosts: dict[str, VhostLimits] | None = None,
        users: dict[str, UserLimits] | None = None,
        default_user: UserLimits | None = None,
    ) -> None:
        self.vhosts: dict[str, VhostLimits] = dict(vhosts or {})
        self.users: dict[str, UserLimits] = dict(users or {})
        self.default_user = default_user or UserLimits()
        self.connections: dict[str, int] = {}  # vhost -> open connections that entered it
        self.user_connections: dict[str, int] = {}
        self.rates: dict[str, Rate] = {}  # user -> its buckets, while it has a rate and a connection
        self.bites: dict[tuple[str, str], int] = {}  # (vhost, limit) -> times it bit
        self._told: set[tuple[str, str]] = set()  # (limit, vhost or user) already logged
        self.on_change: Callable[[], None] | None = None  # the runtime re-reads its connections' rates
        self.store: LimitStore | None = None

    # -- what is configured ---------------------------------------------------------------------------

    def of_vhost(self, vhost: str) -> VhostLimits | None:
        return self.vhosts.get(vhost)

    def of_user(self, user: str | None) -> UserLimits:
        return self.users.get(user or "", self.default_user)

    def set_vhost(self, vhost: str, limits: VhostLimits) -> None:
        self.vhosts[vhost] = limits
        self._forget_told(vhost)
        self._changed()

    def clear_vhost(self, vhost: str) -> bool:
        found = self.vhosts.pop(vhost, None) is not None
        self._forget_told(vhost)
        self._changed()
        return found

    def set_user(self, user: str, limits: UserLimits) -> None:
        self.users[user] = limits
        self._forget_told(user)
        self._changed()

    def clear_user(self, user: str) -> bool:
        found = self.users.pop(user, None) is not None
        self._forget_told(user)
        self._changed()
        return found

    def set_default_user(self, limits: UserLimits) -> None:
        self.default_user = limits
        self._told = {told for told in self._told if told[0] not in (USER_CONNECTIONS, RATE)}
        self._changed()

    # -- changes at run time, kept in the store ------------------------------------------------------

    def use_store(self, store: LimitStore) -> None:
        """Apply what was changed at run time before, over the settings (blocking: at start), and
        keep the next changes in ``store``."""
        self.store = store
        for kind, name, values in store.load_limits():
            if kind == VHOST:
                if values is None:
                    self.vhosts.pop(name, None)
                else:
                    self.vhosts[name] = _limits_from(VhostLimits, values)
            elif kind == USER:
                if values is None:
                    self.users.pop(name, None)
                else:
                    self.users[name] = _limits_from(UserLimits, values)
            elif kind == DEFAULT_USER and values is not None:
                self.default_user = _limits_from(UserLimits, values)
        self._changed()

    async def change_vhost(self, vhost: str, limits: VhostLimits | None) -> bool:
        """Set (or, with None, clear) ``vhost``'s limits, kept in the store; False: none to clear."""
        if limits is None and vhost not in self.vhosts:
            return False
        if self.store is not None:
            await self.store.save_limits(VHOST, vhost, None if limits is None else asdict(limits))
        if limits is None:
            return self.clear_vhost(vhost)
        self.set_vhost(vhost, limits)
        return True

    async def change_user(self, user: str, limits: UserLimits | None) -> bool:
        """Set (or, with None, clear) ``user``'s own limits, kept in the store; False: none to clear."""
        if limits is None and user not in self.users:
            return False
        if self.store is not None:
            await self.store.save_limits(USER, user, None if limits is None else asdict(limits))
        if limits is None:
            return self.clear_user(user)
        self.set_user(user, limits)
        return True

    async def change_default_user(self, limits: UserLimits) -> None:
        if self.store is not None:
            await self.store.save_limits(DEFAULT_USER, "", asdict(limits))
        self.set_default_user(limits)

    def snapshot(self) -> dict[str, object]:
        """The limits and the counts, as JSON values (the admin API's answer)."""
        vhosts = sorted(set(self.vhosts) | set(self.connections))
        return {
            "vhosts": {
                name: {
                    **asdict(self.vhosts.get(name) or VhostLimits()),
                    "connections": self.connections.get(name, 0),
                }
                for name in vhosts
            },
            "users": {
                name: {**asdict(limits), "connections": self.user_connections.get(name, 0)}
                for name, limits in sorted(self.users.items())
            },
            "default_user": asdict(self.default_user),
            "bites": [
                {"vhost": vhost, "limit": limit, "count": count}
                for (vhost, limit), count in sorted(self.bites.items())
            ],
        }

    # -- connections ----------------------------------------------------------------------------------

    def enter(self, user: str | None, vhost: str) -> str | None:
        """A login of ``user`` into ``vhost``: None when it may (and it is counted), else why not."""
        name = user or ""
        limits = self.vhosts.get(vhost)
        count = self.connections.get(vhost, 0)
        if limits is not None and limits.max_connections and count >= limits.max_connections:
            self.bit(CONNECTIONS, vhost, vhost, f"connection limit ({limits.max_connections}) is reached")
            return (
                f"access to vhost '{vhost}' refused for user '{name}': "
                f"connection limit ({limits.max_connections}) is reached"
            )
        per_user = self.of_user(user).max_connections
        if per_user and self.user_connections.get(name, 0) >= per_user:
            self.bit(USER_CONNECTIONS, vhost, name, f"connection limit ({per_user}) is reached")
            return f"access refused for user '{name}': user connection limit ({per_user}) is reached"
        self.connections[vhost] = count + 1
        self.user_connections[name] = self.user_connections.get(name, 0) + 1
        return None

    def leave(self, user: str | None, vhost: str) -> None:
        name = user or ""
        _drop_one(self.connections, vhost)
        if not _drop_one(self.user_connections, name):
            self.rates.pop(name, None)

    def rate(self, user: str | None, now: float) -> Rate | None:
        """The buckets of a user that entered, shared by its connections; None without a rate."""
        name = user or ""
        limits = self.of_user(user)
        if not limits.rated():
            self.rates.pop(name, None)
            return None
        rate = self.rates.get(name)
        if rate is None:
            rate = self.rates[name] = Rate(limits, now)
        else:
            rate.retune(limits)
        return rate

    # -- queues and stored bytes ----------------------------------------------------------------------

    def may_declare_queue(self, vhost: str, queues: int, queue: str) -> str | None:
        """None if ``vhost``, holding ``queues`` queues, may get ``queue`` too; else RabbitMQ's reason."""
        limits = self.vhosts.get(vhost)
        if limits is None or not limits.max_queues or queues < limits.max_queues:
            return None
        self.bit(QUEUES, vhost, vhost, f"queue limit ({limits.max_queues}) is reached, {queue!r} refused")
        return f"vhost queue limit ({limits.max_queues}) is reached"

    def may_store(self, vhost: str, stored: int, size: int) -> str | None:
        """None if ``vhost``, whose queues hold ``stored`` bytes, may store ``size`` more."""
        limits = self.vhosts.get(vhost)
        if limits is None or not limits.max_stored_bytes or stored + size <= limits.max_stored_bytes:
            return None
        self.bit(STORED_BYTES, vhost, vhost, f"stored-bytes quota ({limits.max_stored_bytes}) is reached")
        return f"vhost '{vhost}' stored-bytes quota ({limits.max_stored_bytes}) is reached"

    # -- counting ---------------------------------------------------------------------------------------

    def bit(self, limit: str, vhost: str, subject: str, what: str) -> None:
        """Count a bite; say it once per limit and vhost or user (again after the limit changes)."""
        key = (vhost, limit)
        self.bites[key] = self.bites.get(key, 0) + 1
        told = (limit, subject)
        if told not in self._told:
            self._told.add(told)
            if limit in (CONNECTIONS, QUEUES, STORED_BYTES):
                log.warning("limits: vhost %r: %s; counted from now on", vhost, what)
            else:
                log.warning("limits: user %r (vhost %r): %s; counted from now on", subject, vhost, what)

    def _forget_told(self, subject: str) -> None:
        self._told = {told for told in self._told if told[1] != subject}

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _drop_one(counts: dict[str, int], key: str) -> int:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
        return left
    counts.pop(key, None)
    return 0
