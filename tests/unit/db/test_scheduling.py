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

"""The scheduler in SQL on SQLite, MariaDB and PostgreSQL: the same choices
and refusals as matching every node in Python, its lock, and the checks of
``instance create --host``."""

import concurrent.futures
import dataclasses
import datetime
import random
import threading
import time
import uuid as uuidlib

import pytest
import sqlalchemy as sa

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.cluster import liveness
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import locks as db_locks
from ironic_compute.db import migration
from ironic_compute.db import models
from ironic_compute.db import node_match
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.db import services as db_services
from ironic_compute.instances import model as inst
from ironic_compute.instances import scheduler
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes

_services = models.services
_instances = models.instances
_locks = models.locks
SERVICE_DOWN_TIME = 60


def ctx():
    return db_api.Context()


def new_uuid():
    return str(uuidlib.uuid4())


def add_nodes(host, nodes):
    """Rows for ``nodes`` held by ``host``, written as its cycle writes them."""
    service_id = db_services.get_by_host(ctx(), host).id
    db_nodes.create_or_revive(
        ctx(), {n.uuid: resource_tracker.row_fields(n, ironic.node_resources(n))
                for n in nodes}, host, service_id)


def set_service(host, **values):
    with db_api.get_engine().begin() as conn:
        conn.execute(_services.update().where(_services.c.host == host)
                     .values(**values))


def schedule(spec, host=None):
    return db_scheduling.schedule_and_create(
        ctx(), new_uuid(), 'vm', spec, 'http://img', SERVICE_DOWN_TIME,
        host=host)


def outcome(spec, host=None):
    """The host chosen, or the refusal's text; nothing stays written."""
    try:
        row = schedule(spec, host)
    except (exception.NoValidHost, exception.RequestRefused) as exc:
        return str(exc)
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.delete().where(_instances.c.uuid == row.uuid))
    return row.host


def per_node_outcome(spec, hosts):
    """What the scheduler chose before it matched in SQL: every row of the
    live hosts decoded and matched in Python (kept here as the reference)."""
    offers = {h: [o for o in db_nodes.offers_of(ctx(), h)
                  if spec.partition_key is None
                  or group_of(o.uuid) == spec.partition_key] for h in hosts}
    busy = {i.node for i in db_instances.list_instances(ctx()) if i.node}
    states, every_offer = [], []
    for host in hosts:
        mine = [i for i in db_instances.list_instances(ctx(), host)]
        waiting = sum(1 for i in mine if i.node is None and i.task_state in (
            inst.SCHEDULED, inst.SPAWNING))
        free = len(inst.match_nodes(spec, offers[host], busy).candidates)
        states.append(scheduler.HostState(host, free - waiting, len(mine)))
        every_offer += offers[host]
    why = (inst.match_nodes(spec, every_offer, busy).fault
           or f'no free node for {spec.describe()} (all are being built on)')
    try:
        return scheduler.pick_host(states, why)
    except exception.NoValidHost as exc:
        return str(exc)


def group_of(node_uuid):
    with db_api.get_engine().connect() as conn:
        return conn.execute(sa.select(models.compute_nodes.c.conductor_group).where(
            models.compute_nodes.c.uuid == node_uuid)).scalar_one()


def random_node(rng, group):
    return fakes.make_node(
        conductor_group=group, cpus=rng.choice((2, 8, 32)),
        memory_mb=rng.choice((4096, 65536)), local_gb=rng.choice((10, 500)),
        resource_class=rng.choice(('baremetal', 'baremetal', 'gpu', None)),
        provision_state=rng.choice(('available', 'available', 'active',
                                    'manageable')),
        traits=rng.sample(('CUSTOM_A', 'CUSTOM_B', 'CUSTOM_X_1'),
                          rng.randint(0, 2)),
        capabilities=rng.choice(('', 'boot_mode:uefi', 'boot_mode:bios',
                                 'boot_mode:uefi,has_gpu:true',
                                 'boot_mode:UEFI')))


