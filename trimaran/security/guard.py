"""Who may connect and what each client may do: one object shared by every protocol's hull.

- Logins: users from ``auth.password_file`` (hashed) and ``[[auth.users]]`` (plaintext, a WARNING at
  start). Hashes are checked on a worker thread, and a verified password is remembered for
  ``auth.login_cache_s`` (as an HMAC under a key of this process, never in clear). A failed login is
  logged at WARNING and counted. A wrong password is refused after a wait that grows with the
  failures of the same user from the same address (:mod:`trimaran.security.throttle`); a correct
  one is never delayed.
- Anonymous clients: ``auth.allow_anonymous``; unset, only from loopback addresses. Users named in
  ``auth.loopback_users`` (``guest``) only from loopback, as RabbitMQ's ``loopback_users``.
- A user name that names nobody, or a wrong password, is refused, also with no users configured
  (RabbitMQ's rule); only MQTT treats a name with no users configured as anonymous (Mosquitto's).
  AMQP's ``guest``/``guest``, RabbitMQ's default login, is the anonymous login unless a real user
  ``guest`` is configured (:meth:`Security.is_default_guest`).
- Certificates: a verified client certificate's subject field (``auth.identity_field``) as username.
- RabbitMQ's vhost and topic permissions (:mod:`trimaran.security.permissions`): :meth:`Security.may_enter`
  at login (no row, no entry; anonymous clients have ``guest``'s rows), :meth:`Security.permits` for
  the queue or exchange an operation configures, writes or reads (each hull maps its operations:
  amqp091/access.py, mqtt/handler.py, amqp1/handler.py), :meth:`Security.permits_key` for a routing
  key through a topic exchange; kept in storage (:meth:`use_permissions`), their changes bump
  ``generation`` as a reload does, so that every cached verdict is asked again.
- Permissions (:mod:`trimaran.security.acl`): each connection holds a :class:`Principal`; hulls ask
  :meth:`Security.authorize` before a publish, a subscription, a settle or a queue change. Without a
  rule file everything is allowed except writing ``$SYS``. A refusal is logged at WARNING once per
  connection, access and topic, and counted.
- :meth:`Security.reload` (SIGHUP, the admin API) reads the files again; hulls registered with
  :meth:`Security.on_reload` re-check what their connections hold, none is dropped.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.to_thread

from trimaran.config import AuthSettings
from trimaran.security import acl, passwords
from trimaran.security.acl import CONFIGURE, READ, WRITE, RuleSet
from trimaran.security.passwords import PasswordHash
from trimaran.security.permissions import (
    AMQ_TOPIC,
    ANONYMOUS,
    DEFAULT_EXCHANGE,
    EXCHANGE,
    QUEUE,
    Permissions,
    check_pattern,
    default_rows,
    expand,
    pattern_user,
)
from trimaran.security.throttle import Throttle, ceiling
from trimaran.topics import TopicError, filter_to_binding_key, topic_to_routing_key
from trimaran.vhosts import DEFAULT_VHOST, TENANT, Permission, PermissionStore, TopicPermission

log = logging.getLogger("trimaran.security")

__all__ = [
    "AMQ_TOPIC",
    "CONFIGURE",
    "EXCHANGE",
    "QUEUE",
    "READ",
    "WRITE",
    "Login",
    "Principal",
    "Security",
    "is_loopback",
    "publish_resource",
]

DECISION_CACHE: Final = 512  # per connection
CACHE_MAX_USERS: Final = 10_000
QUEUE_TOPIC: Final = "$queue/"
GUARDED: Final = ("$SYS/", TENANT)
#: RabbitMQ's default user and password: what AMQP clients send when given no account
GUEST: Final = ("guest", "guest")


@functools.lru_cache(maxsize=4096)
def is_loopback(host: str) -> bool:
    """Parsing an address is a good part of a login's cost; the same few hosts come back."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def is_guarded(topic: str) -> bool:
    """``$SYS`` topics, never written by clients, and ``$vhost/`` names, never named by clients
    (another vhost's keys: trimaran/vhosts.py)."""
    return topic.startswith(GUARDED) or topic == "$SYS"


