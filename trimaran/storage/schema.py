"""SQLAlchemy Core tables. Alembic migrations under ``migrations/`` create them; keep both in step.

Times are integer epoch milliseconds.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, MetaData, String, Table, Text

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    }
)

# Facts about this database: node identity, when it was created.
broker_meta = Table(
    "broker_meta",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)
