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

"""The instance pass of a cycle (takeover.py): which partition covers an
instance of a dead host. The takeover itself, on the three databases, is in
tests/unit/db/test_instances.py and tests/unit/test_fencing.py."""

import types

import pytest

from ironic_compute.instances import takeover
from ironic_compute.nodes import ownership


def view(partition_key):
    return types.SimpleNamespace(partition_key=partition_key)


def row(group):
    return types.SimpleNamespace(conductor_group=group)


def dead(partition_key):
    return ownership.ServiceRecord(
        host='dead', disabled=False, forced_down=False, stopped=False,
        last_seen_up=None, has_compute_nodes=True,
        partition_key=partition_key)


@pytest.mark.parametrize('partition, node_row, asked, dead_group, covered', [
    (None, None, None, None, True),  # no partition: every instance
    ('g1', row('g1'), None, None, True),  # its node's group decides
    ('g1', row('g2'), 'g1', 'g1', False),  # ...whatever else says
    ('g1', None, None, None, False),  # a node no service of ours listed
    ('g1', 'no node', 'g1', None, True),  # a build: the group asked for
    ('g2', 'no node', 'g1', 'g2', False),
    ('g1', 'no node', None, 'g1', True),  # else its dead host's group
    ('g2', 'no node', None, 'g1', False),
    ('g2', 'no node', None, None, True),  # a host without a group: anyone
])
def test_the_partition_that_covers_an_instance(partition, node_row, asked,
                                               dead_group, covered):
    node = None if node_row == 'no node' else 'node-1'
    record = dead(dead_group)
    assert takeover.InstanceKeeper._in_partition(
        view(partition), None if node_row == 'no node' else node_row, node,
        asked, record) is covered


def test_a_build_of_a_host_without_a_services_row_goes_to_any_partition():
    assert takeover.InstanceKeeper._in_partition(view('g1'), None, None, None,
                                                 None)
