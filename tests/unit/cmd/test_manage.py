"""ironic-compute-manage as an operator runs it: a real process."""

import os
import shutil
import subprocess
import sys

import pytest

from ironic_compute.db import migration
from tests.unit.cmd import assert_one_line_error


def manage(*args, config=None):
    command = [sys.executable, '-m', 'ironic_compute.cmd.manage']
    if config is not None:
        command += ['--config-file', str(config)]
    return subprocess.run(command + list(args), capture_output=True,
                          text=True, timeout=60)


def write_config(tmp_path, text):
    path = tmp_path / 'ironic-compute.conf'
    path.write_text(text)
    return path


def test_console_script_is_installed():
    bindir = os.path.dirname(sys.executable)
    assert shutil.which('ironic-compute-manage', path=bindir)
    assert shutil.which('ironic-compute', path=bindir)


def test_db_sync_and_version_on_every_backend(tmp_path, database):
    config = write_config(tmp_path,
                          f'[database]\nconnection = {database.url}\n')
    before = manage('db', 'version', config=config)
    assert before.returncode == 0, before.stderr
    assert before.stdout.startswith('None')
    sync = manage('db', 'sync', config=config)
    assert sync.returncode == 0, sync.stderr
    after = manage('db', 'version', config=config)
    assert after.stdout.strip() == migration.head()


def test_db_sync_creates_the_default_sqlite_file(tmp_path):
    state = tmp_path / 'state'
    config = write_config(tmp_path, f'[DEFAULT]\nstate_path = {state}\n')
    result = manage('db', 'sync', config=config)
    assert result.returncode == 0, result.stderr
    assert (state / 'ironic_compute.sqlite').exists()


def _assert_one_line_error(result, *fragments):
    assert_one_line_error('ironic-compute-manage', result.returncode, result.stderr,
                          *fragments)


@pytest.mark.parametrize('url, fragment', [
    ('mysql+pymysql://u:secretpw@127.0.0.1:1/db', 'cannot connect'),
    ('postgresql+psycopg2://u:secretpw@127.0.0.1:1/db', 'cannot connect'),
])
def test_unreachable_database(tmp_path, url, fragment):
    config = write_config(tmp_path, f'[database]\nconnection = {url}\n')
    result = manage('db', 'sync', config=config)
    _assert_one_line_error(result, fragment)
    assert 'secretpw' not in result.stderr + result.stdout


def test_unreachable_database_with_debug_shows_traceback(tmp_path):
    config = write_config(
        tmp_path, '[database]\nconnection = '
        'postgresql+psycopg2://u:p@127.0.0.1:1/db\n')
    result = manage('--debug', 'db', 'sync', config=config)
    assert result.returncode != 0
    assert 'Traceback' in result.stdout + result.stderr


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
    assert result.returncode == 2
    assert 'invalid choice' in result.stderr
