"""mqtt: a persistent session's queued messages, a row each (sessions are saved incrementally)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mqtt_session_messages",
        sa.Column("client_id", sa.String(65535), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("client_id", "seq", name="pk_mqtt_session_messages"),
    )


def downgrade() -> None:
    op.drop_table("mqtt_session_messages")
