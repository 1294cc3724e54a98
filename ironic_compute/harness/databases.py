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

The server databases use the ``openstack_citest`` user that
``tools/test-setup.sh`` creates on the local servers, or the servers that
``IC_TEST_MYSQL_URL`` / ``IC_TEST_POSTGRESQL_URL`` name. A server that
cannot be reached raises :class:`DatabaseUnavailable`, whose message says how
to enable it; the caller decides what that means (the tests skip off CI and
fail on CI, see :func:`on_ci`; the benchmarks report it).
"""

import os
import secrets
import tempfile

import sqlalchemy as sa
from sqlalchemy.engine import make_url

BACKENDS = ('sqlite', 'mysql', 'postgresql')
# The backends that need a running server (the tests' ``db_server`` marker).
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
    """``CI`` is set true: an unreachable database or Ironic is a failure,
    not a reason to skip (a skipped backend is an untested one)."""
    return os.environ.get('CI', '').strip().lower() in ('1', 'true', 'yes', 'on')


class DatabaseUnavailable(Exception):
    """A database server cannot be reached; the message says how to fix it."""


def unavailable_message(what, exc):
    return (f'{what} is not reachable ({" ".join(str(exc).split())[:200]}); '
            'run tools/test-setup.sh to create the openstack_citest user '
            'on local servers, or set IC_TEST_MYSQL_URL / '
            'IC_TEST_POSTGRESQL_URL')


class ProvisionedDatabase:
    """A database that exists until ``drop()``; ``url`` reaches it.

    Raises :class:`DatabaseUnavailable` when the backend's server does not
    answer.
    """

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
            raise DatabaseUnavailable(unavailable_message(backend, exc)) from None
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


def benchmark_database(choice, say):
    """(ProvisionedDatabase, label) for a benchmark run: PostgreSQL when
    ``choice`` is 'postgresql', or 'auto' and it is reachable; else a SQLite
    file. A PostgreSQL asked for by name but not reachable is a RuntimeError."""
    if choice in ('auto', 'postgresql'):
        try:
            return ProvisionedDatabase('postgresql'), 'PostgreSQL'
        except DatabaseUnavailable as exc:
            if choice == 'postgresql':
                raise RuntimeError(f'PostgreSQL: {exc}') from None
            say(f'  PostgreSQL not reachable ({str(exc).splitlines()[0][:120]}); '
                'using a SQLite file')
    return ProvisionedDatabase('sqlite'), 'SQLite'
