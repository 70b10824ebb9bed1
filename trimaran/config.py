"""Settings: one pydantic-settings model with a section per concern.

Precedence, lowest first: defaults < TOML file (``--config FILE`` or ``./trimaran.toml``) <
environment (``TRIMARAN_`` prefix, ``__`` between nested keys) < CLI flags.
"""

from __future__ import annotations

import contextvars
import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal, NamedTuple, get_args
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from trimaran.broker.events import expand_patterns
from trimaran.topics import binding_key_to_filter, topic_matches, validate_topic_filter
from trimaran.vhosts import DEFAULT_VHOST, VHostError, validate_name

DEFAULT_CONFIG_FILE = Path("trimaran.toml")


class Endpoint(NamedTuple):
    """A socket address a listener binds; port 0 picks a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(value: object, default_host: str = "0.0.0.0") -> Endpoint | None:
    """Parse ``[HOST:]PORT`` (IPv6 as ``[::1]:PORT``) or ``off``."""
    if value is None or isinstance(value, Endpoint):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return Endpoint(str(value[0]), _port(value[1]))
    if isinstance(value, int) and not isinstance(value, bool):
        return Endpoint(default_host, _port(value))
    if not isinstance(value, str):
        raise ValueError("expected '[HOST:]PORT' or 'off'")
    text = value.strip()
    if text.lower() in ("off", "none", "disabled", ""):
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        return Endpoint(default_host, _port(text))
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        host = default_host
    return Endpoint(host, _port(port))


def _port(value: object) -> int:
    try:
        port = int(str(value))
    except ValueError:
        raise ValueError(f"port {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 0-65535")
    return port


def _endpoint_or_off(value: object) -> Endpoint | None:
    return parse_endpoint(value)


def _local_endpoint(value: object) -> Endpoint | None:
    return parse_endpoint(value, default_host="127.0.0.1")


def _show_endpoint(value: Endpoint | None) -> str:
    return "off" if value is None else str(value)


BindAddress = Annotated[
    Endpoint | None, BeforeValidator(_endpoint_or_off), PlainSerializer(_show_endpoint, return_type=str)
]
LocalBindAddress = Annotated[
    Endpoint | None, BeforeValidator(_local_endpoint), PlainSerializer(_show_endpoint, return_type=str)
]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class TlsSettings(Section):
    cert_file: Path | None = Field(None, description="PEM certificate (chain) the TLS listeners present")
    key_file: Path | None = Field(None, description="PEM private key of cert_file")
    ca_file: Path | None = Field(None, description="CA bundle to verify client certificates")
    require_client_cert: bool = Field(
        False, description="refuse a TLS client without a certificate that ca_file verifies"
    )
    min_version: Literal["1.2", "1.3"] = Field("1.2", description="oldest TLS version accepted")


# The listen() backlog of every listener unless its settings say otherwise: as deep as Linux allows
# by default (net.core.somaxconn, 4096 since 5.4; it caps what is asked). A connection past a full
# accept queue waits a second for the kernel's retransmission, and a reconnect storm of 4,000
# handshakes at once overflowed 1024 (docs/performance.md).
LISTEN_BACKLOG: Final = 4096


class ListenerSettings(Section):
    mqtt: BindAddress = Field(
        Endpoint("0.0.0.0", 1883), description="MQTT over TCP: [HOST:]PORT or off; port 0 picks a free port"
    )
    mqtt_tls: BindAddress = Field(None, description="MQTT over TLS (needs listeners.tls), e.g. 0.0.0.0:8883")
    mqtt_ws: BindAddress = Field(
        Endpoint("0.0.0.0", 8083), description="MQTT over WebSocket, on the paths of mqtt_ws_paths"
    )
    mqtt_wss: BindAddress = Field(
        None, description="MQTT over secure WebSocket (needs listeners.tls), e.g. 0.0.0.0:8084"
    )
    mqtt_ws_paths: list[str] = Field(["/mqtt"], min_length=1, description="WebSocket paths MQTT is served on")
    mqtt_ws_origins: list[str] = Field(
        [], description="Origin headers a browser may connect from; empty = any (others send none)"
    )
    amqp: BindAddress = Field(
        Endpoint("0.0.0.0", 5672), description="AMQP 0.9.1 and 1.0, told apart by the protocol header"
    )
    amqps: BindAddress = Field(
        None, description="AMQP 0.9.1 and 1.0 over TLS (needs listeners.tls), e.g. 0.0.0.0:5671"
    )
    tls: TlsSettings = TlsSettings()
    backlog: int = Field(
        LISTEN_BACKLOG,
        ge=1,
        description="the listen() backlog: connections the kernel queues before they are accepted "
        "(capped by net.core.somaxconn)",
    )
    tcp_nodelay: bool = Field(
        True, description="TCP_NODELAY on every connection (no Nagle delay on small writes)"
    )
    vhosts: dict[str, str] = Field(
        {}, description="listener name -> vhost its clients enter unless they name one (mqtt_tls = 'prod')"
    )

    @field_validator("vhosts")
    @classmethod
    def _vhost_names(cls, value: dict[str, str]) -> dict[str, str]:
        _valid_vhosts(list(value.values()))
        listeners = ("amqp", "amqps", "mqtt", "mqtt_tls", "mqtt_ws", "mqtt_wss")
        unknown = sorted(set(value) - set(listeners))
        if unknown:
            raise ValueError(f"no listener named {', '.join(unknown)} (one of {', '.join(listeners)})")
        return value


class StorageSettings(Section):
    url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite file in data_dir")
    data_dir: Path = Field(
        Path("data"), description="where the SQLite database and the data directory's lock live"
    )
    sqlite_synchronous: Literal["off", "normal", "full"] = Field(
        "full",
        description="SQLite's synchronous pragma: full survives a power cut, normal trades that for speed",
    )
    pool_size: int = Field(5, ge=1, description="database connections kept open")
    commit_interval_ms: float = Field(
        0.0,
        ge=0,
        description="group commit: extra wait to gather between back-to-back commits (an idle writer "
        "commits at once; 0 = none, batches gather while a commit is in flight)",
    )
    commit_batch_max: int = Field(2000, ge=1, description="group commit: most rows in one transaction")
    statement_timeout_s: float = Field(
        30.0, ge=0, description="PostgreSQL: longest statement, also the TCP user time-out (0 = no limit)"
    )
    min_free_bytes: int = Field(
        50_000_000,
        ge=0,
        description="SQLite: refuse new durable publishes while the data directory's disk has less free "
        "(0 = off)",
    )
    ready_timeout_s: float = Field(2.0, gt=0, description="/readyz: longest wait for the storage's answer")

    @field_validator("url")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("sqlite", "postgresql", "postgres")):
            raise ValueError("only sqlite:// and postgresql:// URLs are supported")
        return value

    def effective_url(self) -> str:
        if self.url:
            return self.url
        return f"sqlite:///{self.data_dir / 'trimaran.db'}"


class VhostLimitSettings(Section):
    """One virtual host's limits (RabbitMQ's ``set_vhost_limits``); 0 = no limit."""

    max_connections: int = Field(0, ge=0, description="open connections in the vhost, all protocols")
    max_queues: int = Field(0, ge=0, description="queues the vhost may hold; a declare beyond is refused")
    max_stored_bytes: int = Field(
        0, ge=0, description="bytes the vhost's queues may store; a publish beyond is refused"
    )


class UserLimitSettings(Section):
    """One user's limits; 0 = no limit. The rates are shared by all of the user's connections."""

    max_connections: int = Field(0, ge=0, description="open connections of the user, all protocols")
    max_messages_per_s: float = Field(
        0.0, ge=0, description="messages a second published; beyond, its sockets are read more slowly"
    )
    max_bytes_per_s: float = Field(
        0.0, ge=0, description="bytes a second read from its connections; beyond, read more slowly"
    )


class LimitSettings(Section):
    """Limits the connection runtime enforces for every protocol (and MQTT's own)."""

    max_connections: int = Field(100_000, ge=1, description="open connections, all listeners together")
    max_connections_per_address: int = Field(0, ge=0, description="per source address; 0 = no limit")
    accept_rate_per_address: float = Field(
        0.0, ge=0, description="new connections a second per source address (burst 50); 0 = no limit"
    )
    accept_rate: float = Field(
        0.0,
        ge=0,
        description="new connections a second per listener; those beyond wait their turn, unread, "
        "instead of being refused; 0 = no limit",
    )
    accept_burst: int = Field(
        100, ge=1, description="new connections a listener takes at once under accept_rate"
    )
    handshake_timeout: float = Field(
        10.0, gt=0, description="seconds for TLS and the protocol header before a connection is dropped"
    )
    max_packet_size: int = Field(
        16 * 1024 * 1024,
        ge=64,
        le=268_435_455,
        description="largest MQTT packet after the login (announced as Maximum Packet Size when smaller "
        "than MQTT's)",
    )
    max_packet_size_unauthenticated: int = Field(
        65536, ge=64, description="largest packet before the login succeeded (MQTT CONNECT included)"
    )
    receive_maximum: int = Field(
        1024,
        ge=1,
        le=65535,
        description="MQTT 5 Receive Maximum: inbound QoS 1/2 publishes a client may have unacknowledged",
    )
    max_inflight: int = Field(64, ge=1, le=65535, description="outbound QoS 1/2 window per client")
    outbox_bytes: int = Field(
        8 * 1024 * 1024, ge=4096, description="bytes waiting for a slow subscriber; QoS 0 beyond is dropped"
    )
    memory_high_watermark: int = Field(
        256 * 1024 * 1024, ge=0, description="bytes waiting for slow readers that pause publishers; 0 = off"
    )
    memory_low_watermark: int = Field(128 * 1024 * 1024, ge=0, description="publishers resume below this")
    hold_publishers_s: float = Field(
        1.0,
        gt=0,
        description="longest a QoS 0 subscriber whose socket is full holds its publishers; then QoS 0 "
        "past its outbox is dropped",
    )
    backpressure_messages: int = Field(
        1000,
        ge=1,
        description="QoS 1/2 messages waiting for one online MQTT subscriber beyond its window above which "
        "the publishers feeding it are not read; they are again below half",
    )
    backpressure_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="the same in bytes (payloads and topics): whichever is reached first holds them",
    )
    queue_backpressure_messages: int = Field(
        100_000,
        ge=1,
        description="messages a queue read by an online consumer holds not yet delivered above which "
        "the connections publishing into it are not read (AMQP 1.0 links: no new credit); they are "
        "again below half, or once it has no consumer. A queue nobody reads, or with a max-length, "
        "is bounded by its max-length only",
    )
    queue_backpressure_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="the same in payload bytes: whichever is reached first holds them (a queue keeps "
        "about 450 bytes of its own per message besides the payload)",
    )
    stalled_consumer_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a consumer that holds publishers and takes nothing for this long is disconnected "
        "(AMQP: its channel closed 406, its link detached); its messages stay with its session or queue",
    )
    session_queue_size: int = Field(
        10_000,
        ge=0,
        description="QoS 1/2 kept per offline session (online, publishers are slowed instead)",
    )
    session_queue_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="bytes (payloads and topics) kept per offline session; 0 = no bound",
    )
    max_keep_alive: int = Field(
        3600, ge=0, le=65535, description="seconds; a client asking for more (or 0) gets this; 0 = client's"
    )
    max_topic_length: int = Field(65535, ge=1, le=65535, description="characters of a topic or filter")
    max_topic_levels: int = Field(128, ge=1, description="levels of a topic or filter")
    max_subscriptions_per_client: int = Field(
        10_000, ge=0, description="subscriptions one MQTT session may hold; 0 = no limit"
    )
    topic_alias_maximum: int = Field(
        64, ge=0, le=65535, description="MQTT 5 Topic Alias Maximum announced to clients; 0 = no aliases"
    )
    maximum_qos: int = Field(
        2,
        ge=0,
        le=2,
        description="highest QoS accepted (MQTT 5 Maximum QoS; a higher publish is refused with 0x9B)",
    )
    retain_available: bool = Field(True, description="whether MQTT clients may publish retained messages")
    max_session_expiry: int = Field(
        7 * 24 * 3600,
        ge=0,
        description="seconds an offline session is kept at most: caps MQTT 5's Session Expiry Interval "
        "and ends 3.1.1 clean-session-0 sessions too (Mosquitto's persistent_client_expiration)",
    )
    connect_timeout: float = Field(
        10.0, gt=0, description="seconds from the socket opening to an MQTT CONNECT"
    )
    vhosts: dict[str, VhostLimitSettings] = Field(
        {}, description='limits per virtual host, by name ("/" is the default vhost)'
    )
    users: dict[str, UserLimitSettings] = Field({}, description="limits per user name")
    default_user: UserLimitSettings = Field(
        UserLimitSettings(), description='limits of every user without its own entry (anonymous too, as "")'
    )
    sys_interval: float = Field(
        10.0, ge=0, description="$SYS period in seconds: each value is published when it changed; 0 disables"
    )


