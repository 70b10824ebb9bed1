"""Virtual hosts: names, the key scheme that isolates them, and the registry of those that exist.

A virtual host (vhost) is a tenant: its own topic tree, retained messages, MQTT sessions, ``$queue/``
queues and streams, AMQP 0.9.1 exchanges and bindings, dead letters and statistics. The default vhost
``/`` is what every client gets unless it names another.

The key scheme: one prefix in front of every key, put there once
-----------------------------------------------------------------------
A hull turns what its client names (a topic, a filter, a queue, an MQTT client id) into the deck's
key by prepending its connection's :func:`prefix`, and strips it again (``key[len(prefix):]``) from
what it delivers. Nothing below the hulls knows about vhosts: the router, the retained store, the
session directory, the queue manager, the storage rows, the cluster's notifications and the events
all carry the prefixed key, so a name in one vhost can never meet the same name in another.

- ``/`` has the empty prefix: its keys are the names as clients spell them, byte for byte what they
  were before vhosts existed. The default vhost therefore costs nothing (a concatenation with ``""``
  and a ``[0:]`` slice, no call), and a database written before vhosts holds ``/``'s data unchanged.
- Any other vhost ``v`` has the prefix ``$vhost/<quoted v>/``, ``<quoted v>`` being ``v``
  percent-encoded with nothing kept (``prod/eu`` -> ``prod%2Feu``, as RabbitMQ's HTTP API spells
  vhosts). Quoting leaves no ``/``, ``+`` or ``#`` in that level, so the prefix is exactly two topic
  levels whatever the name, and keys are plain printable text that PostgreSQL's TEXT can hold (a NUL
  separator could not be stored there).
- The prefix starts with ``$``, so MQTT's rule that a first-level ``+`` or ``#`` does not match a
  ``$`` topic keeps every tenant's traffic out of a ``/`` subscriber's ``#``. Inside a tenant the rule
  must hold at the first level of *its* tree (``$vhost/v/$SYS/x`` is not matched by the tenant's
  ``#``, stored as ``$vhost/v/#``): the router and :func:`trimaran.topics.topic_matches` apply it at
  :data:`TENANT_LEVELS` for a key that starts with :data:`TENANT`.
- Forged prefixes: a client of a non-default vhost cannot name another vhost's keys, since whatever it
  names is put behind its own prefix. A client of ``/`` could spell one (``$vhost/v/...``), so a ``/``
  name that :func:`is_reserved` is refused the protocol's way (MQTT: SUBACK/PUBACK 0x87, a refused
  client id; AMQP: 403 ACCESS_REFUSED / ``amqp:unauthorized-access``), checked where ``$`` names are
  already singled out, never on a plain topic's path.
- Dead letters stay inside their vhost: :func:`dead_letter_name` puts ``$dlq/`` after the prefix.

This module is the ground floor (standard library only): config, storage, the deck and the hulls use
it. The registry :class:`VHosts` knows which vhosts exist; it persists through a small port
(:class:`VHostStore`) that ``trimaran.storage`` implements, and removes a deleted vhost's contents
through the callbacks the composition root registers (:meth:`VHosts.on_delete`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import quote, unquote

__all__ = [
    "DEFAULT_VHOST",
    "MAX_NAME_BYTES",
    "TENANT",
    "TENANT_LEVELS",
    "Permission",
    "PermissionStore",
    "TopicPermission",
    "VHostError",
    "VHostStore",
    "VHosts",
    "dead_letter_name",
    "describe",
    "is_reserved",
    "key_prefix",
    "prefix",
    "split_key",
    "split_user",
    "strip",
    "validate_name",
    "vhost_of",
]

DEFAULT_VHOST: Final = "/"
MAX_NAME_BYTES: Final = 255  # an AMQP 0.9.1 shortstr, as RabbitMQ
TENANT: Final = "$vhost/"  # every non-default vhost's keys start with it
TENANT_LEVELS: Final = 2  # ``$vhost`` and the quoted name: a tenant's own tree starts at level 2
DEAD_LETTER: Final = "$dlq/"


class VHostError(ValueError):
    """A vhost name that cannot be used, or a vhost that does not exist where one must."""


def validate_name(name: str) -> str:
    """``name`` if it can be a vhost: 1..255 bytes of UTF-8, no control character; else VHostError."""
    if not isinstance(name, str) or not name:
        raise VHostError("a vhost name cannot be empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise VHostError(f"vhost name {name!r} is not valid UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise VHostError(f"vhost name {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise VHostError(f"vhost name {name!r} holds a control character")
    return name


# Quoting goes through urllib, a dozen calls; a server has few vhosts, and a tenant's every message
# needs its prefix or its name: both are remembered (bounded, for names that are not vhosts).
_PREFIXES: dict[str, str] = {}
_NAMES: dict[str, str] = {}
_REMEMBERED = 4096


def prefix(vhost: str) -> str:
    """What goes in front of every key of ``vhost``: ``""`` for ``/``, ``$vhost/<quoted>/`` otherwise."""
    if vhost == DEFAULT_VHOST:
        return ""
    known = _PREFIXES.get(vhost)
    if known is None:
        if len(_PREFIXES) >= _REMEMBERED:
            _PREFIXES.clear()
        known = _PREFIXES[vhost] = f"{TENANT}{quote(vhost, safe='')}/"
    return known


def is_reserved(name: str) -> bool:
    """True for a name a client of ``/`` may not use: it would name another vhost's key."""
    return name.startswith(TENANT) or name == TENANT[:-1]


