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

"""Queries on the ``services`` table: registration, heartbeat, peers.

Every time written here is the database server's (``clock.utc_now``), and
:func:`load_services` returns the server's time with the rows: liveness is
judged on one clock, whatever the hosts' clocks say.
"""

import dataclasses
import datetime

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute.db import api as db_api
from ironic_compute.db import clock
from ironic_compute.db import models
from ironic_compute.nodes import ownership

BINARY = 'ironic-compute'
TOPIC = 'compute'

_services = models.services
_nodes = models.compute_nodes


@dataclasses.dataclass(frozen=True)
class ServiceRow:
    id: int
    host: str
    disabled: bool
    disabled_reason: str | None
    forced_down: bool
    last_seen_up: datetime.datetime | None
    stopped_at: datetime.datetime | None
    last_cycle_at: datetime.datetime | None
    last_cycle_seconds: float | None
    partition_key: str | None
    shard: str | None
    ring_settings: str | None
    shard_ring: bool
    node_count: int

    @property
    def cycle_started_at(self):
        """When its last recorded cycle started (database time), or None."""
        if self.last_cycle_at is None:
            return None
        return self.last_cycle_at - datetime.timedelta(
            seconds=self.last_cycle_seconds or 0)

    def record(self):
        """This row as the ownership rules see a service."""
        return ownership.ServiceRecord(
            host=self.host, disabled=self.disabled,
            forced_down=self.forced_down, stopped=self.stopped_at is not None,
            last_seen_up=self.last_seen_up,
            has_compute_nodes=self.node_count > 0,
            partition_key=self.partition_key, shard=self.shard,
            shard_ring=bool(self.shard_ring))


_COLUMNS = (_services.c.id, _services.c.host, _services.c.disabled,
            _services.c.disabled_reason, _services.c.forced_down,
            _services.c.last_seen_up, _services.c.stopped_at,
            _services.c.last_cycle_at, _services.c.last_cycle_seconds,
            _services.c.partition_key, _services.c.shard,
            _services.c.ring_settings, _services.c.shard_ring)


# A second process of the same host may insert the row between our UPDATE
# and INSERT; the retry then finds it and revives it.
@db_api.writer(also=db_exc.DBDuplicateEntry)
def register(ctx, host, binary=BINARY, partition_key=None, shard=None):
    """Create or revive the row of this service; return its id.

    A service that starts again keeps its row (and its id, which its
    compute_nodes rows point at) and clears the mark of a clean stop. The
    write comes first: on SQLite a transaction that reads and then writes
    fails at once, without waiting, when another process writes meanwhile.
    """
    now = clock.utc_now()
    this_service = sa.and_(_services.c.host == host,
                           _services.c.binary == binary,
                           _services.c.deleted == 0)
    revived = ctx.session.execute(
        _services.update().where(this_service).values(
            stopped_at=None, last_seen_up=now, updated_at=now,
            partition_key=partition_key, shard=shard))
    if revived.rowcount:
        return ctx.session.execute(
            sa.select(_services.c.id).where(this_service)).scalar_one()
    result = ctx.session.execute(_services.insert().values(
        host=host, binary=binary, topic=TOPIC, report_count=0,
        disabled=False, forced_down=False, last_seen_up=now,
        partition_key=partition_key, shard=shard, created_at=now,
        deleted=0))
    return result.inserted_primary_key[0]


@dataclasses.dataclass(frozen=True)
class Beat:
    """What a heartbeat learnt: the database's time it wrote, and whether
    the service may still act (the lease, see lease.py)."""

    now: datetime.datetime | None
    forced_down: bool
    gone: bool  # no live row: deleted by an operator


@db_api.writer
def heartbeat_state(ctx, service_id, before_commit=None):
    """Stamp the row with the database's time; return a Beat.

    ``before_commit``, if given, is called with the Beat inside the
    transaction, before the new stamp is visible to anyone else
    (daemon/heartbeat.py: a lapse must be known before a peer or this
    service's own cycle can read the heartbeat that ends it).
    """
    now = clock.utc_now()
    # A running service is not stopped, whatever an older process of the
    # same host wrote when it left.
    ctx.session.execute(
        _services.update().where(_services.c.id == service_id).values(
            report_count=_services.c.report_count + 1,
            last_seen_up=now, updated_at=now, stopped_at=None))
    row = ctx.session.execute(
        sa.select(_services.c.last_seen_up, _services.c.forced_down,
                  _services.c.deleted)
        .where(_services.c.id == service_id)).first()
    if row is None:
        beat = Beat(None, False, True)
    else:
        beat = Beat(row.last_seen_up, bool(row.forced_down), row.deleted != 0)
    if before_commit is not None:
        before_commit(beat)
    return beat


def heartbeat(ctx, service_id):
    """Stamp the row with the database's time; return that time."""
    return heartbeat_state(ctx, service_id).now


@db_api.writer
def mark_stopped(ctx, service_id):
    """Tell the peers this service left, so they take its nodes at once."""
    now = clock.utc_now()
    ctx.session.execute(
        _services.update().where(_services.c.id == service_id).values(
            stopped_at=now, updated_at=now))


@db_api.writer
def record_cycle(ctx, service_id, seconds, partition_key=None, shard=None,
                 ring_settings=None, shard_ring=False):
    now = clock.utc_now()
    ctx.session.execute(
        _services.update().where(_services.c.id == service_id).values(
            last_cycle_at=now, last_cycle_seconds=seconds,
            partition_key=partition_key, shard=shard,
            ring_settings=ring_settings, shard_ring=bool(shard_ring)))


@dataclasses.dataclass(frozen=True)
class ServiceList:
    """The services rows and the database's time they were read at."""

    rows: list[ServiceRow]
    now: datetime.datetime  # naive UTC, the database server's clock


@db_api.context_manager.reader
def load_services(ctx, binary=BINARY, count_nodes=True):
    """Every live row of ``binary`` and the database's time: a ServiceList.

    One statement reads the rows and the server's clock, so the heartbeats
    are judged against the clock that wrote them. Each row has its number
    of compute nodes; with ``count_nodes=False`` (every cycle) ``node_count``
    is only 1 or 0: whether the service holds any row, which is cheaper
    than counting them all.
    """
    if count_nodes:
        counts = (sa.select(_nodes.c.service_id, sa.func.count().label('n'))
                  .where(_nodes.c.deleted == 0)
                  .group_by(_nodes.c.service_id).subquery())
        node_count = sa.func.coalesce(counts.c.n, 0)
        source = _services.outerjoin(
            counts, counts.c.service_id == _services.c.id)
    else:
        holds = (sa.select(sa.literal(1))
                 .where(_nodes.c.service_id == _services.c.id,
                        _nodes.c.deleted == 0).exists())
        node_count = sa.case((holds, 1), else_=0)
        source = _services
    query = (sa.select(*_COLUMNS, node_count, clock.utc_now())
             .select_from(source)
             .where(_services.c.binary == binary, _services.c.deleted == 0)
             .order_by(_services.c.host))
    result = ctx.session.execute(query).all()
    if not result:
        return ServiceList([], clock.now(ctx))
    return ServiceList([ServiceRow(*row[:-1]) for row in result],
                       result[0][-1])


@db_api.context_manager.reader
def list_services(ctx, binary=BINARY, count_nodes=True):
    """The rows of :func:`load_services`, without the database's time."""
    return load_services(ctx, binary, count_nodes).rows


@db_api.context_manager.reader
def get_by_host(ctx, host, binary=BINARY):
    return next((s for s in list_services(ctx, binary) if s.host == host),
                None)