def queue_of(topic: str) -> str | None:
    """The queue a ``$queue/...`` topic or filter names (``$dlq/<q>`` for a dead-letter queue)."""
    if not topic.startswith(QUEUE_TOPIC):
        return None
    levels = topic[len(QUEUE_TOPIC) :].split("/")
    if levels[0] == "$dlq" and len(levels) > 1:
        return f"$dlq/{levels[1]}"
    return levels[0] or None


# Not frozen: compiled, a frozen dataclass is made by a Python-level __init__ (a sixth of a login).
@dataclass(slots=True)
class Login:
    ok: bool
    user: str | None  # None: anonymous
    reason: str = "ok"
    #: the refusal is about who (anonymous, loopback-only user), not a wrong password
    not_authorized: bool = False


class Memo:
    """What one connection's permission checks found, made at its first check: most connections
    publish to few names, and an idle one holds none of this (issue 47). The verdicts
    (``decisions``, ``last_write``, ``last_exchange``, ``keyed``) hold for one ``generation`` of the
    rules and permissions (``Security.generation``), all asked again when it moves
    (:meth:`Principal.memo_for`); ``own_queues`` and ``warned`` are the connection's for its life."""

    __slots__ = (
        "decisions",
        "generation",
        "keyed",
        "last_exchange",
        "last_write",
        "own_queues",
        "rules",
        "warned",
    )

    def __init__(self, generation: int) -> None:
        self.generation = generation
        # The rules naming this client, asked with decisions; kept when those go (Security.reading).
        self.rules: list[acl.Rule] | None = None
        self.decisions: dict[tuple[str, str], bool] | None = None  # None: rules not asked this generation
        # What this connection last published to with the rules' blessing (an MQTT topic, an AMQP
        # 0.9.1 default-exchange queue): a hull that sees the same name again need not ask (a
        # publisher mostly repeats it; asking is four calls).
        self.last_write: str | None = None
        # The same for the exchange an AMQP 0.9.1 connection last published through (patterns), or
        # amq.topic for MQTT.
        self.last_exchange: str | None = None
        # Dicts as sets: an empty dict is a quarter of an empty set, and most connections own no
        # queue and are never refused.
        # Server-named and temporary queues this connection made; made with the first one.
        self.own_queues: dict[str, None] | None = None
        self.warned: dict[tuple[str, str], None] | None = None  # made at the first refusal
        # Whether topic permissions name this user in its vhost (known with last_exchange): only
        # then is a routing key checked on the way of each publish.
        self.keyed = False


class Principal:
    """One connection's identity, and its permission memo once it is checked."""

    __slots__ = ("client_id", "host", "memo", "protocol", "user", "vhost")

    def __init__(self, protocol: str, user: str | None, client_id: str, host: str) -> None:
        self.protocol = protocol
        self.user = user
        self.client_id = client_id
        self.host = host
        self.vhost: str = DEFAULT_VHOST  # the vhost it entered: the hull sets it at the login
        # Made at the first check (memo_for), as an idle connection needs none of it: with the memo's
        # fifteen fields in it a Principal was 144 bytes compiled, 72 now (issue 47). A hull's hot
        # check reads it inline, no call: ``memo is None or memo.generation != security.generation``
        # asks memo_for, then ``name != memo.last_write``.
        self.memo: Memo | None = None

    def memo_for(self, generation: int) -> Memo:
        """The memo, made now or emptied of an earlier generation's verdicts (what the connection
        owns and was told stays): a verdict is written only into the memo of its generation."""
        memo = self.memo
        if memo is None:
            memo = self.memo = Memo(generation)
        elif memo.generation != generation:
            memo.generation = generation
            memo.decisions = None
            memo.last_write = None
            memo.last_exchange = None
            memo.keyed = False
        return memo

    def own(self, queue: str) -> None:
        """``queue`` was made by this connection (server-named or temporary): it may use it."""
        memo = self.memo
        if memo is None:
            memo = self.memo = Memo(-1)  # no generation's verdicts yet
        if memo.own_queues is None:
            memo.own_queues = {}
        memo.own_queues[queue] = None

    def rename(self, client_id: str) -> None:
        """The client's id became known later (AMQP's connection name): rules are looked up again."""
        self.client_id = client_id
        if self.memo is not None:
            self.memo.generation = -1  # every verdict asked again (the rules may name it: %c)

    def __repr__(self) -> str:
        who = "anonymous" if self.user is None else repr(self.user)
        return f"{self.protocol} client {self.client_id!r} ({who} from {self.host or '?'})"


