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

"""ironic-compute-manage service / ring / node / instance.

The checks call ``manage.main()`` in this process (the enginefacade is
already pointed at the test database by the fixtures), which is fast;
tests/functional/test_cli_processes.py runs the real command as operators
do, once per backend.
"""

import collections
import datetime
import json
import os
import re
import shlex
import types

import pytest
import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute.cmd import instance_console
from ironic_compute.cmd import status
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import configdrive
from ironic_compute.instances import model as instances
from ironic_compute.nodes import ownership
from ironic_compute.ring import hash_ring
from tests.unit.cmd import BASE_CONF
from tests.unit.cmd import EXPONENT
from tests.unit.cmd import Result
from tests.unit.test_configdrive import public_key

_services = models.services
_nodes = models.compute_nodes
_instances = models.instances


def node_uuid(i):
    return f'00000000-0000-4000-8000-{i:012d}'


def instance_uuid(i):
    return f'11111111-1111-4111-8111-{i:012d}'


# --- running the command --------------------------------------------------



# --- rows -----------------------------------------------------------------

def fields(group=''):
    return ('hh', group, 4, 1024, 10, 0, 0, 0, 'x86_64', 'baremetal', '{}', None,
            True, '|', '|')


def service(host, *nodes, group='', age=0, stopped=False, cycle=None,
            **flags):
    """Register ``host`` with rows for ``nodes``; heartbeat ``age`` s ago."""
    ctx = db_api.Context()
    service_id = db_services.register(ctx, host)
    now = _utcnow()
    values = dict(flags, last_seen_up=now - datetime.timedelta(seconds=age))
    if stopped:
        values['stopped_at'] = now
    if cycle is not None:
        values.update(last_cycle_at=now, last_cycle_seconds=cycle)
    with db_api.get_engine().begin() as conn:
        conn.execute(_services.update()
                     .where(_services.c.id == service_id).values(**values))
    if nodes:
        compute_nodes.create_or_revive(
            ctx, {u: fields(group) for u in nodes}, host, service_id)
    return service_id


def rows_without_service(host, *nodes):
    compute_nodes.create_or_revive(
        db_api.Context(), {u: fields() for u in nodes}, host, None)


def instance(uuid, host, node):
    admin.add_instance(db_api.Context(), uuid, host, node, 'active')


def node_row(uuid):
    with db_api.get_engine().connect() as conn:
        return conn.execute(sa.select(_nodes.c.host, _nodes.c.service_id)
                            .where(_nodes.c.uuid == uuid,
                                   _nodes.c.deleted == 0)).one()


def instance_host(uuid):
    with db_api.get_engine().connect() as conn:
        return conn.execute(sa.select(_instances.c.host).where(
            _instances.c.uuid == uuid, _instances.c.deleted == 0)).scalar()


def by_host(listing):
    return {entry['host']: entry for entry in listing}


def table_line(text, first_cell):
    return next(line for line in text.splitlines()
                if line.startswith(f'| {first_cell} '))


def cells(line):
    return [cell.strip() for cell in line.split('|')[1:-1]]


# --- service ----------------------------------------------------------------

def test_service_list_on_every_backend(migrated_engine, cli):
    service('cmp-1', node_uuid(1), node_uuid(2), cycle=0.5)
    service('cmp-2', disabled=True, disabled_reason='kernel upgrade')
    service('cmp-3', forced_down=True)
    service('cmp-4', stopped=True)
    service('cmp-5', node_uuid(3), age=600)

    listing = by_host(cli('service', 'list', '--format', 'json').json())
    assert {h: (e['state'], e['reason']) for h, e in listing.items()
            if h != 'cmp-5'} == {
        'cmp-1': ('up', None), 'cmp-2': ('down', 'disabled'),
        'cmp-3': ('down', 'forced down'), 'cmp-4': ('down', 'stopped')}
    assert listing['cmp-5']['state'] == 'down'
    assert listing['cmp-5']['reason'].startswith('no heartbeat for 6')
    assert listing['cmp-1']['nodes'] == 2
    assert listing['cmp-1']['last_cycle_seconds'] == 0.5
    assert listing['cmp-1']['last_cycle_at'].endswith('Z')
    assert listing['cmp-2']['disabled_reason'] == 'kernel upgrade'

    table = cli('service', 'list').ok().out
    for header in ('Host', 'State', 'Why down', 'Nodes', 'Last heartbeat',
                   'Last cycle (UTC)', 'Cycle (s)', 'Disabled reason'):
        assert header in table.splitlines()[1]
    assert 'kernel upgrade' in table_line(table, 'cmp-2')
    assert 'forced down' in table_line(table, 'cmp-3')
    assert '0.50' in table_line(table, 'cmp-1')


