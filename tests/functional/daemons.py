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

"""The functional tests' side of ``ironic_compute.harness.fleet``.

The daemons, samplers and proxy are the harness's (re-exported here for the
tests); this module adds what is the tests' own: the entry point with test
hooks, a fleet on a fresh database of the tests' (:class:`BackendFleet`) and
the context manager their fixtures start a fleet with.
"""

import contextlib
import sys

import pytest

from ironic_compute.harness.fleet import BIN_DIR  # noqa: F401
from ironic_compute.harness.fleet import Daemon  # noqa: F401
from ironic_compute.harness.fleet import Fleet
from ironic_compute.harness.fleet import HttpProxy  # noqa: F401
from ironic_compute.harness.fleet import InstanceSampler  # noqa: F401
from ironic_compute.harness.fleet import OwnershipSampler  # noqa: F401
from ironic_compute.harness.fleet import TcpProxy  # noqa: F401
from ironic_compute.harness.fleet import config_text  # noqa: F401
from ironic_compute.harness.fleet import manage  # noqa: F401
from ironic_compute.harness.fleet import wait_until  # noqa: F401
from tests import db_fixtures
from tests.functional import ironic_env

# ironic-compute with the test hooks of tests/functional/hooked_compute.py
# (a daemon runs in the checkout, where ``tests`` is importable).
HOOKED_COMPUTE = [sys.executable, '-m', 'tests.functional.hooked_compute']


class BackendFleet(Fleet):
    """A :class:`Fleet` on a fresh database of ``backend`` (skipped or failed
    as the tests' databases are), with a client of the session's Ironic.

    ``sampler``: ``callable(url)`` that makes the sampler of the database
    (None: none). At :meth:`close` the nodes the fleet made (``nodes``) are
    deleted in Ironic and the database is dropped.
    """

    def __init__(self, backend, workdir, ironic, sampler=None, manage_options=None):
        self.backend = backend
        self.ironic = ironic
        self.client = ironic.client()
        self.nodes = []
        self.database = db_fixtures.ProvisionedDatabase(backend)
        super().__init__(workdir, self.database.url,
                         sampler(self.database.url) if sampler else None, manage_options)

    def close(self, *closeables):
        super().close(*closeables)
        ironic_env.delete_nodes(self.client, self.nodes)
        self.database.drop()


@contextlib.contextmanager
def running(group_class, backend, ironic, tmp_path_factory):
    """``group_class(backend, workdir, ironic)``, started for a fixture in a
    work directory of its own.

    The group has ``start``, ``close`` and ``daemons``. At the end it is
    closed and each daemon's last log lines printed, which pytest keeps next
    to the report of a failed test.
    """
    module = group_class.__module__.rsplit('.', 1)[-1]
    workdir = str(tmp_path_factory.mktemp(f'{module}-{backend}'))
    group = group_class(backend, workdir, ironic)
    try:
        group.start()
        yield group
    finally:
        group.close()
        for name, daemon in group.daemons.items():
            print(f'---- {name} log (last 3000 chars) ----\n{daemon.log()[-3000:]}')


def started_on_each_backend(group_class, ironic_fixture='ironic_server'):
    """The class-scoped ``started_cluster`` fixture of a test module: one
    ``group_class`` on MariaDB and one on PostgreSQL, with the Ironic of
    ``ironic_fixture``, started once for the tests of a class.

    conftest's ``cluster`` hands it to each test after its ``ready()``.
    """
    @pytest.fixture(scope='class', params=['mysql', 'postgresql'], name='started_cluster')
    def started_cluster(request, tmp_path_factory):
        ironic = request.getfixturevalue(ironic_fixture)
        with running(group_class, request.param, ironic, tmp_path_factory) as group:
            yield group

    return started_cluster
