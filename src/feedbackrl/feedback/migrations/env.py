"""Alembic environment: run by `store.upgrade`, which passes an open connection in `attributes`.

From a shell (developers adding a revision): `alembic -x db=URL revision -m "..."` with an
alembic.ini whose script_location points here; `-x db=` names the database to compare against.
"""

from alembic import context
from sqlalchemy import create_engine

from feedbackrl.feedback.store import Base, make_engine

config = context.config


def run(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    db = context.get_x_argument(as_dictionary=True).get("db") or config.get_main_option("sqlalchemy.url")
    engine = make_engine(db) if db else create_engine("sqlite://")
    with engine.begin() as conn:
        run(conn)
