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

"""One clock: the database server's, on every backend.

Heartbeats are stamped by the database and judged against its time read
with the rows, so the clock of the host a service runs on does not matter.
"""

import datetime

import pytest
import sqlalchemy as sa

from ironic_compute.cluster import liveness
from ironic_compute.db import api as db_api
from ironic_compute.db import clock
from ironic_compute.db import models
from ironic_compute.db import services as db_services


def ctx():
    return db_api.Context()


def python_utcnow():
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def test_database_now_is_naive_utc(migrated_engine):
    with migrated_engine.connect() as conn:
        now = conn.execute(sa.select(clock.utc_now())).scalar_one()
    assert isinstance(now, datetime.datetime) and now.tzinfo is None
    # The servers run on this machine: their UTC is ours, give or take.
    assert abs((now - python_utcnow()).total_seconds()) < 5


def test_utc_ago_is_the_database_now_less_the_seconds(migrated_engine):
    with migrated_engine.connect() as conn:
        now, ago, late = conn.execute(sa.select(
            clock.utc_now(), clock.utc_ago(3600.25), clock.utc_ago(0))).one()
    # One statement, one clock (SQLite's has milliseconds).
    assert now - ago == datetime.timedelta(seconds=3600.25)
    assert late == now


@pytest.mark.parametrize('shift', [-300, 300])
def test_heartbeat_ignores_the_host_clock(migrated_engine, monkeypatch, shift):
    monkeypatch.setattr(models, 'CLOCK_OFFSET',
                        datetime.timedelta(seconds=shift))
    service_id = db_services.register(ctx(), 'compute-a')
    written = db_services.heartbeat(ctx(), service_id)
    listing = db_services.load_services(ctx())
    (row,) = listing.rows
    assert row.last_seen_up == written
    age = (listing.now - row.last_seen_up).total_seconds()
    assert 0 <= age < 5
    assert liveness.is_up(row.record(), listing.now, 10)
    # What the shifted host clock would have said: down, or from the future.
    assert abs((models._utcnow() - row.last_seen_up).total_seconds()) > 250


def test_load_services_gives_the_time_without_rows(migrated_engine):
    listing = db_services.load_services(ctx())
    assert listing.rows == []
    assert abs((listing.now - python_utcnow()).total_seconds()) < 5


def _set_session_time_zone(conn):
    name = conn.dialect.name
    if name == 'mysql':
        conn.execute(sa.text("SET time_zone = '+09:00'"))
    elif name == 'postgresql':
        conn.execute(sa.text("SET TIME ZONE 'Asia/Tokyo'"))
    # SQLite has no session time zone: 'now' is UTC.
    return name


def test_session_time_zone_does_not_move_the_clock(migrated_engine):
    with migrated_engine.connect() as conn:
        plain = conn.execute(sa.select(clock.utc_now())).scalar_one()
        _set_session_time_zone(conn)
        if conn.dialect.name != 'sqlite':
            local = conn.execute(sa.text('SELECT CURRENT_TIMESTAMP')).scalar()
            local = local.replace(tzinfo=None)
            # The session really is 9 hours ahead: the guard below means it.
            assert abs((local - plain).total_seconds() - 9 * 3600) < 60
        shifted = conn.execute(sa.select(clock.utc_now())).scalar_one()
    assert abs((shifted - plain).total_seconds()) < 5


def test_timestamps_keep_microseconds(migrated_engine):
    stamp = datetime.datetime(2026, 11, 23, 1, 2, 3, 456789)
    table = models.services
    service_id = db_services.register(ctx(), 'compute-a')
    with migrated_engine.begin() as conn:
        conn.execute(table.update().where(table.c.id == service_id)
                     .values(last_seen_up=stamp, stopped_at=stamp,
                             last_cycle_at=stamp, created_at=stamp))
    with migrated_engine.connect() as conn:
        values = conn.execute(
            sa.select(table.c.last_seen_up, table.c.stopped_at,
                      table.c.last_cycle_at, table.c.created_at)
            .where(table.c.id == service_id)).one()
    assert list(values) == [stamp] * 4


def test_database_heartbeats_keep_sub_second_order(migrated_engine):
    service_id = db_services.register(ctx(), 'compute-a')
    first = db_services.heartbeat(ctx(), service_id)
    second = db_services.heartbeat(ctx(), service_id)
    assert first <= second
    # Two heartbeats in a row are far less than a second apart: with a
    # whole-second column both would often read the same second.
    assert (second - first).total_seconds() < 1
    assert any(t.microsecond for t in (first, second))


def test_mariadb_columns_are_datetime6(migrated_engine):
    inspector = sa.inspect(migrated_engine)
    for table, columns in (('services', ('last_seen_up', 'stopped_at',
                                         'last_cycle_at', 'created_at',
                                         'updated_at', 'deleted_at')),
                           ('compute_nodes', ('created_at', 'updated_at')),
                           ('instances', ('created_at', 'deleted_at'))):
        types = {c['name']: c['type'] for c in inspector.get_columns(table)}
        for column in columns:
            kind = types[column]
            if migrated_engine.dialect.name == 'mysql':
                assert getattr(kind, 'fsp', None) == 6, (table, column, kind)
            else:
                assert isinstance(kind, sa.DateTime), (table, column, kind)