def test_service_disable_enable_force_down(sqlite_engine, cli):
    service('cmp-1', node_uuid(1))
    service('cmp-2', node_uuid(2))

    cli('service', 'disable', 'CMP-1', '--reason', 'rack maintenance').ok()
    cli('service', 'force-down', ' Cmp-2 ').ok()
    listing = by_host(cli('service', 'list', '--format', 'json').json())
    assert listing['cmp-1']['state'] == 'down'
    assert listing['cmp-1']['disabled_reason'] == 'rack maintenance'
    assert (listing['cmp-2']['state'], listing['cmp-2']['reason']) == (
        'down', 'forced down')
    table = cli('service', 'list').out
    assert 'rack maintenance' in table_line(table, 'cmp-1')
    assert 'down' in table_line(table, 'cmp-2')

    cli('service', 'enable', 'cmp-1').ok()
    cli('service', 'unset-force-down', 'cmp-2').ok()
    listing = by_host(cli('service', 'list', '--format', 'json').json())
    assert listing['cmp-1']['state'] == listing['cmp-2']['state'] == 'up'
    assert listing['cmp-1']['disabled_reason'] is None

    for action in ('disable', 'enable', 'force-down', 'unset-force-down'):
        cli('service', action, 'nope').one_line_error(
            "no ironic-compute service on host 'nope'")
    cli('service', 'disable', 'cmp-1', '--reason', 'x' * 256).one_line_error(
        'longer than 255')


# --- ring -----------------------------------------------------------------

def test_ring_show(sqlite_engine, cli):
    service('cmp-1', node_uuid(1), node_uuid(2), node_uuid(3))
    service('cmp-2', node_uuid(4))
    service('cmp-2', node_uuid(5), group='rack2')
    service('cmp-3', node_uuid(6), node_uuid(7), age=600)
    service('cmp-4')  # up, but no rows yet: joins at its first cycle
    ring = hash_ring.HashRing({'cmp-1', 'cmp-2'}, EXPONENT)

    report = cli('ring', 'show', '--format', 'json').json()
    assert report['peers'] == ['cmp-1', 'cmp-2']
    # Two ranks at least: the owner, and who takes over if it dies.
    assert (report['buckets'], report['replicas']) == (2 ** EXPONENT, 2)
    assert report['partition_key'] is None
    assert report['nodes'] == 7
    # The shares the daemons converge to, computed by the function they run
    # (bounded loads over the 7 nodes: no host above ceil(7 / 2) = 4).
    nodes = [ownership.NodeInfo(node_uuid(i)) for i in range(1, 8)]
    owners = ownership.node_ring(ring, nodes, [], 1.10).assign(
        [n.uuid for n in nodes])
    expected = collections.Counter(hosts[0] for hosts in owners.values())
    hosts = by_host(report['hosts'])
    assert {h: hosts[h]['expected_nodes'] for h in ('cmp-1', 'cmp-2')} == {
        h: float(expected[h]) for h in ('cmp-1', 'cmp-2')}
    assert max(expected.values()) <= 4
    assert report['ring_imbalance'] == pytest.approx(
        max(expected.values()) / 3.5, abs=1e-3)
    assert report['node_imbalance'] == pytest.approx(3 / 2.5)
    assert set(hosts) == {'cmp-1', 'cmp-2', 'cmp-3'}
    assert hosts['cmp-1']['nodes'] == 3
    assert hosts['cmp-3']['in_ring'] is False
    assert hosts['cmp-3']['state'].startswith('down: no heartbeat')
    # Each node has one standby: the other peer.
    assert hosts['cmp-1']['standby_for'] == expected['cmp-2']
    assert hosts['cmp-2']['standby_for'] == expected['cmp-1']

    table = cli('ring', 'show').ok().out
    assert '| Field ' in table and '| Buckets ' in table
    assert cells(table_line(table, 'Host')) == [
        'Host', 'State', 'In ring', 'Ring share', 'Expected nodes', 'Nodes',
        'First standby for']

    # The nodes of one conductor group only: cmp-2 now manages rack2.
    db_services.register(db_api.Context(), 'cmp-2', partition_key='rack2')
    report = cli('ring', 'show', '--partition-key', 'RACK2',
                 '--format', 'json').json()
    assert report['partition_key'] == 'RACK2'
    assert report['nodes'] == 1
    assert {h['host']: h['nodes'] for h in report['hosts']} == {'cmp-2': 1}
    assert report['node_imbalance'] == 1.0

    # The configured key and peer list, as the services of a partition use.
    report = cli('ring', 'show', '--format', 'json', conf=(
        '[ironic]\npartition_key = rack2\npeer_list = CMP-2,cmp-3\n')).json()
    assert report['peers'] == ['cmp-2']
    assert report['ring_imbalance'] == 1.0
    report = cli('ring', 'show', '--format', 'json',
                 conf='[ironic]\npeer_list = cmp-2\n').json()
    assert report['peers'] == ['cmp-1']  # cmp-2 is in another partition
    assert 'ignored' in report['warnings'][0]

    cli('ring', 'show', '--partition-key', 'a b').one_line_error(
        'invalid partition key')


