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

"""tools/trace_actions.py reads an action's parts from the two logs."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE = '0ec125fe-03ce-49c0-b15c-e36dd699cdd9'
INSTANCE = '7d704d8d-f399-47de-be78-d313fe6525e5'
API = '2026-11-27 16:29:{t} 8503 INFO ironic.api [None req-1 - - - - - -] 127.0.0.1 - '

# A reboot: the read (50 ms) ends at 56.600, the call (400 ms) at 57.040,
# Ironic ends it at 57.200, the service logs it done at 57.500. A poll's GET
# after the call is not the read before it.
IRONIC_LOG = [
    API.format(t='56.600') + f'GET /v1/nodes/{NODE}?fields=uuid,power_state - 200 (50.0ms)',
    API.format(t='57.040') + f'PUT /v1/nodes/{NODE}/states/power - 202 (400.0ms)',
    API.format(t='57.100') + f'GET /v1/nodes/{NODE}?fields=uuid,power_state - 200 (10.0ms)',
    f'2026-11-27 16:29:57.200 8503 INFO ironic.conductor.utils [None req-2 - - - - - -] '
    f'Successfully set node {NODE} power state to power on by soft rebooting.',
]
COMPUTE_LOG = [
    f'2026-11-27 16:29:22.651 8765 INFO ironic_compute.instances.build [-] Instance '
    f'{INSTANCE}: active on node {NODE}',
    f'2026-11-27 16:29:57.500 8765 INFO ironic_compute.instances.power [-] Instance '
    f'{INSTANCE}: rebooting done, active',
]


@pytest.fixture
def trace_actions():
    spec = importlib.util.spec_from_file_location(
        'trace_actions', ROOT / 'tools' / 'trace_actions.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_directory(tmp_path):
    (tmp_path / 'ironic' / 'log').mkdir(parents=True)
    (tmp_path / 'ironic' / 'log' / 'ironic.log').write_text('\n'.join(IRONIC_LOG) + '\n')
    (tmp_path / 'compute-1.log').write_text('\n'.join(COMPUTE_LOG) + '\n')
    return tmp_path


def test_the_parts_of_a_reboot(trace_actions, run_directory):
    (trace,) = trace_actions.traces(str(run_directory), 'rebooting')
    parts = {label: round(part(trace), 3) for label, part in trace_actions.PARTS}
    assert parts == {'the read': 0.05, 'read to call': 0.04, 'the call': 0.4,
                     "Ironic's end": 0.16, 'seen done': 0.3, 'read to done': 0.95}
    assert trace_actions.traces(str(run_directory), 'rebuilding') == []


def test_the_report_and_a_directory_without_logs(trace_actions, run_directory,
                                                 tmp_path_factory, capsys):
    assert trace_actions.main([str(run_directory)]) == 0
    assert 'seen done' in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        trace_actions.main([str(tmp_path_factory.mktemp('empty'))])
    assert exc.value.code == 2
    assert 'no ironic/log/ironic.log there' in capsys.readouterr().err
