"""SQLite: queue_messages and queue_pending are WITHOUT ROWID tables

Both are only ever reached by their primary key (and the claim index), so a rowid table kept two
b-trees where one does: every insert and delete of the hot path wrote a row and its key index. A
WITHOUT ROWID table is its primary key's b-tree. PostgreSQL is unchanged.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _messages(name: str, rowid: bool) -> None:
    op.create_table(
        name,
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
        sa.PrimaryKeyConstraint("queue", "offset", name=f"pk_{name.removesuffix('_new')}"),
        sqlite_with_rowid=rowid,
    )


def _pending(name: str, rowid: bool) -> None:
    op.create_table(
        name,
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
        sa.PrimaryKeyConstraint("queue", "group", "offset", name=f"pk_{name.removesuffix('_new')}"),
        sqlite_with_rowid=rowid,
    )


def _rebuild(rowid: bool) -> None:
    """Copy both tables into new ones made ``rowid`` or not, keeping names, keys and the index."""
    if op.get_bind().dialect.name != "sqlite":
        return
    op.drop_index("ix_queue_pending_claim", table_name="queue_pending")
    for table, make in (("queue_messages", _messages), ("queue_pending", _pending)):
        make(f"{table}_new", rowid)
        op.execute(f"INSERT INTO {table}_new SELECT * FROM {table}")
        op.drop_table(table)
        op.rename_table(f"{table}_new", table)
    op.create_index("ix_queue_pending_claim", "queue_pending", ["queue", "group", "available_at"])


def upgrade() -> None:
    _rebuild(rowid=False)


def downgrade() -> None:
    _rebuild(rowid=True)
