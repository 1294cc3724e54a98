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

"""ironic-compute-manage ironic shards / shard-assign, with a fake Ironic at
the adapter boundary (tests/functional/test_shard_ring.py runs them against
the real one)."""

import dataclasses

import pytest

from ironic_compute import exception
from ironic_compute.cmd import manage_ironic
from ironic_compute.ring import hash_ring
from ironic_compute.ring import shard_ring
from tests.unit import fakes
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service


class FakeClient(fakes.FakeIronic):
    def __init__(self, nodes=()):
        super().__init__(nodes)
        self.patched = []
        self.fail_after = None

    def set_shard(self, uuid, shard):
        if self.fail_after is not None and len(self.patched) >= self.fail_after:
            raise exception.IronicUnavailable('HTTP 503 from Ironic')
        self.patched.append((uuid, shard))
        self.nodes[uuid] = dataclasses.replace(self.nodes[uuid], shard=shard)


@pytest.fixture
def fake(monkeypatch):
    client = FakeClient()
    monkeypatch.setattr(manage_ironic, '_client', lambda: client)
    return client


def sharded_nodes(counts, group=''):
    return [fakes.make_node(shard=None if name == 'None' else name, conductor_group=group)
            for name, count in counts.items() for _ in range(count)]


def test_shards_shows_each_shard_and_its_service(sqlite_engine, cli, fake):
    counts = {'ic-00': 5, 'ic-01': 3, 'ic-02': 7, 'None': 2}
    fake.add(*sharded_nodes(counts))
    for i, host in enumerate(('cmp-1', 'cmp-2')):
        service(host, node_uuid(i), shard_ring=True)
    report = cli('ironic', 'shards', '--format', 'json').json()
    ring = hash_ring.get_ring(frozenset({'cmp-1', 'cmp-2'}), 8)
    assigned = shard_ring.assign(ring, counts, 1.10)  # the default
    assert report['shards'] == [{'shard': s, 'nodes': counts[s],
                                 'service': shard_ring.owner(assigned, s)}
                                for s in sorted(counts)]
    assert report['peers'] == ['cmp-1', 'cmp-2'] and report['in_force'] is True
    assert report['nodes'] == 17 and report['load_factor'] == 1.10
    assert sum(s['nodes'] for s in report['services']) == 17
    table = cli('ironic', 'shards').ok().out
    assert 'Shard ring in force' in table and '| ic-02 ' in table


def test_shards_not_in_force_while_a_peer_lists_everything(sqlite_engine, cli, fake):
    fake.add(*sharded_nodes({'ic-00': 2}))
    service('cmp-1', node_uuid(1), shard_ring=True)
    service('cmp-2', node_uuid(2))
    report = cli('ironic', 'shards', '--format', 'json').json()
    assert report['in_force'] is False and report['shard_ring_peers'] == ['cmp-1']
    assert {s['shard'] for s in report['shards']} == {'ic-00', 'None'}


def test_shards_without_live_peer(sqlite_engine, cli, fake):
    fake.add(*sharded_nodes({'ic-00': 2}))
    report = cli('ironic', 'shards', '--format', 'json').json()
    assert report['peers'] == [] and report['in_force'] is False
    assert [s['service'] for s in report['shards']] == [None, None]
    assert '(no live peer)' in cli('ironic', 'shards').ok().out


def test_shard_assign_gives_each_unsharded_node_a_shard(sqlite_engine, cli, fake):
    fake.add(*sharded_nodes({'ic-07': 2, 'None': 40}))
    fake.add(*sharded_nodes({'None': 3}, group='rack-1'))
    dry = cli('ironic', 'shard-assign', '--shards', '4', '--dry-run').ok().out
    assert dry.startswith('Would give 43 unsharded nodes of any conductor group')
    assert fake.patched == []
    out = cli('ironic', 'shard-assign', '--shards', '4').ok().out
    assert out.splitlines()[0] == ('Gave 43 unsharded nodes of any conductor group '
                                   'a shard (4 shards):')
    assert len(fake.patched) == 43
    assert all(shard == shard_ring.shard_key(uuid, 4) for uuid, shard in fake.patched)
    assert {n.shard for n in fake.nodes.values()} == {'ic-07', 'ic-00', 'ic-01', 'ic-02',
                                                      'ic-03'}
    # Again: nothing left to do, nothing changes.
    again = cli('ironic', 'shard-assign', '--shards', '4').ok().out
    assert again.strip() == 'Gave 0 unsharded nodes of any conductor group a shard (4 shards).'
    assert len(fake.patched) == 43


def test_shard_assign_in_a_conductor_group(sqlite_engine, cli, fake):
    fake.add(*sharded_nodes({'None': 5}, group='rack-1'), *sharded_nodes({'None': 2}))
    out = cli('ironic', 'shard-assign', '--shards', '2', '--partition-key', 'Rack-1').ok().out
    assert "5 unsharded nodes of conductor group 'rack-1'" in out
    assert {s for _, s in fake.patched} <= {'ic-rack-1-00', 'ic-rack-1-01'}


@pytest.mark.parametrize('argv, fragment', [
    (('--shards', '0'), '--shards must be between 1 and'),
    (('--shards', '10001'), '--shards must be between 1 and'),
    (('--shards', '2', '--partition-key', 'a b'), 'invalid partition key'),
])
def test_shard_assign_bad_input_is_one_line(sqlite_engine, cli, fake, argv, fragment):
    cli('ironic', 'shard-assign', *argv).one_line_error(fragment)


def test_shard_assign_stops_at_the_first_failure_and_says_how_far(sqlite_engine, cli,
                                                                   fake):
    fake.add(*sharded_nodes({'None': 5}))
    fake.fail_after = 2
    cli('ironic', 'shard-assign', '--shards', '2').one_line_error(
        'HTTP 503 from Ironic', '2 of 5 nodes done')


def test_ironic_unreachable_is_one_line(sqlite_engine, cli, fake):
    fake.fail = True
    cli('ironic', 'shards').one_line_error('fake Ironic is down')
    cli('ironic', 'shard-assign', '--shards', '2').one_line_error('fake Ironic is down')


def test_missing_ironic_credentials_are_one_line(sqlite_engine, cli):
    cli('ironic', 'shards').one_line_error('[ironic]auth_type is not set')