class QueuePolicySettings(Section):
    mode: Literal["work", "stream"] = Field(
        "work",
        description="work: competing consumers and acks; stream: retained log read by offset per group",
    )
    visibility_timeout_s: float = Field(
        30.0, gt=0, description="a delivery not settled within this is delivered again (a failed attempt)"
    )
    max_attempts: int = Field(5, ge=1, description="deliveries of one message before it is dead-lettered")
    backoff_initial_s: float = Field(
        1.0, ge=0, description="wait before the first retry of a nacked or timed-out delivery"
    )
    backoff_multiplier: float = Field(
        2.0, ge=1, description="each retry waits this many times longer than the one before"
    )
    backoff_max_s: float = Field(60.0, ge=0, description="the retry wait's ceiling")
    dead_letter: str | None = Field(None, description="default: $dlq/<queue>")
    dead_letter_exchange: str | None = Field(
        None,
        description="AMQP 0.9.1 x-dead-letter-exchange: dead letters (expired ones too) are routed "
        "through this exchange when they die, instead of going to dead_letter",
    )
    dead_letter_routing_key: str | None = Field(
        None, description="x-dead-letter-routing-key: the key they are routed with (default: their own)"
    )
    ttl_s: float | None = Field(
        None,
        gt=0,
        description="a message older than this expires (dead-lettered through dead_letter_exchange if "
        "set); unset = never",
    )
    max_length: int | None = Field(
        None, ge=1, description="most messages the queue holds; what happens past it is overflow's"
    )
    max_length_bytes: int | None = Field(
        None, ge=1, description="most payload bytes the queue holds; what happens past it is overflow's"
    )
    overflow: Literal["reject", "drop-oldest", "reject-dead-letter"] = Field(
        "reject",
        description="when full: refuse the publish, drop the oldest (dead-lettered through "
        "dead_letter_exchange if set), or refuse the publish and dead-letter it (AMQP 0.9.1 "
        "x-overflow reject-publish-dlx)",
    )
    retention_age_s: float | None = Field(
        None, gt=0, description="stream: messages older than this are removed"
    )
    retention_bytes: int | None = Field(
        None, ge=1, description="stream: the oldest messages are removed past this many payload bytes"
    )
    retention_count: int | None = Field(
        None, ge=1, description="stream: the oldest messages are removed past this many messages"
    )