def vhost_of(key: str) -> str:
    """The vhost a key belongs to (``/`` for an unprefixed key)."""
    return split_key(key)[0]


def split_key(key: str) -> tuple[str, str]:
    """``(vhost, name)`` of a key: the inverse of ``prefix(vhost) + name``."""
    if not key.startswith(TENANT):
        return DEFAULT_VHOST, key
    end = key.find("/", len(TENANT))
    if end <= len(TENANT):
        return DEFAULT_VHOST, key  # not one of ours (a /-name refused at the door): leave it whole
    quoted = key[len(TENANT) : end]
    vhost = _NAMES.get(quoted)
    if vhost is None:
        if len(_NAMES) >= _REMEMBERED:
            _NAMES.clear()
        vhost = _NAMES[quoted] = unquote(quoted)
    return vhost, key[end + 1 :]


def key_prefix(key: str) -> str:
    """The vhost prefix ``key`` carries (``""`` for a key of ``/``), without decoding the vhost."""
    if not key.startswith(TENANT):
        return ""
    end = key.find("/", len(TENANT))
    return key[: end + 1] if end > len(TENANT) else ""


def describe(key: str, kind: str = "queue") -> str:
    """A key as people read it in a log line or a reply text, as RabbitMQ words it:
    ``queue 'q' in vhost 'v'`` (the prefix never shows)."""
    vhost, name = split_key(key)
    return f"{kind} '{name}' in vhost '{vhost}'"


def strip(key: str, vhost_prefix: str) -> str:
    """The client's own name for ``key`` seen from the vhost whose prefix is ``vhost_prefix``."""
    return key[len(vhost_prefix) :] if key.startswith(vhost_prefix) else key


def dead_letter_name(queue_key: str) -> str:
    """The dead-letter queue of a queue key, in the same vhost: ``$dlq/<name>`` behind its prefix."""
    vhost, name = split_key(queue_key)
    return prefix(vhost) + DEAD_LETTER + name


def split_user(username: str | None) -> tuple[str | None, str | None]:
    """RabbitMQ's MQTT convention: ``vhost:user`` names a vhost; ``(vhost or None, user)``.

    Only the first ``:`` splits, and only when both sides are non-empty (a user name with a colon and
    no vhost stays whole, as RabbitMQ reads ``:user``).
    """
    if not username or ":" not in username:
        return None, username
    vhost, _, user = username.partition(":")
    if not vhost or not user:
        return None, username
    return vhost, user


