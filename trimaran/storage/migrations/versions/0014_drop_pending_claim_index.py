"""drop the pending rows' claim index, which only misled the planner

``ix_queue_pending_claim`` (queue, group, available_at) was made for claims of what waits for its
time. A claim walks a group's rows in offset order with sorts turned off (``queue_store.claim``),
so it reads the primary key and never this index. But with a young table's statistics the planner
costs one row for any (queue, group), and then took this index over the primary key to look up one
message's row, walking every row of the group for each message a claim of new messages passed:
28-48 ms a claim with 500 messages in flight, ten claims a second on an idle shared consumer. Every
pending row written also paid for this index. Without it, a row is looked up by its key.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_queue_pending_claim", table_name="queue_pending")


def downgrade() -> None:
    op.create_index("ix_queue_pending_claim", "queue_pending", ["queue", "group", "available_at"])
