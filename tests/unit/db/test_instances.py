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

"""Instance requests in the database, on SQLite, MariaDB and PostgreSQL:
scheduling, conditional transitions, takeover."""

import concurrent.futures
import dataclasses
import datetime
import uuid as uuidlib

import pytest
import sqlalchemy as sa

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import models
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.db import services as db_services
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst
from ironic_compute.instances import takeover
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes

SPEC = inst.RequestSpec(resource_class='baremetal', vcpus=2)
SETTINGS = resource_tracker.Settings(partition_exponent=8, service_down_time=6,
                                     takeover_grace=30)
_services = models.services
_instances = models.instances


def ctx():
    return db_api.Context()


def new_uuid():
    return str(uuidlib.uuid4())


def cluster(hosts, nodes_each=0, nodes=()):
    """Register ``hosts`` and let their trackers share ``nodes``."""
    fake = fakes.FakeIronic(list(nodes) or [
        fakes.make_node() for _ in range(nodes_each * len(hosts))])
    trackers = {h: resource_tracker.ResourceTracker(
        h, db_services.register(ctx(), h), fake) for h in hosts}
    run(trackers.values())
    return fake, trackers


def set_service(host, **values):
    with db_api.get_engine().begin() as conn:
        conn.execute(_services.update().where(_services.c.host == host)
                     .values(**values))


def schedule(spec=SPEC, host=None):
    return db_scheduling.schedule_and_create(
        ctx(), new_uuid(), 'vm', spec, 'http://img', 60, host=host)


def live_instances():
    with db_api.get_engine().connect() as conn:
        return conn.execute(sa.select(_instances.c.uuid, _instances.c.host,
                                      _instances.c.node)
                            .where(_instances.c.deleted == 0)).all()


def test_the_host_with_the_fewest_instances_gets_the_build(migrated_engine):
    cluster(['a', 'b', 'c'], nodes_each=10)
    hosts = [schedule().host for _ in range(9)]
    assert sorted(hosts.count(h) for h in 'abc') == [3, 3, 3]


def test_requests_made_at_once_spread_evenly_and_never_overbook(migrated_engine):
    fake, _ = cluster(['a', 'b', 'c'], nodes_each=3)
    held = {h: len(db_nodes.offers_of(ctx(), h)) for h in 'abc'}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: _try_schedule(), range(12)))
    made = [r for r in results if r is not None]
    # 9 free nodes: 9 requests recorded, the 3 others refused.
    assert len(made) == 9
    for host in 'abc':
        assert sum(1 for r in made if r.host == host) == held[host]


def _try_schedule():
    try:
        return schedule()
    except exception.NoValidHost:
        return None


def test_no_candidate_writes_nothing(migrated_engine):
    cluster(['a'], nodes_each=2)
    with pytest.raises(exception.NoValidHost) as raised:
        schedule(inst.RequestSpec(resource_class='gpu'))
    assert str(raised.value) == ('no free node for resource class gpu '
                                 '(2 of another resource class), on the 1 '
                                 'live services')
    assert live_instances() == []


def test_dead_disabled_and_other_partitions_get_no_builds(migrated_engine):
    cluster(['a', 'b', 'c'], nodes_each=6)
    set_service('a', last_seen_up=datetime.datetime(2020, 1, 1))
    set_service('b', disabled=True)
    assert {schedule().host for _ in range(2)} == {'c'}
    with pytest.raises(exception.NoValidHost):
        schedule(inst.RequestSpec(resource_class='baremetal',
                                  partition_key='rack-9'))


def test_nodes_of_instances_and_waiting_builds_are_not_free(migrated_engine):
    fake, _ = cluster(['a'], nodes_each=2)
    node = next(iter(fake.nodes))
    db_instances.create(ctx(), new_uuid(), 'x', 'a', SPEC, '')
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().values(node=node))
    schedule()  # the second node, waiting for its build
    with pytest.raises(exception.NoValidHost, match='all are being built on'):
        schedule()


def test_a_forced_host_is_recorded_if_it_passes_the_checks(migrated_engine):
    # More --host refusals: tests/unit/db/test_scheduling.py.
    cluster(['a'], nodes_each=1)
    assert schedule(host='a').host == 'a'
    with pytest.raises(exception.RequestRefused, match="no ironic-compute service 'zz'"):
        schedule(host='zz')