def test_ring_show_without_live_service(sqlite_engine, cli):
    service('cmp-1', node_uuid(1), age=600)
    report = cli('ring', 'show', '--format', 'json').json()
    assert report['peers'] == []
    assert report['ring_imbalance'] is None
    assert report['hosts'][0]['nodes'] == 1
    assert report['warnings'] == [
        'no live service manages all nodes (no partition key): no service '
        'is up']


def test_ring_show_of_a_partition_nobody_manages_says_why(sqlite_engine, cli):
    service('cmp-1', node_uuid(1))
    report = cli('ring', 'show', '--partition-key', 'group-a', '--format',
                 'json').json()
    assert report['peers'] == []
    assert report['warnings'] == [
        "no live service manages partition 'group-a'; the live services "
        'manage: (all nodes)']


# --- node show ----------------------------------------------------------------

def _nodes_mapped_to(ring, host, count):
    found = [node_uuid(i) for i in range(100, 400)
             if ring.get_hosts(node_uuid(i))[0] == host]
    return found[:count]


def test_node_show_reasons(sqlite_engine, cli):
    ring = hash_ring.HashRing({'cmp-1', 'cmp-2'}, EXPONENT)
    (ring_1, ring_1b, ring_1c, pinned, gone, deleted, instance_only,
     orphan) = _nodes_mapped_to(ring, 'cmp-1', 8)
    service('cmp-1', ring_1, pinned, orphan)
    service('cmp-2', ring_1b, ring_1c)
    service('cmp-3', node_uuid(1), age=600)
    rows_without_service('gone-host', gone)
    service('cmp-1', deleted)
    compute_nodes.soft_delete(db_api.Context(), deleted, 'cmp-1')
    instance(instance_uuid(1), 'cmp-2', ring_1c)
    instance(instance_uuid(2), 'cmp-2', pinned)
    instance(instance_uuid(3), 'cmp-1', instance_only)
    with db_api.get_engine().begin() as conn:  # an instance nobody manages
        conn.execute(_instances.insert().values(
            uuid=instance_uuid(4), host=None, node=orphan, deleted=0))

    def show(node, /, **expected):
        """The report of ``node``, once checked to hold the ``expected`` values."""
        report = cli('node', 'show', node, '--format', 'json').json()
        assert {key: report[key] for key in expected} == expected, report
        return report

    # standby: who takes it if cmp-1 dies.
    show(ring_1, managed_by='cmp-1', reason='ring', ring_host='cmp-1',
         expected_host='cmp-1', standby=['cmp-2'])
    show(ring_1b.upper(), uuid=ring_1b, managed_by='cmp-2',
         reason='ring: other host', ring_host='cmp-1')
    show(ring_1c, managed_by='cmp-2', reason='own instance',
         instance=instance_uuid(1), ring_host='cmp-1', expected_host='cmp-2')
    show(pinned, managed_by='cmp-1', reason='foreign instance',
         expected_host='cmp-2')
    report = show(orphan, managed_by='cmp-1', reason='unknown instance',
                  expected_host='cmp-1')
    assert 'never touched' in report['detail']

    # The node is judged by the ring of the services that list it, whatever
    # partition this configuration names.
    report = cli('node', 'show', ring_1, '--format', 'json',
                 conf='[ironic]\npartition_key = rack9\n').json()
    assert (report['ring_host'], report['reason']) == ('cmp-1', 'ring')

    report = show(node_uuid(1), managed_by=None, reason='unmanaged', host='cmp-3')
    assert report['host_state'].startswith('down: no heartbeat')
    assert 'takes it at its next cycle' in report['detail']

    report = show(gone, managed_by=None, reason='unmanaged')
    assert 'gone-host is not a registered service' in report['detail']

    for uuid in (deleted, instance_only):
        report = show(uuid, host=None, reason='unmanaged')
        assert 'no live compute_nodes row' in report['detail']
    assert report['expected_host'] == 'cmp-1'  # its instance pins it

    table = cli('node', 'show', pinned).ok().out
    assert cells(table_line(table, 'Field')) == ['Field', 'Value']
    assert cells(table_line(table, 'Why')) == ['Why', 'foreign instance']

    cli('node', 'show', node_uuid(999)).one_line_error(
        f'no compute node {node_uuid(999)}')

    # node list says, for every live row, what node show says.
    listing = cli('node', 'list', '--format', 'json').json()
    assert [n['uuid'] for n in listing] == sorted(
        [ring_1, ring_1b, ring_1c, pinned, orphan, node_uuid(1), gone])
    for node in listing:
        report = show(node['uuid'])
        assert (node['host'], node['reason'], node['instance']) == (
            report['host'], report['reason'], report['instance'])
    assert {n['uuid'] for n in cli('node', 'list', '--host', 'CMP-2',
                                   '--format', 'json').json()} == {
        ring_1b, ring_1c}
    assert [n['uuid'] for n in cli('node', 'list', '--reason',
                                   'foreign instance', '--format',
                                   'json').json()] == [pinned]
    assert cli('node', 'list', '--partition-key', 'rack9', '--format',
               'json').json() == []
    table = cli('node', 'list', '--reason', 'unknown instance').ok().out
    assert cells(table_line(table, 'UUID')) == [
        'UUID', 'Name', 'Host', 'Conductor group', 'Why', 'Instance',
        'Resource class', 'VCPUs', 'Memory (MB)', 'Disk (GB)']
    assert orphan in table and ring_1 not in table