class DeclaredQueue(QueuePolicySettings):
    name: str = Field(min_length=1, description="the queue's name (MQTT: $queue/<name>)")


class QueueSettings(Section):
    auto_create: bool = Field(
        True, description="a publish or consume of an unknown queue creates it with queues.defaults"
    )
    shared: bool = Field(
        False,
        description="several server processes share one PostgreSQL database: work queues deliver only "
        "messages this process claimed (SKIP LOCKED claims with leases); needs storage.url = postgresql://",
    )
    defaults: QueuePolicySettings = Field(
        QueuePolicySettings(), description="the policy of queues created on first use"
    )
    declare: list[DeclaredQueue] = Field([], description="queues created at start, each with its own policy")


class ClusterSettings(Section):
    """Several nodes on one PostgreSQL: pub/sub, retained messages and sessions across nodes."""

    enabled: bool = Field(
        False,
        description="join the nodes that share storage.url (PostgreSQL only; durable queues are shared as "
        "with queues.shared); node_name must differ per node",
    )
    heartbeat_s: float = Field(2.0, gt=0, description="how often this node renews its row in cluster_nodes")
    node_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a node whose heartbeat is older is dead: its routes and sessions are released",
    )
    takeover_timeout_s: float = Field(
        5.0, gt=0, description="longest wait for another node to hand a session over before taking it anyway"
    )
    address: str = Field(
        "", description="how operators reach this node (shown in /api/v1/cluster); default: host name"
    )
    forward_backpressure_messages: int = Field(
        10_000,
        ge=1,
        le=50_000,
        description="messages queued for the other nodes and not yet sent (their NOTIFYs not committed) "
        "above which the connections publishing them are not read; they are again below half, after a "
        "send. Past 100,000 (a last-resort bound) new forwards are dropped, counted as cluster_forward",
    )
    forward_backpressure_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="the same in encoded bytes: whichever is reached first holds them",
    )


def _valid_vhosts(names: list[str]) -> list[str]:
    try:
        return [validate_name(name) for name in names]
    except VHostError as exc:
        raise ValueError(str(exc)) from None


class Amqp091Settings(Section):
    """The AMQP 0.9.1 front end (RabbitMQ-compatible)."""

    vhosts: list[str] = Field(["/"], min_length=1, description="an alias of the top-level vhosts, kept")

    @field_validator("vhosts")
    @classmethod
    def _vhost_names(cls, value: list[str]) -> list[str]:
        return _valid_vhosts(value)

    heartbeat: int = Field(60, ge=0, le=65535, description="seconds proposed in connection.tune; 0 = off")
    frame_max: int = Field(
        131072, ge=4096, le=2**31 - 1, description="largest frame proposed in connection.tune (bytes)"
    )
    channel_max: int = Field(2047, ge=1, le=65535, description="most channels proposed in connection.tune")
    handshake_timeout: float = Field(10.0, gt=0, description="seconds from the header to connection.open")
    max_message_size: int = Field(
        128 * 1024 * 1024, ge=1, description="largest message body accepted (bytes)"
    )
    prefetch_window: int = Field(
        1000, ge=1, description="ignored: a consumer without basic.qos has no limit, as in RabbitMQ"
    )


