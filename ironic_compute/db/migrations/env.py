"""alembic environment: runs on the connection given by migration.py."""

from alembic import context

from ironic_compute.db import models

config = context.config
connection = config.attributes['connection']
context.configure(connection=connection, target_metadata=models.Base.metadata,
                  render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
