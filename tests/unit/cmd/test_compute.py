"""ironic-compute's start-up checks, as a real process."""

import subprocess
import sys

import pytest

from tests.unit.cmd import assert_one_line_error


def compute(tmp_path, text):
    path = tmp_path / 'ironic-compute.conf'
    # state_path exists, so the default SQLite URL passes its own check.
    path.write_text(f'[DEFAULT]\nstate_path = {tmp_path}\n' + text)
    return subprocess.run(
        [sys.executable, '-m', 'ironic_compute.cmd.compute', '--config-file', str(path)],
        capture_output=True, text=True, timeout=60)


def one_line_error(result, fragment):
    assert_one_line_error('ironic-compute', result.returncode, result.stderr, fragment)


@pytest.mark.parametrize('text, fragment', [
    ('[DEFAULT]\nhost = c1\n', '[ironic]auth_type is not set'),
    ('[DEFAULT]\nhost = c1\n[ironic]\nauth_type = none\npartition_key = g\n'
     'peer_list = c2,c3\n', "does not contain this host 'c1'"),
    ('[DEFAULT]\nreport_interval = 60\n[ironic]\nauth_type = none\n', 'service_down_time'),
])
def test_refuses_to_start(tmp_path, text, fragment):
    one_line_error(compute(tmp_path, text), fragment)


def test_schema_not_synced(tmp_path):
    text = (f'[DEFAULT]\nstate_path = {tmp_path}\n'
            '[ironic]\nauth_type = none\nendpoint_override = http://127.0.0.1:1\n')
    (tmp_path / 'ironic_compute.sqlite').touch()
    one_line_error(compute(tmp_path, text), 'ironic-compute-manage db sync')


def test_parse_error_does_not_show_the_line(tmp_path):
    result = compute(tmp_path, '[ironic]\npassword s3cr3t-value\n')
    one_line_error(result, 'Failed to parse')
    assert 's3cr3t' not in result.stderr + result.stdout
