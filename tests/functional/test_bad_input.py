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

"""What a new user types, run as real commands: each mistake is one line.

Real processes (exit code, stderr, the daemon's start-up): functional, as
each start costs about two seconds; tests/unit/cmd checks the same messages
in-process.
"""

import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ironic_compute.db import migration
from tests import db_fixtures
from tests.unit.cmd import UNWORKABLE_URLS
from tests.unit.cmd import assert_one_line_error
from tests.unit.db.releases import newer_release

pytestmark = pytest.mark.functional

COMMANDS = {'ironic-compute-manage': 'ironic_compute.cmd.manage',
            'ironic-compute': 'ironic_compute.cmd.compute',
            'ironic-compute-status': 'ironic_compute.cmd.status'}
# Enough for the daemon to pass its own checks and reach the database.
DAEMON = ('[DEFAULT]\nhost = c1\n[ironic]\nauth_type = none\n'
          'endpoint_override = http://127.0.0.1:1\napi_max_retries = 0\n')


def run(prog, *args, config=None, home=None, env=None):
    command = [sys.executable, '-m', COMMANDS[prog]]
    if config is not None:
        command += ['--config-file', str(config)]
    environ = {k: v for k, v in os.environ.items() if not k.startswith('OS_')}
    if home is not None:
        environ['HOME'] = str(home)
    environ.update(env or {})
    return subprocess.run(command + list(args), capture_output=True, text=True,
                          timeout=60, env=environ, cwd=home)


def manage(*args, **kwargs):
    return run('ironic-compute-manage', *args, **kwargs)


def write_config(tmp_path, text, name='ironic-compute.conf'):
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line(result, *fragments, prog='ironic-compute-manage'):
    assert_one_line_error(prog, result.returncode, result.stderr, *fragments)


def bare(url):
    """``url`` as most people write it: without the driver."""
    parsed = make_url(url)
    return parsed.set(drivername=parsed.get_backend_name()).render_as_string(
        hide_password=False)


@pytest.fixture
def no_system_config():
    searched = ('/etc/ironic-compute/ironic-compute.conf',
                '/etc/ironic-compute.conf', '/etc/ironic-compute-manage.conf',
                '/etc/ironic-compute/ironic-compute-manage.conf')
    found = [path for path in searched if os.path.exists(path)]
    if found:
        pytest.skip(f'this host has a configuration file: {found}')


@pytest.mark.parametrize('backend', ['mysql', 'postgresql'])
def test_bare_server_urls_use_the_installed_drivers(tmp_path, backend):
    database = db_fixtures.ProvisionedDatabase(backend)
    try:
        url = bare(database.url)
        assert '+' not in url.split('://')[0]
        config = write_config(tmp_path, f'[database]\nconnection = {url}\n')
        daemon = write_config(tmp_path, DAEMON + f'[database]\nconnection = {url}\n',
                              name='daemon.conf')
        # The daemon reaches the database through the same URL: it finds it
        # empty (not "No module named 'psycopg'" or 'MySQLdb').
        one_line(run('ironic-compute', config=daemon), 'has no schema',
                 prog='ironic-compute')
        sync = manage('db', 'sync', config=config)
        assert sync.returncode == 0, sync.stderr
        version = manage('db', 'version', config=config)
        assert version.stdout.strip() == migration.head(), version.stderr
    finally:
        database.drop()


@pytest.mark.parametrize('url, fragments', UNWORKABLE_URLS)
def test_a_url_that_cannot_work_says_what_to_write(tmp_path, url, fragments):
    section = f'[database]\nconnection = {url}\n'
    manage_result = manage('db', 'sync', config=write_config(tmp_path, section))
    daemon_result = run('ironic-compute', config=write_config(
        tmp_path, DAEMON + section, name='daemon.conf'))
    for prog, result in (('ironic-compute-manage', manage_result),
                         ('ironic-compute', daemon_result)):
        one_line(result, '[database]connection', *fragments, prog=prog)
        assert 'secretpw' not in result.stderr + result.stdout


@pytest.mark.parametrize('prog, names', [
    ('ironic-compute-manage', 'ironic-compute.conf and '
                              'ironic-compute-manage.conf'),
    ('ironic-compute', 'ironic-compute.conf in'),
])
def test_no_config_file_found_says_where_it_looked(tmp_path, no_system_config,
                                                   prog, names):
    args = ('db', 'sync') if prog == 'ironic-compute-manage' else ()
    result = run(prog, *args, home=tmp_path)
    one_line(result, 'no configuration file found', names,
             f'{tmp_path}/.ironic-compute, {tmp_path}, /etc/ironic-compute, '
             '/etc', '--config-file', prog=prog)
    assert not (tmp_path / 'ironic_compute.sqlite').exists()


def test_config_found_in_home_or_environment_is_used(tmp_path,
                                                     no_system_config):
    (tmp_path / '.ironic-compute').mkdir()
    write_config(tmp_path / '.ironic-compute',
                 f'[database]\nconnection = sqlite:///{tmp_path}/home.sqlite\n')
    assert manage('db', 'sync', home=tmp_path).returncode == 0
    assert (tmp_path / 'home.sqlite').exists()
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    result = manage('db', 'sync', home=elsewhere, env={
        'OS_DATABASE__CONNECTION': f'sqlite:///{tmp_path}/env.sqlite'})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / 'env.sqlite').exists()


