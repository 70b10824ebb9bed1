"""Alembic environment: the engine comes from trimaran, never from an alembic.ini."""

from alembic import context

from trimaran.storage.schema import metadata

engine = context.config.attributes["engine"]

with engine.begin() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    context.run_migrations()
