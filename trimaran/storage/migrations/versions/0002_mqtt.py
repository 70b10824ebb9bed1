"""mqtt: retained messages and persistent sessions

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retained_messages",
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("qos", sa.Integer, nullable=False),
        sa.Column("properties", sa.Text, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=True),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "mqtt_sessions",
        sa.Column("client_id", sa.String(65535), primary_key=True),
        sa.Column("protocol_level", sa.Integer, nullable=False),
        sa.Column("expiry_interval_s", sa.BigInteger, nullable=False),
        sa.Column("disconnected_at", sa.BigInteger, nullable=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("mqtt_sessions")
    op.drop_table("retained_messages")
