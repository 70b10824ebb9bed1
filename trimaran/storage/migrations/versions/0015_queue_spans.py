"""queue_spans: what a shared node claims as it publishes, one row a run of offsets

A shared node that claimed a message for its own consumers as it published it wrote a pending row
'held' for it, and deleted that row again at the ack: two of the three rows a delivered message
cost PostgreSQL. A span says the same for a run of consecutive offsets, one row a commit.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_spans",
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("group", sa.String(255), nullable=False),
        sa.Column("first_offset", sa.BigInteger, nullable=False),
        sa.Column("last_offset", sa.BigInteger, nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("lease_until", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("queue", "group", "first_offset"),
    )


def downgrade() -> None:
    op.drop_table("queue_spans")
