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

"""Fresh, randomly named databases on SQLite, MariaDB/MySQL and PostgreSQL.

The unit tests get theirs from oslo.db's provisioning (``OsloDatabase``);
the functional tests and tools/ from ``ProvisionedDatabase``, which needs
no project import. The server tests use the ``openstack_citest`` user that
``tools/test-setup.sh`` creates. Off CI a server that cannot be reached
skips its tests with a message saying how to enable them; on CI
(``CI=true``) it fails them, because a skipped backend is an untested one.
"""

import functools
import os
import secrets
import tempfile

import pytest
import sqlalchemy as sa
from oslo_db import exception as db_exc
from oslo_db.sqlalchemy import provision
from sqlalchemy.engine import make_url

from ironic_compute.db import api as db_api

BACKENDS = ('sqlite', 'mysql', 'postgresql')
# The backends that need a running server (the ``db_server`` marker).
SERVER_BACKENDS = ('mysql', 'postgresql')

# Admin URLs of the servers; override to use other servers.
SERVER_URLS = {
    'mysql': os.environ.get(
        'IC_TEST_MYSQL_URL',
        'mysql+pymysql://openstack_citest:openstack_citest@127.0.0.1:3306/'),
    'postgresql': os.environ.get(
        'IC_TEST_POSTGRESQL_URL',
        'postgresql+psycopg2://openstack_citest:openstack_citest@127.0.0.1'
        ':5432/openstack_citest'),
}


def on_ci():
    return os.environ.get('CI', '').lower() in ('1', 'true', 'yes')


def unavailable(what, exc):
    message = (f'{what} is not reachable ({" ".join(str(exc).split())[:200]}); '
               'run tools/test-setup.sh to create the openstack_citest user '
               'on local servers, or set IC_TEST_MYSQL_URL / '
               'IC_TEST_POSTGRESQL_URL')
    if on_ci():
        pytest.fail(f'CI=true and {message}', pytrace=False)
    pytest.skip(message)


class ProvisionedDatabase:
    """A database that exists until ``drop()``; ``url`` reaches it."""

    def __init__(self, backend):
        self.backend = backend
        self.name = 'ictest_' + secrets.token_hex(6)
        self._tmpdir = None
        if backend == 'sqlite':
            self._tmpdir = tempfile.TemporaryDirectory(prefix='ictest-')
            self.url = f'sqlite:///{self._tmpdir.name}/{self.name}.sqlite'
            return
        admin_url = make_url(SERVER_URLS[backend])
        self._admin = sa.create_engine(admin_url,
                                       isolation_level='AUTOCOMMIT',
                                       poolclass=sa.pool.NullPool)
        try:
            with self._admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE {self.name}'))
        except sa.exc.OperationalError as exc:
            self._admin.dispose()
            unavailable(backend, exc)
        self.url = admin_url.set(database=self.name).render_as_string(
            hide_password=False)

    def drop(self):
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            return
        with self._admin.connect() as conn:
            if self.backend == 'postgresql':
                conn.execute(sa.text(
                    'SELECT pg_terminate_backend(pid) FROM pg_stat_activity '
                    'WHERE datname = :name AND pid <> pg_backend_pid()'),
                    {'name': self.name})
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS {self.name}'))
        self._admin.dispose()


@functools.cache
def _provision_on_project_servers():
    """Make oslo.db provision on SERVER_URLS and in SQLite files.

    oslo.db's own defaults (``OS_TEST_DBAPI_ADMIN_CONNECTION`` or
    localhost) would ignore IC_TEST_MYSQL_URL / IC_TEST_POSTGRESQL_URL,
    which the functional tests and tools/ honour; and its SQLite default is
    one in-memory connection, where the threaded tests need a file.
    """
    backends = provision.Backend.backends_by_database_type
    base = os.path.join(tempfile.gettempdir(), f'ictest-{os.getpid()}.sqlite')
    for backend, url in dict(SERVER_URLS, sqlite=f'sqlite:///{base}').items():
        backends[backend] = provision.Backend(backend, make_url(url))


class OsloDatabase:
    """A new database from oslo.db's provisioning, until ``drop()``.

    ``engine`` reaches it; ``use()`` points the project's enginefacade
    (``db_api.context_manager``, not oslo.db's global one) at it.
    """

    def __init__(self, backend):
        _provision_on_project_servers()
        try:
            self._resource = provision.DatabaseResource(
                backend, db_api.context_manager, provision_new_database=True)
        except db_exc.BackendNotAvailable as exc:
            unavailable(backend, exc)
        self._provisioned = self._resource.getResource()
        self.backend = backend
        self.engine = self._provisioned.engine
        # For a test that makes an engine of its own.
        self.url = self.engine.url.render_as_string(hide_password=False)

    def use(self):
        """Patch the project's facade to this database; returns the undo."""
        return db_api.context_manager.patch_factory(
            self._provisioned.enginefacade)

    def drop(self):
        self.engine.dispose()
        self._resource.finishedWith(self._provisioned)


def benchmark_database(choice, say):
    """(ProvisionedDatabase, label) for a benchmark run: PostgreSQL when
    ``choice`` is 'postgresql', or 'auto' and it is reachable; else a SQLite
    file. A PostgreSQL asked for by name but not reachable is a RuntimeError."""
    if choice in ('auto', 'postgresql'):
        try:
            return ProvisionedDatabase('postgresql'), 'PostgreSQL'
        except (pytest.skip.Exception, pytest.fail.Exception) as exc:
            if choice == 'postgresql':
                raise RuntimeError(f'PostgreSQL: {exc}') from None
            say(f'  PostgreSQL not reachable ({str(exc).splitlines()[0][:120]}); '
                'using a SQLite file')
    return ProvisionedDatabase('sqlite'), 'SQLite'
