"""vhosts: the vhosts created at run time, who may enter which, and each queue's vhost

Keys (queue names, retained topics, MQTT client ids) carry their vhost as a ``$vhost/<name>/`` prefix
(trimaran/vhosts.py); the default vhost ``/`` has none, so every row written before this revision
already belongs to ``/``. ``queues.vhost`` says it as a column the audit and the admin views can group
by: ``/`` for the existing rows, the prefix's vhost for the new ones.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vhosts",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_vhosts"),
    )
    op.create_table(
        "vhost_permissions",
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("vhost", sa.String(255), nullable=False),
        sa.Column("configure", sa.Text, nullable=False),
        sa.Column("write", sa.Text, nullable=False),
        sa.Column("read", sa.Text, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("user", "vhost", name="pk_vhost_permissions"),
    )
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("vhost", sa.String(255), nullable=False, server_default="/"))


def downgrade() -> None:
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("vhost")
    op.drop_table("vhost_permissions")
    op.drop_table("vhosts")