SPECS = [
    inst.RequestSpec(resource_class='baremetal'),
    inst.RequestSpec(resource_class='baremetal', vcpus=8, memory_mb=65536),
    inst.RequestSpec(resource_class='baremetal', disk_gb=500,
                     traits=frozenset({'CUSTOM_A'})),
    inst.RequestSpec(resource_class='gpu', traits=frozenset({'CUSTOM_A',
                                                             'CUSTOM_B'})),
    # '_' is a wildcard of LIKE: CUSTOM_X_1 must not match CUSTOMAX01.
    inst.RequestSpec(resource_class='baremetal',
                     traits=frozenset({'CUSTOM_X_1'})),
    inst.RequestSpec(resource_class='baremetal', partition_key='g2'),
    inst.RequestSpec(resource_class='baremetal', vcpus=64),
    inst.RequestSpec(resource_class='tiny'),
    inst.RequestSpec(resource_class='baremetal',
                     capabilities={'boot_mode': 'uefi'}),
    inst.RequestSpec(resource_class='baremetal',
                     capabilities={'boot_mode': 'uefi', 'has_gpu': 'true'}),
    inst.RequestSpec(resource_class='baremetal', disk_gb=10, swap_mb=1,
                     capabilities={'has_gpu': 'false'}),
]


@pytest.mark.parametrize('seed', [1, 2])
def test_same_choices_and_refusals_as_matching_every_node(migrated_engine,
                                                          seed):
    rng = random.Random(seed)
    hosts = ['a', 'b', 'c', 'd']
    groups = {'a': 'g1', 'b': 'g1', 'c': 'g2', 'd': 'g2'}
    for host in hosts:
        db_services.register(ctx(), host, partition_key=groups[host])
        add_nodes(host, [random_node(rng, groups[host])
                         for _ in range(rng.randint(0, 12))])
    # Some nodes carry instances, some builds wait for a node.
    nodes = [(h, o.uuid) for h in hosts for o in db_nodes.offers_of(ctx(), h)]
    for host, node in rng.sample(nodes, len(nodes) // 4):
        db_instances.create(ctx(), new_uuid(), 'x', host, SPECS[0], '')
        with db_api.get_engine().begin() as conn:
            conn.execute(_instances.update().where(_instances.c.node.is_(None),
                                                   _instances.c.host == host)
                         .values(node=node, vm_state=inst.ACTIVE,
                                 task_state=None))
    for host in rng.sample(hosts, 2):
        db_instances.create(ctx(), new_uuid(), 'x', host, SPECS[0], '')
    compared = []
    for spec in SPECS:
        live = [h for h in hosts if spec.partition_key in (None, groups[h])]
        expected = per_node_outcome(spec, live)
        assert outcome(spec) == expected, spec
        compared.append(expected)
    # The cases cover both choices and refusals.
    assert any(c in hosts for c in compared)
    assert any(c not in hosts for c in compared)


def test_a_roomy_host_is_no_roomier_beyond_the_count(migrated_engine):
    # Free nodes are counted up to FREE_NODES_COUNTED: past it, the tie
    # (same instance count) goes to the first name.
    counted = scheduler.FREE_NODES_COUNTED
    for host, count in (('a', counted + 1), ('b', counted + 5), ('c', 2)):
        db_services.register(ctx(), host)
        add_nodes(host, [fakes.make_node() for _ in range(count)])
    spec = inst.RequestSpec(resource_class='baremetal')
    assert outcome(spec) == 'a'
    assert per_node_outcome(spec, ['a', 'b', 'c']) == 'a'


@db_api.context_manager.reader
def free_counts(ctx, spec, limits):
    return node_match.free_counts(ctx, spec, limits)


def test_free_nodes_are_counted_exactly_up_to_each_hosts_limit(
        migrated_engine):
    # Around the limit (waiting builds + FREE_NODES_COUNTED, one limit per
    # number of waiting builds): the count the database makes is every
    # free matching node, up to the limit, as matching every node says.
    counted = scheduler.FREE_NODES_COUNTED
    layout = {'a': (counted + 1, 1), 'b': (counted, 0), 'c': (counted - 1, 0),
              'd': (counted + 3, 2), 'e': (counted + 1, 3), 'f': (0, 1),
              'g': (counted + 1, 0)}
    for host, (free, waiting) in layout.items():
        db_services.register(ctx(), host)
        add_nodes(host, [fakes.make_node() for _ in range(free)]
                  + [fakes.make_node(cpus=1) for _ in range(2)])
        for _ in range(waiting):
            db_instances.create(ctx(), new_uuid(), 'x', host, SPECS[0], '')
    spec = inst.RequestSpec(resource_class='baremetal', vcpus=2)
    limits = {host: waiting + counted
              for host, (_, waiting) in layout.items()}
    assert db_scheduling.host_loads(ctx(), layout) == {
        host: (waiting, waiting) for host, (_, waiting) in layout.items()}
    assert free_counts(ctx(), spec, limits) == {host: min(count, limits[host])
                    for host, (count, _) in layout.items() if count}
    assert outcome(spec) == per_node_outcome(spec, sorted(layout))



def test_any_number_of_hosts_is_counted_by_a_few_statement_shapes(
        migrated_engine):
    # The hosts asked about vary with their instance counts: on PostgreSQL
    # the VALUES list is padded to a power of two (rows that probe
    # nothing), so that a few compiled statements serve every request.
    hosts = [f'h{i:02d}' for i in range(12)]
    for i, host in enumerate(hosts):
        db_services.register(ctx(), host)
        add_nodes(host, [fakes.make_node() for _ in range(i % 4)])
    spec = inst.RequestSpec(resource_class='baremetal')
    node_match._compiled.cache_clear()
    for count in range(1, len(hosts) + 1):
        limits = {host: 2 for host in hosts[:count]}
        assert free_counts(ctx(), spec, limits) == {
            host: min(i % 4, 2) for i, host in enumerate(hosts[:count])
            if i % 4}, count
    shapes = node_match._compiled.cache_info().currsize
    assert shapes == (2 if migrated_engine.dialect.name == 'postgresql'
                      else 0)
    assert [node_match._padded(n) for n in (1, 8, 9, 100, 128, 129)] == [
        8, 8, 16, 128, 128, 256]

def test_the_live_hosts_are_the_ones_the_liveness_rules_say(
        migrated_engine):
    old = datetime.datetime(2020, 1, 1)

    def ago(seconds):
        return models._utcnow() - datetime.timedelta(seconds=seconds)
    states = {'up': {}, 'disabled': {'disabled': True},
              'forced': {'forced_down': True},
              'stopped': {'stopped_at': models._utcnow()},
              'never': {'last_seen_up': None}, 'dead': {'last_seen_up': old},
              # Either side of service_down_time (the database's clock).
              'recent': {'last_seen_up': ago(SERVICE_DOWN_TIME - 5)},
              'late': {'last_seen_up': ago(SERVICE_DOWN_TIME + 5)},
              'other-group': {'partition_key': 'g2'}}
    for host, values in states.items():
        db_services.register(ctx(), host, partition_key='g1')
        add_nodes(host, [fakes.make_node()])
        set_service(host, **values)
    listing = db_services.load_services(ctx(), count_nodes=False)
    for group in (None, 'g1', 'g2'):
        spec = inst.RequestSpec(resource_class='baremetal',
                                partition_key=group)
        expected = [s.host for s in listing.rows
                    if liveness.is_up(s.record(), listing.now,
                                       SERVICE_DOWN_TIME)
                    and group in (None, s.partition_key)]
        assert db_scheduling._candidates(
            ctx(), spec, SERVICE_DOWN_TIME, None) == expected
        if group is None:
            assert sorted(expected) == ['other-group', 'recent', 'up']


def test_refusals_name_what_did_not_match(migrated_engine):
    db_services.register(ctx(), 'a')
    add_nodes('a', [fakes.make_node(), fakes.make_node(cpus=2),
                    fakes.make_node(provision_state='active')])
    assert outcome(inst.RequestSpec(resource_class='baremetal', vcpus=4,
                                    traits=frozenset({'CUSTOM_Q'}))) == (
        'no free node for resource class baremetal, 4 vcpus, traits CUSTOM_Q '
        '(1 not available; 1 with too few vcpus; 1 without the traits), on the '
        '1 live services')
    db_services.register(ctx(), 'b')
    assert outcome(inst.RequestSpec(resource_class='baremetal')) == 'a'
    assert outcome(inst.RequestSpec(resource_class='baremetal',
                                    partition_key='g9')) == (
        'no live ironic-compute service to build on')


def test_a_request_reads_a_few_rows_per_host(migrated_engine):
    for host in ('a', 'b'):
        db_services.register(ctx(), host)
        add_nodes(host, [fakes.make_node() for _ in range(30)])
    fetched = []

    def count_rows(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith('SELECT') and cursor.description:
            fetched.append(cursor.rowcount)
    sa.event.listen(migrated_engine, 'after_cursor_execute', count_rows)
    try:
        schedule(inst.RequestSpec(resource_class='baremetal'))
    finally:
        sa.event.remove(migrated_engine, 'after_cursor_execute', count_rows)
    # services, clock, loads, free counts, the new row: never the 60 nodes.
    assert len(fetched) <= 8
    assert all(rows <= 2 or rows == -1 for rows in fetched), fetched



def _free_count_statements(monkeypatch, spec):
    """The choice, and the hosts each free-count statement asked about."""
    asked = []
    counts = node_match.free_counts

    def recording(ctx, spec, limits, partition_key=None):
        asked.append(sorted(limits))
        return counts(ctx, spec, limits, partition_key)
    monkeypatch.setattr(node_match, 'free_counts', recording)
    try:
        return outcome(spec), asked
    finally:
        monkeypatch.setattr(node_match, 'free_counts', counts)


def test_free_nodes_are_counted_on_the_hosts_with_the_fewest_instances_first(
        migrated_engine, monkeypatch):
    # a and b have no instance, c has one: when a or b has room, c's free
    # nodes are not counted (c cannot win); when neither has, they are.
    spec = inst.RequestSpec(resource_class='baremetal', vcpus=2)
    for host, free in (('a', 0), ('b', 2), ('c', 5)):
        db_services.register(ctx(), host)
        add_nodes(host, [fakes.make_node() for _ in range(free)]
                  + [fakes.make_node(cpus=1)])
    db_instances.create(ctx(), new_uuid(), 'x', 'c', SPECS[0], '')
    assert _free_count_statements(monkeypatch, spec) == ('b', [['a', 'b']])
    assert per_node_outcome(spec, ['a', 'b', 'c']) == 'b'
    # Two builds wait on b, for its two free nodes: a alone has the fewest
    # instances, and no room; b and c are counted next.
    for _ in range(2):
        db_instances.create(ctx(), new_uuid(), 'x', 'b', SPECS[0], '')
    assert _free_count_statements(monkeypatch, spec) == (
        'c', [['a'], ['b', 'c']])
    assert per_node_outcome(spec, ['a', 'b', 'c']) == 'c'
    # No room anywhere: the refusal is worded as before.
    for _ in range(5):
        db_instances.create(ctx(), new_uuid(), 'x', 'c', SPECS[0], '')
    assert _free_count_statements(monkeypatch, spec) == (
        per_node_outcome(spec, ['a', 'b', 'c']), [['a'], ['b', 'c']])


# --- the lock ---------------------------------------------------------------

def lock_generation():
    with db_api.get_engine().connect() as conn:
        return conn.execute(sa.select(_locks.c.generation).where(
            _locks.c.name == db_locks.SCHEDULER)).scalar()


def test_the_migration_makes_the_lock_row(database):
    engine = sa.create_engine(database.url)
    try:
        migration.upgrade('head', engine=engine)
        with engine.connect() as conn:
            assert conn.execute(sa.select(_locks.c.name, _locks.c.generation)
                                ).all() == [(db_locks.SCHEDULER, 0)]
    finally:
        engine.dispose()


def test_each_request_takes_the_lock_row_and_remakes_it_if_missing(
        migrated_engine):
    db_services.register(ctx(), 'a')
    add_nodes('a', [fakes.make_node() for _ in range(3)])
    spec = inst.RequestSpec(resource_class='baremetal')
    with migrated_engine.begin() as conn:
        conn.execute(_locks.delete())
    schedule(spec)
    assert lock_generation() == 1
    schedule(spec)
    assert lock_generation() == 2


@pytest.mark.parametrize('hosts, nodes_each', [(['a'], 1), (['a', 'b', 'c'], 2)])
def test_concurrent_requests_never_share_the_last_free_node(migrated_engine,
                                                            hosts, nodes_each):
    for host in hosts:
        db_services.register(ctx(), host)
        add_nodes(host, [fakes.make_node() for _ in range(nodes_each)])
    spec = inst.RequestSpec(resource_class='baremetal')
    start = threading.Barrier(8)

    def request(_):
        start.wait()
        try:
            return schedule(spec).host
        except exception.NoValidHost:
            return None
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        placed = [h for h in pool.map(request, range(8)) if h is not None]
    assert sorted(placed) == sorted(hosts * nodes_each)


# SQLite has a single writer: no lock wait to bound, no idle holder.
_servers_only = pytest.mark.parametrize('migrated_engine',
                                        ['mysql', 'postgresql'],
                                        indirect=True)


def _hold_lock(seconds, taken):
    """Take the scheduler lock in a transaction, then stay idle in it."""
    holder = db_api.Context()
    try:
        with (db_api.context_manager.writer.using(holder),
              db_locks.held(holder, db_locks.SCHEDULER)):
            taken.set()
            time.sleep(seconds)
    except Exception:  # noqa: BLE001 - the server ended the idle session
        return False
    return True


@_servers_only
def test_a_busy_lock_is_refused_in_one_line_and_a_paused_holder_is_ended(
        migrated_engine, monkeypatch):
    monkeypatch.setattr(db_locks, 'WAIT_SECONDS', 1)
    monkeypatch.setattr(db_locks, 'HOLD_SECONDS', 2)
    db_services.register(ctx(), 'a')
    add_nodes('a', [fakes.make_node()])
    spec = inst.RequestSpec(resource_class='baremetal')
    taken = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_hold_lock, 6, taken)
        assert taken.wait(10)
        started = time.monotonic()
        with pytest.raises(exception.RequestRefused) as refused:
            schedule(spec)
        assert time.monotonic() - started < 3
        assert str(refused.value) == ('another request held the scheduler '
                                      'lock for more than 1 s; try again')
        # The holder stays idle: the server ends it after HOLD_SECONDS,
        # long before its 6 s are over, and a request goes through.
        time.sleep(2)
        assert schedule(spec).host == 'a'
        assert time.monotonic() - started < 5.5
        assert holder.result() is False


@_servers_only
def test_db_sync_and_heartbeats_never_wait_for_a_scheduler(
        migrated_engine):
    service_id = db_services.register(ctx(), 'a')
    taken = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_hold_lock, 3, taken)
        assert taken.wait(10)
        started = time.monotonic()
        migration.sync(migrated_engine)
        db_services.heartbeat(ctx(), service_id)
        assert time.monotonic() - started < 2
        assert holder.result() is True


