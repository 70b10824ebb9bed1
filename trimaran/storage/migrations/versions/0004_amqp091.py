"""amqp 0.9.1: durable exchanges and the bindings between durable exchanges and queues

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "amqp_exchanges",
        sa.Column("vhost", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("durable", sa.Boolean, nullable=False),
        sa.Column("auto_delete", sa.Boolean, nullable=False),
        sa.Column("internal", sa.Boolean, nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("vhost", "name", name="pk_amqp_exchanges"),
    )
    op.create_table(
        "amqp_bindings",
        sa.Column("vhost", sa.String(255), nullable=False),
        sa.Column("binding_key", sa.String(64), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("destination", sa.String(255), nullable=False),
        sa.Column("destination_kind", sa.String(8), nullable=False),
        sa.Column("routing_key", sa.Text, nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("vhost", "binding_key", name="pk_amqp_bindings"),
    )
    op.create_index("ix_amqp_bindings_vhost_source", "amqp_bindings", ["vhost", "source"])
    op.create_index(
        "ix_amqp_bindings_vhost_destination_kind_destination",
        "amqp_bindings",
        ["vhost", "destination_kind", "destination"],
    )


def downgrade() -> None:
    op.drop_index("ix_amqp_bindings_vhost_destination_kind_destination", table_name="amqp_bindings")
    op.drop_index("ix_amqp_bindings_vhost_source", table_name="amqp_bindings")
    op.drop_table("amqp_bindings")
    op.drop_table("amqp_exchanges")
