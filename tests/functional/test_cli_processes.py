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

"""The commands as operators run them: real processes, exit codes, stderr.

Each process start costs about two seconds (mostly imports), so these live
in the functional suite; tests/unit/cmd runs the same commands in-process.
"""

import json
import os
import subprocess
import sys

import pytest

from ironic_compute.db import migration
from tests.unit.cmd import assert_one_line_error
from tests.unit.cmd import test_status as status_scenarios
from tests.unit.cmd.test_manage_admin import BASE_CONF
from tests.unit.cmd.test_manage_admin import Result
from tests.unit.cmd.test_manage_admin import by_host
from tests.unit.cmd.test_manage_admin import instance
from tests.unit.cmd.test_manage_admin import instance_host
from tests.unit.cmd.test_manage_admin import instance_uuid
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service as admin_service
from tests.unit.cmd.test_status import url_of

pytestmark = pytest.mark.functional


def run(module, *args, config=None, env=None):
    command = [sys.executable, '-m', f'ironic_compute.cmd.{module}']
    if config is not None:
        command += ['--config-file', str(config)]
    done = subprocess.run(command + list(args), capture_output=True,
                          text=True, timeout=60,
                          env=None if env is None else dict(os.environ, **env))
    return Result(done.returncode, done.stdout, done.stderr)


def write_config(tmp_path, text, name='ironic-compute.conf'):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- loading ----------------------------------------------------------------

def test_commands_do_not_load_ironicclient():
    # ironicclient loads openstacksdk (about a second): the commands pay for
    # it only when they build an Ironic client.
    code = ('import sys; import ironic_compute.cmd.manage; '
            'import ironic_compute.cmd.status; '
            'sys.exit(", ".join(sorted(m for m in sys.modules '
            'if m.split(".")[0] in ("ironicclient", "openstack"))[:3]) or 0)')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- ironic-compute-manage ----------------------------------------------------

def manage(*args, config=None):
    return run('manage', *args, config=config)


def _assert_one_line_error(result, *fragments):
    assert_one_line_error('ironic-compute-manage', result.code, result.err,
                          *fragments)


def test_db_sync_and_version_on_every_backend(tmp_path, database):
    config = write_config(tmp_path,
                          f'[database]\nconnection = {database.url}\n')
    before = manage('db', 'version', config=config)
    assert before.code == 0, before.err
    assert before.out.startswith('None')
    sync = manage('db', 'sync', config=config)
    assert sync.code == 0, sync.err
    after = manage('db', 'version', config=config)
    assert after.out.strip() == migration.head()


def test_db_sync_creates_the_default_sqlite_file(tmp_path):
    state = tmp_path / 'state'
    config = write_config(tmp_path, f'[DEFAULT]\nstate_path = {state}\n')
    result = manage('db', 'sync', config=config)
    assert result.code == 0, result.err
    assert (state / 'ironic_compute.sqlite').exists()


@pytest.mark.parametrize('url, fragment', [
    ('mysql+pymysql://u:secretpw@127.0.0.1:1/db', 'cannot connect'),
    ('postgresql+psycopg2://u:secretpw@127.0.0.1:1/db', 'cannot connect'),
])
def test_unreachable_database(tmp_path, url, fragment):
    config = write_config(tmp_path, f'[database]\nconnection = {url}\n')
    result = manage('db', 'sync', config=config)
    _assert_one_line_error(result, fragment)
    assert 'secretpw' not in result.err + result.out


def test_unreachable_database_with_debug_shows_traceback(tmp_path):
    config = write_config(
        tmp_path, '[database]\nconnection = '
        'postgresql+psycopg2://u:p@127.0.0.1:1/db\n')
    result = manage('--debug', 'db', 'sync', config=config)
    assert result.code != 0
    assert 'Traceback' in result.out + result.err


def test_config_file_that_does_not_parse(tmp_path):
    config = write_config(tmp_path, '[DEFAULT\nhost = x\n')
    _assert_one_line_error(manage('db', 'version', config=config),
                           'Failed to parse', str(config))


def test_missing_config_file(tmp_path):
    _assert_one_line_error(
        manage('db', 'version', config=tmp_path / 'nope.conf'),
        'nope.conf')


def test_bad_typed_value(tmp_path):
    config = write_config(tmp_path, '[DEFAULT]\nreport_interval = often\n')
    _assert_one_line_error(manage('db', 'version', config=config),
                           '[DEFAULT]report_interval', str(config))


def test_invalid_partition_key(tmp_path):
    config = write_config(tmp_path, '[ironic]\npartition_key = a b\n')
    _assert_one_line_error(manage('db', 'version', config=config),
                           '[ironic]partition_key')


