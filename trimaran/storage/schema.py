"""SQLAlchemy Core tables. Alembic migrations under ``migrations/`` create them; keep both in step.

Times are integer epoch milliseconds.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    }
)

# Facts about this database: node identity, when it was created.
broker_meta = Table(
    "broker_meta",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

# -- MQTT (migration 0002) --------------------------------------------------------------------

# Retained messages survive a restart; an empty payload deletes the row.
retained_messages = Table(
    "retained_messages",
    metadata,
    Column("topic", Text, primary_key=True),
    Column("payload", LargeBinary, nullable=False),
    Column("qos", Integer, nullable=False),
    Column("properties", Text, nullable=False),
    Column("expires_at", BigInteger, nullable=True),
    Column("updated_at", BigInteger, nullable=False),
)

# Persistent MQTT sessions: subscriptions, inflight and queued messages and protocol state as one
# JSON document per client (mqtt.session.Session.to_json), written when it changes, at disconnect
# and at shutdown (as Mosquitto persists its sessions).
mqtt_sessions = Table(
    "mqtt_sessions",
    metadata,
    Column("client_id", String(65535), primary_key=True),
    Column("protocol_level", Integer, nullable=False),
    Column("expiry_interval_s", BigInteger, nullable=False),
    Column("disconnected_at", BigInteger, nullable=True),
    Column("state", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

# A persistent session's queued messages (migration 0005), a row each by sequence number, so a
# filling offline session writes only what was queued since the last save; the session's JSON above
# holds the rest (subscriptions, inflight, ids) and the first sequence number still queued.
mqtt_session_messages = Table(
    "mqtt_session_messages",
    metadata,
    Column("client_id", String(65535), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("message", Text, nullable=False),
    PrimaryKeyConstraint("client_id", "seq", name="pk_mqtt_session_messages"),
)

# -- durable queues (migration 0003) --------------------------------------------------------------

from sqlalchemy import Index  # noqa: E402

# One row per durable queue. ``next_offset`` is the first offset not yet handed out, so offsets are
# never reused even after every message was acknowledged and deleted (message ids stay unique for the
# audit). In shared (multi-node) mode nodes reserve blocks of offsets by advancing it.
queues = Table(
    "queues",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("mode", String(16), nullable=False),
    Column("policy", Text, nullable=False),
    Column("next_offset", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("vhost", String(255), nullable=False, server_default="/"),  # migration 0009; the name's prefix
)

# The messages a queue still holds (work: until every group is done; stream: until retention).
queue_messages = Table(
    "queue_messages",
    metadata,
    Column("queue", String(255), nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("topic", Text, nullable=False),
    Column("routing_key", Text, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("qos", Integer, nullable=False),
    Column("properties", Text, nullable=False),
    Column("published_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=True),
    Column("publisher", String(65535), nullable=True),
    Column("protocol", String(16), nullable=False),
    PrimaryKeyConstraint("queue", "offset"),
    sqlite_with_rowid=False,  # one b-tree, its key's (migration 0008)
)

# Per consumer group: work mode's cursor (first offset never handed out) and a stream's committed
# offset (first offset not yet committed).
queue_groups = Table(
    "queue_groups",
    metadata,
    Column("queue", String(255), nullable=False),
    Column("group", String(255), nullable=False),
    Column("cursor", BigInteger, nullable=False),
    Column("committed", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("queue", "group"),
)

# Work mode's pending entries. state: held (delivered, not settled), wait (to be redelivered at
# available_at), done (acknowledged ahead of the group's cursor, kept until the cursor passes it).
# ``node`` and ``lease_until`` let several nodes share one PostgreSQL database (claims).
queue_pending = Table(
    "queue_pending",
    metadata,
    Column("queue", String(255), nullable=False),
    Column("group", String(255), nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("state", String(8), nullable=False),
    Column("consumer", String(65535), nullable=True),
    Column("node", String(255), nullable=True),
    Column("delivered_at", BigInteger, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("available_at", BigInteger, nullable=True),
    Column("lease_until", BigInteger, nullable=True),
    Column("reason", String(16), nullable=True),  # why it waits: nack, timeout, disconnect, restart
    # Of the attempts, those that were not failures (migration 0012): handed back unsent, and
    # returned unprocessed (AMQP 1.0 released); max_attempts counts the rest.
    Column("unsent", Integer, nullable=False, server_default="0"),
    Column("returned", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("queue", "group", "offset"),
    sqlite_with_rowid=False,  # one b-tree, its key's, besides the claim index (migration 0008)
)

# Shared mode: runs of consecutive offsets a node claimed for a group as it published them, held
# there under a lease (``Claims.claim_published``): one row a commit where a pending row a message
# cost an insert and a delete. A message of a span with no pending row of its group is the span's
# node's; one with a row ('wait' after a nack, 'done' with several groups) is the row's. A span whose
# lease ran out is turned into 'wait' rows by the next claim of its group; its node deletes it once
# none of its messages is left to it (``queue_store.renew_leases``).
queue_spans = Table(
    "queue_spans",
    metadata,
    Column("queue", String(255), nullable=False),
    Column("group", String(255), nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("node", String(255), nullable=False),
    Column("lease_until", BigInteger, nullable=False),
    PrimaryKeyConstraint("queue", "group", "first_offset"),
)

# Append-only history of every state change: what the Spark audit replays. ``reason`` explains a
# delivery (first, timeout, nack, disconnect, restart), a rejection, a dead-lettering or a drop. A
# row stands for ``span`` events (migration 0007): the same kind, moment, queue, group, consumer,
# node, attempt and reason on the consecutive offsets ``offset`` .. ``offset + span - 1`` (a run of
# publishes, a dispatch's deliveries, a multiple ack), so a message costs a fraction of a row.
queue_events = Table(
    "queue_events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("time", BigInteger, nullable=False),
    Column("queue", String(255), nullable=False),
    Column("group", String(255), nullable=True),
    Column("offset", BigInteger, nullable=True),
    Column("consumer", String(65535), nullable=True),
    Column("node", String(255), nullable=True),
    Column("kind", String(16), nullable=False),
    Column("attempt", Integer, nullable=True),
    Column("reason", Text, nullable=True),
    Column("span", Integer, nullable=False, server_default="1"),
)
# The longest span a row may have: a lookup by offset reads the index from ``offset - SPAN_MAX``.
SPAN_MAX = 1024
Index("ix_queue_events_queue_offset", queue_events.c.queue, queue_events.c.offset)
# (ix_queue_pending_claim, on queue, group, available_at, was dropped by migration 0014: claims walk
# the primary key in offset order, and the planner took that index for key lookups.)
# The 'done' markers alone (migration 0013): the shared mode's compaction reads them at every poll.
Index(
    "ix_queue_pending_done",
    queue_pending.c.queue,
    queue_pending.c.offset,
    postgresql_where=text("state = 'done'"),
    sqlite_where=text("state = 'done'"),
)

# -- AMQP 0.9.1 (migration 0004) --------------------------------------------------------------------

from sqlalchemy import Boolean  # noqa: E402

# Durable exchanges (RabbitMQ persists only those). ``arguments`` is the field table as tagged JSON
# (written by amqp091.durable), so every AMQP field type survives the round trip.
amqp_exchanges = Table(
    "amqp_exchanges",
    metadata,
    Column("vhost", String(255), nullable=False),
    Column("name", String(255), nullable=False),
    Column("type", String(32), nullable=False),
    Column("durable", Boolean, nullable=False),
    Column("auto_delete", Boolean, nullable=False),
    Column("internal", Boolean, nullable=False),
    Column("arguments", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("vhost", "name"),
)

# Bindings whose source and destination are both durable. ``binding_key`` is a digest of
# (source, destination, destination_kind, routing_key, arguments), so a binding is stored once per
# vhost however long its key and arguments are.
amqp_bindings = Table(
    "amqp_bindings",
    metadata,
    Column("vhost", String(255), nullable=False),
    Column("binding_key", String(64), nullable=False),
    Column("source", String(255), nullable=False),
    Column("destination", String(255), nullable=False),
    Column("destination_kind", String(8), nullable=False),  # queue | exchange
    Column("routing_key", Text, nullable=False),
    Column("arguments", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("vhost", "binding_key"),
)
Index("ix_amqp_bindings_vhost_source", amqp_bindings.c.vhost, amqp_bindings.c.source)
Index(
    "ix_amqp_bindings_vhost_destination_kind_destination",
    amqp_bindings.c.vhost,
    amqp_bindings.c.destination_kind,
    amqp_bindings.c.destination,
)

# -- several nodes on one PostgreSQL (migration 0006) ----------------------------------------------

# One row per node by name. ``heartbeat_at`` is renewed every cluster.heartbeat_s; a row older than
# cluster.node_timeout_s is a dead node, whose routes and sessions the others release. ``incarnation``
# tells a restarted node from its predecessor; ``claims_as`` is the node id its shared-queue claims use.
cluster_nodes = Table(
    "cluster_nodes",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("incarnation", String(64), nullable=False),
    Column("claims_as", String(255), nullable=False),
    Column("address", Text, nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("heartbeat_at", BigInteger, nullable=False),
)

# Which filters a node's subscribers hold: a filter once per node (shared subscriptions as
# ``$share/<group>/<filter>``), so a publish is forwarded only to nodes with a matching route.
cluster_routes = Table(
    "cluster_routes",
    metadata,
    Column("node", String(255), nullable=False),
    Column("topic_filter", Text, nullable=False),
    PrimaryKeyConstraint("node", "topic_filter", name="pk_cluster_routes"),
)

# Forwards too large for one NOTIFY (8,000 bytes): the NOTIFY names the row, the receiving node
# reads and deletes it.
cluster_spill = Table(
    "cluster_spill",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("node", String(255), nullable=False),
    Column("batch", LargeBinary, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

# Which node holds each MQTT client's session (connected or persistent offline): one at a time.
cluster_sessions = Table(
    "cluster_sessions",
    metadata,
    Column("client_id", String(65535), primary_key=True),
    Column("node", String(255), nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)
Index("ix_cluster_sessions_node", cluster_sessions.c.node)


# -- virtual hosts (migration 0009) ---------------------------------------------------------------

# Vhosts created at run time (those in the settings are not stored).
vhosts = Table(
    "vhosts",
    metadata,
    Column("name", String(255), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("name"),
)

# RabbitMQ's set_permissions: a row lets ``user`` enter ``vhost``, and its configure, write and read
# regular expressions say which queues and exchanges it may do what with (no row: no entry).
vhost_permissions = Table(
    "vhost_permissions",
    metadata,
    Column("user", String(255), nullable=False),
    Column("vhost", String(255), nullable=False),
    Column("configure", Text, nullable=False),
    Column("write", Text, nullable=False),
    Column("read", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("user", "vhost"),
)

# RabbitMQ's set_topic_permissions (migration 0011): write and read patterns on the routing keys a
# user may publish with and bind with through ``exchange`` (a topic exchange) in ``vhost``.
topic_permissions = Table(
    "topic_permissions",
    metadata,
    Column("user", String(255), nullable=False),
    Column("vhost", String(255), nullable=False),
    Column("exchange", String(255), nullable=False),
    Column("write", Text, nullable=False),
    Column("read", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("user", "vhost", "exchange"),
)


# -- limits per vhost and per user set at run time (migration 0010) --------------------------------

# What the admin API set (``limits`` JSON: trimaran.tenant_limits' fields) or cleared (``limits``
# NULL) for a vhost, a user or the default user (``name`` ""); it wins over the settings at start.
tenant_limits = Table(
    "tenant_limits",
    metadata,
    Column("kind", String(16), nullable=False),  # vhost, user, default_user
    Column("name", String(255), nullable=False),
    Column("limits", Text, nullable=True),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("kind", "name"),
)
