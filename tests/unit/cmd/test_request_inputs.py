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