# --- instance create --host -------------------------------------------------

def test_a_host_given_gets_the_schedulers_checks(migrated_engine):
    for host, group in (('a', 'g1'), ('b', 'g2')):
        db_services.register(ctx(), host, partition_key=group)
        add_nodes(host, [fakes.make_node(conductor_group=group)])
    spec = inst.RequestSpec(resource_class='baremetal')
    in_g2 = inst.RequestSpec(resource_class='baremetal', partition_key='g2')
    assert outcome(spec, host='a') == 'a'
    assert outcome(in_g2, host='b') == 'b'
    assert outcome(in_g2, host='a') == (
        "ironic-compute service 'a' manages conductor group g1, not "
        "conductor group g2")
    assert outcome(inst.RequestSpec(resource_class='gpu'), host='a') == (
        'no free node for resource class gpu (1 of another resource class), '
        "on ironic-compute service 'a'")
    schedule(spec, host='a')  # waits for a's only node
    assert outcome(spec, host='a') == (
        'no free node for resource class baremetal (all are being built on), '
        "on ironic-compute service 'a'")
    set_service('b', last_seen_up=datetime.datetime(2020, 1, 1))
    assert outcome(spec, host='b').startswith(
        "ironic-compute service 'b' takes no builds: no heartbeat for ")
    set_service('b', last_seen_up=models._utcnow(), disabled=True,
                disabled_reason='maintenance')
    assert outcome(spec, host='b') == (
        "ironic-compute service 'b' takes no builds: disabled (maintenance)")
    set_service('b', disabled=False, forced_down=True)
    assert outcome(spec, host='b') == (
        "ironic-compute service 'b' takes no builds: forced down")
    assert outcome(spec, host='zz') == "no ironic-compute service 'zz'"


