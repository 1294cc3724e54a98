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

"""Every entry point says a configuration it cannot use in one line.

In this process; tests/functional/test_bad_input.py runs the same as real
processes.
"""

import pytest

from ironic_compute.cmd import compute
from ironic_compute.cmd import manage
from ironic_compute.cmd import status
from tests.unit.cmd import assert_one_line_error

SECRET = 's3cr3t-value'
ENTRY_POINTS = [
    (compute.main, 'ironic-compute', (), 1),
    (manage.main, 'ironic-compute-manage', ('db', 'version'), 1),
    (status.main, 'ironic-compute-status', ('upgrade', 'check'), 255),
]


@pytest.mark.parametrize('main, prog, args, exit_code', ENTRY_POINTS)
@pytest.mark.parametrize('text', [
    f'[ironic]\npassword {SECRET}\n',
    f'[ironic]\n\tpassword = {SECRET}\n',
    f'password = {SECRET}\n',
    f'[ironic\npassword = {SECRET}]\n',
])
def test_a_file_that_does_not_parse(tmp_path, in_process, main, prog, args,
                                    exit_code, text):
    config = tmp_path / 'ic.conf'
    config.write_text(text)
    code, out, err = in_process(main, '--config-file', str(config), *args)
    assert_one_line_error(prog, code, err, f'Failed to parse {config}',
                          '<line not shown>', exit_code=exit_code)
    assert SECRET not in out + err


@pytest.mark.parametrize('main, prog, args, exit_code', ENTRY_POINTS)
def test_a_missing_file(tmp_path, in_process, main, prog, args, exit_code):
    code, _, err = in_process(main, '--config-file',
                              str(tmp_path / 'nope.conf'), *args)
    assert_one_line_error(prog, code, err, 'nope.conf', exit_code=exit_code)


@pytest.mark.parametrize('text, fragment', [
    ('[DEFAULT]\nservice_down_time = 5\nreport_interval = 10\n',
     'service_down_time (5) must be larger'),
    (f'[database]\nconnection = postgres://u:{SECRET}@db.example/ic\n',
     "unknown database type 'postgres'"),
    ('[database]\nconnection = sqlite:////nonexistent/dir/ic.sqlite\n',
     'the directory /nonexistent/dir of the SQLite database does not exist'),
])
def test_status_checks_the_configuration_as_the_others(tmp_path, in_process,
                                                       text, fragment):
    config = tmp_path / 'ic.conf'
    config.write_text(f'[DEFAULT]\nstate_path = {tmp_path}\n' + text)
    code, out, err = in_process(status.main, '--config-file', str(config),
                                'upgrade', 'check')
    assert_one_line_error('ironic-compute-status', code, err, fragment,
                          exit_code=255)
    assert SECRET not in out + err
    assert out == ''
