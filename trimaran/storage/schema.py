"""SQLAlchemy Core tables. Alembic migrations under ``migrations/`` create them; keep both in step.

Times are integer epoch milliseconds.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Integer, LargeBinary, MetaData, String, Table, Text

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

# Persistent MQTT sessions: subscriptions and protocol state as one JSON document per client,
# written when it changes, at disconnect and at shutdown (as Mosquitto persists its sessions).
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

# Messages a persistent session holds: queued while offline, or sent and not yet acknowledged.
mqtt_session_messages = Table(
    "mqtt_session_messages",
    metadata,
    Column("client_id", String(65535), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("packet_id", Integer, nullable=True),
    Column("state", String(16), nullable=False),  # queued | sent | released (QoS 2 after PUBREC)
    Column("topic", Text, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("qos", Integer, nullable=False),
    Column("retain", Boolean, nullable=False),
    Column("properties", Text, nullable=False),
)
