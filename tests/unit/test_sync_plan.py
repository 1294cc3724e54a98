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

"""The pure plan of a cycle, without a database."""

from ironic_compute.db import compute_nodes
from ironic_compute.nodes import ownership
from ironic_compute.nodes import sync_plan

R = ownership.Reason
FIELDS = ('n', 'g', 8, 16, 100, 0, 0, 0, 'x86_64', 'baremetal', '{}')
OTHER_FIELDS = ('n', 'g', 16, 16, 100, 0, 0, 0, 'x86_64', 'baremetal', '{}')


def NodeRow(uuid, host, fields):  # noqa: N802 - stands in for the tuple type
    return compute_nodes.NodeRow(uuid, host, fields[1], fields)


class Ring:
    hosts = frozenset({'a', 'b'})

    def __init__(self, owner):
        self.owner = owner

    def get_hosts(self, key):
        return [self.owner]


def plan(owned=None, others=None, foreign=None, unknown=None, listed=(), rows=None,
         live=frozenset({'a', 'b'}), ring_owner='a', partition_key='g', pinned=()):
    own = ownership.Ownership(owned or {}, foreign or {}, unknown or {}, others or {})
    fields = {u: FIELDS for u in listed}
    return sync_plan.plan('a', own, set(listed), fields, rows or {}, live,
                          Ring(ring_owner), partition_key, set(pinned))


def test_new_node_of_ours_is_created():
    result = plan(owned={'n1': R.RING}, listed=['n1'])
    assert result.create == {'n1': FIELDS}


def test_node_of_ours_held_elsewhere_is_taken_from_that_owner():
    rows = {'n1': NodeRow('n1', 'b', FIELDS), 'n2': NodeRow('n2', None, FIELDS)}
    result = plan(owned={'n1': R.RING, 'n2': R.RING}, listed=['n1', 'n2'], rows=rows)
    assert dict(result.take) == {'b': ['n1'], None: ['n2']}
    assert not result.update


def test_node_held_by_a_live_service_outside_our_ring_is_left_to_it():
    # 'c' is up but in another partition: it releases the row itself.
    rows = {'n1': NodeRow('n1', 'c', FIELDS)}
    result = plan(owned={'n1': R.RING}, listed=['n1'], rows=rows,
                  live=frozenset({'a', 'b', 'c'}))
    assert result.waiting == ['n1'] and not result.take and not result.update


def test_unchanged_row_is_not_written():
    rows = {'n1': NodeRow('n1', 'a', FIELDS)}
    result = plan(owned={'n1': R.RING}, listed=['n1'], rows=rows)
    assert not (result.create or result.take or result.update or result.release)


def test_changed_capacity_is_updated():
    rows = {'n1': NodeRow('n1', 'a', OTHER_FIELDS)}
    result = plan(owned={'n1': R.RING}, listed=['n1'], rows=rows)
    assert result.update == {'n1': FIELDS}


def test_row_we_no_longer_manage_is_released_to_its_manager():
    rows = {'n1': NodeRow('n1', 'a', FIELDS), 'n2': NodeRow('n2', 'a', FIELDS)}
    result = plan(others={'n1': 'b'}, foreign={'n2': 'c'}, listed=['n1', 'n2'], rows=rows)
    assert dict(result.release) == {'b': ['n1'], 'c': ['n2']}


def test_row_with_unknown_instance_is_kept():
    rows = {'n1': NodeRow('n1', 'a', FIELDS)}
    result = plan(unknown={'n1': 'i1'}, listed=['n1'], rows=rows)
    assert result.unknown_kept == ['n1'] and not result.release


def test_unlisted_row_of_ours_is_checked_unless_our_instance_is_on_it():
    rows = {'n1': NodeRow('n1', 'a', FIELDS), 'n2': NodeRow('n2', 'a', FIELDS)}
    result = plan(rows=rows, pinned=['n2'])
    assert result.check_gone == {'n1': 'a'}


def test_unlisted_orphan_is_checked_by_the_ring_owner_of_its_partition():
    rows = {'dead': NodeRow('dead', 'z', FIELDS), 'live': NodeRow('live', 'b', FIELDS),
            'other-group': NodeRow('other-group', None, OTHER_FIELDS[:1] + ('h',)
                                   + OTHER_FIELDS[2:])}
    assert plan(rows=rows).check_gone == {'dead': 'z'}
    assert plan(rows=rows, ring_owner='b').check_gone == {}


def test_plan_with_the_bounded_ring_of_the_cycle():
    # The resource tracker gives plan() the ring ownership.node_ring built:
    # listed nodes follow the bounded assignment, an unlisted orphan the
    # plain ring's pick, so that one service alone asks Ironic about it.
    from ironic_compute.ring.hash_ring import HashRing

    plain = HashRing(['a', 'b', 'c'], partition_exponent=10)
    listed = [f'bm-{i}' for i in range(40)]  # plain hashing: 9 / 13 / 18
    nodes = [ownership.NodeInfo(u) for u in listed]
    ring = ownership.node_ring(plain, nodes, [], 1.1)
    orphans = [f'gone-{i}' for i in range(30)]
    rows = {u: NodeRow(u, 'dead', FIELDS) for u in listed + orphans}
    checked = {}
    for me in ('a', 'b', 'c'):
        own = ownership.owned_nodes(me, ring, nodes, [])
        result = sync_plan.plan(me, own, set(listed), {u: FIELDS for u in own.owned}, rows,
                                frozenset({'a', 'b', 'c'}), ring, 'g', set())
        assert len(result.take['dead']) == len(own.owned) <= 14
        for uuid in result.check_gone:
            assert checked.setdefault(uuid, me) == me
    assert sorted(checked) == sorted(orphans)
    assert all(plain.get_hosts(u) == [h] for u, h in checked.items())
