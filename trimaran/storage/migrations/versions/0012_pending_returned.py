"""pending deliveries keep their attempts that were not failures: unsent and returned

``queue_pending.attempts`` numbers every delivery of a message to a group, but a delivery handed
back unsent (its consumer went before it was written) or returned unprocessed (AMQP 1.0 released,
modified without delivery-failed) is not a failed attempt and does not count towards
``max_attempts``. Memory knew that; the row did not, so a message loaded at start, or claimed again
by a node sharing the queue, counted every return as a failure. ``unsent`` and ``returned`` keep the
two counts beside ``attempts``; rows from before start at 0 (as they were read before).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("queue_pending", sa.Column("unsent", sa.Integer, nullable=False, server_default="0"))
    op.add_column("queue_pending", sa.Column("returned", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("queue_pending") as batch:
        batch.drop_column("returned")
        batch.drop_column("unsent")