# --- node move ----------------------------------------------------------------

def test_node_move_on_every_backend(migrated_engine, cli):
    up_id = service('cmp-1', node_uuid(1))
    service('cmp-2', node_uuid(2))
    service('cmp-3', node_uuid(3), node_uuid(4), age=600)
    service('cmp-4', node_uuid(5), forced_down=True)
    service('cmp-5', node_uuid(6), age=600)
    instance(instance_uuid(3), 'cmp-3', node_uuid(3))

    # Refusals change nothing.
    cli('node', 'move', node_uuid(1), '--to', 'cmp-2').one_line_error(
        'from cmp-1', 'is alive (up, last heartbeat',
        'service force-down cmp-1')
    assert node_row(node_uuid(1)) == ('cmp-1', up_id)
    cli('node', 'move', node_uuid(4), '--to', 'cmp-5').one_line_error(
        'to cmp-5', 'is down (no heartbeat')
    assert node_row(node_uuid(4)).host == 'cmp-3'
    cli('node', 'move', node_uuid(4), '--to', 'cmp-3').one_line_error(
        'already on cmp-3')
    cli('node', 'move', node_uuid(4), '--to', 'nope').one_line_error(
        "no ironic-compute service on host 'nope'")
    cli('node', 'move', node_uuid(999), '--to', 'cmp-1').one_line_error(
        f'no compute node {node_uuid(999)}')

    # From a dead service: the instance follows its node.
    result = cli('node', 'move', node_uuid(3), '--to', 'CMP-2').ok()
    assert 'from cmp-3 (no heartbeat for' in result.out
    assert instance_uuid(3) in result.out
    assert node_row(node_uuid(3)) == ('cmp-2', service('cmp-2'))
    assert instance_host(instance_uuid(3)) == 'cmp-2'
    # From a forced-down service whose heartbeat is fresh.
    result = cli('node', 'move', node_uuid(5), '--to', 'cmp-1').ok()
    assert '(forced down)' in result.out
    assert node_row(node_uuid(5)) == ('cmp-1', up_id)


