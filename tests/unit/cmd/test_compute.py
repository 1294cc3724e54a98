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

"""ironic-compute's start-up checks, run in this process.

tests/functional/test_cli_processes.py runs them as real processes, with
the check of the schema that needs the service itself.
"""

import pytest

from ironic_compute.cmd import compute
from tests.unit.cmd import assert_one_line_error


@pytest.fixture
def start(tmp_path, in_process):
    def start(text):
        path = tmp_path / 'ironic-compute.conf'
        # state_path exists, so the default SQLite URL passes its own check.
        path.write_text(f'[DEFAULT]\nstate_path = {tmp_path}\n' + text)
        return in_process(compute.main, '--config-file', str(path))
    return start


def one_line_error(result, *fragments):
    code, _, err = result
    assert_one_line_error('ironic-compute', code, err, *fragments)


@pytest.mark.parametrize('text, fragment', [
    ('[DEFAULT]\nhost = c1\n', '[ironic]auth_type is not set'),
    ('[DEFAULT]\nhost = c1\n[ironic]\nauth_type = none\npartition_key = g\n'
     'peer_list = c2,c3\n', "does not contain this host 'c1'"),
    ('[DEFAULT]\nreport_interval = 60\n[ironic]\nauth_type = none\n', 'service_down_time'),
])
def test_refuses_to_start(start, text, fragment):
    one_line_error(start(text), fragment)


def test_parse_error_does_not_show_the_line(start):
    result = start('[ironic]\npassword s3cr3t-value\n')
    one_line_error(result, 'Failed to parse')
    assert 's3cr3t' not in result[1] + result[2]


def test_a_url_that_cannot_work_says_what_to_write(start):
    result = start('[DEFAULT]\nhost = c1\n[ironic]\nauth_type = none\n'
                   '[database]\nconnection = postgres://u:secretpw@127.0.0.1/db\n')
    one_line_error(result, '[database]connection', "unknown database type 'postgres'")
    assert 'secretpw' not in result[1] + result[2]
