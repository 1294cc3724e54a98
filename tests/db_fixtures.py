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

"""The tests' databases: pytest's side of ``ironic_compute.harness.databases``.

The unit tests get theirs from oslo.db's provisioning (``OsloDatabase``);
the functional tests from ``ProvisionedDatabase``. Off CI a server that
cannot be reached skips its tests with a message saying how to enable
them; on CI (``CI=true``) it fails them, because a skipped backend is an
untested one.
"""

import functools
import os
import tempfile

import pytest
from oslo_db import exception as db_exc
from oslo_db.sqlalchemy import provision
from sqlalchemy.engine import make_url

from ironic_compute.db import api as db_api
from ironic_compute.harness import databases
from ironic_compute.harness.databases import BACKENDS  # noqa: F401
from ironic_compute.harness.databases import SERVER_BACKENDS  # noqa: F401
from ironic_compute.harness.databases import SERVER_URLS
from ironic_compute.harness.databases import on_ci


def unavailable(message):
    """Skip (off CI) or fail (on CI) with ``message``."""
    if on_ci():
        pytest.fail(f'CI=true and {message}', pytrace=False)
    pytest.skip(message)


class ProvisionedDatabase(databases.ProvisionedDatabase):
    """A database that exists until ``drop()``; skips or fails the test when
    its server cannot be reached."""

    def __init__(self, backend):
        try:
            super().__init__(backend)
        except databases.DatabaseUnavailable as exc:
            unavailable(str(exc))


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
                backend, db_api.facade(), provision_new_database=True)
        except db_exc.BackendNotAvailable as exc:
            unavailable(databases.unavailable_message(backend, exc))
        self._provisioned = self._resource.getResource()
        self.backend = backend
        self.engine = self._provisioned.engine
        # For a test that makes an engine of its own.
        self.url = self.engine.url.render_as_string(hide_password=False)

    def use(self):
        """Patch the project's facade to this database; returns the undo."""
        return db_api.facade().patch_factory(
            self._provisioned.enginefacade)

    def drop(self):
        self.engine.dispose()
        self._resource.finishedWith(self._provisioned)