def test_down_time_not_above_report_interval(tmp_path):
    config = write_config(tmp_path, '[DEFAULT]\nreport_interval = 90\n')
    _assert_one_line_error(manage('db', 'version', config=config),
                           'service_down_time')


def test_unknown_command_is_a_usage_error():
    result = manage('db', 'explode')
    assert result.code == 2
    assert 'invalid choice' in result.err


def test_admin_commands_on_every_backend(tmp_path, migrated_engine):
    url = migrated_engine.url.render_as_string(hide_password=False)
    config = write_config(tmp_path,
                          BASE_CONF + f'[database]\nconnection = {url}\n')
    admin_service('cmp-1', node_uuid(1))
    admin_service('cmp-2', node_uuid(2), age=600)
    instance(instance_uuid(2), 'cmp-2', node_uuid(2))

    manage('node', 'move', node_uuid(2), '--to', 'cmp-1', config=config).ok()
    listing = by_host(manage('service', 'list', '--format', 'json',
                             config=config).json())
    assert (listing['cmp-1']['state'], listing['cmp-1']['nodes']) == ('up', 2)
    assert (listing['cmp-2']['state'], listing['cmp-2']['nodes']) == (
        'down', 0)
    assert instance_host(instance_uuid(2)) == 'cmp-1'
    if migrated_engine.dialect.name == 'sqlite':
        manage('node', 'move', node_uuid(2), '--to', 'cmp-2',
               config=config).one_line_error('is down')


# --- ironic-compute ----------------------------------------------------------

def compute(tmp_path, text):
    # state_path exists, so the default SQLite URL passes its own check.
    config = write_config(tmp_path, f'[DEFAULT]\nstate_path = {tmp_path}\n'
                          + text)
    return run('compute', config=config)


def one_line_error(result, fragment):
    assert_one_line_error('ironic-compute', result.code, result.err, fragment)


@pytest.mark.parametrize('text, fragment', [
    ('[DEFAULT]\nhost = c1\n', '[ironic]auth_type is not set'),
    ('[DEFAULT]\nhost = c1\n[ironic]\nauth_type = none\npartition_key = g\n'
     'peer_list = c2,c3\n', "does not contain this host 'c1'"),
    ('[DEFAULT]\nreport_interval = 60\n[ironic]\nauth_type = none\n',
     'service_down_time'),
])
def test_compute_refuses_to_start(tmp_path, text, fragment):
    one_line_error(compute(tmp_path, text), fragment)


def test_compute_schema_not_synced(tmp_path):
    text = (f'[DEFAULT]\nstate_path = {tmp_path}\n'
            '[ironic]\nauth_type = none\nendpoint_override = http://127.0.0.1:1\n')
    (tmp_path / 'ironic_compute.sqlite').touch()
    one_line_error(compute(tmp_path, text), 'ironic-compute-manage db sync')


def test_compute_parse_error_does_not_show_the_line(tmp_path):
    result = compute(tmp_path, '[ironic]\npassword s3cr3t-value\n')
    one_line_error(result, 'Failed to parse')
    assert 's3cr3t' not in result.err + result.out


# --- ironic-compute-status upgrade check -------------------------------------

def status_command(tmp_path, url):
    """The ``checks`` of the scenarios of tests/unit/cmd/test_status.py, by
    ``ironic-compute-status upgrade check --json`` run as a process."""
    config = write_config(tmp_path, f'[database]\nconnection = {url}\n'
                          '[DEFAULT]\nservice_down_time = 60\n',
                          name='status.conf')

    def checks():
        done = run('status', 'upgrade', 'check', '--json', config=config,
                   env={'XDG_CACHE_HOME': str(tmp_path)})
        results = json.loads(done.out)['checks']
        return done.code, {r['check']: (r['result'], r['details'])
                           for r in results}
    return checks


def test_status_at_head_with_agreeing_services(migrated_engine, tmp_path):
    # A URL without a driver (what most people write) works here too.
    url = url_of(migrated_engine).replace('+psycopg2', '').replace(
        '+pymysql', '')
    status_scenarios.agreeing_services_at_head(status_command(tmp_path, url))


def test_status_disagreeing_services_and_a_dead_one(migrated_engine, tmp_path):
    status_scenarios.disagreeing_services_and_a_dead_one(
        migrated_engine, status_command(tmp_path, url_of(migrated_engine)))


def test_status_stopped_and_disabled_services_apart(migrated_engine, tmp_path):
    status_scenarios.stopped_and_disabled_services_apart(
        migrated_engine, status_command(tmp_path, url_of(migrated_engine)))


def test_status_a_schema_behind_this_release(engine, tmp_path):
    status_scenarios.a_schema_behind_this_release(
        engine, status_command(tmp_path, url_of(engine)))


def test_status_an_empty_database(engine, tmp_path):
    status_scenarios.an_empty_database(status_command(tmp_path, url_of(engine)))
