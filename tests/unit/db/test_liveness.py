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

"""Liveness is stated once: the Python rules of cluster/liveness.py and
every SQL form of them (db/liveness.py, and the queries built on it: the
scheduler's live hosts, the takeover's host-still-down) agree on the same
services rows, on SQLite, MariaDB and PostgreSQL."""

import datetime

import sqlalchemy as sa

from ironic_compute.cluster import liveness
from ironic_compute.db import api as db_api
from ironic_compute.db import clock
from ironic_compute.db import liveness as db_liveness
from ironic_compute.db import models
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.db import services as db_services
from ironic_compute.db import takeover as db_takeover
from ironic_compute.instances import model as inst

SDT, GRACE = 60, 30
_services = models.services
MS = datetime.timedelta(milliseconds=1)

# host -> (seconds since its last heartbeat, None: never; other columns).
# Ages are whole milliseconds: SQLite's clock has no finer grain.
STATES = {
    'fresh': (1, {}),
    'disabled': (1, {'disabled': True}),
    'forced-down': (1, {'forced_down': True}),
    'stopped': (1, {'stopped': True}),
    'disabled-stopped': (1, {'disabled': True, 'stopped': True}),
    'never-reported': (None, {}),
    'at-the-limit': (SDT, {}),
    'just-past-the-limit': (SDT + 0.001, {}),
    'disabled-at-the-limit': (SDT, {'disabled': True}),
    'within-the-grace': (SDT + GRACE / 2, {}),
    'at-the-takeover-limit': (SDT + GRACE, {}),
    'past-the-takeover-limit': (SDT + GRACE + 0.001, {}),
    'stale': (600, {}),
    'stale-disabled': (600, {'disabled': True}),
    'other-binary': (1, {'binary': 'nova-compute'}),
    'deleted': (1, {'deleted': True}),
}
NO_ROW = 'no-row'
# Where a few milliseconds of the database's clock decide: judged only on
# a fixed time, not on the clock that runs between two statements.
AT_A_LIMIT = {'at-the-limit', 'just-past-the-limit', 'disabled-at-the-limit',
              'at-the-takeover-limit', 'past-the-takeover-limit'}


def add_rows(now):
    """The services rows of STATES, their heartbeats counted back from
    ``now`` (the database's time)."""
    with db_api.get_engine().begin() as conn:
        for host, (age, extra) in STATES.items():
            values = dict(
                host=host, binary=extra.get('binary', db_services.BINARY),
                topic='compute', report_count=0,
                disabled=extra.get('disabled', False),
                forced_down=extra.get('forced_down', False),
                stopped_at=now if extra.get('stopped') else None,
                last_seen_up=(None if age is None
                              else now - datetime.timedelta(seconds=age)),
                created_at=now, deleted=0)
            new_id = conn.execute(_services.insert().values(**values)
                                  ).inserted_primary_key[0]
            if extra.get('deleted'):
                conn.execute(_services.update()
                             .where(_services.c.id == new_id)
                             .values(deleted=new_id))


def hosts_where(clause):
    with db_api.get_engine().connect() as conn:
        return set(conn.execute(
            sa.select(_services.c.host).where(clause)).scalars())


def sql_says(expression):
    with db_api.get_engine().connect() as conn:
        return bool(conn.execute(sa.select(expression)).scalar())


def test_every_form_of_liveness_agrees_on_the_same_rows(migrated_engine):
    ctx = db_api.Context()
    with db_api.context_manager.reader.using(ctx):
        # Whole milliseconds: the ages then land exactly on SQLite too.
        now = clock.now(ctx)
    now = now.replace(microsecond=now.microsecond // 1000 * 1000)
    add_rows(now)
    listing = db_services.load_services(ctx, count_nodes=False)
    records = {row.host: row.record() for row in listing.rows}
    hosts = [*STATES, NO_ROW]
    # Only the live rows of our binary are records: the others are no row.
    assert set(records) == set(STATES) - {'other-binary', 'deleted'}

    # 1. On one fixed time, every state, the limits included.
    for python, sql in db_liveness.TWINS.items():
        for limit in (SDT, SDT + GRACE):
            expected = {host for host in hosts
                        if python(records.get(host), now, limit)}
            assert hosts_where(sql(limit, now)) == expected, (python, limit)
            assert expected  # the matrix says something either way
    for host in hosts:
        for limit in (SDT, SDT + GRACE):
            assert sql_says(db_liveness.host_alive(host, limit, now)) is (
                liveness.is_alive(records.get(host), now, limit)), (
                host, limit)
        assert sql_says(~db_liveness.host_alive(host, SDT + GRACE, now)) is (
            liveness.takeover_due(records.get(host), now, SDT, GRACE)), host
    # What the states are meant to say, in words (the matrix's key).
    assert {h for h in hosts if liveness.is_up(records.get(h), now, SDT)} == {
        'fresh', 'at-the-limit'}
    assert {h for h in hosts
            if liveness.is_alive(records.get(h), now, SDT)} == {
        'fresh', 'disabled', 'stopped', 'disabled-stopped', 'at-the-limit',
        'disabled-at-the-limit'}
    assert {h for h in hosts if liveness.takeover_due(
        records.get(h), now, SDT, GRACE)} == {
        'forced-down', 'never-reported', 'past-the-takeover-limit', 'stale',
        'stale-disabled', 'other-binary', 'deleted', NO_ROW}

    # 2. On the database's running clock, in the queries that use the
    # twins: the scheduler's live hosts and the takeover's check, against
    # the Python rules at the time load_services read.
    listing = db_services.load_services(ctx, count_nodes=False)
    records = {row.host: row.record() for row in listing.rows}
    clear = [host for host in hosts if host not in AT_A_LIMIT]
    spec = inst.RequestSpec(resource_class='baremetal')
    with db_api.context_manager.reader.using(ctx):
        live = set(db_scheduling._live_hosts(ctx, spec, SDT))
    assert live == {host for host in clear
                    if liveness.is_up(records.get(host), listing.now, SDT)}
    for host in clear:
        with db_api.context_manager.reader.using(ctx):
            still_down = ctx.session.execute(sa.select(
                db_takeover.host_still_down(ctx, host, SDT + GRACE))
            ).scalar()
        assert bool(still_down) is liveness.takeover_due(
            records.get(host), listing.now, SDT, GRACE), host
