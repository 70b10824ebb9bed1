"""permissions enforced: vhosts closed until granted, guest's row on /, topic permissions

Before this revision a vhost permission only let its user enter the vhost, and with no permission at
all everyone entered every vhost; ``guest`` and anonymous clients always entered ``/``. From now on
no row means no entry and the configure / write / read patterns are enforced (trimaran/security/
permissions.py). So that a working deployment keeps working:

- a fresh database gets RabbitMQ's first-start grant: ``guest`` (whose permissions anonymous clients
  have) ``.* .* .*`` on ``/``;
- a database a server has run on keeps ``guest``'s ``/`` (added ``.* .* .*`` unless a row is there);
  and when it held no permission at all, every user could enter every vhost: the marker
  ``permissions_upgrade`` = ``open`` asks the next start (which knows the users and the declared
  vhosts, this revision does not) to grant each of them ``.* .* .*`` on every vhost, and to say so
  once in the log (``trimaran.security.guard.Security.use_permissions``).

``topic_permissions`` holds RabbitMQ's set_topic_permissions: write and read patterns on routing keys
per user, vhost and exchange.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE_MARKER = "permissions_upgrade"


def upgrade() -> None:
    op.create_table(
        "topic_permissions",
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("vhost", sa.String(255), nullable=False),
        sa.Column("exchange", sa.String(255), nullable=False),
        sa.Column("write", sa.Text, nullable=False),
        sa.Column("read", sa.Text, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("user", "vhost", "exchange", name="pk_topic_permissions"),
    )
    bind = op.get_bind()
    meta = sa.table("broker_meta", sa.column("key"), sa.column("value"), sa.column("updated_at"))
    rows = sa.table(
        "vhost_permissions",
        sa.column("user"),
        sa.column("vhost"),
        sa.column("configure"),
        sa.column("write"),
        sa.column("read"),
        sa.column("updated_at"),
    )
    now = int(time.time() * 1000)
    started = bind.execute(sa.select(meta.c.key).where(meta.c.key == "last_start")).first() is not None
    count = bind.execute(sa.select(sa.func.count()).select_from(rows)).scalar_one()
    if started and not count:
        bind.execute(sa.insert(meta).values(key=UPGRADE_MARKER, value="open", updated_at=now))
        return
    guest = bind.execute(
        sa.select(rows.c.user).where(rows.c.user == "guest", rows.c.vhost == "/")
    ).first()
    if guest is None:
        bind.execute(
            sa.insert(rows).values(user="guest", vhost="/", configure=".*", write=".*", read=".*", updated_at=now)
        )
        if started:
            bind.execute(sa.insert(meta).values(key=UPGRADE_MARKER, value="guest", updated_at=now))


def downgrade() -> None:
    op.drop_table("topic_permissions")