class Amqp1Settings(Section):
    """The AMQP 1.0 front end (served on the AMQP port next to 0.9.1)."""

    container_id: str | None = Field(None, description="our container id; default: node_name")
    bare_address: Literal["queue", "topic"] = Field(
        "queue", description="what an address without prefix or capability names"
    )
    max_frame_size: int = Field(
        65536, ge=512, le=0xFFFF_FFFF, description="largest frame offered in the open (bytes)"
    )
    channel_max: int = Field(255, ge=0, le=65535, description="highest channel number offered in the open")
    idle_timeout_s: float = Field(60.0, ge=0, description="close a peer silent this long; 0 = never")
    max_message_size: int = Field(16 * 1024 * 1024, ge=512, description="largest message accepted")
    link_credit: int = Field(500, ge=1, le=100_000, description="credit granted to each sending peer")
    outbox_size: int = Field(1000, ge=1, description="topic messages held per receiving link without credit")
    hostname_vhost: bool = Field(
        False,
        description="a plain open.hostname that names a vhost selects it (the older mapping); off: "
        "only vhost:NAME selects one, as RabbitMQ 3.10 reads it, and any other host name is the "
        "listener's default vhost",
    )


class UserSettings(Section):
    name: str = Field(min_length=1, description="the user name")
    password: SecretStr = Field(description="the password, in plain text")


class PermissionSettings(Section):
    """RabbitMQ's set_permissions in the settings: applied over the stored ones at every start."""

    user: str = Field(min_length=1, description="the user (guest: also anonymous clients)")
    vhost: str = Field("/", description="the vhost it may enter")
    configure: str = Field(".*", description="queues and exchanges it may declare and delete (regex)")
    write: str = Field(".*", description="exchanges it may publish to, queues it may bind (regex)")
    read: str = Field(".*", description="queues it may consume, get and purge, exchanges it may bind from")

    @field_validator("vhost")
    @classmethod
    def _vhost_name(cls, value: str) -> str:
        _valid_vhosts([value])
        return value

    @field_validator("configure", "write", "read")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


class AuthSettings(Section):
    allow_anonymous: bool | None = Field(
        None, description="anonymous clients; unset = from loopback addresses only"
    )
    users: list[UserSettings] = Field(
        [], description="plaintext passwords (a WARNING at start); prefer password_file"
    )
    password_file: Path | None = Field(
        None, description="mosquitto_passwd format ($7$ PBKDF2-SHA512, $6$) or scrypt"
    )
    acl_file: Path | None = Field(
        None, description="Mosquitto acl_file syntax plus 'configure'; deny by default"
    )
    loopback_users: list[str] = Field(["guest"], description="users that may log in only from loopback")
    use_identity_as_username: bool = Field(
        False, description="a verified client certificate's subject field is the username (MQTT)"
    )
    identity_field: str = Field("commonName", description="certificate subject field used as the username")
    login_delay_initial_s: float = Field(
        0.2,
        ge=0,
        description="seconds a wrong password's refusal waits after the first failure of that user from "
        "that address, twice as long after each further one; a correct password never waits and resets "
        "the count (a quiet minute does too); 0 = off",
    )
    login_delay_max_s: float = Field(
        1.0,
        ge=0,
        description="the longest wait before a refusal (and at most a quarter of the shortest handshake "
        "deadline, so that every refusal is the protocol's answer, never a dropped socket)",
    )
    login_cache_s: float = Field(300.0, ge=0, description="a verified password is remembered this long")
    vhost_map: dict[str, str] = Field(
        {}, description="user name or certificate identity -> the vhost it enters unless it names one"
    )
    permissions: list[PermissionSettings] = Field(
        [],
        description="permissions (user, vhost, configure, write, read) applied at every start over those "
        "set through the CLI or API; no permission, no entry",
    )

    @field_validator("vhost_map")
    @classmethod
    def _vhost_names(cls, value: dict[str, str]) -> dict[str, str]:
        _valid_vhosts(list(value.values()))
        return value


class WebhookEndpoint(Section):
    url: str = Field(description="http:// or https:// URL the events are POSTed to")
    events: list[str] = Field(["*"], description="event types; '*' is all, 'client.*' a family")
    topics: list[str] = Field(["#"], description="topic filters for message.* events (MQTT wildcards)")
    headers: dict[str, str] = Field({}, description="extra HTTP headers sent with every request")
    secret: SecretStr | None = Field(None, description="HMAC-SHA256 key for the signature header")
    include_payload: bool = Field(
        False, description="message events carry the payload (base64, and as text when UTF-8)"
    )
    ca_file: Path | None = Field(None, description="CA bundle to verify an https endpoint")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http:// or https:// URL with a host")
        return value

    @field_validator("events")
    @classmethod
    def _known_events(cls, value: list[str]) -> list[str]:
        expand_patterns(value)
        return value

    @field_validator("topics")
    @classmethod
    def _filters(cls, value: list[str]) -> list[str]:
        for topic_filter in value:
            validate_topic_filter(topic_filter)
        return value