def test_node_move_refuses_a_disabled_source_that_is_alive(migrated_engine,
                                                            cli):
    # A disabled (or stopped) service that still heartbeats holds a valid
    # lease and keeps working: moving its node would race it.
    disabled_id = service('cmp-1', node_uuid(1), disabled=True)
    stopped_id = service('cmp-3', node_uuid(3), stopped=True)
    service('cmp-2', node_uuid(2))
    instance(instance_uuid(1), 'cmp-1', node_uuid(1))
    cli('node', 'move', node_uuid(1), '--to', 'cmp-2').one_line_error(
        f'cannot move node {node_uuid(1)} from cmp-1: that service is alive '
        '(disabled, last heartbeat', 'disabled or not',
        'stop it and wait until it has been silent for service_down_time '
        '(60 s), or run "service force-down cmp-1" first')
    cli('node', 'move', node_uuid(3), '--to', 'cmp-2').one_line_error(
        'from cmp-3: that service is alive (stopped, last heartbeat')
    assert node_row(node_uuid(1)) == ('cmp-1', disabled_id)
    assert node_row(node_uuid(3)) == ('cmp-3', stopped_id)
    assert instance_host(instance_uuid(1)) == 'cmp-1'
    # Silent for longer than service_down_time, disabled or not: it moves.
    service('cmp-1', age=61)
    result = cli('node', 'move', node_uuid(1), '--to', 'cmp-2').ok()
    assert 'from cmp-1 (no heartbeat for 61 s)' in result.out
    assert instance_host(instance_uuid(1)) == 'cmp-2'


def test_node_move_moves_only_the_instances_whose_host_is_dead(
        migrated_engine, cli):
    service('cmp-1', node_uuid(1), node_uuid(2), node_uuid(3), age=600)
    service('cmp-2')
    service('cmp-3')  # alive: keeps its instance wherever its node's row is
    service('cmp-4', disabled=True)  # alive too
    service('cmp-5', forced_down=True)  # dead by the operator's word
    instance(instance_uuid(1), 'cmp-3', node_uuid(1))
    instance(instance_uuid(2), 'cmp-4', node_uuid(2))
    instance(instance_uuid(3), 'cmp-5', node_uuid(3))
    generation = {i: db_instances.get(db_api.Context(), instance_uuid(i))
                  .generation for i in (1, 2, 3)}

    for i, host in ((1, 'cmp-3'), (2, 'cmp-4')):
        result = cli('node', 'move', node_uuid(i), '--to', 'cmp-2').ok()
        assert node_row(node_uuid(i)).host == 'cmp-2'
        assert instance_host(instance_uuid(i)) == host
        assert db_instances.get(db_api.Context(), instance_uuid(i)
                                ).generation == generation[i]
        assert 'moved with it' not in result.out
        assert (f'Instance {instance_uuid(i)} stays with {host}, which is '
                f'alive: {host} takes the node back') in result.out
    moved = admin.move_node(db_api.Context(), node_uuid(3), 'cmp-2', 60)
    assert (moved.instances, moved.stayed) == ([instance_uuid(3)], {})
    assert instance_host(instance_uuid(3)) == 'cmp-2'
    assert db_instances.get(db_api.Context(), instance_uuid(3)
                            ).generation == generation[3] + 1


def test_node_move_is_all_or_nothing(migrated_engine, cli, monkeypatch):
    source_id = service('cmp-1', node_uuid(1), age=600)
    service('cmp-2', node_uuid(2))
    instance(instance_uuid(1), 'cmp-1', node_uuid(1))
    move_instances = admin._move_instances

    def fail_after_moving_instances(*args):
        move_instances(*args)
        raise db_exc.DBError('injected failure')

    monkeypatch.setattr(admin, '_move_instances', fail_after_moving_instances)
    cli('node', 'move', node_uuid(1), '--to', 'cmp-2').one_line_error(
        'database error: injected failure')
    assert node_row(node_uuid(1)) == ('cmp-1', source_id)
    assert instance_host(instance_uuid(1)) == 'cmp-1'


# --- instances ------------------------------------------------------------