def test_the_migration_fills_the_columns_in_from_stats(database):
    engine = sa.create_engine(database.url)
    nodes = sa.table('compute_nodes', sa.column('uuid'), sa.column('stats'),
                     sa.column('vcpus_used'), sa.column('deleted'),
                     sa.column('created_at'))
    try:
        migration.upgrade('0009', engine=engine)
        with engine.begin() as conn:
            conn.execute(nodes.insert(), [
                {'uuid': 'free', 'vcpus_used': 0, 'deleted': 0,
                 'stats': '{"available": true, "traits": ["CUSTOM_B", "CUSTOM_A"]}',
                 'created_at': models._utcnow()},
                {'uuid': 'deployed', 'vcpus_used': 0, 'deleted': 0,
                 'stats': '{"available": false}', 'created_at': models._utcnow()},
                {'uuid': 'old', 'vcpus_used': 4, 'deleted': 0, 'stats': None,
                 'created_at': models._utcnow()}])
        migration.upgrade('head', engine=engine)
        table = models.compute_nodes
        with engine.connect() as conn:
            rows = dict((u, (a, t)) for u, a, t in conn.execute(
                sa.select(table.c.uuid, table.c.available, table.c.traits)))
        assert rows == {'free': (True, '|CUSTOM_A|CUSTOM_B|'),
                        'deployed': (False, '|'), 'old': (False, '|')}
    finally:
        engine.dispose()