class Security:
    def __init__(self, settings: AuthSettings, *, handshake_s: float | None = None) -> None:
        """``handshake_s``: the shortest handshake deadline of the protocols served, which a refusal
        must beat (the login throttle's longest wait is a share of it)."""
        self.settings = settings
        self.allow_anonymous = settings.allow_anonymous
        self.loopback_users = frozenset(settings.loopback_users)
        self.throttle = Throttle(
            settings.login_delay_initial_s, ceiling(settings.login_delay_max_s, handshake_s)
        )
        self.stats: Counter[str] = Counter()  # failed logins, refusals by protocol
        self.refusals: Counter[str] = Counter()
        self.hashed: dict[str, PasswordHash] = {}
        self.plain: dict[str, bytes] = {}
        self.rules: RuleSet | None = None
        self.generation = 0
        self._key = secrets.token_bytes(32)
        self._verified: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._limiter = anyio.CapacityLimiter(2)
        self._dummy = passwords.parse_hash(passwords.make_hash("", iterations=1000))
        self._listeners: list[Callable[[], Any]] = []
        # RabbitMQ's set_permissions, kept in storage (use_permissions); until then, and with no
        # storage, a fresh install's: guest (and anonymous clients) on / and the settings' rows.
        self.permission_table = Permissions()
        self._permission_store: PermissionStore | None = None
        self._on_cleared: list[Callable[[str, str], Any]] = []
        self.load()
        self._load_rows(default_rows())

    # -- users and rules --------------------------------------------------------------------------

    def load(self) -> None:
        """Read the password and rule files (raises ``PasswordFileError`` / ``AclError``)."""
        settings = self.settings
        hashed = passwords.load(settings.password_file) if settings.password_file is not None else {}
        rules = acl.load(settings.acl_file) if settings.acl_file is not None else None
        self.hashed = hashed
        self.plain = {u.name: u.password.get_secret_value().encode() for u in settings.users}
        self.rules = rules
        self.generation += 1
        self._verified.clear()
        if hashed:
            sample = next(iter(hashed.values()))
            self._dummy = passwords.PasswordHash(
                sample.kind, b"\x00" * len(sample.salt), sample.digest, sample.iterations, sample.log_n,
                sample.r, sample.p,
            )  # fmt: skip

    def describe_start(self) -> None:
        """The start log: where users come from, and who may connect anonymously."""
        settings = self.settings
        if self.plain:
            log.warning(
                "auth: %d user(s) with plaintext passwords in the configuration (auth.users); "
                "move them to auth.password_file (trimaran passwd add FILE USER)",
                len(self.plain),
            )
        if settings.password_file is not None:
            log.info("auth: %d user(s) from %s", len(self.hashed), settings.password_file)
        if self.allow_anonymous is None:
            log.info(
                "auth: anonymous clients accepted from loopback addresses only (auth.allow_anonymous unset)"
            )
        elif self.allow_anonymous:
            log.warning("auth: anonymous clients accepted from any address (auth.allow_anonymous = true)")
        else:
            log.info("auth: anonymous clients refused")
        if self.rules is None:
            log.info("auth: no acl_file: every client may read and write every topic and queue (not $SYS)")
        else:
            log.info("auth: permissions from %s (deny by default)", settings.acl_file)

    def on_reload(self, callback: Callable[[], Any]) -> None:
        self._listeners.append(callback)

    def reload(self) -> bool:
        """Read the files again; on an error keep the current users and rules. Connections stay;
        each hull re-checks what its clients hold."""
        try:
            self.load()
        except (passwords.PasswordFileError, acl.AclError) as exc:
            log.error("auth: reload failed, keeping the current users and rules: %s", exc)
            return False
        log.info(
            "auth: reloaded: %d user(s) from the password file, %s",
            len(self.hashed),
            "no rule file" if self.rules is None else f"rules from {self.settings.acl_file}",
        )
        for callback in list(self._listeners):
            try:
                callback()
            except Exception:
                log.exception("auth: re-checking permissions after a reload failed")
        return True

    def known_user(self, name: str) -> bool:
        return name in self.hashed or name in self.plain

    def is_default_guest(self, username: str | None, password: str | bytes | None) -> bool:
        """RabbitMQ's default ``guest``/``guest`` with no real user ``guest`` configured: the AMQP
        hulls log it in as anonymous (``anonymous_alias``), from loopback only, as RabbitMQ does."""
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        return (username, password) == GUEST and not self.known_user(GUEST[0])

    # -- logins -----------------------------------------------------------------------------------

    def anonymous_allowed(self, host: str) -> bool:
        if self.allow_anonymous is None:
            return is_loopback(host)
        return self.allow_anonymous

    def login(
        self,
        username: str | None,
        password: str | bytes | None,
        host: str,
        *,
        protocol: str,
        certificate_user: str | None = None,
        anonymous_alias: bool = False,
        anonymous_without_users: bool = False,
        client_id: str | None = None,
        peer: str | None = None,
    ) -> Login | Awaitable[Login]:
        """Check a login: the answer at once when no hash must be computed and nobody must wait,
        else an awaitable (hulls return it from ``handle``, so the connection waits for it).

        ``certificate_user``: the verified certificate's identity, which is the user (no password).
        ``anonymous_alias``: RabbitMQ's default guest/guest standing for an anonymous client
        (``username`` is still checked against the loopback-only users).

        A user name that names nobody is refused, as RabbitMQ refuses it, also with no users at all.
        ``anonymous_without_users`` (MQTT): with no users at all (no password file, no
        ``auth.users``), where anonymous clients are accepted, the client is anonymous instead, as
        Mosquitto treats a user name with ``allow_anonymous`` and no password file (several client
        libraries always send one).

        ``client_id`` and ``peer`` (``host:port``) only say who failed in the log line."""
        who = (client_id, peer or host)
        if certificate_user is not None:
            if certificate_user in self.loopback_users and not is_loopback(host):
                return self._refused(protocol, certificate_user, host, "user allowed from loopback only", who)
            return Login(True, certificate_user)
        if username is not None and username in self.loopback_users and not is_loopback(host):
            return self.failed_login(protocol, username, host, "user allowed from loopback only", True, who)
        if username is None or anonymous_alias:
            if self.anonymous_allowed(host):
                return Login(True, None)
            return self.failed_login(protocol, username, host, "anonymous refused", True, who)
        if anonymous_without_users and not (self.hashed or self.plain) and self.anonymous_allowed(host):
            return Login(True, None)  # Mosquitto: a name of nobody, where anyone may connect
        raw = password.encode() if isinstance(password, str) else password
        if raw is not None and self._known_password(username, raw):
            self.throttle.succeeded(username, host)
            return Login(True, username)
        return self._slow_login(username, raw, host, protocol, who)

    async def _slow_login(
        self, username: str, password: bytes | None, host: str, protocol: str, who: tuple[str | None, str]
    ) -> Login:
        """The password checked first, so that a correct one is never delayed; a wrong one is
        refused after the throttle's wait for this user and address."""
        if password is not None and await self._check_password(username, password):
            self.throttle.succeeded(username, host)
            return Login(True, username)
        wait = self.throttle.failed(username, host)
        if wait:
            await anyio.sleep(wait)
        return self._refused(protocol, username, host, "bad user name or password", who, False)

    def _known_password(self, user: str, password: bytes) -> bool:
        """A plaintext user's password, or a hash verified recently (no hashing here)."""
        plain = self.plain.get(user)
        if plain is not None:
            return hmac.compare_digest(plain, password)
        cached = self._verified.get(user)
        if cached is None or cached[1] <= time.monotonic() or user not in self.hashed:
            return False
        return hmac.compare_digest(cached[0], self._mark(user, password))

    def _mark(self, user: str, password: bytes) -> bytes:
        return hmac.new(self._key, user.encode() + b"\x00" + password, hashlib.sha256).digest()

    async def _check_password(self, user: str, password: bytes) -> bool:
        if self._known_password(user, password):
            return True
        if user in self.plain:
            return False
        stored = self.hashed.get(user)
        generation = self.generation
        target = stored if stored is not None else self._dummy  # the same work for unknown users
        ok = await anyio.to_thread.run_sync(target.matches, password, limiter=self._limiter)
        ok = ok and stored is not None
        if ok and generation == self.generation and self.settings.login_cache_s:
            self._verified[user] = (
                self._mark(user, password),
                time.monotonic() + self.settings.login_cache_s,
            )
            self._verified.move_to_end(user)
            while len(self._verified) > CACHE_MAX_USERS:
                self._verified.popitem(last=False)
        return ok

    def failed_login(
        self,
        protocol: str,
        user: str | None,
        host: str,
        reason: str,
        not_authorized: bool,
        who: tuple[str | None, str] | None = None,
    ) -> Login:
        """A login refused for who it is, not for a guessed password (no identity, anonymous, a
        loopback-only user from elsewhere): counted and logged, at once. ``who``: the client id (if
        the protocol has one yet) and the peer address, for the log line."""
        return self._refused(protocol, user, host, reason, who, not_authorized)

    def _refused(
        self,
        protocol: str,
        user: str | None,
        host: str,
        reason: str,
        who: tuple[str | None, str] | None = None,
        not_authorized: bool = True,
    ) -> Login:
        """A refused login: counted, and one WARNING with the peer, protocol, client id, user and
        reason as fields of their own (JSON logs), for a log pipeline to filter and alert on."""
        self.stats["login_failures"] += 1
        client_id, peer = who if who is not None else (None, host)
        peer = peer or "?"
        fields = {"peer": peer, "protocol": protocol, "client_id": client_id, "user": user, "reason": reason}
        if client_id is not None:
            log.warning(
                "%s: client %r from %s refused (%s, user %r)",
                protocol,
                client_id,
                peer,
                reason,
                user,
                extra=fields,
            )
        else:
            log.warning("%s: %s refused (%s, user %r)", protocol, peer, reason, user, extra=fields)
        return Login(False, user, reason, not_authorized=not_authorized)

    def certificate_identity(self, certificate: dict[str, Any] | None) -> str | None:
        """The configured subject field of a verified client certificate (``None``: no certificate
        or no such field)."""
        if not certificate:
            return None
        wanted = self.settings.identity_field
        for rdn in certificate.get("subject", ()):
            for key, value in rdn:
                if key == wanted and isinstance(value, str) and value:
                    return value
        return None

    # -- vhosts and RabbitMQ's permissions (trimaran/security/permissions.py) -------------------

    def use_permissions(self, store: PermissionStore, vhosts: Iterable[str] = (DEFAULT_VHOST,)) -> None:
        """Read the permissions from ``store`` and keep changes there (blocking: at start, before the
        listeners open). ``vhosts``: every vhost that exists, for the grants of an upgrade from a
        server where everyone entered everywhere (migration 0011), made here once and logged."""
        self._permission_store = store
        rows = store.load_permissions()
        upgrade = store.take_upgrade_marker()
        if upgrade == "open":
            users = sorted({ANONYMOUS, *self.hashed, *self.plain})
            names = sorted(set(vhosts))
            granted = [Permission(user, vhost) for vhost in names for user in users]
            have = {(p.user, p.vhost) for p in rows}
            granted = [p for p in granted if (p.user, p.vhost) not in have]
            store.save_permissions_now(granted)
            rows = [*rows, *granted]
            log.warning(
                "permissions: upgraded from a server where everyone entered every vhost: granted "
                ".* .* .* on %d vhost(s) (%s) to %d user(s) (%s; anonymous clients have guest's); "
                "vhosts are now closed until granted (trimaran permissions list)",
                len(names), ", ".join(names), len(users), ", ".join(users),
            )  # fmt: skip
        elif upgrade == "guest":
            log.warning(
                "permissions: upgraded: guest (and anonymous clients, who have guest's permissions) "
                "keep vhost '/' with .* .* .*; every other row is now enforced (trimaran permissions list)"
            )
        self._load_rows(rows)
        self.permission_table.replace_topics(store.load_topic_permissions())
        self.generation += 1

    def _load_rows(self, rows: Iterable[Permission]) -> None:
        """The stored rows, the settings' ``auth.permissions`` over them."""
        declared = [
            Permission(p.user, p.vhost, p.configure, p.write, p.read) for p in self.settings.permissions
        ]
        self.permission_table.replace([*rows, *declared])
        self.generation += 1

    def may_enter(self, user: str | None, vhost: str) -> bool:
        """May ``user`` (None: anonymous, checked as ``guest``) enter ``vhost``? Only with a row for
        it, whatever else the table holds (whether the vhost exists is the caller's question)."""
        return self.permission_table.may_enter(user, vhost)

    def user_exists(self, name: str) -> bool:
        """A user a permission may name: the password file's, ``auth.users``', or ``guest``."""
        return name == ANONYMOUS or self.known_user(name)

    def permissions(self, vhost: str | None = None) -> list[Permission]:
        """Every permission (of ``vhost``), by vhost and user."""
        return self.permission_table.rows(vhost)

    async def set_permission(self, permission: Permission) -> None:
        """Let ``permission.user`` enter ``permission.vhost`` with its patterns, persisted; raises
        PatternError for a pattern that is not a regular expression."""
        for pattern in (permission.configure, permission.write, permission.read):
            check_pattern(pattern)
        if self._permission_store is not None:
            await self._permission_store.save_permission(permission)
        self.permission_table.set(permission)
        self.generation += 1

    async def clear_permission(self, user: str, vhost: str) -> bool:
        """Take ``user``'s permission for ``vhost`` away; False if it had none. The connections it has
        open in ``vhost`` are then closed, as RabbitMQ does (:meth:`on_permission_cleared`)."""
        if self.permission_table.get(user, vhost) is None:
            return False
        if self._permission_store is not None:
            await self._permission_store.delete_permission(user, vhost)
        self.permission_table.clear(user, vhost)
        self.generation += 1
        for callback in self._on_cleared:
            callback(user, vhost)
        return True

    def on_permission_cleared(self, callback: Callable[[str, str], Any]) -> None:
        """Call ``callback(user, vhost)`` when a permission is cleared (the app closes connections)."""
        self._on_cleared.append(callback)

    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost's permissions go with it (the store deletes its rows with the vhost)."""
        self.permission_table.forget_vhost(vhost)
        self.generation += 1

    def topic_permissions(self, vhost: str | None = None) -> list[TopicPermission]:
        """Every topic permission (of ``vhost``), by vhost, user and exchange."""
        return self.permission_table.topic_rows(vhost)

    async def set_topic_permission(self, permission: TopicPermission) -> None:
        """RabbitMQ's set_topic_permissions, persisted; PatternError for a bad pattern (checked with
        its variables standing for a plain name)."""
        for pattern in (permission.write, permission.read):
            check_pattern(expand(pattern, "u", "v", "c"))
        if self._permission_store is not None:
            await self._permission_store.save_topic_permission(permission)
        self.permission_table.set_topic(permission)
        self.generation += 1

    async def clear_topic_permission(self, user: str, vhost: str, exchange: str | None = None) -> int:
        """RabbitMQ's clear_topic_permissions (one exchange's, or all of ``user``'s in ``vhost``);
        how many went."""
        rows = [
            t for t in self.permission_table.topic_rows(vhost)
            if t.user == user and (exchange is None or t.exchange == exchange)
        ]  # fmt: skip
        if self._permission_store is not None:
            for row in rows:
                await self._permission_store.delete_topic_permission(user, vhost, row.exchange)
        self.permission_table.clear_topic(user, vhost, exchange)
        self.generation += 1
        return len(rows)

    def permits_key(self, who: Principal, access: str, exchange: str, key: str) -> bool:
        """RabbitMQ's topic permissions: may ``who`` publish (write) or bind (read) with routing or
        binding key ``key`` through the topic exchange ``exchange``? Refusals logged and counted."""
        table = self.permission_table
        if table.allows_key(who.user, who.vhost, access, exchange, key, who.client_id):
            return True
        self.refused(who, access, f"topic {key} in {exchange}", self.topic_text(who, exchange, key))
        return False

    def topic_refusal(self, who: Principal, access: str, topic: str) -> str | None:
        """RabbitMQ's topic permissions on ``amq.topic`` for an MQTT or AMQP 1.0 topic, as their
        plugins ask them: a publish's routing key (``a/b`` is ``a.b``) against the write pattern, a
        subscription's binding key (``a/+/#`` is ``a.*.#``) against the read pattern. None when
        allowed (``$queue/`` names are not topics; a bad filter is refused on its own), else
        RabbitMQ's text, logged and counted."""
        if topic.startswith(QUEUE_TOPIC):
            return None
        try:
            key = topic_to_routing_key(topic) if access == WRITE else filter_to_binding_key(topic)
        except TopicError:
            return None
        if self.permits_key(who, access, AMQ_TOPIC, key):
            return None
        return self.topic_text(who, AMQ_TOPIC, key)

    def topic_text(self, who: Principal, exchange: str, key: str) -> str:
        """RabbitMQ's words for a refused topic permission."""
        return (
            f"access to topic '{key}' in exchange '{exchange}' in vhost '{who.vhost}' refused for user "
            f"'{pattern_user(who.user)}'"
        )

    def has_topic_permissions(self, who: Principal) -> bool:
        return (pattern_user(who.user), who.vhost) in self.permission_table.topic_users

    def permits(self, who: Principal, access: str, kind: str, name: str) -> bool:
        """May ``who`` ``access`` (configure, write, read) the ``kind`` (queue, exchange) ``name`` of
        its vhost, by its row's patterns? Each verdict is remembered until a permission changes."""
        return self.permission_table.allows(who.user, who.vhost, access, kind, name)

    def refuse_resource(self, who: Principal, access: str, kind: str, name: str) -> str:
        """Count and log (once per connection and name) a refusal by the patterns; RabbitMQ's text:
        ``access to queue 'q' in vhost 'v' refused for user 'u'``."""
        shown = (name or DEFAULT_EXCHANGE) if kind == EXCHANGE else name
        text = (
            f"access to {kind} '{shown}' in vhost '{who.vhost}' refused for user '{pattern_user(who.user)}'"
        )
        self.refused(who, access, f"{kind} {shown}", text)
        return text

    # -- permissions ------------------------------------------------------------------------------

    def principal(self, protocol: str, user: str | None, client_id: str, host: str) -> Principal:
        return Principal(protocol, user, client_id, host)

    def allowed(self, who: Principal, access: str, topic: str) -> bool:
        """May ``who`` read (subscribe, consume, settle), write (publish) or configure ``topic``?"""
        if access == WRITE and is_guarded(topic):
            return False
        if access != WRITE and topic.startswith(TENANT):
            return False  # a /-client naming another vhost's keys
        rules = self.rules
        if rules is None:
            return True
        memo = who.memo
        if memo is None or memo.generation != self.generation:
            memo = who.memo_for(self.generation)
        queue = queue_of(topic)
        own = memo.own_queues
        if queue is not None and own is not None and queue in own:
            return True
        decisions = memo.decisions
        if decisions is None:
            memo.rules = rules.rules_for(who.user, who.client_id)
            decisions = memo.decisions = {}
        key = (access, topic)
        decided = decisions.get(key)
        if decided is None:
            found = memo.rules
            assert found is not None
            decided = acl.decide(found, access, topic)
            if len(decisions) >= DECISION_CACHE:
                decisions.clear()
            decisions[key] = decided
        return decided

    def reading(self, who: Principal, topic_filter: str, cut: int = 0) -> bool | Callable[[str], bool]:
        """May ``who`` subscribe to ``topic_filter`` (topics, not ``$queue/``), Mosquitto's way:
        True when every topic it matches may be read (nothing to check per delivery); a function of
        the router's key when only some may be, to be asked for each delivery (the router keeps the
        answer with its match of the topic; ``cut``: the length of the vhost prefix the key carries,
        trimaran/vhosts.py); False, logged and counted, when none may be."""
        if self.allowed(who, READ, topic_filter):
            return True
        memo = who.memo
        found = memo.rules if memo is not None else None
        if found is not None and acl.decide_some(found, READ, topic_filter):
            if cut:
                return functools.partial(self._reads_key, who, cut)
            return functools.partial(self.allowed, who, READ)
        self.refused(who, READ, topic_filter)
        return False

    def _reads_key(self, who: Principal, cut: int, key: str) -> bool:
        return self.allowed(who, READ, key[cut:])

    def authorize(self, who: Principal, access: str, topic: str) -> bool:
        """:meth:`allowed`, and a refusal logged (once per connection, access and topic) and counted."""
        if self.allowed(who, access, topic):
            return True
        self.refused(who, access, topic)
        return False

    def refused(self, who: Principal, access: str, topic: str, why: str = "not allowed") -> None:
        self.refusals[who.protocol] += 1
        key = (access, topic)
        memo = who.memo
        if memo is None:
            memo = who.memo = Memo(-1)  # no generation's verdicts yet
        warned = memo.warned
        if warned is None:
            warned = memo.warned = {}
        if key not in warned and len(warned) < 1000:
            warned[key] = None
            log.warning("auth: %s may not %s %r: %s", who, access, topic, why)


