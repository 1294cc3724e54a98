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

"""Takeover at scale, on SQLite, MariaDB and PostgreSQL: a dead host's
instances are taken in bulk (db.takeover.take_over_many), each once, by
its ring primary, in a number of statements that grows with the chunks,
not with the instances."""

import concurrent.futures
import contextlib
import datetime
import logging
import uuid as uuidlib

import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.db import takeover as db_takeover
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes

SDT, GRACE = 6, 30
DOWN_FOR = SDT + GRACE
SETTINGS = resource_tracker.Settings(partition_exponent=8,
                                     service_down_time=SDT,
                                     takeover_grace=GRACE)
_services = models.services
_instances = models.instances
_nodes = models.compute_nodes


def ctx():
    return db_api.Context()


def set_service(host, **values):
    with db_api.get_engine().begin() as conn:
        conn.execute(_services.update().where(_services.c.host == host)
                     .values(**values))


def silence(host, seconds=DOWN_FOR + 60):
    set_service(host, last_seen_up=_utcnow()
                - datetime.timedelta(seconds=seconds))


def pin_many(host, count, nodes=()):
    """``count`` live instances of ``host``, the first on ``nodes``."""
    nodes = list(nodes)
    rows = [dict(uuid=str(uuidlib.uuid4()), host=host,
                 node=nodes[i] if i < len(nodes) else None, deleted=0,
                 vm_state=inst.ACTIVE if i < len(nodes) else inst.BUILDING,
                 resource_class='baremetal', generation=0,
                 created_at=datetime.datetime(2026, 1, 1))
            for i in range(count)]
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.insert(), rows)
    return [row['uuid'] for row in rows]


def live_instances():
    with db_api.get_engine().connect() as conn:
        return {uuid: (host, node, generation)
                for uuid, host, node, generation in conn.execute(
                    sa.select(_instances.c.uuid, _instances.c.host,
                              _instances.c.node, _instances.c.generation)
                    .where(_instances.c.deleted == 0))}


def node_owners():
    with db_api.get_engine().connect() as conn:
        return dict(conn.execute(sa.select(_nodes.c.uuid, _nodes.c.host)
                                 .where(_nodes.c.deleted == 0)).all())


@contextlib.contextmanager
def statements():
    """Count the statements sent to the database inside the block."""
    sent = []

    def count(conn, cursor, statement, *args):
        sent.append(statement)
    engine = db_api.get_engine()
    sa.event.listen(engine, 'before_cursor_execute', count)
    try:
        yield sent
    finally:
        sa.event.remove(engine, 'before_cursor_execute', count)


def cluster(hosts, nodes_each):
    fake = fakes.FakeIronic([fakes.make_node()
                             for _ in range(nodes_each * len(hosts))])
    trackers = {h: resource_tracker.ResourceTracker(
        h, db_services.register(ctx(), h), fake) for h in hosts}
    cycle(trackers.values())
    return fake, trackers


def cycle(trackers):
    """One cycle each, heartbeating first as the daemon does; the stats."""
    stats = {}
    for tracker in trackers:
        db_services.heartbeat(ctx(), tracker.service_id)
        stats[tracker.host] = tracker.run_cycle(SETTINGS)
    return stats


def test_a_thousand_instances_are_taken_in_one_cycle_each_once(
        migrated_engine, caplog):
    fake, trackers = cluster(['a', 'b', 'c', 'd'], nodes_each=25)
    # Instances of a on every node (whoever holds its row) and queued
    # builds without a node: 1,000 in all.
    uuids = pin_many('a', 1000, nodes=sorted(fake.nodes))
    silence('a')
    survivors = [trackers[h] for h in 'bcd']
    with caplog.at_level(logging.DEBUG,
                         logger='ironic_compute.instances.takeover'):
        stats = cycle(survivors)
    rows = live_instances()
    assert sum(s.taken_over for s in stats.values()) == 1000
    assert all(s.taken_over for s in stats.values())
    assert set(rows) == set(uuids)
    # Each by the ring's primary of its node (else itself), once.
    ring = ownership.build_ring(['b', 'c', 'd'], SETTINGS.partition_exponent)
    owners = node_owners()
    for uuid, (host, node, generation) in rows.items():
        assert generation == 1, uuid
        assert host == ring.get_hosts(inst.takeover_key(node, uuid))[0]
        if node is not None:
            assert owners[node] == host  # its node's row followed it
    # A second cycle finds nothing left to take.
    assert not any(s.taken_over for s in cycle(survivors).values())
    assert all(g == 1 for _, _, g in live_instances().values())
    # One warning per taking service, the instances at DEBUG.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and 'taken over from a' in r.getMessage()]
    assert len(warnings) == 3
    assert sum(1 for r in caplog.records if r.levelno == logging.DEBUG
               and 'taken over from a' in r.getMessage()) == 1000


