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

"""Services writing at the same moment, as daemons started together do.

Several processes start at once under systemd and register, heartbeat and
move rows together. On MySQL/MariaDB concurrent registrations of new hosts
take the same gap lock and InnoDB kills one of them as a deadlock victim;
the service must retry, not exit.
"""

import threading

import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import models
from ironic_compute.db import services as db_services

THREADS = 8
ROUNDS = 4


def run_together(target, count=THREADS):
    """Run target(i) in ``count`` threads released at one instant."""
    barrier = threading.Barrier(count)
    results, errors = [None] * count, []

    def worker(index):
        try:
            barrier.wait()
            results[index] = target(index)
        except Exception as exc:  # reported below with the thread index
            errors.append((index, exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


def live_services(engine):
    table = models.services
    with engine.connect() as conn:
        return conn.execute(sa.select(table.c.id, table.c.host)
                            .where(table.c.deleted == 0)).all()


def test_new_hosts_register_together(migrated_engine):
    for attempt in range(ROUNDS):
        ids = run_together(lambda i, attempt=attempt: db_services.register(
            db_api.Context(), f'compute-{attempt}-{i}'))
        assert len(set(ids)) == THREADS
    assert len(live_services(migrated_engine)) == THREADS * ROUNDS


def test_one_host_registering_twice_at_once_keeps_one_row(migrated_engine):
    # Two processes of one host (a restart racing an old process): one row.
    ids = run_together(lambda i: db_services.register(db_api.Context(), 'same'))
    assert len(set(ids)) == 1
    assert [h for _, h in live_services(migrated_engine)] == ['same']


def test_heartbeats_and_cycle_records_together(migrated_engine):
    ids = [db_services.register(db_api.Context(), f'c{i}')
           for i in range(THREADS)]

    def beat(i):
        for _ in range(ROUNDS):
            db_services.heartbeat(db_api.Context(), ids[i])
            db_services.record_cycle(db_api.Context(), ids[i], 0.1, 'g', None)
    run_together(beat)
    rows = db_services.list_services(db_api.Context())
    assert {r.partition_key for r in rows} == {'g'}


def test_services_create_and_take_the_same_rows_together(migrated_engine):
    """Every service creates then claims one set of rows: one owner each."""
    hosts = [f'c{i}' for i in range(THREADS)]
    ids = {h: db_services.register(db_api.Context(), h) for h in hosts}
    fields = (None, '', 1, 1, 1, 0, 0, 0, 'x86_64', 'baremetal', '{}', None,
              True, '|', '|')
    uuids = [f'00000000-0000-0000-0000-{n:012d}' for n in range(60)]

    def claim(i):
        host = hosts[i]
        created, _ = db_nodes.create_or_revive(
            db_api.Context(), {u: fields for u in uuids}, host, ids[host])
        # Then try to take every row from whoever got it.
        rows = db_nodes.load_rows(db_api.Context(), host)
        taken = set()
        for owner in {r.host for r in rows.values()} - {host}:
            taken |= db_nodes.move(
                db_api.Context(),
                [u for u, r in rows.items() if r.host == owner],
                owner, host, ids[host])
        return created

    created = run_together(claim)
    # Each node was created exactly once, by one service.
    assert sorted(u for batch in created for u in batch) == uuids
    table = models.compute_nodes
    with migrated_engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.uuid, table.c.host)
                            .where(table.c.deleted == 0)).all()
    assert sorted(u for u, _ in rows) == uuids
    assert {h for _, h in rows} <= set(hosts)