def on_login(
    verdict: Login | Awaitable[Login], act: Callable[[Login], None], still_open: Callable[[], bool]
) -> Awaitable[None] | None:
    """Act on a login's verdict: at once when it is known, else as the hull step the runtime awaits
    (holding the connection's later frames), skipped when the connection closed meanwhile."""
    if isinstance(verdict, Login):
        act(verdict)
        return None

    async def decided() -> None:
        login = await verdict
        if still_open():
            act(login)

    return decided()


def publish_access(topic: str) -> tuple[str, str]:
    """What publishing to ``topic`` needs: a write, or for a queue control topic
    (``$queue/<q>/$ack|$nack|$reject|$commit``) a read of the queue (settling is reading)."""
    if topic.startswith(QUEUE_TOPIC):
        last = topic.rpartition("/")[2]
        if last in ("$ack", "$nack", "$reject", "$commit"):
            queue = queue_of(topic)
            if queue is not None:
                return READ, QUEUE_TOPIC + queue
    return WRITE, topic


def publish_resource(topic: str) -> tuple[str, str, str]:
    """What publishing to an MQTT or AMQP 1.0 topic needs of RabbitMQ's patterns, as its plugins
    map it: ``(access, kind, name)``. A topic is published through ``amq.topic`` (write it); a
    ``$queue/<q>`` name through the default exchange (write ``amq.default``), as an AMQP 0.9.1
    publish to queue ``q`` goes; settling by topic (``$queue/<q>/$ack`` ...) reads queue ``q``."""
    access, target = publish_access(topic)
    if access == READ:
        return READ, QUEUE, queue_of(target) or ""
    if topic.startswith(QUEUE_TOPIC):
        return WRITE, EXCHANGE, ""
    return WRITE, EXCHANGE, AMQ_TOPIC


def subscription_filter(topic_filter: str) -> str:
    """The filter a subscription reads: ``$share/<group>/`` taken off."""
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        if len(parts) == 3:
            return parts[2]
    return topic_filter
