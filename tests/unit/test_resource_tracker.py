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

"""Resource-tracker cycles of several services on one database.

Each tracker is one service; running their cycles in turn is what several
processes do, with the database as the only thing they share.
"""

import dataclasses
import datetime

import pytest
import sqlalchemy as sa

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes
from tests.unit.db_rows import live_nodes

SETTINGS = resource_tracker.Settings(partition_exponent=10)


def ctx():
    return db_api.Context()


def tracker(host, fake):
    service_id = db_services.register(ctx(), ownership.normalize_host(host))
    return resource_tracker.ResourceTracker(host, service_id, fake)


def owners(engine, include_deleted=False):
    table = models.compute_nodes
    query = sa.select(table.c.uuid, table.c.host)
    if not include_deleted:
        query = query.where(table.c.deleted == 0)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    by_uuid = {}
    for uuid, host in rows:
        by_uuid.setdefault(uuid, []).append(host)
    return by_uuid


def settle(trackers, settings=SETTINGS, rounds=3):
    for _ in range(rounds):
        for t in trackers:
            t.run_cycle(settings)


def set_service(engine, host, **values):
    table = models.services
    with engine.begin() as conn:
        conn.execute(table.update().where(table.c.host == host).values(**values))


def add_instance(engine, uuid, host, node):
    with engine.begin() as conn:
        conn.execute(models.instances.insert().values(
            uuid=uuid, host=host, node=node, deleted=0,
            created_at=datetime.datetime(2026, 1, 1)))


@pytest.fixture
def fake():
    return fakes.FakeIronic(fakes.make_node() for _ in range(60))


def test_one_service_creates_a_row_per_node(migrated_engine, fake):
    a = tracker('compute-a', fake)
    stats = a.run_cycle(SETTINGS)
    assert stats.created == 60 and stats.owned == 60
    assert owners(migrated_engine) == {u: ['compute-a'] for u in fake.nodes}


def test_steady_state_changes_nothing(migrated_engine, fake):
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    with migrated_engine.connect() as conn:
        before = conn.execute(sa.select(models.compute_nodes)).all()
    stats = a.run_cycle(SETTINGS)
    assert (stats.created, stats.updated, stats.taken, stats.released) == (0, 0, 0, 0)
    with migrated_engine.connect() as conn:
        after = conn.execute(sa.select(models.compute_nodes)).all()
    assert before == after  # not even updated_at moved


def test_three_services_share_every_node_once(migrated_engine, fake):
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b', 'compute-c')]
    settle(trackers)
    rows = owners(migrated_engine)
    assert set(rows) == set(fake.nodes)
    assert all(len(hosts) == 1 for hosts in rows.values())
    counts = {h: sum(1 for hs in rows.values() if hs == [h])
              for h in ('compute-a', 'compute-b', 'compute-c')}
    assert all(c > 5 for c in counts.values()), counts
    # Every service agrees: what it owns is what it holds.
    for t in trackers:
        assert t.run_cycle(SETTINGS).owned == counts[t.host]


def test_a_dead_service_loses_its_nodes_to_the_survivors(migrated_engine, fake):
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b', 'compute-c')]
    settle(trackers)
    set_service(migrated_engine, 'compute-c',
                last_seen_up=datetime.datetime(2020, 1, 1))
    settle(trackers[:2])
    rows = owners(migrated_engine)
    assert set(rows) == set(fake.nodes)
    assert {h for hs in rows.values() for h in hs} == {'compute-a', 'compute-b'}


def test_a_stopped_service_loses_its_nodes_at_once(migrated_engine, fake):
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b')]
    settle(trackers)
    db_services.mark_stopped(ctx(), trackers[1].service_id)
    trackers[0].run_cycle(SETTINGS)
    assert {h for hs in owners(migrated_engine).values() for h in hs} == {'compute-a'}


