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

"""The CLI's answer to "who owns this node" is the daemons' answer.

Real resource-tracker cycles settle the rows first; then ``ring show``,
``node show``, ``node list`` and ``ironic shards`` must agree with where
the rows are (all of them and the tracker call nodes/partition.view).
"""

import collections
import dataclasses
import datetime
import json

import pytest

from ironic_compute import ironic
from ironic_compute.cmd import manage
from ironic_compute.cmd import manage_ironic
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes

EXPONENT = 8


@dataclasses.dataclass
class Cli:
    in_process: object
    path: object

    def json(self, *argv, conf=''):
        self.path.write_text(
            f'[DEFAULT]\nstate_path = {self.path.parent}\n'
            f'[hash_ring]\npartition_exponent = {EXPONENT}\n{conf}')
        code, out, err = self.in_process(
            manage.main, '--config-file', str(self.path), *argv,
            '--format', 'json')
        assert code == 0, err
        return json.loads(out)


def cli(in_process, tmp_path):
    return Cli(in_process, tmp_path / 'manage.conf')


def settle(nodes, settings_by_host, rounds=4):
    """Run every service's cycles over ``nodes`` until they are steady;
    return the fake Ironic they list."""
    fake = fakes.FakeIronic(nodes)
    trackers = [resource_tracker.ResourceTracker(
        host, db_services.register(db_api.Context(), host), fake)
        for host in settings_by_host]
    for _ in range(rounds):
        for t in trackers:
            t.run_cycle(settings_by_host[t.host])
    return fake


def holders():
    return {item.record.uuid: item.record.host
            for item in admin.list_nodes(db_api.Context())}


def assert_every_node_stays(listing, rows):
    # The daemons have settled: each node is where the ring puts it.
    assert {n['uuid']: n['host'] for n in listing} == rows
    assert collections.Counter(n['reason'] for n in listing) == {
        'ring': len(rows)}


def test_the_cli_builds_the_shard_ring_when_the_partition_runs_it(
        sqlite_engine, in_process, tmp_path):
    nodes = ([fakes.make_node(shard=f'ic-{i % 8:02d}') for i in range(60)]
             + [fakes.make_node() for _ in range(4)])
    shards = resource_tracker.Settings(partition_exponent=EXPONENT,
                                       shard_ring=True)
    settle(nodes, {h: shards for h in ('cmp-1', 'cmp-2', 'cmp-3')})
    rows = holders()
    run = cli(in_process, tmp_path)

    assert_every_node_stays(run.json('node', 'list'), rows)
    report = run.json('ring', 'show')
    assert report['shard_ring'] is True
    per_host = collections.Counter(rows.values())
    assert {h['host']: h['expected_nodes'] for h in report['hosts']} == {
        h: float(n) for h, n in per_host.items()}
    # A node's standbys are its shard's: never its owner again.
    uuid = next(iter(rows))
    shown = run.json('node', 'show', uuid)
    assert shown['expected_host'] == rows[uuid]
    assert shown['standby'] and rows[uuid] not in shown['standby']


def test_each_node_is_judged_by_its_own_conductor_groups_ring(
        sqlite_engine, in_process, tmp_path):
    nodes = [fakes.make_node(conductor_group=group)
             for group in ('g1', 'g2') for _ in range(30)]
    settle(nodes, {
        'a1': resource_tracker.Settings(partition_exponent=EXPONENT,
                                        partition_key='g1'),
        'a2': resource_tracker.Settings(partition_exponent=EXPONENT,
                                        partition_key='g1'),
        'b1': resource_tracker.Settings(partition_exponent=EXPONENT,
                                        partition_key='g2',
                                        peer_list=('b1', 'b2')),
        'b2': resource_tracker.Settings(partition_exponent=EXPONENT,
                                        partition_key='g2',
                                        peer_list=('b1', 'b2'))})
    rows = holders()
    assert set(rows.values()) == {'a1', 'a2', 'b1', 'b2'}
    run = cli(in_process, tmp_path)
    # This file is one of group g1's: its peer_list does not apply to g2,
    # whose services recorded their own.
    g1 = '[ironic]\npartition_key = g1\npeer_list = a1,a2\n'

    assert_every_node_stays(run.json('node', 'list', conf=g1), rows)
    for uuid, host in rows.items():
        shown = run.json('node', 'show', uuid, conf=g1)
        assert (shown['managed_by'], shown['expected_host']) == (host, host)
    report = run.json('ring', 'show', '--partition-key', 'g2', conf=g1)
    assert (report['peers'], report['peer_list']) == (['b1', 'b2'],
                                                      ['b1', 'b2'])


