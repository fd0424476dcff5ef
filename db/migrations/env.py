"""Alembic environment: runs migrations on the connection handed in by db.engine.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from db.models import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # `alembic` CLI use: OVERNIGHT_DB or sqlalchemy.url
        url = config.get_main_option("sqlalchemy.url")
        if not url:
            raise RuntimeError("set sqlalchemy.url (e.g. sqlite:////path/to/overnight.db)")
        engine = create_engine(url)
        with engine.begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata,
                              render_as_batch=conn.dialect.name == "sqlite")
            with context.begin_transaction():
                context.run_migrations()
        return
    # Batch mode (copy, drop, rename a table) is how SQLite alters tables; PostgreSQL alters
    # them in place, and `batch_alter_table` in a migration runs its ops directly there.
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


run()
