"""durable queues: queues, messages, groups, pending entries and the events history

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queues",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "queue_messages",
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("routing_key", sa.Text, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("qos", sa.Integer, nullable=False),
        sa.Column("properties", sa.Text, nullable=False),
        sa.Column("published_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=True),
        sa.Column("publisher", sa.String(65535), nullable=True),
        sa.Column("protocol", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("queue", "offset", name="pk_queue_messages"),
    )
    op.create_table(
        "queue_groups",
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("group", sa.String(255), nullable=False),
        sa.Column("cursor", sa.BigInteger, nullable=False),
        sa.Column("committed", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("queue", "group", name="pk_queue_groups"),
    )
    op.create_table(
        "queue_pending",
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("group", sa.String(255), nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("consumer", sa.String(65535), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("delivered_at", sa.BigInteger, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("available_at", sa.BigInteger, nullable=True),
        sa.Column("lease_until", sa.BigInteger, nullable=True),
        sa.Column("reason", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("queue", "group", "offset", name="pk_queue_pending"),
    )
    op.create_index("ix_queue_pending_claim", "queue_pending", ["queue", "group", "available_at"])
    op.create_table(
        "queue_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("time", sa.BigInteger, nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("group", sa.String(255), nullable=True),
        sa.Column("offset", sa.BigInteger, nullable=True),
        sa.Column("consumer", sa.String(65535), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_queue_events"),
    )
    op.create_index("ix_queue_events_queue_offset", "queue_events", ["queue", "offset"])


def downgrade() -> None:
    op.drop_table("queue_events")
    op.drop_index("ix_queue_pending_claim", table_name="queue_pending")
    op.drop_table("queue_pending")
    op.drop_table("queue_groups")
    op.drop_table("queue_messages")
    op.drop_table("queues")
