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

"""Resource-tracker cycles with [ironic]shard_ring: each service lists only
its shards, every node is owned once, and the switch is rolling."""

import collections
import dataclasses
import datetime

import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes

HOSTS = ('compute-a', 'compute-b', 'compute-c')
NODE_RING = resource_tracker.Settings(partition_exponent=10)
SHARD_RING = dataclasses.replace(NODE_RING, shard_ring=True)
SHARDS = 16


def make_nodes(count=200, unsharded=8):
    nodes = [fakes.make_node(shard=f'ic-{i % SHARDS:02d}') for i in range(count)]
    return nodes + [fakes.make_node() for _ in range(unsharded)]


def views(nodes, hosts=HOSTS):
    """One fake Ironic per service over the same nodes (each counts what it
    fetches)."""
    shared = {n.uuid: n for n in nodes}
    result = {}
    for host in hosts:
        fake = fakes.FakeIronic()
        fake.nodes = shared
        result[host] = fake
    return result


def start(host, fake):
    service_id = db_services.register(db_api.Context(), host)
    return resource_tracker.ResourceTracker(host, service_id, fake)


def holders(engine):
    table = models.compute_nodes
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.uuid, table.c.host)
                            .where(table.c.deleted == 0)).all()
    by_uuid = collections.defaultdict(list)
    for uuid, host in rows:
        by_uuid[uuid].append(host)
    return by_uuid


def run(trackers, settings):
    return {t.host: t.run_cycle(settings[t.host] if isinstance(settings, dict)
                                else settings) for t in trackers}


def assert_owned_once(engine, nodes, hosts):
    rows = holders(engine)
    assert set(rows) == {n.uuid for n in nodes}
    assert all(len(h) == 1 and h[0] in hosts for h in rows.values()), rows


def fetched_in_one_cycle(trackers, settings, fakes_by_host):
    """Run one cycle of every tracker; ``{host: nodes it fetched from Ironic}``."""
    for fake in fakes_by_host.values():
        fake.fetched = 0
    run(trackers, settings)
    return {host: fake.fetched for host, fake in fakes_by_host.items()}


def test_each_service_lists_only_its_shards(migrated_engine):
    nodes = make_nodes()
    fakes_by_host = views(nodes)
    trackers = [start(h, fakes_by_host[h]) for h in HOSTS]
    for _ in range(4):  # the first cycle lists all, then the shard ring
        run(trackers, SHARD_RING)
    assert_owned_once(migrated_engine, nodes, HOSTS)
    for fake in fakes_by_host.values():
        fake.fetched = 0
    stats = run(trackers, SHARD_RING)
    assert sum(s.fetched for s in stats.values()) == len(nodes)
    for host, fake in fakes_by_host.items():
        assert fake.fetched == stats[host].fetched
        assert fake.fetched <= 1.5 * len(nodes) / len(HOSTS), (host, fake.fetched)
        assert stats[host].owned == fake.fetched
        assert (stats[host].taken, stats[host].released, stats[host].updated) == (0, 0, 0)
    # Every node's row is held by the service of its shard.
    rows = holders(migrated_engine)
    by_shard = collections.defaultdict(set)
    for node in nodes:
        by_shard[node.shard].add(rows[node.uuid][0])
    assert all(len(hosts) == 1 for hosts in by_shard.values()), by_shard


def test_a_dead_service_loses_its_shards_to_the_survivors(migrated_engine):
    nodes = make_nodes()
    fakes_by_host = views(nodes)
    trackers = [start(h, fakes_by_host[h]) for h in HOSTS]
    for _ in range(4):
        run(trackers, SHARD_RING)
    table = models.services
    with migrated_engine.begin() as conn:
        conn.execute(table.update().where(table.c.host == 'compute-c')
                     .values(last_seen_up=datetime.datetime(2020, 1, 1)))
    run(trackers[:2], SHARD_RING)
    assert_owned_once(migrated_engine, nodes, HOSTS[:2])


def test_an_instance_node_stays_with_its_host_outside_its_shards(migrated_engine):
    nodes = make_nodes(count=48, unsharded=0)
    fakes_by_host = views(nodes)
    trackers = [start(h, fakes_by_host[h]) for h in HOSTS]
    for _ in range(3):
        run(trackers, SHARD_RING)
    rows = holders(migrated_engine)
    node = next(n for n in nodes if rows[n.uuid] != ['compute-a'])
    with migrated_engine.begin() as conn:
        conn.execute(models.instances.insert().values(
            uuid='inst-1', host='compute-a', node=node.uuid, deleted=0,
            created_at=datetime.datetime(2026, 1, 1)))
    for fake in fakes_by_host.values():
        fake.nodes[node.uuid] = dataclasses.replace(node, instance_uuid='inst-1')
    for _ in range(2):
        run(trackers, SHARD_RING)
    assert holders(migrated_engine)[node.uuid] == ['compute-a']
    assert_owned_once(migrated_engine, nodes, HOSTS)
    stats = run(trackers, SHARD_RING)
    assert all((s.taken, s.released) == (0, 0) for s in stats.values())


def test_rolling_switch_on_and_off_keeps_every_node_owned_once(migrated_engine):
    nodes = make_nodes()
    fakes_by_host = views(nodes)
    trackers = [start(h, fakes_by_host[h]) for h in HOSTS]
    settings = {h: NODE_RING for h in HOSTS}
    for _ in range(2):
        run(trackers, settings)
    assert_owned_once(migrated_engine, nodes, HOSTS)
    fetched_before = {h: f.fetched for h, f in fakes_by_host.items()}
    # One service at a time (SIGHUP), one cycle of everybody in between.
    for host in HOSTS:
        settings[host] = SHARD_RING
        run(trackers, settings)
        assert_owned_once(migrated_engine, nodes, HOSTS)
    for _ in range(2):
        run(trackers, settings)
        assert_owned_once(migrated_engine, nodes, HOSTS)
    fetched = fetched_in_one_cycle(trackers, settings, fakes_by_host)
    assert max(fetched.values()) < len(nodes) / 2
    assert all(fetched_before[h] >= len(nodes) for h in HOSTS)
    # And back: the first service that turns it off ends it for all.
    settings['compute-b'] = NODE_RING
    for _ in range(3):
        run(trackers, settings)
        assert_owned_once(migrated_engine, nodes, HOSTS)
    fetched = fetched_in_one_cycle(trackers, settings, fakes_by_host)
    assert all(count == len(nodes) for count in fetched.values()), fetched


def test_the_flag_is_recorded_for_the_peers(migrated_engine):
    fake = fakes.FakeIronic(make_nodes(count=4, unsharded=0))
    a = start('compute-a', fake)
    a.run_cycle(SHARD_RING)
    rows = db_services.load_services(db_api.Context()).rows
    assert [r.record().shard_ring for r in rows] == [True]
    a.run_cycle(NODE_RING)
    rows = db_services.load_services(db_api.Context()).rows
    assert [r.record().shard_ring for r in rows] == [False]


def test_shard_ring_is_ignored_with_a_fixed_shard(migrated_engine):
    nodes = make_nodes(count=32, unsharded=0)
    fake = fakes.FakeIronic(nodes)
    a = start('compute-a', fake)
    pinned = dataclasses.replace(SHARD_RING, shard='ic-01')
    for _ in range(2):
        stats = a.run_cycle(pinned)
    assert stats.fetched == sum(1 for n in nodes if n.shard == 'ic-01')
    assert ownership.normalize_host('compute-a') in {
        h for hs in holders(migrated_engine).values() for h in hs}