class WebhookSettings(Section):
    endpoints: list[WebhookEndpoint] = Field(
        [], description="where events are POSTed, each with its own events, topics and secret"
    )
    batch_max: int = Field(100, ge=1, description="most events in one request")
    batch_wait_ms: float = Field(200.0, ge=0, description="longest wait to fill a batch")
    timeout_s: float = Field(5.0, gt=0, description="one request: connect, send and answer")
    max_retries: int = Field(8, ge=0, description="retries of a failed batch before it is dropped")
    queue_size: int = Field(10_000, ge=1, description="events held per endpoint; the oldest go first")
    backoff_initial_s: float = Field(0.5, ge=0, description="retry n waits random(0, initial * 2**n)")
    backoff_max_s: float = Field(30.0, ge=0, description="the retry wait's ceiling")
    breaker_threshold: int = Field(5, ge=1, description="consecutive failures that open the breaker")
    breaker_cooldown_s: float = Field(10.0, ge=0, description="open this long before one probe request")
    signature_header: str = Field(
        "X-Trimaran-Signature",
        description="header holding sha256=<HMAC of timestamp.body> when the endpoint has a secret",
    )
    timestamp_header: str = Field(
        "X-Trimaran-Timestamp", description="header holding the request's unix time, part of the signed text"
    )
    flush_timeout_s: float = Field(2.0, ge=0, description="at shutdown: longest wait to send what is queued")


class BridgeTopic(NamedTuple):
    """One ``topic`` line of a bridge, as Mosquitto reads it: ``PATTERN [in|out|both [QOS
    [LOCAL-PREFIX REMOTE-PREFIX]]]``. A message to ``local_prefix + T`` here goes to
    ``remote_prefix + T`` there (out), and back (in), for the topics ``T`` the pattern matches."""

    pattern: str
    direction: Literal["in", "out", "both"]
    qos: int
    local_prefix: str
    remote_prefix: str

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.pattern

    def outward(self, local: str) -> str | None:
        """The remote topic of ``local`` (a topic here, without the vhost prefix) when this line
        takes it out; else None."""
        if self.direction == "in" or not local.startswith(self.local_prefix):
            return None
        if not topic_matches(self.local_filter, local):
            return None
        return self.remote_prefix + local[len(self.local_prefix) :]

    def inward(self, remote: str) -> str | None:
        """The topic here of ``remote`` when this line brings it in; else None."""
        if self.direction == "out" or not remote.startswith(self.remote_prefix):
            return None
        if not topic_matches(self.remote_filter, remote):
            return None
        return self.local_prefix + remote[len(self.remote_prefix) :]


def parse_bridge_topic(line: str) -> BridgeTopic:
    """A ``topic`` line (``""`` stands for an empty pattern or prefix, as in mosquitto.conf); raises
    ValueError saying what is wrong."""
    words = [word[1:-1] if word.startswith('"') and word.endswith('"') and len(word) >= 2 else word
             for word in line.split()]  # fmt: skip
    if not words or len(words) == 4 or len(words) > 5:
        raise ValueError(f"{line!r}: expected PATTERN [in|out|both [QOS [LOCAL-PREFIX REMOTE-PREFIX]]]")
    pattern = words[0]
    direction = words[1] if len(words) > 1 else "out"
    if direction not in ("in", "out", "both"):
        raise ValueError(f"{line!r}: the direction is in, out or both, not {direction!r}")
    qos_word = words[2] if len(words) > 2 else "0"
    if qos_word not in ("0", "1", "2"):
        raise ValueError(f"{line!r}: the QoS is 0, 1 or 2, not {qos_word!r}")
    local_prefix, remote_prefix = (words[3], words[4]) if len(words) == 5 else ("", "")
    topic = BridgeTopic(pattern, direction, int(qos_word), local_prefix, remote_prefix)  # type: ignore[arg-type]
    for side, prefix in (("local", local_prefix), ("remote", remote_prefix)):
        if "+" in prefix or "#" in prefix:
            raise ValueError(f"{line!r}: the {side} prefix {prefix!r} holds a wildcard")
    if not pattern and not (local_prefix and remote_prefix):
        raise ValueError(f"{line!r}: an empty pattern needs both prefixes (the topics themselves)")
    for topic_filter in (topic.local_filter, topic.remote_filter):
        try:
            validate_topic_filter(topic_filter)
        except ValueError as exc:
            raise ValueError(f"{line!r}: {topic_filter!r} is not a topic filter: {exc}") from None
    if topic.local_filter.startswith("$queue/"):
        if direction == "both":
            raise ValueError(f"{line!r}: a $queue/ topic is bridged in or out, not both")
        name = topic.local_filter.removeprefix("$queue/").split("/")[0]
        if not name or "+" in name or "#" in name:
            raise ValueError(f"{line!r}: {topic.local_filter!r} names no queue ($queue/NAME[/KEYS])")
    return topic