def test_the_row_a_request_returns_is_the_row_stored(migrated_engine):
    # Made from the values inserted (no read-back under the lock).
    db_services.register(ctx(), 'a', partition_key='g1')
    add_nodes('a', [fakes.make_node(conductor_group='g1',
                                    traits=['CUSTOM_B', 'CUSTOM_A'])])
    spec = inst.RequestSpec(resource_class='baremetal', vcpus=2,
                            memory_mb=1024, disk_gb=10,
                            traits=frozenset({'CUSTOM_A', 'CUSTOM_B'}),
                            partition_key='g1')
    row = schedule(spec)
    assert row == db_instances.get(ctx(), row.uuid)
    assert (row.host, row.generation, row.spec()) == ('a', 0, spec)


@pytest.mark.parametrize('node_rc, asked_rc', [('baremetal', 'BAREMETAL'),
                                               ('BAREMETAL', 'baremetal'),
                                               ('baremetal', 'Baremetal')])
def test_a_resource_class_matches_exactly_on_every_backend(
        migrated_engine, node_rc, asked_rc):
    # As instances.match_nodes matches in Python: a resource class that
    # differs only in case is another one (MariaDB's default collation
    # compared them without case until migration 0011).
    db_services.register(ctx(), 'a')
    add_nodes('a', [fakes.make_node(resource_class=node_rc)])
    spec = inst.RequestSpec(resource_class=asked_rc)
    assert outcome(spec) == per_node_outcome(spec, ['a'])
    assert outcome(spec).startswith('no free node')
    assert free_counts(ctx(), spec, {'a': 9}) == {}
    assert outcome(inst.RequestSpec(resource_class=node_rc)) == 'a'


