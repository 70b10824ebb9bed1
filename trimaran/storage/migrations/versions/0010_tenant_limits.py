"""tenant_limits: limits per vhost and per user set or cleared through the admin API

The settings give each vhost's and user's limits at start; what an operator changes at run time is
kept here and applied over them at the next start, as RabbitMQ keeps set_vhost_limits.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_limits",
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("limits", sa.Text, nullable=True),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("kind", "name", name="pk_tenant_limits"),
    )


def downgrade() -> None:
    op.drop_table("tenant_limits")
