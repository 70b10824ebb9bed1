"""queue_events: one row may span consecutive offsets (span)

An event row stands for ``span`` events of the same kind, moment, queue, group, consumer, node,
attempt and reason on the offsets ``offset`` .. ``offset + span - 1``: a published run, a dispatch's
deliveries, a multiple ack. Existing rows are single events (span 1).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("queue_events") as batch:
        batch.add_column(sa.Column("span", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("queue_events") as batch:
        batch.drop_column("span")
