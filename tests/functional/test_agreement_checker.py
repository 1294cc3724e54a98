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

"""The agreement checker's rules on made-up samples: each can fail.

Pure (no database, no Ironic): the functional tests trust the checker to
see a disagreement, so each rule is shown to fire here, and the
legitimate transients shown not to.
"""

import datetime

from tests.functional import agreement

NOW = datetime.datetime(2026, 11, 25, 12, 0, 0)
X, Y = 'instance-x', 'instance-y'
N, M = 'node-n', 'node-m'


def row(uuid=X, node=N, vm='active', task=None, built=True, deleted_ago=None):
    deleted_at = None if deleted_ago is None else NOW - datetime.timedelta(seconds=deleted_ago)
    return agreement.Row(uuid, 'compute-1', node, vm, task, built, deleted_at)


def node(uuid=N, state='active', target=None, instance=X):
    return {'uuid': uuid, 'provision_state': state, 'target_provision_state': target,
            'instance_uuid': instance, 'power_state': 'power on'}


def allocation(name=X, node_uuid=N):
    return {'uuid': name, 'name': name, 'node_uuid': node_uuid, 'state': 'active'}


def sample(rows, nodes, allocations):
    return agreement.Sample(NOW, rows, {n['uuid']: n for n in nodes}, allocations)


def rules(found):
    return sorted(rule for rule, _ in found)


def test_agreement_is_quiet():
    s = sample([row()], [node(), node(M, 'available', instance=None)], [allocation()])
    assert agreement.check(s, 0) == []
    assert agreement.quiet(s) == []


def test_active_instance_on_a_node_torn_down():
    s = sample([row()], [node(state='deleting', target='available')], [allocation()])
    assert rules(agreement.check(s, 0)) == ['active_not_deployed']


def test_active_instance_whose_node_serves_another():
    s = sample([row(), row(Y, node=None, vm='building', task='spawning')],
               [node(instance=Y)], [allocation(Y)])
    assert 'active_not_deployed' in rules(agreement.check(s, 0))


def test_records_of_instances_built_elsewhere_are_not_checked():
    s = sample([row(built=False)], [node(state='enroll', instance=None)], [])
    assert agreement.check(s, 0) == []


def test_node_serves_a_deleted_instance_after_the_allowance():
    s = sample([row(vm='deleted', deleted_ago=30)], [node(state='deleting')], [])
    assert rules(agreement.check(s, 10)) == ['serves_deleted']
    assert agreement.check(s, 60) == []  # the reaper's teardown, in time


def test_node_serves_a_failed_build():
    s = sample([row(vm='error', node=None)], [], [allocation(node_uuid=None)])
    assert rules(agreement.check(s, 0)) == ['serves_failed']
    releasing = sample([row(vm='error', task='releasing')], [node()], [allocation()])
    assert agreement.check(releasing, 0) == []


def test_node_serves_an_instance_recorded_elsewhere():
    s = sample([row(node=M, vm='building', task='spawning')],
               [node(state='deploying', target='active')], [allocation()])
    assert rules(agreement.check(s, 0)) == ['serves_elsewhere']


def test_a_build_in_flight_may_hold_a_node_its_row_does_not_name_yet():
    s = sample([row(node=None, vm='building', task='spawning')],
               [node(state='available', instance=X)], [allocation()])
    assert agreement.check(s, 0) == []
    assert 'unsettled' in rules(agreement.quiet(s))


def test_two_nodes_for_one_instance():
    s = sample([row()], [node(), node(M)], [allocation()])
    assert 'two_allocations' in rules(agreement.check(s, 0))


def test_unknown_instance():
    s = sample([], [node(instance=Y)], [])
    assert rules(agreement.check(s, 0)) == ['serves_unknown']


def test_an_instance_recorded_after_the_database_read_is_not_unknown():
    # The database is read first, then Ironic: a build recorded in between
    # whose worker allocated a node before Ironic was read (CI, the chaos
    # soak on PostgreSQL) has no row in the sample, and a row now.
    s = sample([], [node(instance=Y)], [allocation(Y)])
    assert agreement.unknown_instances(s) == {Y}
    assert rules(agreement.check(s, 0, recorded_since={Y})) == []
    assert rules(agreement.check(s, 0, recorded_since={X})) == ['serves_unknown']


def test_quiet_wants_free_nodes_clean():
    s = sample([], [node(M, 'clean failed', instance=None)], [])
    assert agreement.check(s, 0) == []
    assert rules(agreement.quiet(s)) == ['not_free']
    assert agreement.quiet(s, free_states=('available', 'clean failed')) == []