def test_instance_commands_on_every_backend(migrated_engine, cli):
    service('cmp-1', node_uuid(1))
    service('cmp-2')

    cli('instance', 'add', instance_uuid(1).upper(), '--host', 'CMP-1',
        '--node', node_uuid(1), '--vm-state', 'building').ok()
    listing = cli('instance', 'list', '--format', 'json').json()
    assert [(i['uuid'], i['host'], i['node'], i['vm_state'])
            for i in listing] == [
        (instance_uuid(1), 'cmp-1', node_uuid(1), 'building')]
    assert cli('instance', 'list', '--host', 'cmp-2', '--format',
               'json').json() == []
    table = cli('instance', 'list', '--host', 'Cmp-1').ok().out
    assert cells(table_line(table, 'UUID'))[:5] == [
        'UUID', 'Name', 'Host', 'Node', 'VM state']
    assert instance_uuid(1) in table

    cli('instance', 'add', instance_uuid(1), '--host', 'cmp-2',
        '--node', node_uuid(2)).one_line_error(
        f'instance {instance_uuid(1)} exists already')
    cli('instance', 'add', instance_uuid(2), '--host', 'cmp-2',
        '--node', node_uuid(1)).one_line_error(
        f'node {node_uuid(1)} already has instance {instance_uuid(1)}')
    cli('instance', 'add', instance_uuid(2), '--host', 'nope',
        '--node', node_uuid(2)).one_line_error(
        "no ironic-compute service on host 'nope'")
    cli('instance', 'add', 'not-a-uuid', '--host', 'cmp-2',
        '--node', node_uuid(2)).one_line_error("'not-a-uuid' is not a UUID")

    # The node show of a node pinned by an instance, then removed.
    assert cli('node', 'show', node_uuid(1), '--format', 'json').json()[
        'reason'] == 'own instance'
    cli('instance', 'remove', instance_uuid(1)).ok()
    assert cli('instance', 'list', '--format', 'json').json() == []
    with db_api.get_engine().connect() as conn:
        row = conn.execute(sa.select(_instances).where(
            _instances.c.uuid == instance_uuid(1))).one()
    assert row.deleted == row.id and row.deleted_at is not None
    cli('instance', 'remove', instance_uuid(1)).one_line_error(
        f'no instance {instance_uuid(1)}')
    # Its uuid can be used again once the record is deleted.
    cli('instance', 'add', instance_uuid(1), '--host', 'cmp-2',
        '--node', node_uuid(1)).ok()


# --- doc/cli.md shows what the commands print -------------------------------

DOC = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'doc',
                   'cli.md')
_UUID = re.compile(r'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-'
                   r'[0-9a-f]{12}')
# What differs from run to run: times, and ages in seconds.
_TIME = re.compile(r'\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?Z?')
_AGE = re.compile(r'\b\d+(\.\d+)? s\b|("heartbeat_age_seconds": )[\d.]+')
_PROGRAMS = ('ironic-compute-manage', 'ironic-compute-status')


def doc_examples():
    """(program, command args, output lines) of every example in doc/cli.md."""
    with open(DOC) as f:
        text = f.read()
    examples = []
    for block in re.findall(r'```\n(.*?)```', text, re.S):
        current = None
        for line in block.splitlines():
            words = shlex.split(line) if line.startswith('$ ') else []
            if words[1:2] and words[1] in _PROGRAMS:
                current = (words[1], words[2:], [])
                examples.append(current)
            elif current is not None:
                current[2].append(line)
    return examples


def normalised(lines):
    """``lines`` with what varies from run to run replaced, and tables
    compared by their cells (a column's width follows its values)."""
    found = []
    for line in lines:
        line = _UUID.sub('UUID', _TIME.sub('TIME', line))
        line = _AGE.sub(lambda m: (m.group(2) or '') + 'N' + (
            '' if m.group(2) else ' s'), line)
        if line.startswith('+') and set(line) <= set('+-'):
            found.append('+')
        elif line.startswith('|'):
            found.append('|'.join(cell.strip() for cell in line.split('|')))
        else:
            found.append(line.rstrip())
    return found


def assert_shows(want, got, argv):
    """The doc's lines are the output's; a "..." line in the doc stands for
    any lines of the output (a long JSON object or list, shortened)."""
    want, got = normalised(want), normalised(got)
    if '  ...' in want or '...' in want:
        cut = next(i for i, line in enumerate(want) if line.strip() == '...')
        head, tail = want[:cut], want[cut + 1:]
        assert got[:len(head)] == head, (argv, head, got)
        assert got[len(got) - len(tail):] == tail, (argv, tail, got)
    else:
        assert want == got, (argv, want, got)