class BridgeSettings(Section):
    """A bridge to another MQTT broker, in the words of Mosquitto's bridge configuration."""

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="the bridge's name (Mosquitto's connection): in logs, metrics, the API",
    )
    address: str = Field(
        description="the remote broker, HOST[:PORT] (1883, or 8883 with TLS); several, space-separated, "
        "are tried in turn"
    )
    topic: list[str] = Field(
        min_length=1,
        description="topic lines: PATTERN [in|out|both [QOS [LOCAL-PREFIX REMOTE-PREFIX]]] (out, QoS 0 "
        "unless said)",
    )
    bridge_protocol_version: Literal["mqttv311", "mqttv50"] = Field(
        "mqttv311", description="the MQTT version spoken to the remote"
    )
    remote_clientid: str | None = Field(
        None, description="client id at the remote; default NODE_NAME.NAME (the node's and the bridge's)"
    )
    remote_username: str | None = Field(None, description="user name at the remote")
    remote_password: SecretStr | None = Field(None, description="password at the remote")
    cleansession: bool = Field(
        False,
        description="start a new session at every connection; false keeps it, so the remote holds what "
        "comes in for the bridge while it is away",
    )
    session_expiry_interval: int = Field(
        3600, ge=0, description="MQTT 5: seconds the remote keeps the session in a gap (cleansession false)"
    )
    keepalive_interval: int = Field(60, ge=0, le=65535, description="seconds; 0 = no keep-alive")
    try_private: bool = Field(
        True,
        description="MQTT 3.1.1: tell the remote this is a bridge (Mosquitto then sends it nothing it "
        "published itself); turn off for a broker that refuses it",
    )
    restart_timeout: str = Field(
        "5 30",
        description="seconds between tries: BASE CAP backs off at random between them, one number waits "
        "that long each time",
    )
    vhost: str = Field("/", description="the local vhost the bridge publishes into and subscribes in")
    max_inflight_messages: int = Field(
        1024,
        ge=1,
        le=65535,
        description="outbound QoS 1/2 messages the remote has not acknowledged, at most (and at most "
        "its MQTT 5 Receive Maximum)",
    )
    queue_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="payload bytes of outbound QoS 1/2 messages held (in the bridge's queue) for the "
        "remote: connected, publishers are slowed past half of it; away, newer ones are dropped past it "
        "and counted",
    )
    notifications: bool = Field(
        True,
        description="publish 1 / 0 retained to $SYS/broker/connection/CLIENTID/state here as the bridge "
        "comes and goes",
    )
    bridge_cafile: Path | None = Field(None, description="CA bundle that verifies the remote: TLS on")
    bridge_certfile: Path | None = Field(None, description="client certificate for the remote (PEM)")
    bridge_keyfile: Path | None = Field(None, description="its private key (PEM)")
    bridge_insecure: bool = Field(
        False, description="TLS without checking the remote's host name (tests only: anyone can pose as it)"
    )

    @field_validator("topic")
    @classmethod
    def _topics(cls, value: list[str]) -> list[str]:
        for line in value:
            parse_bridge_topic(line)
        return value

    @field_validator("vhost")
    @classmethod
    def _vhost_name(cls, value: str) -> str:
        _valid_vhosts([value])
        return value

    @field_validator("address")
    @classmethod
    def _addresses(cls, value: str) -> str:
        cls.split_addresses(value, 0)
        return value

    @field_validator("restart_timeout")
    @classmethod
    def _restart(cls, value: str) -> str:
        cls.restart_times(value)
        return value

    @staticmethod
    def restart_times(value: str) -> tuple[float, float]:
        """``restart_timeout`` as (base, cap); one number is both."""
        try:
            numbers = [float(word) for word in value.split()]
        except ValueError:
            numbers = []
        if len(numbers) not in (1, 2) or min(numbers) <= 0 or numbers[0] > numbers[-1]:
            raise ValueError(f"{value!r} is not BASE [CAP], seconds, with 0 < BASE <= CAP")
        return numbers[0], numbers[-1]

    @property
    def topics(self) -> list[BridgeTopic]:
        return [parse_bridge_topic(line) for line in self.topic]

    @property
    def tls(self) -> bool:
        return self.bridge_cafile is not None

    def addresses(self) -> list[tuple[str, int]]:
        return self.split_addresses(self.address, 8883 if self.tls else 1883)

    @staticmethod
    def split_addresses(value: str, default_port: int) -> list[tuple[str, int]]:
        """``address`` as (host, port) pairs; raises ValueError naming a word that is not HOST[:PORT]."""
        out = []
        for word in value.split() or [""]:
            host, _, port = word.rpartition(":") if ":" in word else (word, "", "")
            if not host or (port and not port.isdigit()):
                raise ValueError(f"{word!r} is not HOST[:PORT]")
            out.append((host.strip("[]"), int(port) if port else default_port))
        return out


class ShovelUri(NamedTuple):
    """A shovel's ``src_uri`` or ``dest_uri``, read: ``amqp://`` with no host is this broker."""

    local: bool
    tls: bool
    host: str
    port: int
    username: str | None
    password: str | None
    vhost: str  # the remote's, or the local vhost
    query: dict[str, str]  # cacertfile, certfile, keyfile, verify, server_name_indication, heartbeat

    @property
    def shown(self) -> str:
        """The URI as logs and the API show it: no password."""
        if self.local:
            return "amqp://" if self.vhost == DEFAULT_VHOST else f"amqp:///{self.vhost}"
        user = f"{self.username}@" if self.username else ""
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{user}{self.host}:{self.port}"


#: What a shovel URI's query may say (RabbitMQ's names).
SHOVEL_URI_QUERY = frozenset(
    {"cacertfile", "certfile", "keyfile", "verify", "server_name_indication", "heartbeat"}
)


def parse_shovel_uri(value: str) -> ShovelUri:
    """``amqp[s]://[USER[:PASSWORD]@]HOST[:PORT][/VHOST][?KEY=VALUE...]``, or ``amqp://[/VHOST]``
    for this broker; raises ValueError saying what is wrong."""
    parts = urlsplit(value)
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"{value!r}: the scheme is amqp or amqps")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r}: the port is not a number") from None
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else DEFAULT_VHOST
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - SHOVEL_URI_QUERY)
    if unknown:
        raise ValueError(f"{value!r}: unknown query keys {', '.join(unknown)}")
    if query.get("verify", "verify_peer") not in ("verify_peer", "verify_none"):
        raise ValueError(f"{value!r}: verify is verify_peer or verify_none")
    if not parts.hostname:
        if parts.scheme == "amqps" or parts.username or port or query:
            raise ValueError(f"{value!r}: this broker's URI is amqp:// or amqp:///VHOST, with nothing else")
        return ShovelUri(True, False, "", 0, None, None, vhost, {})
    tls = parts.scheme == "amqps"
    return ShovelUri(
        False,
        tls,
        parts.hostname,
        port or (5671 if tls else 5672),
        unquote(parts.username) if parts.username is not None else None,
        unquote(parts.password) if parts.password is not None else None,
        vhost,
        query,
    )


