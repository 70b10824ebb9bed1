"""cluster: nodes with heartbeats, routes per node, oversized forwards, session owners

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_nodes",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("incarnation", sa.String(64), nullable=False),
        sa.Column("claims_as", sa.String(255), nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "cluster_routes",
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("topic_filter", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("node", "topic_filter", name="pk_cluster_routes"),
    )
    op.create_table(
        "cluster_spill",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("batch", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "cluster_sessions",
        sa.Column("client_id", sa.String(65535), primary_key=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_cluster_sessions_node", "cluster_sessions", ["node"])


def downgrade() -> None:
    op.drop_index("ix_cluster_sessions_node", "cluster_sessions")
    op.drop_table("cluster_sessions")
    op.drop_table("cluster_spill")
    op.drop_table("cluster_routes")
    op.drop_table("cluster_nodes")
