"""Schema migrations with alembic: upgrade to head and report the version."""

import os

from alembic import command as alembic_command
from alembic import config as alembic_config
from alembic import migration as alembic_migration
from alembic import script as alembic_script

from ironic_compute.db import api as db_api

_SCRIPT_LOCATION = os.path.join(os.path.dirname(__file__), 'migrations')


def _config(connection):
    config = alembic_config.Config()
    config.set_main_option('script_location', _SCRIPT_LOCATION)
    config.attributes['connection'] = connection
    return config


def upgrade(revision='head', engine=None):
    """Apply the migrations up to ``revision``."""
    engine = engine or db_api.get_engine()
    with engine.begin() as connection:
        alembic_command.upgrade(_config(connection), revision)


def version(engine=None):
    """The revision the database is at, or None for an empty database."""
    engine = engine or db_api.get_engine()
    with engine.connect() as connection:
        return alembic_migration.MigrationContext.configure(
            connection).get_current_revision()


def head():
    """The newest revision this code knows."""
    script = alembic_script.ScriptDirectory(_SCRIPT_LOCATION)
    return script.get_current_head()