def test_a_returning_service_takes_back_its_share(migrated_engine, fake):
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b')]
    settle(trackers)
    share_b = {u for u, hs in owners(migrated_engine).items() if hs == ['compute-b']}
    db_services.mark_stopped(ctx(), trackers[1].service_id)
    trackers[0].run_cycle(SETTINGS)
    # compute-b starts again: register() clears the stop mark.
    trackers[1] = tracker('compute-b', fake)
    settle(trackers)
    assert {u for u, hs in owners(migrated_engine).items() if hs == ['compute-b']} == share_b


def test_failed_listing_changes_no_row(migrated_engine, fake):
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    before = owners(migrated_engine)
    fake.nodes.clear()
    fake.fail = True
    stats = a.run_cycle(SETTINGS)
    assert stats.skipped and 'unavailable' in stats.skipped
    assert owners(migrated_engine) == before


def test_deleted_node_row_is_soft_deleted_and_comes_back(migrated_engine, fake):
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    gone = next(iter(fake.nodes))
    node = fake.nodes.pop(gone)
    table = models.compute_nodes
    with migrated_engine.connect() as conn:
        row_id = conn.execute(sa.select(table.c.id).where(table.c.uuid == gone)).scalar()
    assert a.run_cycle(SETTINGS).deleted == 1
    assert gone not in owners(migrated_engine)
    fake.add(node)
    assert a.run_cycle(SETTINGS).revived == 1
    with migrated_engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.id, table.c.deleted)
                            .where(table.c.uuid == gone)).all()
    assert rows == [(row_id, 0)]  # the same row, not a duplicate


def test_unlisted_node_that_still_exists_is_not_deleted(migrated_engine):
    node = fakes.make_node(conductor_group='rack-1')
    fake = fakes.FakeIronic([node])
    a = tracker('compute-a', fake)
    rack1 = dataclasses.replace(SETTINGS, partition_key='rack-1')
    a.run_cycle(rack1)
    # The node moves to another conductor group: released, not deleted.
    fake.add(dataclasses.replace(node, conductor_group='rack-2'))
    stats = a.run_cycle(rack1)
    assert stats.deleted == 0 and stats.released == 1
    assert owners(migrated_engine) == {node.uuid: [None]}
    b = tracker('compute-b', fake)
    b.run_cycle(dataclasses.replace(SETTINGS, partition_key='rack-2'))
    assert owners(migrated_engine) == {node.uuid: ['compute-b']}


def test_node_of_our_instance_stays_whatever_the_ring_says(migrated_engine, fake):
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b', 'compute-c')]
    settle(trackers)
    rows = owners(migrated_engine)
    node_b = next(u for u, hs in rows.items() if hs == ['compute-b'])
    # An instance of compute-a sits on a node the ring gives to compute-b.
    add_instance(migrated_engine, 'inst-1', 'compute-a', node_b)
    settle(trackers)
    assert owners(migrated_engine)[node_b] == ['compute-a']


def test_instance_host_differing_in_case(migrated_engine, fake):
    trackers = [tracker(h, fake) for h in ('Compute-A', 'compute-b')]
    settle(trackers)
    node_b = next(u for u, hs in owners(migrated_engine).items() if hs == ['compute-b'])
    add_instance(migrated_engine, 'inst-1', 'COMPUTE-a ', node_b)
    settle(trackers)
    assert owners(migrated_engine)[node_b] == ['compute-a']


def test_capacity_change_updates_only_that_row(migrated_engine, fake):
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    changed = next(iter(fake.nodes))
    fake.add(fakes.make_node(uuid=changed, cpus=64))
    assert a.run_cycle(SETTINGS).updated == 1
    table = models.compute_nodes
    with migrated_engine.connect() as conn:
        assert conn.execute(sa.select(table.c.vcpus).where(
            table.c.uuid == changed)).scalar() == 64