class ShovelSettings(Section):
    """A shovel between this broker and another AMQP broker, in the words of RabbitMQ's Shovel
    plugin (its ``src-uri`` is ``src_uri`` here). One side is this broker (``amqp://``)."""

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="the shovel's name: in logs, metrics, the API (one namespace with the bridges)",
    )
    src_protocol: Literal["amqp091", "amqp10"] = Field("amqp091", description="what the source speaks")
    src_uri: str = Field(
        description="the source: amqp[s]://USER:PASS@HOST[:PORT][/VHOST][?cacertfile=...] for a remote, "
        "amqp:// or amqp:///VHOST for this broker; several, space-separated, are tried in turn"
    )
    src_queue: str | None = Field(None, description="AMQP 0.9.1: the queue to consume (declared if absent)")
    src_exchange: str | None = Field(
        None,
        description="AMQP 0.9.1: consume what this exchange routes with src_exchange_key, through a queue of "
        "the shovel's own (here: amq.topic, the topics)",
    )
    src_exchange_key: str = Field("#", description="the binding key of src_exchange")
    src_address: str | None = Field(None, description="AMQP 1.0: the address the source link consumes")
    src_prefetch_count: int = Field(
        1000, ge=1, le=65535, description="messages taken from the source and not yet settled, at most"
    )
    dest_protocol: Literal["amqp091", "amqp10"] = Field("amqp091", description="what the destination speaks")
    dest_uri: str = Field(description="the destination, as src_uri")
    dest_queue: str | None = Field(None, description="AMQP 0.9.1: publish to this queue (declared if absent)")
    dest_exchange: str | None = Field(
        None, description="AMQP 0.9.1: publish to this exchange (here: amq.topic, the topics)"
    )
    dest_exchange_key: str | None = Field(
        None, description="the routing key to publish with; default: the message's own"
    )
    dest_address: str | None = Field(None, description="AMQP 1.0: the address the destination link sends to")
    ack_mode: Literal["on-confirm", "on-publish", "no-ack"] = Field(
        "on-confirm",
        description="on-confirm: the source's message is acknowledged once the destination has it "
        "(confirmed, committed); on-publish: once sent; no-ack: at once (loses messages in a gap)",
    )
    reconnect_delay: float = Field(5.0, gt=0, description="seconds between tries to connect")
    queue_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="payload bytes the shovel's own queue holds for the destination (an amq.topic source): "
        "connected, publishers are slowed past half of it; away, newer ones are dropped past it and counted",
    )

    @field_validator("src_uri", "dest_uri")
    @classmethod
    def _uris(cls, value: str) -> str:
        if not value.split():
            raise ValueError("no URI")
        ends = [parse_shovel_uri(word) for word in value.split()]
        if len(ends) > 1 and any(end.local for end in ends):
            raise ValueError(f"{value!r}: this broker's amqp:// is one URI alone")
        return value

    @model_validator(mode="after")
    def _ends(self) -> ShovelSettings:
        src, dest = self.source, self.destination
        if src.local == dest.local:
            raise ValueError("one of src_uri and dest_uri is this broker (amqp://), the other a remote")
        for side, end, protocol in (("src", src, self.src_protocol), ("dest", dest, self.dest_protocol)):
            queue, exchange = getattr(self, f"{side}_queue"), getattr(self, f"{side}_exchange")
            address = getattr(self, f"{side}_address")
            if end.local and (protocol != "amqp091" or address is not None):
                raise ValueError(
                    f"this broker's side is named in AMQP 0.9.1 terms: {side}_queue or {side}_exchange"
                )
            if protocol == "amqp10" and (address is None or queue is not None or exchange is not None):
                raise ValueError(f"an AMQP 1.0 {side} names {side}_address, not a queue or exchange")
            if protocol == "amqp091" and address is not None:
                raise ValueError(f"{side}_address is AMQP 1.0's: name {side}_queue or {side}_exchange")
            if queue is not None and exchange is not None:
                raise ValueError(f"{side}_queue or {side}_exchange, not both")
            if end.local and exchange not in (None, "amq.topic"):
                raise ValueError(
                    f"{side}_exchange {exchange!r}: here a shovel reaches amq.topic (the topics) or a queue; "
                    f"bind a queue to {exchange!r} and name it in {side}_queue"
                )
        if self.src_protocol == "amqp091" and self.src_queue is None and self.src_exchange is None:
            raise ValueError("the source names src_queue or src_exchange")
        if (
            self.src_protocol == "amqp10"
            and self.dest_exchange is not None
            and self.dest_exchange_key is None
        ):
            raise ValueError("an AMQP 1.0 source has no routing key: name dest_exchange_key")
        if src.local:
            if self.src_exchange is not None:
                try:
                    validate_topic_filter(binding_key_to_filter(self.src_exchange_key))
                except ValueError as exc:
                    raise ValueError(f"src_exchange_key {self.src_exchange_key!r}: {exc}") from None
            _valid_vhosts([src.vhost])
        if dest.local:
            _valid_vhosts([dest.vhost])
        return self

    @property
    def source(self) -> ShovelUri:
        return parse_shovel_uri(self.src_uri.split()[0])

    @property
    def destination(self) -> ShovelUri:
        return parse_shovel_uri(self.dest_uri.split()[0])

    @property
    def local(self) -> ShovelUri:
        return self.source if self.source.local else self.destination

    def remotes(self) -> list[ShovelUri]:
        """The remote side's URIs, tried in turn."""
        uris = self.dest_uri if self.source.local else self.src_uri
        return [parse_shovel_uri(word) for word in uris.split()]


class TelemetrySettings(Section):
    metrics: bool = Field(True, description="serve /metrics (false: 404)")
    traces: bool = Field(False, description="reserved: the server exports no traces yet, whatever this says")
    otlp_endpoint: str | None = Field(
        None, description="also push the metrics by OTLP/HTTP here (needs the otlp extra)"
    )
    service_name: str = Field("trimaran", description="service.name of the OpenTelemetry resource")
    per_object_metrics: bool = Field(False, description="per-queue and per-endpoint series in /metrics")
    history_interval_s: float = Field(
        5.0,
        gt=0,
        description="how often the management page's charts are sampled (rates, connections, queues, "
        "bridges)",
    )
    history_samples: int = Field(
        180, ge=2, le=10_000, description="samples the charts keep: 180 at 5 s is the last 15 minutes"
    )


class HttpSettings(Section):
    bind: LocalBindAddress = Field(
        Endpoint("127.0.0.1", 8080),
        description="the admin listener (health, /metrics, /api/v1, /ui): [HOST:]PORT or off",
    )
    tokens: list[SecretStr] = Field(
        [], description="bearer tokens for /api/v1 and the management page; none = the API is locked"
    )
    max_body_bytes: int = Field(1024 * 1024, ge=1, description="largest request body (413 beyond)")
    request_timeout_s: float = Field(10.0, gt=0, description="longest time to read a request and answer it")


class LogSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="lowest level logged")
    format: Literal["text", "json"] = Field("text", description="text lines, or one JSON object per line")

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class AuditSettings(Section):
    """``trimaran audit``: where its Spark runs. ``--master``, ``--jars`` and ``--conf`` override."""

    master: str = Field("local[*]", description="local[*], spark://HOST:7077, yarn or k8s://https://HOST")
    jars: list[str] = Field([], description="JDBC driver jars; default: Debian's in /usr/share/java")
    conf: dict[str, str] = Field({}, description="Spark settings, e.g. spark.executor.memory = '4g'")
    executor_timeout_s: float = Field(180.0, gt=0, description="longest wait for a first executor task")


_toml_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("toml_file", default=None)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TRIMARAN_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    node_name: str = Field(
        "trimaran", description="this server's name: in $SYS, /api/v1, webhook events and among cluster nodes"
    )
    vhosts: list[str] = Field(["/"], description="virtual hosts that always exist; '/' is always one")
    shutdown_grace_s: float = Field(5.0, ge=0, description="longest graceful shutdown before exit")
    listeners: ListenerSettings = ListenerSettings()
    storage: StorageSettings = StorageSettings()
    limits: LimitSettings = LimitSettings()
    queues: QueueSettings = QueueSettings()
    cluster: ClusterSettings = ClusterSettings()
    amqp091: Amqp091Settings = Amqp091Settings()
    amqp1: Amqp1Settings = Amqp1Settings()
    auth: AuthSettings = AuthSettings()
    webhooks: WebhookSettings = WebhookSettings()
    bridges: list[BridgeSettings] = Field([], description="bridges to other MQTT brokers, one table each")
    shovels: list[ShovelSettings] = Field(
        [], description="shovels to and from other AMQP brokers, one table each"
    )
    telemetry: TelemetrySettings = TelemetrySettings()
    http: HttpSettings = HttpSettings()
    log: LogSettings = LogSettings()
    audit: AuditSettings = AuditSettings()

    @field_validator("vhosts")
    @classmethod
    def _vhost_names(cls, value: list[str]) -> list[str]:
        return _valid_vhosts(value)

    @field_validator("bridges")
    @classmethod
    def _bridge_names(cls, value: list[BridgeSettings]) -> list[BridgeSettings]:
        names = [bridge.name for bridge in value]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"two bridges are named {', '.join(twice)}")
        return value

    @field_validator("shovels")
    @classmethod
    def _shovel_names(cls, value: list[ShovelSettings], info: ValidationInfo) -> list[ShovelSettings]:
        names = [shovel.name for shovel in value] + [bridge.name for bridge in info.data.get("bridges", [])]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"two bridges or shovels are named {', '.join(twice)}")
        return value

    def declared_vhosts(self) -> list[str]:
        """``/``, the top-level ``vhosts`` and the older ``amqp091.vhosts`` (an alias), in order."""
        names = [DEFAULT_VHOST, *self.vhosts, *self.amqp091.vhosts]
        return list(dict.fromkeys(names))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win: CLI flags (passed as init values) > environment > TOML file.
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_path = _toml_file.get()
        if toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
        return tuple(sources)


class ConfigError(Exception):
    """Settings that cannot be used; the message names each key and its problem."""


def load_settings(config_file: Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Build the effective settings. ``overrides`` are CLI flags as a nested dict."""
    if config_file is None and DEFAULT_CONFIG_FILE.is_file():
        config_file = DEFAULT_CONFIG_FILE
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"config file {config_file} does not exist")
    token = _toml_file.set(config_file)
    try:
        settings = Settings(**(overrides or {}))
        check_settings(settings)
        return settings
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc)) from None
    except ValueError as exc:  # e.g. a TOML syntax error
        raise ConfigError(f"cannot read {config_file}: {exc}") from None
    finally:
        _toml_file.reset(token)


def check_settings(settings: Settings) -> None:
    """Rules that join two sections; raises :class:`ConfigError`."""
    if settings.queues.shared and not settings.storage.effective_url().startswith("postgres"):
        raise ConfigError(
            "invalid setting queues.shared: several servers can share queues only on PostgreSQL "
            f"(storage.url is {settings.storage.effective_url()!r}); set storage.url = postgresql://... "
            "or queues.shared = false"
        )
    for bridge in settings.bridges:
        if bridge.vhost not in settings.declared_vhosts():
            raise ConfigError(
                f"invalid setting bridges ({bridge.name}).vhost: {bridge.vhost!r} is not declared; add it "
                "to vhosts"
            )
    for shovel in settings.shovels:
        if shovel.local.vhost not in settings.declared_vhosts():
            raise ConfigError(
                f"invalid setting shovels ({shovel.name}): the vhost {shovel.local.vhost!r} of amqp:// is "
                "not declared; add it to vhosts"
            )
    cluster = settings.cluster
    if cluster.enabled and not settings.storage.effective_url().startswith("postgres"):
        raise ConfigError(
            "invalid setting cluster.enabled: several nodes need one PostgreSQL database "
            f"(storage.url is {settings.storage.effective_url()!r}); set storage.url = postgresql://..."
        )
    if cluster.enabled and cluster.node_timeout_s <= cluster.heartbeat_s:
        raise ConfigError(
            f"invalid setting cluster.node_timeout_s: {cluster.node_timeout_s:g} s must be longer than "
            f"cluster.heartbeat_s ({cluster.heartbeat_s:g} s), or live nodes are declared dead"
        )


def describe_errors(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(root)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown setting" + _did_you_mean(error["loc"])
        lines.append(f"invalid setting {key}: {message}")
    return "\n".join(lines)


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """For an unknown key, the closest key of the same section (``; did you mean 'mqtt_ws'?``)."""
    model: Any = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        if isinstance(part, int):  # an entry of a list of sections, e.g. auth.users[0]
            continue
        while get_args(annotation) and not isinstance(annotation, type):
            annotation = get_args(annotation)[0]  # list[Section] -> Section
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, secrets shown as '********'."""
    return settings.model_dump(mode="json")