@pytest.mark.parametrize('node_traits', [('custom_gpu',), ('CUSTOM_Gpu',),
                                         ('CUSTOM_GPu', 'CUSTOM_X')])
def test_a_trait_matches_exactly_on_every_backend(migrated_engine,
                                                  node_traits):
    # A request's traits are upper case (RequestSpec checks them); a node
    # whose trait differs in case does not have it.
    db_services.register(ctx(), 'a')
    add_nodes('a', [fakes.make_node(traits=node_traits)])
    spec = inst.RequestSpec(resource_class='baremetal',
                            traits=frozenset({'CUSTOM_GPU'}))
    assert outcome(spec) == per_node_outcome(spec, ['a'])
    assert outcome(spec) == (
        'no free node for resource class baremetal, traits CUSTOM_GPU (1 '
        'without the traits), on the 1 live services')
    assert free_counts(ctx(), spec, {'a': 9}) == {}


def test_a_trait_matches_only_itself(migrated_engine):
    # "_" is a wildcard of LIKE, and one trait may be part of another.
    db_services.register(ctx(), 'a')
    add_nodes('a', [fakes.make_node(traits=('CUSTOM_AXB', 'CUSTOM_LONGER'))])
    for asked in ('CUSTOM_A_B', 'CUSTOM_LONG', 'CUSTOM_A', 'LONGER'):
        spec = inst.RequestSpec(resource_class='baremetal',
                                traits=frozenset({asked}))
        assert outcome(spec).startswith('no free node'), asked
        assert free_counts(ctx(), spec, {'a': 9}) == {}
    spec = inst.RequestSpec(resource_class='baremetal',
                            traits=frozenset({'CUSTOM_AXB', 'CUSTOM_LONGER'}))
    assert outcome(spec) == 'a'