def test_take_is_conditional_on_the_owner_we_saw(migrated_engine, fake):
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    uuid = next(iter(fake.nodes))
    # compute-c read the row when compute-b owned it; compute-a still does.
    assert db_nodes.move(ctx(), [uuid], 'compute-b', 'compute-c', None) == set()
    assert owners(migrated_engine)[uuid] == ['compute-a']


def test_a_row_just_taken_is_not_deleted_by_its_old_owner(migrated_engine, fake):
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    uuid = next(iter(fake.nodes))
    assert db_nodes.move(ctx(), [uuid], 'compute-a', 'compute-b', None) == {uuid}
    assert db_nodes.soft_delete(ctx(), uuid, 'compute-a') is False
    assert owners(migrated_engine)[uuid] == ['compute-b']


def test_two_services_creating_the_same_node_make_one_row(migrated_engine, fake):
    node = next(iter(fake.nodes.values()))
    fields = resource_tracker.row_fields(node, __import__(
        'ironic_compute.ironic', fromlist=['x']).node_resources(node))
    created, _ = db_nodes.create_or_revive(ctx(), {node.uuid: fields}, 'compute-a', None)
    again, revived = db_nodes.create_or_revive(ctx(), {node.uuid: fields}, 'compute-b', None)
    assert created == {node.uuid} and again == set() and revived == set()
    assert owners(migrated_engine)[node.uuid] == ['compute-a']


def test_peer_list_limits_the_ring(migrated_engine):
    nodes = [fakes.make_node(conductor_group='rack-1') for _ in range(40)]
    fake = fakes.FakeIronic(nodes)
    settings = dataclasses.replace(SETTINGS, partition_key='rack-1',
                                   peer_list=('compute-a', 'compute-b'))
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b')]
    other = tracker('compute-x', fakes.FakeIronic())  # in another group
    other.run_cycle(dataclasses.replace(SETTINGS, partition_key='rack-2'))
    settle(trackers, settings)
    assert {h for hs in owners(migrated_engine).values() for h in hs} == {
        'compute-a', 'compute-b'}


def test_peer_list_without_this_host_is_an_error(migrated_engine, fake):
    a = tracker('compute-a', fake)
    with pytest.raises(exception.PeerListError):
        a.run_cycle(dataclasses.replace(SETTINGS, partition_key='g',
                                        peer_list=('compute-b',)))


def test_rows_of_a_gone_service_for_deleted_nodes_are_cleaned(migrated_engine, fake):
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b')]
    settle(trackers)
    node_b = next(u for u, hs in owners(migrated_engine).items() if hs == ['compute-b'])
    db_services.mark_stopped(ctx(), trackers[1].service_id)
    del fake.nodes[node_b]
    trackers[0].run_cycle(SETTINGS)
    assert node_b not in owners(migrated_engine)


@pytest.mark.parametrize('flag', ['disabled', 'forced_down'])
def test_a_running_service_set_aside_hands_its_nodes_over(migrated_engine, fake, flag):
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b')]
    settle(trackers)
    node_b = next(u for u, hs in owners(migrated_engine).items() if hs == ['compute-b'])
    add_instance(migrated_engine, 'inst-b', 'compute-b', node_b)
    set_service(migrated_engine, 'compute-b', **{flag: True})
    settle(trackers)
    after = owners(migrated_engine)
    # compute-b keeps only the node of its own instance; no swapping back.
    assert {u for u, hs in after.items() if hs == ['compute-b']} == {node_b}
    settle(trackers)
    assert owners(migrated_engine) == after


def test_the_only_service_set_aside_keeps_what_it_holds(migrated_engine, fake):
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    set_service(migrated_engine, 'compute-a', disabled=True)
    before = owners(migrated_engine)
    stats = a.run_cycle(SETTINGS)
    assert stats.peers == 0 and stats.released == 0
    assert owners(migrated_engine) == before


