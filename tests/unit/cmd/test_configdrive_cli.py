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

"""The config drive options of instance create and instance rebuild:
every file read and checked before anything is recorded, bad input
refused in one line, and the user data shown only as its size and
digest."""

import hashlib
import json

import pytest

from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import configdrive
from ironic_compute.instances import model as inst
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service
from tests.unit.cmd.test_request_inputs import count_instances
from tests.unit.test_configdrive import KEY_A
from tests.unit.test_configdrive import KEY_B
from tests.unit.test_configdrive import NETWORK
from tests.unit.test_configdrive import SECRET


@pytest.fixture
def files(tmp_path):
    """name -> path of the files the options read."""
    contents = {'a_pub': KEY_A + '\n', 'b_pub': f'# bob\n{KEY_B}\n',
                'user_data': SECRET, 'network_json': json.dumps(NETWORK),
                'empty': '', 'not_json': '{', 'list_json': '[]',
                'private': '-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n'}
    paths = {}
    for name, text in contents.items():
        paths[name] = tmp_path / name
        paths[name].write_text(text)
    paths['binary'] = tmp_path / 'binary'
    paths['binary'].write_bytes(b'MARKER-4f1d\xff')
    paths['missing'] = tmp_path / 'missing'
    return {name: str(path) for name, path in paths.items()}


def test_create_records_the_config_drive_and_shows_no_user_data(
        migrated_engine, manage_cli, files):
    service('cmp-1', node_uuid(1))
    result = manage_cli(
        'instance', 'create', '--name', 'web', '--resource-class',
        'baremetal', '--ssh-key', files['a_pub'], '--ssh-key', files['b_pub'],
        '--user-data', files['user_data'], '--meta', 'role=web', '--meta',
        'tier=a=b', '--network-data', files['network_json'], '--hostname',
        'web-1.example.com', '--format', 'json')
    assert result.code == 0, result
    shown = result.json()
    raw = SECRET.encode()
    assert {key: shown[key] for key in (
        'ssh_keys', 'user_data', 'meta', 'network_data', 'hostname')} == {
        'ssh_keys': [KEY_A, KEY_B],
        'user_data': {'size': len(raw),
                      'sha256': hashlib.sha256(raw).hexdigest()},
        'meta': {'role': 'web', 'tier': 'a=b'}, 'network_data': NETWORK,
        'hostname': 'web-1.example.com'}
    row = db_instances.get(db_api.Context(), shown['uuid'])
    assert row.config_drive() == configdrive.ConfigDrive(
        ssh_keys=(KEY_A, KEY_B), user_data=SECRET,
        meta=(('role', 'web'), ('tier', 'a=b')), network_data=NETWORK,
        hostname='web-1.example.com')
    table = manage_cli('instance', 'show', shown['uuid']).out
    assert f'| User data        | {len(raw)} bytes, sha256 ' in table
    assert 'ssh-ed25519 alice@example.com, ssh-rsa bob@example.com' in table
    assert '| Meta             | role=web, tier=a=b ' in table
    outputs = [result.out + result.err, table, manage_cli(
        'instance', 'list', '--format', 'json').out]
    assert not any('MARKER-4f1d' in text for text in outputs)


def test_create_without_a_config_drive_shows_none(migrated_engine,
                                                  manage_cli):
    service('cmp-1', node_uuid(1))
    shown = manage_cli('instance', 'create', '--name', 'web',
                       '--resource-class', 'baremetal', '--format',
                       'json').json()
    assert (shown['ssh_keys'], shown['user_data'], shown['meta'],
            shown['network_data'], shown['hostname']) == ([], None, {}, None,
                                                          None)


@pytest.mark.parametrize('args, fragment', [
    (('--ssh-key', '{missing}'),
     'cannot read --ssh-key {missing}: No such file or directory'),
    (('--ssh-key', '{user_data}'),
     '--ssh-key {user_data} line 2 is not an SSH public key'),
    (('--ssh-key', '{a_pub}', '--ssh-key', '{private}'),
     '--ssh-key {private} holds a private key: give the public one (.pub)'),
    (('--ssh-key', '{empty}'), '--ssh-key {empty} holds no SSH public key'),
    (('--ssh-key', '{binary}'), '--ssh-key {binary} is not UTF-8 text'),
    (('--user-data', '{missing}'), 'cannot read --user-data {missing}: '),
    (('--user-data', '{binary}'),
     '--user-data {binary} is not UTF-8 text (Ironic takes user data as '
     'text)'),
    (('--network-data', '{not_json}'),
     '--network-data {not_json} is not valid JSON: '),
    (('--network-data', '{list_json}'),
     '--network-data {list_json} is not a JSON object'),
    (('--meta', 'role'), "invalid --meta 'role': use KEY=VALUE"),
    (('--hostname', 'web_1'), "invalid hostname 'web_1': labels of"),
    (('--hostname', 'web-'), "invalid hostname 'web-'"),
])
def test_create_refuses_a_bad_config_drive(migrated_engine, manage_cli, files,
                                           args, fragment):
    service('cmp-1', node_uuid(1))
    result = manage_cli('instance', 'create', '--name', 'x',
                        '--resource-class', 'baremetal',
                        *[arg.format(**files) for arg in args])
    result.one_line_error(fragment.format(**files))
    assert 'MARKER-4f1d' not in result.out + result.err
    assert count_instances() == 0


def test_create_refuses_a_config_drive_ironic_would_not_take(
        migrated_engine, manage_cli, tmp_path):
    service('cmp-1', node_uuid(1))
    big = tmp_path / 'big'
    big.write_bytes(b'x' * (configdrive.MAX_BYTES + 1))
    manage_cli('instance', 'create', '--name', 'x', '--resource-class',
               'baremetal', '--user-data', str(big)).one_line_error(
        f'--user-data {big} is larger than Ironic takes a config drive '
        '(64 MiB)')
    # Under the limit alone, over it as a drive (JSON doubles each "\n").
    big.write_bytes(b'\n' * (configdrive.MAX_BYTES // 2 + 1))
    manage_cli('instance', 'create', '--name', 'x', '--resource-class',
               'baremetal', '--user-data', str(big)).one_line_error(
        'more than Ironic takes (64 MiB: its API refuses a larger '
        'provision request)')
    assert count_instances() == 0


def test_rebuild_queues_the_new_user_data_and_keys(instance, manage_cli,
                                                   files):
    result = manage_cli('instance', 'rebuild', instance, '--user-data',
                        files['user_data'], '--ssh-key', files['b_pub'],
                        '--format', 'json')
    assert result.code == 0, result
    assert result.json()['task_state'] == inst.REBUILDING
    assert 'MARKER-4f1d' not in result.out + result.err
    row = db_instances.get(db_api.Context(), instance)
    assert row.args() == {'image': None, 'user_data': SECRET,
                          'ssh_keys': [KEY_B]}
    # Recorded on the row once the rebuild is sent, not before.
    assert row.user_data is None and row.ssh_keys is None


@pytest.mark.parametrize('args, fragment', [
    (('--user-data', '{missing}'), 'cannot read --user-data {missing}'),
    (('--ssh-key', '{network_json}'),
     '--ssh-key {network_json} line 1 is not an SSH public key'),
])
def test_rebuild_refuses_bad_files_and_queues_nothing(instance, manage_cli,
                                                      files, args, fragment):
    manage_cli('instance', 'rebuild', instance,
               *[arg.format(**files) for arg in args]).one_line_error(
        fragment.format(**files))
    row = db_instances.get(db_api.Context(), instance)
    assert (row.task_state, row.task_args) == (None, None)