def _settings(**kwargs):
    return resource_tracker.Settings(partition_exponent=EXPONENT, **kwargs)


# Services by host, the nodes (conductor group, shard) and this file's
# [ironic] section: a few partitions, with and without the shard ring.
SCENARIOS = {
    # a2 builds an instance on the first node of g1.
    'node-ring-two-partitions': (
        {'a1': _settings(partition_key='g1'),
         'a2': _settings(partition_key='g1'),
         'b1': _settings(partition_key='g2', peer_list=('b1', 'b2')),
         'b2': _settings(partition_key='g2', peer_list=('b1', 'b2'))},
        [('g1', None)] * 20 + [('g2', f'ic-{i % 3}') for i in range(20)],
        '[ironic]\npartition_key = g1\npeer_list = a1,a2\n'),
    'shard-ring': (
        {h: _settings(shard_ring=True) for h in ('s1', 's2', 's3')},
        [('', f'ic-{i % 6:02d}') for i in range(36)] + [('', None)] * 4,
        ''),
}


@pytest.mark.parametrize('scenario', sorted(SCENARIOS))
def test_every_cli_view_agrees_with_the_rows_the_cycles_wrote(
        migrated_engine, in_process, tmp_path, monkeypatch, scenario):
    services, layout, conf = SCENARIOS[scenario]
    nodes = [fakes.make_node(conductor_group=group, shard=shard)
             for group, shard in layout]
    pinned = {}
    if 'a2' in services:
        pinned[nodes[0].uuid] = 'a2'
        nodes[0] = dataclasses.replace(nodes[0], instance_uuid='inst-1')
        with migrated_engine.begin() as conn:
            conn.execute(models.instances.insert().values(
                uuid='inst-1', host='a2', node=nodes[0].uuid, deleted=0,
                created_at=datetime.datetime(2026, 1, 1)))
    fake = settle(nodes, services)
    monkeypatch.setattr(manage_ironic, '_client', lambda: fake)
    rows = holders()
    assert set(rows) == {n.uuid for n in nodes}
    run = cli(in_process, tmp_path)
    group_of = {n.uuid: n.conductor_group or None for n in nodes}
    shard_of = {n.uuid: n.shard or ironic.UNSHARDED for n in nodes}

    assert all(rows[uuid] == host for uuid, host in pinned.items())
    listing = run.json('node', 'list', conf=conf)
    assert {n['uuid']: n['host'] for n in listing} == rows
    assert {n['uuid']: n['reason'] for n in listing} == {
        uuid: 'own instance' if uuid in pinned else 'ring' for uuid in rows}
    for uuid, host in rows.items():
        shown = run.json('node', 'show', uuid, conf=conf)
        assert (shown['managed_by'], shown['expected_host']) == (host, host)
        if uuid in pinned:
            assert (shown['instance'], shown['instance_host']) == (
                'inst-1', host)
            assert shown['detail'] == f'{host} manages instance inst-1 on ' \
                'this node'
        else:
            assert shown['ring_host'] == host, shown
            assert host not in shown['standby']

    for group in sorted(set(group_of.values()), key=str):
        members = {h for h, s in services.items()
                   if s.partition_key == group}
        argv = ('--partition-key', group) if group else ()
        ring = run.json('ring', 'show', *argv, conf=conf)
        in_group = collections.Counter(
            host for uuid, host in rows.items() if group_of[uuid] == group)
        assert set(ring['peers']) == members
        assert ring['shard_ring'] == any(
            services[h].shard_ring for h in members)
        assert {h['host']: h['nodes'] for h in ring['hosts']} == {
            h: in_group.get(h, 0) for h in members}
        assert {h['host']: h['expected_nodes'] for h in ring['hosts']} == {
            h: float(in_group.get(h, 0)) for h in members}

        shards = run.json('ironic', 'shards', *argv, conf=conf)
        assert set(shards['peers']) == members
        assert shards['in_force'] == ring['shard_ring']
        if shards['in_force']:
            # Each shard's nodes are held by the service it is assigned to.
            by_shard = {s['shard']: s['service'] for s in shards['shards']}
            assert all(rows[uuid] == by_shard[shard_of[uuid]]
                       for uuid in rows if group_of[uuid] == group)