def test_peer_list_naming_a_service_of_another_partition(migrated_engine):
    # compute-b is listed as a peer of rack-2 but manages rack-1: rack-2's
    # nodes must not be handed to it, or they would swing back and forth.
    fake = fakes.FakeIronic([fakes.make_node(conductor_group='rack-1') for _ in range(10)]
                            + [fakes.make_node(conductor_group='rack-2') for _ in range(10)])
    a = tracker('compute-a', fake)
    b = tracker('compute-b', fake)
    rack1 = dataclasses.replace(SETTINGS, partition_key='rack-1')
    rack2 = dataclasses.replace(SETTINGS, partition_key='rack-2',
                                peer_list=('compute-a', 'compute-b'))
    for _ in range(3):
        b.run_cycle(rack1)
        stats = a.run_cycle(rack2)
    assert stats.peers == 1 and stats.released == 0
    rows = owners(migrated_engine)
    assert {rows[u][0] for u, n in fake.nodes.items() if n.conductor_group == 'rack-2'} == {
        'compute-a'}


def test_stale_listing_does_not_make_an_instance_node_foreign(migrated_engine, fake):
    # Nova's race: the instance was just placed on a node, the node list was
    # read before Ironic recorded it. The instance record alone keeps the
    # node with the instance's service; the other service does not take it.
    trackers = [tracker(h, fake) for h in ('compute-a', 'compute-b')]
    settle(trackers)
    node_a = next(u for u, hs in owners(migrated_engine).items() if hs == ['compute-a'])
    add_instance(migrated_engine, 'inst-new', 'compute-a', node_a)
    assert fake.nodes[node_a].instance_uuid is None  # the stale listing
    set_service(migrated_engine, 'compute-a', stopped_at=datetime.datetime(2026, 1, 1))
    trackers[1].run_cycle(SETTINGS)  # compute-b's ring now covers every node
    assert owners(migrated_engine)[node_a] == ['compute-a']


def test_services_of_different_shards_do_not_share_a_ring(migrated_engine):
    fake = fakes.FakeIronic([fakes.make_node(shard=s) for s in ['s1'] * 10 + ['s2'] * 10])
    a, b = tracker('compute-a', fake), tracker('compute-b', fake)
    s1 = dataclasses.replace(SETTINGS, shard='s1')
    s2 = dataclasses.replace(SETTINGS, shard='s2')
    for _ in range(3):
        a.run_cycle(s1)
        b.run_cycle(s2)
    rows = owners(migrated_engine)
    assert len(rows) == 20
    assert all(rows[u] == ['compute-a' if n.shard == 's1' else 'compute-b']
               for u, n in fake.nodes.items())


def test_partitioned_and_unpartitioned_services_do_not_tug(migrated_engine):
    fake = fakes.FakeIronic([fakes.make_node(conductor_group='rack-1') for _ in range(20)])
    u, p = tracker('compute-u', fake), tracker('compute-p', fake)
    rack1 = dataclasses.replace(SETTINGS, partition_key='rack-1')
    for _ in range(2):
        u.run_cycle(SETTINGS)
        p.run_cycle(rack1)
    before = owners(migrated_engine)
    for _ in range(3):
        assert u.run_cycle(SETTINGS).taken == 0
        assert p.run_cycle(rack1).taken == 0
    assert owners(migrated_engine) == before
    assert len(before) == 20


def test_rows_record_the_shard_of_their_node(migrated_engine):
    nodes = [fakes.make_node(shard='ic-01'), fakes.make_node(shard='ic-02'),
             fakes.make_node()]
    fake = fakes.FakeIronic(nodes)
    a = tracker('compute-a', fake)
    a.run_cycle(SETTINGS)
    assert live_nodes(migrated_engine, 'shard') == {n.uuid: n.shard for n in nodes}
    # A node moved to another shard: its row follows at the next cycle.
    fake.add(dataclasses.replace(nodes[2], shard='ic-03'))
    stats = a.run_cycle(SETTINGS)
    assert stats.updated == 1
    assert live_nodes(migrated_engine, 'shard')[nodes[2].uuid] == 'ic-03'