# The database of the examples (see the top of doc/cli.md).
DOC_NODES = {'web': node_uuid(1), 'moving': node_uuid(3),
             'ring': node_uuid(7), 'dead': node_uuid(4)}
DOC_INSTANCE = 'bdc95192-9a95-4a43-8327-b27f7b6ac2e6'


def doc_database():
    service('cmp-1', DOC_NODES['web'], DOC_NODES['moving'], cycle=0.04)
    service('cmp-2', DOC_NODES['ring'], cycle=0.04)
    service('cmp-3', DOC_NODES['dead'], age=600)
    instance(instance_uuid(1), 'cmp-3', DOC_NODES['dead'])
    built_web_1()


# web-1's config drive, as doc/cli.md's create example gives it.
DOC_CONFIG_DRIVE = configdrive.ConfigDrive(
    ssh_keys=(public_key(),), user_data='#cloud-config\npackages: [nginx]\n',
    meta=(('role', 'web'),),
    network_data={'links': [], 'networks': [], 'services': []},
    hostname='web-1.example.com')


def built_web_1():
    """web-1, built on cmp-1 (as a service builds it: node, state, times)."""
    db_instances.create(db_api.Context(), DOC_INSTANCE, 'web-1', 'cmp-1',
                        instances.RequestSpec(
                            'baremetal', vcpus=2,
                            capabilities={'boot_mode': 'uefi'}),
                        'http://images.example.com/ubuntu.qcow2',
                        image_checksum='http://images.example.com/SHA256SUMS',
                        project_id='demo', user_id='alice',
                        **DOC_CONFIG_DRIVE.columns())
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update()
                     .where(_instances.c.uuid == DOC_INSTANCE)
                     .values(node=DOC_NODES['web'], vm_state='active',
                             task_state=None, launched_at=_utcnow(),
                             power_state='on'))


def deleted_in_doc_database():
    """web-1 deleted, as ``instance delete --wait`` leaves it."""
    ctx = db_api.Context()
    row = db_instances.request_delete(ctx, DOC_INSTANCE)
    assert db_instances.soft_delete(ctx, row)


class FakeIronicClient:
    def __init__(self, conf):
        pass

    def api(self):
        return types.SimpleNamespace(current_api_version='1.82')


def doc_console_ironic():
    """The Ironic of the console examples: the dead host's node serves
    its instance."""
    from tests.unit import fakes
    fake = fakes.FakeBaremetal([fakes.make_node(
        uuid=DOC_NODES['dead'], instance_uuid=instance_uuid(1),
        provision_state='active')])
    return lambda: fake


def _is_error(lines):
    return any(': error: ' in line for line in lines)


# What the examples of commands that need Ironic or a running service are
# compared with: the command that prints the same thing from the database.
_STAND_INS = {('instance', 'create'): ('instance', 'show', DOC_INSTANCE),
              ('instance', 'delete'): ('instance', 'show', DOC_INSTANCE)}
_COMPARED = {('service', 'list'), ('ring', 'show'), ('node', 'show'),
             ('node', 'list'), ('instance', 'show'), ('instance', 'list'),
             ('instance', 'create'), ('instance', 'delete'),
             ('instance', 'stop'), ('instance', 'start'), ('instance', 'reboot'),
             ('instance', 'rebuild'), ('instance', 'rescue'),
             ('instance', 'unrescue'), ('instance', 'console'),
             ('instance', 'add'), ('instance', 'remove'),
             ('db', 'version'), ('upgrade', 'check')}