def test_transitions_are_conditional_on_the_state_seen(migrated_engine):
    cluster(['a'], nodes_each=1)
    row = schedule(host='a')
    assert row.vm_state == inst.BUILDING and row.task_state == inst.SCHEDULED
    assert db_instances.transition(ctx(), row, inst.SCHEDULED,
                                   task_state=inst.SPAWNING)
    assert not db_instances.transition(ctx(), row, inst.SCHEDULED,
                                       task_state=inst.SPAWNING)
    other_host = dataclasses.replace(row, host='b')
    assert not db_instances.transition(ctx(), other_host, inst.SPAWNING,
                                       vm_state=inst.ACTIVE)
    older = dataclasses.replace(row, generation=row.generation - 1)
    assert not db_instances.transition(ctx(), older, inst.SPAWNING,
                                       vm_state=inst.ACTIVE)
    # A delete during the build: the build can no longer write "active".
    assert db_instances.request_delete(ctx(), row.uuid).task_state == inst.DELETING
    assert not db_instances.transition(ctx(), row, inst.SPAWNING,
                                       vm_state=inst.ACTIVE)
    deleting = db_instances.pending(ctx(), 'a')[0]
    assert deleting.task_state == inst.DELETING
    assert not db_instances.soft_delete(ctx(), older)
    # The row as the build read it: written since (another version).
    assert not db_instances.soft_delete(ctx(), row)
    assert db_instances.soft_delete(ctx(), deleting)
    assert db_instances.get(ctx(), row.uuid) is None
    gone = db_instances.get(ctx(), row.uuid, deleted=True)
    assert (gone.vm_state, gone.task_state) == (inst.DELETED, None)
    assert db_instances.request_delete(ctx(), row.uuid) is None


def test_deleted_builds_are_known_records_made_elsewhere_are_not(migrated_engine):
    cluster(['a'], nodes_each=1)
    built_row = schedule(host='a')
    built = built_row.uuid
    assert db_instances.soft_delete(ctx(),
                                    db_instances.request_delete(ctx(), built))
    recorded = new_uuid()
    with db_api.get_engine().begin() as conn:  # what "instance add" writes
        conn.execute(_instances.insert().values(
            uuid=recorded, host='a', deleted=0,
            created_at=datetime.datetime(2026, 1, 1)))
        conn.execute(_instances.update().where(_instances.c.uuid == recorded)
                     .values(deleted=_instances.c.id))
    assert db_instances.deleted_builds(ctx(), {built, recorded, new_uuid()}) == {built}


# --- takeover ----------------------------------------------------------------

def pin(instance_uuid, host, node):
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.insert().values(
            uuid=instance_uuid, host=host, node=node, deleted=0,
            vm_state=inst.ACTIVE, resource_class='baremetal',
            created_at=datetime.datetime(2026, 1, 1)))


def node_owner(uuid):
    with db_api.get_engine().connect() as conn:
        return conn.execute(sa.select(models.compute_nodes.c.host).where(
            models.compute_nodes.c.uuid == uuid,
            models.compute_nodes.c.deleted == 0)).scalar_one()


def silence(host, seconds):
    set_service(host, last_seen_up=_utcnow()
                - datetime.timedelta(seconds=seconds))


def run(trackers, rounds=2):
    # Each heartbeats before its cycle, as the daemon's heartbeat thread
    # keeps doing: on a slow machine a cycle could otherwise find its own
    # heartbeat older than the lease (service_down_time / 2) and rejoin.
    for _ in range(rounds):
        for tracker in trackers:
            db_services.heartbeat(ctx(), tracker.service_id)
            tracker.run_cycle(SETTINGS)


def test_instances_of_a_dead_host_move_after_the_grace_only(migrated_engine):
    fake, trackers = cluster(['a', 'b', 'c'], nodes_each=8)
    a_nodes = [u for u in fake.nodes if node_owner(u) == 'a'][:3]
    assert len(a_nodes) == 3
    instances = {new_uuid(): node for node in a_nodes}
    for uuid, node in instances.items():
        pin(uuid, 'a', node)
    survivors = [trackers['b'], trackers['c']]
    silence('a', 20)  # down, but within the grace of 30 s
    run(survivors)
    assert {h for _, h, _ in live_instances()} == {'a'}
    silence('a', 35)  # the grace counts from being judged down (6 s)
    run(survivors)
    assert {h for _, h, _ in live_instances()} == {'a'}
    silence('a', 37)
    run(survivors)
    rows = live_instances()
    assert len(rows) == 3 and {h for _, h, _ in rows} <= {'b', 'c'}
    for uuid, host, node in rows:
        assert node == instances[uuid] and node_owner(node) == host
    # A service that comes back does not take them back.
    set_service('a', last_seen_up=_utcnow())
    run(list(trackers.values()))
    assert {h for _, h, _ in live_instances()} <= {'b', 'c'}


