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

"""ironic-compute-manage db and its errors, run in this process.

tests/functional/test_cli_processes.py runs the same commands as real
processes (exit codes, stderr of the real process).
"""

import os
import shutil
import sys

import pytest
from oslo_db import exception as db_exc
from sqlalchemy import exc as sa_exc

from ironic_compute.cmd import manage
from ironic_compute.db import api as db_api
from ironic_compute.db import migration
from tests.unit.cmd import UNWORKABLE_URLS
from tests.unit.cmd import assert_one_line_error


@pytest.fixture
def run(in_process):
    def run(*args, config=None):
        argv = [] if config is None else ['--config-file', str(config)]
        return in_process(manage.main, *argv, *args)
    return run


def write_config(tmp_path, text):
    path = tmp_path / 'ironic-compute.conf'
    # state_path exists: the default SQLite URL passes the directory check.
    path.write_text(f'[DEFAULT]\nstate_path = {tmp_path}\n' + text)
    return path


def _assert_one_line_error(result, *fragments):
    code, _, err = result
    assert_one_line_error('ironic-compute-manage', code, err, *fragments)


def test_console_script_is_installed():
    bindir = os.path.dirname(sys.executable)
    assert shutil.which('ironic-compute-manage', path=bindir)
    assert shutil.which('ironic-compute', path=bindir)


def test_db_sync_and_version_on_every_backend(tmp_path, engine, run):
    # The fixture points the facade at a fresh empty database.
    config = write_config(tmp_path, '')
    code, out, err = run('db', 'version', config=config)
    assert code == 0, err
    assert out.startswith('None')
    code, out, err = run('db', 'sync', config=config)
    assert code == 0, err
    assert out.strip() == f'database schema is at version {migration.head()}'
    code, out, err = run('db', 'version', config=config)
    assert (code, out.strip()) == (0, migration.head())


@pytest.fixture
def unreachable_database():
    manager = db_api.facade().make_new_manager()
    manager.configure(connection='postgresql+psycopg2://u:secretpw@127.0.0.1:1/db',
                      max_retries=0)
    reset = db_api.facade().patch_factory(manager)
    yield
    reset()


def test_unreachable_database(tmp_path, unreachable_database, run):
    result = run('db', 'sync', config=write_config(tmp_path, ''))
    _assert_one_line_error(result, 'cannot connect to the database')
    assert 'secretpw' not in result[1] + result[2]


def test_unreachable_database_with_debug_keeps_the_traceback(
        tmp_path, unreachable_database, run):
    # The error goes up (and Python prints its traceback) instead of one line.
    with pytest.raises((db_exc.DBConnectionError, sa_exc.OperationalError)):
        run('--debug', 'db', 'sync', config=write_config(tmp_path, ''))


def test_config_file_that_does_not_parse(tmp_path, run):
    config = write_config(tmp_path, '[DEFAULT\nhost = x\n')
    _assert_one_line_error(run('db', 'version', config=config),
                           'Failed to parse', str(config))


def test_missing_config_file(tmp_path, run):
    _assert_one_line_error(run('db', 'version', config=tmp_path / 'nope.conf'),
                           'nope.conf')


@pytest.mark.parametrize('text, fragment', [
    ('[DEFAULT]\nreport_interval = often\n', '[DEFAULT]report_interval'),
    ('[ironic]\npartition_key = a b\n', '[ironic]partition_key'),
    ('[DEFAULT]\nreport_interval = 90\n', 'service_down_time'),
])
def test_invalid_values(tmp_path, run, text, fragment):
    _assert_one_line_error(run('db', 'version', config=write_config(tmp_path, text)),
                           fragment)


@pytest.mark.parametrize('url, fragments', UNWORKABLE_URLS)
def test_a_url_that_cannot_work_says_what_to_write(tmp_path, run, url, fragments):
    result = run('db', 'sync', config=write_config(
        tmp_path, f'[database]\nconnection = {url}\n'))
    _assert_one_line_error(result, '[database]connection', *fragments)
    assert 'secretpw' not in result[1] + result[2]


def test_unknown_command_is_a_usage_error(run):
    code, _, err = run('db', 'explode')
    assert code == 2
    assert 'invalid choice' in err