# -- permissions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Permission:
    """RabbitMQ's set_permissions: ``user`` may enter ``vhost`` (no row: no entry), and its configure,
    write and read regular expressions say which queues and exchanges it may declare or delete, publish
    to or bind, consume or bind from (trimaran/security/permissions.py enforces them)."""

    user: str
    vhost: str
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class TopicPermission:
    """RabbitMQ's set_topic_permissions: which routing keys ``user`` may publish with (``write``) and
    bind with (``read``) through the topic exchange ``exchange`` of ``vhost``; regular expressions in
    which ``{username}``, ``{vhost}`` and ``{client_id}`` stand for the client's."""

    user: str
    vhost: str
    exchange: str
    write: str = ".*"
    read: str = ".*"


class PermissionStore(Protocol):
    """Where permissions are kept (``trimaran.storage.vhost_store`` implements it)."""

    def load_permissions(self) -> list[Permission]: ...

    def take_upgrade_marker(self) -> str | None: ...

    def save_permissions_now(self, permissions: list[Permission]) -> None: ...

    async def save_permission(self, permission: Permission) -> None: ...

    async def delete_permission(self, user: str, vhost: str) -> None: ...

    def load_topic_permissions(self) -> list[TopicPermission]: ...

    async def save_topic_permission(self, permission: TopicPermission) -> None: ...

    async def delete_topic_permission(self, user: str, vhost: str, exchange: str) -> None: ...


# -- the registry ------------------------------------------------------------------------------------


class VHostStore(Protocol):
    """Where vhosts created at run time are kept (``trimaran.storage.vhost_store`` implements it)."""

    async def load_vhosts(self) -> list[str]: ...

    async def save_vhost(self, name: str) -> None: ...

    async def delete_vhost(self, name: str) -> None: ...


OnDelete = Callable[[str], Awaitable[None]]


class VHosts:
    """Which vhosts exist: those declared in the settings (``/`` always) and those added at run time.

    ``exists`` and ``names`` are plain reads for the hulls (a login asks ``exists`` once). ``add``
    and ``delete`` persist through the store; ``delete`` first runs every ``on_delete`` callback (the
    hulls' and the queue manager's: queues, exchanges, retained messages and sessions of the vhost go),
    then forgets the name. A declared vhost cannot be deleted (the next start would bring it back).
    """

    def __init__(self, declared: Iterable[str] = (DEFAULT_VHOST,), store: VHostStore | None = None) -> None:
        self.declared: frozenset[str] = frozenset({DEFAULT_VHOST, *(validate_name(n) for n in declared)})
        self.store = store
        self._added: set[str] = set()
        self._on_delete: list[OnDelete] = []

    async def load(self) -> None:
        """Read the vhosts created at run time from the store (at start)."""
        if self.store is not None:
            self._added = set(await self.store.load_vhosts()) - self.declared

    def exists(self, name: str) -> bool:
        return name in self.declared or name in self._added

    def names(self) -> list[str]:
        return sorted(self.declared | self._added)

    def on_delete(self, callback: OnDelete) -> None:
        self._on_delete.append(callback)

    async def add(self, name: str) -> bool:
        """Create ``name``; False if it already exists. Raises VHostError for a bad name."""
        validate_name(name)
        if self.exists(name):
            return False
        if self.store is not None:
            await self.store.save_vhost(name)
        self._added.add(name)
        return True

    async def delete(self, name: str) -> bool:
        """Delete ``name`` and everything in it; False if it does not exist. Raises VHostError for a
        declared vhost (``/`` and the settings' ``vhosts``)."""
        if name in self.declared:
            raise VHostError(f"vhost {name!r} is declared in the settings and cannot be deleted")
        if name not in self._added:
            return False
        self._added.discard(name)  # no new client enters while its contents go
        for callback in list(self._on_delete):
            await callback(name)
        if self.store is not None:
            await self.store.delete_vhost(name)
        return True
