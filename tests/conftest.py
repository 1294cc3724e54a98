"""Fixtures shared by the unit and functional tests."""

import pytest

from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from tests import db_fixtures


def _use_database(url):
    """Point the project's enginefacade at ``url``; return (engine, reset)."""
    manager = db_api.context_manager.make_new_manager()
    manager.configure(connection=url, max_retries=0)
    reset = db_api.context_manager.patch_factory(manager)
    return manager.writer.get_engine(), reset


@pytest.fixture(params=db_fixtures.BACKENDS)
def database(request):
    """A fresh empty database on each backend, dropped afterwards."""
    provisioned = db_fixtures.ProvisionedDatabase(request.param)
    yield provisioned
    provisioned.drop()


@pytest.fixture
def engine(database):
    """The facade's engine on a fresh empty database (every backend)."""
    engine, reset = _use_database(database.url)
    yield engine
    reset()
    engine.dispose()


@pytest.fixture
def migrated_engine(engine):
    """As ``engine``, at the newest schema."""
    migration.upgrade('head', engine=engine)
    return engine


@pytest.fixture
def sqlite_engine(tmp_path):
    """A migrated SQLite database for tests that need one backend only."""
    engine, reset = _use_database(f'sqlite:///{tmp_path}/ic.sqlite')
    migration.upgrade('head', engine=engine)
    yield engine
    reset()
    engine.dispose()
