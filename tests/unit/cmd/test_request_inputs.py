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

"""instance create refuses a resource class or trait Ironic would not take.

One line, exit 1, nothing written: the values never reach the database,
a query string or a request to Ironic.
"""

import json

import pytest
import sqlalchemy as sa

from ironic_compute.db import api as db_api
from tests.unit.cmd.test_manage_admin import _instances
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service


def count_instances():
    with db_api.get_engine().connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(
            _instances)).scalar()


@pytest.mark.parametrize('args, fragment', [
    (('--resource-class', 'baremetal&associated=True'),
     "invalid resource class 'baremetal&associated=True': use up to 80 "
     'letters, digits and "-", ".", "_", "~"'),
    (('--resource-class', 'x' * 81), 'invalid resource class'),
    (('--resource-class', 'baremetal', '--trait', 'custom_gold'),
     "invalid trait 'custom_gold': a trait is a standard one (such as "
     'HW_CPU_X86_AVX2) or CUSTOM_ followed by upper-case letters, digits '
     'and "_", up to 255 characters'),
    (('--resource-class', 'baremetal', '--trait', 'CUSTOM_A',
      '--trait', 'CUSTOM_B&x'), "invalid trait 'CUSTOM_B&x'"),
])
def test_create_refuses_values_ironic_would_not_take(migrated_engine,
                                                     manage_cli, args,
                                                     fragment):
    service('cmp-1', node_uuid(1))
    for host in ((), ('--host', 'cmp-1')):
        manage_cli('instance', 'create', '--name', 'x', *args,
                   *host).one_line_error(fragment)
    assert count_instances() == 0


@pytest.mark.parametrize('args, fragment', [
    (('--capability', 'boot_mode'),
     "invalid capability 'boot_mode': use KEY=VALUE"),
    (('--capability', 'boot_mode='), "invalid capability 'boot_mode='"),
    (('--capability', 'boot:mode=uefi'), "invalid capability 'boot:mode=uefi'"),
    (('--capability', 'a=b,c'), "invalid capability 'a=b,c'"),
    (('--capability', 'a=b|c'), "invalid capability 'a=b|c'"),
    (('--capability', 'a=1', '--capability', 'a=2'),
     'capability a given twice: 1 and 2'),
    (('--ephemeral-gb', '-1'), '--ephemeral-gb must be 0 or more, not -1'),
    (('--swap-mb', '-5'), '--swap-mb must be 0 or more, not -5'),
    (('--ephemeral-format', 'ext4'),
     'an ephemeral format needs an ephemeral size (--ephemeral-gb)'),
    (('--ephemeral-gb', '1', '--ephemeral-format', 'ext4;rm'),
     "invalid ephemeral format 'ext4;rm'"),
    (('--image-kernel', 'http://k'),
     'a partition image needs both --image-kernel and --image-ramdisk'),
    (('--project', 'a b'), "--project must be one word of up to 255 "
     "characters, not 'a b'"),
    (('--user', 'u' * 256), '--user must be one word'),
])
def test_create_refuses_a_bad_request_spec(migrated_engine, manage_cli, args,
                                           fragment):
    service('cmp-1', node_uuid(1))
    manage_cli('instance', 'create', '--name', 'x', '--resource-class',
               'baremetal', *args).one_line_error(fragment)
    assert count_instances() == 0


def test_create_records_the_whole_request_and_list_filters_by_project(
        migrated_engine, manage_cli):
    service('cmp-1', node_uuid(1), node_uuid(2))
    with db_api.get_engine().begin() as conn:
        # What a cycle records of a node whose capabilities are these.
        conn.execute(sa.text(
            "UPDATE compute_nodes SET capabilities = '|boot_mode:uefi|'"))
    result = manage_cli(
        'instance', 'create', '--name', 'web', '--resource-class',
        'baremetal', '--capability', 'boot_mode=uefi', '--ephemeral-gb', '2',
        '--ephemeral-format', 'ext4', '--swap-mb', '512', '--image',
        'http://img', '--image-checksum', 'abc123', '--image-kernel',
        'http://k', '--image-ramdisk', 'http://r', '--project', 'demo',
        '--user', 'alice', '--format', 'json')
    assert result.code == 0, result
    shown = json.loads(result.out)
    assert {key: shown[key] for key in (
        'capabilities', 'ephemeral_gb', 'ephemeral_format', 'swap_mb',
        'image_checksum', 'image_kernel', 'image_ramdisk', 'project_id',
        'user_id')} == {
        'capabilities': {'boot_mode': 'uefi'}, 'ephemeral_gb': 2,
        'ephemeral_format': 'ext4', 'swap_mb': 512, 'image_checksum': 'abc123',
        'image_kernel': 'http://k', 'image_ramdisk': 'http://r',
        'project_id': 'demo', 'user_id': 'alice'}
    show = manage_cli('instance', 'show', shown['uuid'], '--format', 'json')
    assert json.loads(show.out) == {**shown, 'updated_at': json.loads(
        show.out)['updated_at']}
    table = manage_cli('instance', 'show', shown['uuid']).out
    assert '| Capabilities ' in table and 'boot_mode=uefi' in table
    assert '| Project ' in table and 'demo' in table
    assert manage_cli('instance', 'create', '--name', 'other',
                      '--resource-class', 'baremetal').code == 0
    listed = json.loads(manage_cli('instance', 'list', '--project', 'demo',
                                   '--format', 'json').out)
    assert [row['name'] for row in listed] == ['web']
    assert len(json.loads(manage_cli('instance', 'list', '--format',
                                     'json').out)) == 2
    assert json.loads(manage_cli('instance', 'list', '--project', 'nobody',
                                 '--format', 'json').out) == []
    # No node has boot_mode=bios: refused, naming what did not match.
    manage_cli('instance', 'create', '--name', 'x', '--resource-class',
               'baremetal', '--capability', 'boot_mode=bios').one_line_error(
        'capabilities boot_mode=bios', 'without boot_mode=bios')
    assert count_instances() == 2