def test_cli_doc_examples_match_the_commands(sqlite_engine, cli, in_process,
                                             tmp_path, monkeypatch):
    doc_database()
    monkeypatch.setattr(status.ironic, 'IronicClient', FakeIronicClient)
    monkeypatch.setattr(instance_console, '_client', doc_console_ironic())
    doc_conf = '[hash_ring]\npartition_exponent = 16\n'
    checked = 0
    for program, argv, lines in doc_examples():
        if tuple(argv[:2]) not in _COMPARED:
            continue
        if argv[:2] == ['instance', 'delete']:
            deleted_in_doc_database()
        if argv[:2] == ['instance', 'remove'] and DOC_INSTANCE in argv and (
                db_instances.get(db_api.Context(), DOC_INSTANCE) is None):
            built_web_1()  # the remove examples' web-1 is live again
        if program == 'ironic-compute-status':
            config = tmp_path / 'status.conf'
            config.write_text(f'[DEFAULT]\nstate_path = {tmp_path}\n' + BASE_CONF
                              + '[ironic]\nauth_type = none\n')
            result = Result(*in_process(status.main, '--config-file',
                                        str(config), *argv))
        else:
            stand_in = _STAND_INS.get(tuple(argv[:2]))
            if stand_in is not None and not _is_error(lines):
                argv = [*stand_in, *[a for a in argv
                                     if a in ('--format', 'json', 'table')]]
            result = cli(*argv, conf=doc_conf)
        if _is_error(lines):
            assert result.code == 1, (argv, result)
            assert_shows(lines, result.err.splitlines(), argv)
        else:
            # The status example shows a warning (cmp-3 is dead): exit 1.
            assert result.code == (program == 'ironic-compute-status'), (
                argv, result)
            assert_shows(lines, result.out.splitlines(), argv)
        checked += 1
    assert checked >= 20


def test_cli_doc_node_move_refusal_is_the_commands(sqlite_engine, cli):
    # The refused move of doc/cli.md: a disabled source that heartbeats.
    (program, argv, lines), = [
        example for example in doc_examples()
        if example[1][:2] == ['node', 'move'] and _is_error(example[2])]
    service('cmp-1', argv[2], disabled=True, age=4)
    service('cmp-2')
    result = cli(*argv)
    assert result.code == 1, result
    assert_shows(lines, result.err.splitlines(), argv)


def test_node_show_judges_the_instance_ironic_names(sqlite_engine, cli):
    # The cycle records the instance Ironic lists for a node; node show and
    # node list judge the node by it, as the services do.
    ring = hash_ring.HashRing({'cmp-1'}, EXPONENT)
    stray, built = _nodes_mapped_to(ring, 'cmp-1', 2)
    service('cmp-1', stray, built)
    stats = {stray: json.dumps({'instance_uuid': instance_uuid(7)}),
             built: json.dumps({'instance_uuid': instance_uuid(8)})}
    with db_api.get_engine().begin() as conn:
        for uuid, text in stats.items():
            conn.execute(_nodes.update().where(_nodes.c.uuid == uuid)
                         .values(stats=text))
        # A build whose node the database has not recorded yet.
        conn.execute(_instances.insert().values(
            uuid=instance_uuid(8), host='cmp-1', node=None, deleted=0,
            created_at=datetime.datetime(2026, 1, 1)))
    report = cli('node', 'show', stray, '--format', 'json').json()
    assert (report['reason'], report['instance']) == (
        'unknown instance', instance_uuid(7))
    assert 'never touched' in report['detail']
    report = cli('node', 'show', built, '--format', 'json').json()
    assert (report['reason'], report['instance'], report['instance_host']) == (
        'own instance', instance_uuid(8), 'cmp-1')
    listing = {n['uuid']: n['reason'] for n in cli(
        'node', 'list', '--format', 'json').json()}
    assert listing == {stray: 'unknown instance', built: 'own instance'}


def test_node_show_says_a_node_of_a_deleted_instance_is_being_reaped(
        sqlite_engine, cli):
    # Its instance was deleted here while its host was down: the node's
    # owner tears it down (takeover.InstanceKeeper), it is not left alone.
    ring = hash_ring.HashRing({'cmp-1'}, EXPONENT)
    (node,) = _nodes_mapped_to(ring, 'cmp-1', 1)
    service('cmp-1', node)
    with db_api.get_engine().begin() as conn:
        conn.execute(_nodes.update().where(_nodes.c.uuid == node).values(
            stats=json.dumps({'instance_uuid': instance_uuid(9)})))
        conn.execute(_instances.insert().values(
            uuid=instance_uuid(9), host='cmp-2', node=node, deleted=1,
            resource_class='baremetal', vm_state='deleted',
            created_at=datetime.datetime(2026, 1, 1)))
    report = cli('node', 'show', node, '--format', 'json').json()
    assert (report['managed_by'], report['reason'], report['instance']) == (
        'cmp-1', 'deleted instance', instance_uuid(9))
    assert 'cmp-1' in report['detail'] and 'reaping' in report['detail']
    assert 'never touched' not in report['detail']
    assert [n['reason'] for n in cli('node', 'list', '--reason',
                                     'deleted instance', '--format',
                                     'json').json()] == ['deleted instance']
