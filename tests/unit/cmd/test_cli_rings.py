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
``node show`` and ``node list`` must agree with where the rows are.
"""

import collections
import dataclasses
import json

from ironic_compute.cmd import manage
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
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
    """Run every service's cycles over ``nodes`` until they are steady."""
    fake = fakes.FakeIronic(nodes)
    trackers = [resource_tracker.ResourceTracker(
        host, db_services.register(db_api.Context(), host), fake)
        for host in settings_by_host]
    for _ in range(rounds):
        for t in trackers:
            t.run_cycle(settings_by_host[t.host])


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
