# Licensed under the Apache License, Version 2.0 (the "License"); you may
# not use this file except in compliance with the License. You may obtain
# a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
# License for the specific language governing permissions and limitations
# under the License.

"""Fixtures shared by the unit and functional tests."""

import collections
import re

import pytest
from oslo_service import backend

from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from ironic_compute.db import models
from tests import db_fixtures

# As cmd/compute.py does, before any test module loads oslo.service.
backend.init_backend(backend.BackendType.THREADING)

_BACKENDS = '|'.join(db_fixtures.BACKENDS)
_BACKEND_ID = re.compile(rf'\[(?:.*-)?({_BACKENDS})(?:-.*)?\]$')
_backend_outcomes = collections.defaultdict(collections.Counter)


def pytest_runtest_logreport(report):
    # The outcome of each test on a database server, by backend: the summary
    # shows that every backend really ran (a skipped one would show here).
    match = _BACKEND_ID.search(report.nodeid)
    if match and (report.when == 'call' or report.outcome != 'passed'):
        _backend_outcomes[match.group(1)][report.outcome] += 1


def pytest_terminal_summary(terminalreporter):
    if _backend_outcomes:
        terminalreporter.write_line('database backends: ' + '; '.join(
            f'{backend} ' + ', '.join(f'{n} {outcome}' for outcome, n
                                      in sorted(_backend_outcomes[backend].items()))
            for backend in db_fixtures.BACKENDS if backend in _backend_outcomes))


def _use_database(url):
    """Point the project's enginefacade at ``url``; return (engine, reset)."""
    manager = db_api.facade().make_new_manager()
    manager.configure(connection=url, max_retries=0)
    reset = db_api.facade().patch_factory(manager)
    return manager.writer.get_engine(), reset


def _empty(engine):
    with engine.begin() as conn:
        for table in reversed(models.metadata.sorted_tables):
            conn.execute(table.delete())


# The fixtures whose parameter is a database backend; a test given one of
# the servers by them (as a fixture parameter or an indirect parametrize)
# is marked db_server.
_BACKEND_FIXTURES = ('database', 'migrated_engine')


def pytest_collection_modifyitems(items):
    for item in items:
        params = getattr(item, 'callspec', None)
        params = params.params if params else {}
        if any(params.get(name) in db_fixtures.SERVER_BACKENDS
               for name in _BACKEND_FIXTURES):
            item.add_marker(pytest.mark.db_server)


@pytest.fixture(params=db_fixtures.BACKENDS)
def database(request):
    """A fresh empty database on each backend (oslo.db's provisioning),
    dropped afterwards; the facade is not pointed at it."""
    provisioned = db_fixtures.OsloDatabase(request.param)
    yield provisioned
    provisioned.drop()


@pytest.fixture
def engine(database):
    """The facade's engine on a fresh empty database (every backend)."""
    reset = database.use()
    yield database.engine
    reset()


@pytest.fixture(scope='session')
def _migrated_databases():
    """One database at the newest schema per backend, made when first used.

    Migrating a fresh database for every test costs half a second on a
    server; the migrations have their own tests on fresh databases.
    """
    made = {}
    yield made
    for provisioned in made.values():
        provisioned.drop()


@pytest.fixture(params=db_fixtures.BACKENDS)
def migrated_engine(request, _migrated_databases):
    """The facade's engine on an empty database at the newest schema."""
    backend = request.param
    provisioned = _migrated_databases.get(backend)
    if provisioned is None:
        provisioned = db_fixtures.OsloDatabase(backend)
        migration.upgrade('head', engine=provisioned.engine)
        _migrated_databases[backend] = provisioned
    reset = provisioned.use()
    yield provisioned.engine
    reset()
    _empty(provisioned.engine)
    # A connection a test left broken or busy must not serve the next one.
    provisioned.engine.dispose()


@pytest.fixture
def sqlite_engine(tmp_path):
    """A migrated SQLite database for tests that need one backend only."""
    engine, reset = _use_database(f'sqlite:///{tmp_path}/ic.sqlite')
    migration.upgrade('head', engine=engine)
    yield engine
    reset()
    engine.dispose()