@pytest.mark.parametrize('args', [
    ('node', 'show', 'not-a-uuid'),
    ('node', 'show', '1234'),
    ('node', 'move', 'not-a-uuid', '--to', 'c1'),
])
def test_a_malformed_uuid_is_not_a_uuid(tmp_path, args):
    config = write_config(
        tmp_path, f'[database]\nconnection = sqlite:///{tmp_path}/ic.sqlite\n')
    assert manage('db', 'sync', config=config).returncode == 0
    one_line(manage(*args, config=config), f"node '{args[2]}' is not a UUID")


SECRET = 's3cr3t-value'


@pytest.mark.parametrize('prog, args, exit_code', [
    ('ironic-compute', (), 1),
    ('ironic-compute-manage', ('db', 'version'), 1),
    # oslo.upgradecheck's code for "the command itself failed".
    ('ironic-compute-status', ('upgrade', 'check'), 255),
])
@pytest.mark.parametrize('text', [
    f'[ironic]\npassword {SECRET}\n',
    f'[database]\n  connection = mysql+pymysql://u:{SECRET}@db.example/ic\n',
])
def test_a_file_that_does_not_parse_is_one_redacted_line(tmp_path, prog,
                                                         args, exit_code,
                                                         text):
    config = write_config(tmp_path, text)
    result = run(prog, *args, config=config)
    assert_one_line_error(prog, result.returncode, result.stderr,
                          f'Failed to parse {config}', '<line not shown>',
                          exit_code=exit_code)
    assert SECRET not in result.stdout + result.stderr


def test_status_refuses_a_configuration_as_the_others_do(tmp_path):
    # Checked before any check runs: one line, not a traceback per check.
    config = write_config(tmp_path, f'[DEFAULT]\nstate_path = {tmp_path}\n'
                          '[database]\nconnection = postgres://u:'
                          f'{SECRET}@db.example/ic\n')
    result = run('ironic-compute-status', 'upgrade', 'check', config=config)
    assert_one_line_error('ironic-compute-status', result.returncode,
                          result.stderr, "unknown database type 'postgres'",
                          exit_code=255)
    assert SECRET not in result.stdout + result.stderr


def test_sqlite_in_a_missing_directory_is_refused(tmp_path):
    missing = tmp_path / 'no' / 'such'
    text = f'[database]\nconnection = sqlite:///{missing}/ic.sqlite\n'
    config = write_config(tmp_path, text)
    for args in (('db', 'sync'), ('db', 'version')):
        one_line(manage(*args, config=config),
                 f'the directory {missing} of the SQLite database does not '
                 'exist: create it or correct the path')
    daemon = write_config(tmp_path, DAEMON + text, name='daemon.conf')
    one_line(run('ironic-compute', config=daemon), f'the directory {missing}',
             prog='ironic-compute')
    assert not (tmp_path / 'no').exists()


def test_only_db_sync_creates_the_default_state_path(tmp_path):
    state = tmp_path / 'state'
    config = write_config(tmp_path, f'[DEFAULT]\nstate_path = {state}\n')
    one_line(manage('db', 'version', config=config),
             f'the directory {state} of the SQLite database does not exist',
             '"ironic-compute-manage db sync" creates it')
    assert not state.exists()
    assert manage('db', 'sync', config=config).returncode == 0
    assert (state / 'ironic_compute.sqlite').exists()


def test_db_sync_makes_the_state_and_the_database_private(tmp_path):
    state = tmp_path / 'state'
    config = write_config(tmp_path, f'[DEFAULT]\nstate_path = {state}\n')
    previous = os.umask(0o022)  # the usual one: 0755 and 0644 otherwise
    try:
        assert manage('db', 'sync', config=config).returncode == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    database = state / 'ironic_compute.sqlite'
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    assert manage('db', 'version', config=config).returncode == 0


def test_db_sync_after_a_newer_release(tmp_path):
    url = f'sqlite:///{tmp_path}/ic.sqlite'
    config = write_config(tmp_path, f'[database]\nconnection = {url}\n')
    engine = sa.create_engine(url)
    newer = newer_release(tmp_path)
    try:
        migration.upgrade('0901', engine=engine, script_location=newer)
        result = manage('db', 'sync', config=config)
        assert result.returncode == 0, result.stderr
        assert 'at version 0901, newer than this release' in result.stdout
        assert 'nothing to do' in result.stdout
        migration.upgrade('0902', engine=engine, script_location=newer)
        one_line(manage('db', 'sync', config=config),
                 'migration 0902 is not expand-only')
        assert migration.version(engine) == '0902'
    finally:
        engine.dispose()


def _wait_for_line(process, fragment, timeout=30):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen.append(line)
        if fragment in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f'no line with {fragment!r}: {"".join(seen)[-2000:]}')


def test_the_daemon_starts_on_a_newer_expand_only_schema(tmp_path):
    url = f'sqlite:///{tmp_path}/ic.sqlite'
    config = write_config(tmp_path, DAEMON + f'[database]\nconnection = {url}\n')
    logging_config = write_config(
        tmp_path, config.read_text().replace('[DEFAULT]\n', '[DEFAULT]\n'
                                             'use_stderr = true\n'),
        name='logging.conf')
    engine = sa.create_engine(url)
    newer = newer_release(tmp_path)
    migration.upgrade('0901', engine=engine, script_location=newer)
    process = subprocess.Popen(
        [sys.executable, '-m', COMMANDS['ironic-compute'], '--config-file',
         str(logging_config)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True, env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))
    try:
        _wait_for_line(process, 'at version 0901, newer than this release')
        _wait_for_line(process, 'Service c1 registered')
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    # A contract migration later: the same daemon refuses to start.
    migration.upgrade('0902', engine=engine, script_location=newer)
    engine.dispose()
    one_line(run('ironic-compute', config=config),
             'migration 0902 is not expand-only', prog='ironic-compute')
