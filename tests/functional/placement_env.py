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

"""The session's real, standalone Placement (``harness.placement``), for the
functional tests: installed into ``.placement/venv`` on first use, on a
MariaDB database of its own, stopped and dropped at the end. With CI=true a
Placement that cannot be installed or started fails the tests; otherwise
they skip with the reason.

Not a conftest: a test module imports ``placement_server``.
"""

import threading

import pytest

from ironic_compute.harness import databases
from ironic_compute.harness import placement as standalone
from ironic_compute.harness.databases import on_ci


class _Session:
    lock = threading.Lock()
    server = None
    database = None
    error = None
    users = 0


def _give_up(message):
    if on_ci():
        pytest.fail(f'standalone Placement unavailable on CI: {message}', pytrace=False)
    pytest.skip(f'standalone Placement unavailable: {message.splitlines()[0]}')


def _start(tmp_path_factory):
    with _Session.lock:
        _Session.users += 1
        if _Session.server is not None:
            return _Session.server
        if _Session.error is not None:
            _give_up(_Session.error)
        try:
            _Session.database = databases.ProvisionedDatabase('mysql')
            server = standalone.PlacementServer(
                tmp_path_factory.mktemp('placement'), _Session.database.url)
            server.start()
        except Exception as exc:  # noqa: BLE001 - reported through fail/skip
            _Session.error = f'{type(exc).__name__}: {exc}'
            _release_locked()
            _give_up(_Session.error)
        _Session.server = server
        return server


def _release_locked():
    _Session.users = max(0, _Session.users - 1)
    if _Session.users:
        return
    if _Session.server is not None:
        _Session.server.stop()
        _Session.server = None
    if _Session.database is not None:
        _Session.database.drop()
        _Session.database = None


@pytest.fixture(scope='session')
def placement_server(tmp_path_factory):
    """A started harness.placement.PlacementServer; ``.database`` is its
    database (for reads of its own tables)."""
    server = _start(tmp_path_factory)
    server.database = _Session.database
    try:
        yield server
    finally:
        with _Session.lock:
            _release_locked()