def test_queued_requests_of_a_dead_host_are_taken_over(migrated_engine):
    _, trackers = cluster(['a', 'b'], nodes_each=2)
    queued = schedule(host='a')
    silence('a', 100)
    run([trackers['b']])
    assert db_instances.get(ctx(), queued.uuid).host == 'b'
    assert db_instances.pending(ctx(), 'b')[0].uuid == queued.uuid


def test_a_queued_build_stays_in_its_dead_hosts_conductor_group(migrated_engine):
    nodes = ([fakes.make_node(conductor_group='g1') for _ in range(4)]
             + [fakes.make_node(conductor_group='g2') for _ in range(2)])
    fake = fakes.FakeIronic(nodes)
    groups = {'a': 'g1', 'b': 'g1', 'c': 'g2'}
    trackers = {h: resource_tracker.ResourceTracker(
        h, db_services.register(ctx(), h, partition_key=g), fake)
        for h, g in groups.items()}

    def cycle(hosts):
        for _ in range(2):
            for host in hosts:
                db_services.heartbeat(ctx(), trackers[host].service_id)
                trackers[host].run_cycle(dataclasses.replace(
                    SETTINGS, partition_key=groups[host]))
    cycle(groups)
    # Asked for with --host a and no --partition-key: a's group is g1.
    queued = schedule(host='a')
    assert queued.partition_key is None
    silence('a', 100)
    cycle(['c'])  # c's ring (g2) has c alone: it would be the primary
    assert db_instances.get(ctx(), queued.uuid).host == 'a'
    cycle(['b'])
    assert db_instances.get(ctx(), queued.uuid).host == 'b'


def test_a_grace_of_zero_never_takes_over(migrated_engine):
    fake, trackers = cluster(['a', 'b'], nodes_each=2)
    node = next(u for u in fake.nodes if node_owner(u) == 'a')
    pin(new_uuid(), 'a', node)
    silence('a', 10**5)
    settings = resource_tracker.Settings(partition_exponent=8,
                                         service_down_time=6, takeover_grace=0)
    trackers['b'].run_cycle(settings)
    assert {h for _, h, _ in live_instances()} == {'a'}


def test_no_takeover_while_the_peers_cannot_be_judged(migrated_engine):
    fake, trackers = cluster(['a', 'b'], nodes_each=2)
    node = next(u for u in fake.nodes if node_owner(u) == 'a')
    pin(new_uuid(), 'a', node)
    silence('a', 100)
    keeper = trackers['b'].keeper
    view = takeover.CycleView(
        now=_utcnow(), judge_peers=False,
        service_down_time=6, grace=30,
        records={s.host: s.record() for s in db_services.list_services(ctx())},
        ring=ownership.NO_RING, partition_key=None, rows={}, owned=frozenset(),
        unknown_instance={})
    assert keeper.run(ctx(), view).taken_over == 0
    assert {h for _, h, _ in live_instances()} == {'a'}


def test_a_stray_node_is_reported_once_and_its_row_kept(migrated_engine, caplog):
    stray = fakes.make_node(instance_uuid=new_uuid())
    fake, trackers = cluster(['a', 'b'], nodes=[stray, fakes.make_node()])
    holder = node_owner(stray.uuid)

    def warnings():
        return [r for r in caplog.records
                if 'which this database does not know' in r.getMessage()]
    # Said by the holder (by each service while they bootstrap alone)...
    assert 1 <= len(warnings()) <= 2
    caplog.clear()
    # ...and not again at every cycle.
    run(list(trackers.values()), rounds=3)
    assert warnings() == []
    # Its row is held by a live service, and moves if that one dies.
    assert node_owner(stray.uuid) == holder
    silence(holder, 100)
    other = 'b' if holder == 'a' else 'a'
    run([trackers[other]])
    assert node_owner(stray.uuid) == other