def test_capabilities_are_matched_exactly_in_sql(migrated_engine):
    # As written in the node's properties: another case, a capability the
    # node lacks and a node without capabilities all fail the check, and
    # the refusal says so.
    db_services.register(ctx(), 'a')
    uefi_gpu = fakes.make_node(capabilities='boot_mode:uefi,has_gpu:true')
    add_nodes('a', [uefi_gpu, fakes.make_node(capabilities='boot_mode:UEFI'),
                    fakes.make_node()])
    [uefi_gpu_row] = [o for o in db_nodes.offers_of(ctx(), 'a')
                      if o.uuid == uefi_gpu.uuid]
    for capabilities in ({'boot_mode': 'uefi'},
                         {'boot_mode': 'uefi', 'has_gpu': 'true'}):
        spec = inst.RequestSpec('baremetal', capabilities=capabilities)
        assert free_counts(ctx(), spec, {'a': 5}) == {'a': 1}
        assert inst.match_nodes(spec, [uefi_gpu_row]).candidates == (
            uefi_gpu.uuid,)
    spec = inst.RequestSpec('baremetal', capabilities={'boot_mode': 'Uefi'})
    assert outcome(spec) == (
        'no free node for resource class baremetal, capabilities '
        'boot_mode=Uefi (3 without boot_mode=Uefi), on the 1 live services')
    spec = inst.RequestSpec('baremetal', capabilities={'has_gpu': 'false'})
    assert free_counts(ctx(), spec, {'a': 5}) == {}
    assert outcome(spec) == per_node_outcome(spec, ['a'])
    # Each capability the nodes lacked is named, a node counted under the
    # first one it lacks, in the order asked; the same in SQL and per node.
    spec = inst.RequestSpec('baremetal', capabilities={'boot_mode': 'UEFI',
                                                       'has_gpu': 'true'})
    assert outcome(spec) == (
        'no free node for resource class baremetal, capabilities '
        'boot_mode=UEFI,has_gpu=true (2 without boot_mode=UEFI; 1 without '
        'has_gpu=true), on the 1 live services')
    assert outcome(spec) == per_node_outcome(spec, ['a'])


def test_the_disk_holds_root_ephemeral_and_swap(migrated_engine):
    db_services.register(ctx(), 'a')
    add_nodes('a', [fakes.make_node(local_gb=100)])
    fits = inst.RequestSpec('baremetal', disk_gb=60, ephemeral_gb=39,
                            swap_mb=1024)
    assert free_counts(ctx(), fits, {'a': 5}) == {'a': 1}
    too_big = dataclasses.replace(fits, swap_mb=1025)  # 2 GB of disk
    assert free_counts(ctx(), too_big, {'a': 5}) == {}
    assert outcome(too_big) == (
        'no free node for resource class baremetal, 60 GB disk, 39 GB '
        'ephemeral, 1025 MB swap (1 with too little disk), on the 1 live '
        'services')