def test_rows_changed_meanwhile_are_left_alone(migrated_engine):
    _, trackers = cluster(['a', 'b'], nodes_each=0)
    uuids = pin_many('a', 30)
    silence('a')
    seen = db_takeover.of_hosts(ctx(), ['a'])
    # After the read: a worker bumps one row's generation, another service
    # takes another, a third is deleted.
    bumped, elsewhere, deleted = uuids[3], uuids[11], uuids[25]
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == bumped)
                     .values(generation=_instances.c.generation + 1))
        conn.execute(_instances.update().where(_instances.c.uuid == elsewhere)
                     .values(host='c', generation=_instances.c.generation + 1))
        conn.execute(_instances.update().where(_instances.c.uuid == deleted)
                     .values(deleted=_instances.c.id))
    moved = db_takeover.take_over_many(ctx(), 'a', seen, 'b',
                                       trackers['b'].service_id, DOWN_FOR,
                                       chunk=8)
    assert {row.uuid for row in moved} == set(uuids) - {bumped, elsewhere,
                                                        deleted}
    rows = live_instances()
    assert rows[bumped] == ('a', None, 1)
    assert rows[elsewhere] == ('c', None, 1)
    assert deleted not in rows
    assert all(rows[row.uuid] == ('b', None, 1) for row in moved)
    # Taking the same view again moves nothing: never doubled.
    assert db_takeover.take_over_many(ctx(), 'a', seen, 'b',
                                      trackers['b'].service_id,
                                      DOWN_FOR) == []
    assert all(rows[row.uuid][2] == 1 for row in moved)


def test_two_services_taking_the_same_rows_at_once_never_double(
        migrated_engine):
    # Two services that both believe they are the primary (rings that
    # disagree for a moment) take the same 1,000 rows at the same time.
    _, trackers = cluster(['a', 'b', 'c'], nodes_each=0)
    uuids = pin_many('a', 1000)
    silence('a')
    seen = db_takeover.of_hosts(ctx(), ['a'])

    def take(host):
        return db_takeover.take_over_many(
            ctx(), 'a', seen, host, trackers[host].service_id, DOWN_FOR,
            chunk=100)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        moved = dict(zip('bc', pool.map(take, 'bc'), strict=True))
    by_b = {row.uuid for row in moved['b']}
    by_c = {row.uuid for row in moved['c']}
    assert not by_b & by_c and by_b | by_c == set(uuids)
    rows = live_instances()
    assert all(rows[u] == ('b', None, 1) for u in by_b)
    assert all(rows[u] == ('c', None, 1) for u in by_c)


def test_a_host_that_heartbeated_just_before_keeps_them_all(migrated_engine):
    _, trackers = cluster(['a', 'b'], nodes_each=0)
    pin_many('a', 600)
    silence('a')
    seen = db_takeover.of_hosts(ctx(), ['a'])
    db_services.heartbeat(ctx(), trackers['a'].service_id)
    assert db_takeover.take_over_many(ctx(), 'a', seen, 'b',
                                      trackers['b'].service_id,
                                      DOWN_FOR) == []
    assert {v for v in live_instances().values()} == {('a', None, 0)}


def test_statements_grow_with_the_chunks_not_the_instances(migrated_engine):
    fake, trackers = cluster(['a', 'b', 'c'], nodes_each=10)
    pin_many('a', 1000, nodes=sorted(fake.nodes))
    silence('a')
    seen = db_takeover.of_hosts(ctx(), ['a'])
    owners = node_owners()
    with statements() as sent:
        moved = db_takeover.take_over_many(
            ctx(), 'a', seen, 'b', trackers['b'].service_id, DOWN_FOR,
            owners, chunk=100)
    assert len(moved) == 1000
    work = [s for s in sent if s.split()[0].upper() not in ('BEGIN',
                                                             'COMMIT')]
    # Per chunk (10 of them): the database's clock and the instances; the
    # 30 nodes, all in the first chunk, move in a statement or two per
    # holder (a and c; b's own rows stay where they are).
    assert len([s for s in work if s.lstrip().upper().startswith(
        'UPDATE INSTANCES')]) == 10
    assert len(work) <= 10 * 2 + 4, work
    assert all(host == 'b' for host, _, _ in live_instances().values())
    assert set(node_owners().values()) == {'b'}


def test_a_whole_cycle_takes_a_thousand_in_few_statements(migrated_engine):
    _, trackers = cluster(['a', 'b'], nodes_each=0)
    pin_many('a', 1000)
    silence('a')
    db_services.heartbeat(ctx(), trackers['b'].service_id)
    with statements() as sent:
        stats = trackers['b'].run_cycle(SETTINGS)
    assert stats.taken_over == 1000
    assert len(sent) < 60, len(sent)
