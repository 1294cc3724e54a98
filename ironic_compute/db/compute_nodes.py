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

"""Queries on ``compute_nodes``: every change of owner is conditional.

A row changes hands only by ``UPDATE ... WHERE uuid IN (...) AND host =
:the_owner_we_saw``, so when two services race for a row one of them
matches nothing and simply retries at its next cycle; a row is never owned
twice and never deleted by a service that does not own it.
"""

import json
import typing

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute.db import api as db_api
from ironic_compute.db import models
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as instances

_nodes = models.compute_nodes

# What the resource tracker keeps in step with Ironic, in a fixed order.
SYNCED_FIELDS = ('hypervisor_hostname', 'conductor_group', 'vcpus',
                 'memory_mb', 'local_gb', 'vcpus_used', 'memory_mb_used',
                 'local_gb_used', 'cpu_arch', 'resource_class', 'stats',
                 'shard', 'available', 'traits', 'capabilities')
# Bound the size of one IN (...) list.
_CHUNK = 500
# Rows of one update_fields statement: two parameters per row and column,
# within SQLite's 32,766 and the 65,535 of MariaDB and PostgreSQL.
_UPDATE_CHUNK = 200


class NodeRow(typing.NamedTuple):
    # A tuple, not a dataclass: a cycle builds one per row, 10^5 of them.
    uuid: str
    host: str | None
    conductor_group: str | None
    fields: tuple | None = None  # SYNCED_FIELDS values, for rows of ``host`` only
    shard: str | None = None  # set by load_shard_rows only


def chunks(items, size=None):
    items = list(items)
    size = size or _CHUNK
    for start in range(0, len(items), size):
        yield items[start:start + size]


def offer(uuid, resource_class, vcpus, memory_mb, local_gb, vcpus_used,
          stats):
    """What a row offers a build (see row_fields in resource_tracker)."""
    facts = json.loads(stats) if stats else {}
    return instances.NodeOffer(
        uuid=uuid, resource_class=resource_class, vcpus=vcpus,
        memory_mb=memory_mb, local_gb=local_gb,
        traits=frozenset(facts.get('traits') or ()),
        capabilities=dict(facts.get('capabilities') or {}),
        # Rows written before traits and availability were recorded: a
        # node whose capacity is not used is free.
        available=facts.get('available', not vcpus_used))


def traits_text(traits):
    """Traits as the ``traits`` column holds them: '|A|B|', sorted.

    ``traits LIKE '%|A|%'`` then finds a node with trait A (the scheduler
    matches in SQL, without decoding a row).
    """
    return '|' + ''.join(f'{trait}|' for trait in sorted(traits))


def capabilities_text(capabilities):
    """Capabilities ({key: value}) as the ``capabilities`` column holds
    them: '|k1:v1|k2:v2|', sorted, so that the scheduler finds
    '|k1:v1|' in SQL. A capability holding '|' is left out: the request
    never asks for one (inst.parse_capability), and it could make a needle
    straddle two."""
    return '|' + ''.join(
        f'{key}:{value}|' for key, value in sorted(capabilities.items())
        if '|' not in f'{key}{value}')


def host_is(host):
    """The condition: a row held by ``host`` (None: held by nobody)."""
    return _nodes.c.host.is_(None) if host is None else _nodes.c.host == host


@db_api.context_manager.reader
def load_rows(ctx, host):
    """Every live row as {uuid: NodeRow}; the synced values of ``host``'s.

    Two statements: who holds what (every row, three columns), and the
    values a cycle compares, for the rows of this host only.
    """
    result = ctx.session.execute(
        sa.select(_nodes.c.uuid, _nodes.c.host, _nodes.c.conductor_group)
        .where(_nodes.c.deleted == 0))
    rows = {uuid: NodeRow(uuid, owner, group)
            for uuid, owner, group in result}
    result = ctx.session.execute(
        sa.select(_nodes.c.uuid, *(_nodes.c[name] for name in SYNCED_FIELDS))
        .where(_nodes.c.deleted == 0, _nodes.c.host == host))
    for uuid, *fields in result:
        if uuid in rows:  # else created since the first read: next cycle
            rows[uuid] = rows[uuid]._replace(fields=tuple(fields))
    return rows


@db_api.context_manager.reader
def load_shard_rows(ctx, host, conductor_group, shards, unsharded):
    """The live rows a shard_ring cycle may act on, as {uuid: NodeRow}.

    One statement: the rows of ``shards`` (and the rows without a shard if
    ``unsharded``) in ``conductor_group`` (None: any), and every row of
    ``host`` (which it may have to release). The synced values are set for
    the rows of ``host`` only, like :func:`load_rows`.
    """
    of_shards = []
    if shards:
        of_shards.append(_nodes.c.shard.in_(sorted(shards)))
    if unsharded:
        of_shards.append(_nodes.c.shard.is_(None))
    wanted = _nodes.c.host == host
    if of_shards:
        in_group = sa.or_(*of_shards)
        if conductor_group is not None:
            in_group = sa.and_(_nodes.c.conductor_group == conductor_group,
                               in_group)
        wanted = sa.or_(wanted, in_group)
    return _rows(ctx, host, sa.and_(_nodes.c.deleted == 0, wanted))


@db_api.context_manager.reader
def load_rows_of(ctx, host, uuids):
    """The live rows of ``uuids`` as {uuid: NodeRow} (see load_shard_rows)."""
    rows = {}
    for chunk in chunks(uuids):
        rows.update(_rows(ctx, host, sa.and_(_nodes.c.deleted == 0,
                                             _nodes.c.uuid.in_(chunk))))
    return rows


@db_api.context_manager.reader
def recorded_traits(ctx, uuids):
    """{uuid: (conductor_group, traits column)} of the live rows of
    ``uuids``, whoever holds them: what their owner last recorded."""
    found = {}
    for chunk in chunks(sorted(uuids)):
        found.update((uuid, (group, traits)) for uuid, group, traits in
                     ctx.session.execute(
                         sa.select(_nodes.c.uuid, _nodes.c.conductor_group,
                                   _nodes.c.traits)
                         .where(_nodes.c.deleted == 0,
                                _nodes.c.uuid.in_(chunk))))
    return found


@db_api.context_manager.reader
def known_uuids(ctx, uuids):
    """The uuids of ``uuids`` that have a row, live or soft-deleted: the
    nodes this database has managed."""
    found = set()
    for chunk in chunks(sorted(uuids)):
        found.update(uuid for (uuid,) in ctx.session.execute(
            sa.select(_nodes.c.uuid).where(_nodes.c.uuid.in_(chunk))))
    return found


def _rows(ctx, host, condition):
    result = ctx.session.execute(
        sa.select(_nodes.c.uuid, _nodes.c.host, _nodes.c.conductor_group,
                  _nodes.c.shard,
                  *(_nodes.c[name] for name in SYNCED_FIELDS))
        .where(condition))
    return {uuid: NodeRow(uuid, owner, group,
                          tuple(fields) if owner == host else None, shard)
            for uuid, owner, group, shard, *fields in result}


@db_api.context_manager.reader
def offers_of(ctx, host):
    """What each row ``host`` holds offers a build (instances.NodeOffer)."""
    result = ctx.session.execute(
        sa.select(_nodes.c.uuid, _nodes.c.resource_class, _nodes.c.vcpus,
                  _nodes.c.memory_mb, _nodes.c.local_gb, _nodes.c.vcpus_used,
                  _nodes.c.stats)
        .where(_nodes.c.host == host, _nodes.c.deleted == 0))
    return [offer(*row) for row in result]


@db_api.writer
def move(ctx, uuids, from_host, to_host, to_service_id):
    """Give the rows of ``uuids`` still owned by ``from_host`` to ``to_host``.

    Returns the uuids that moved; the others changed owner meanwhile.
    """
    moved = set()
    now = _utcnow()
    for chunk in chunks(uuids):
        result = ctx.session.execute(
            _nodes.update()
            .where(_nodes.c.uuid.in_(chunk), _nodes.c.deleted == 0,
                   host_is(from_host))
            .values(host=to_host, service_id=to_service_id, updated_at=now))
        if result.rowcount == len(chunk):
            moved.update(chunk)
        elif result.rowcount:
            # Some rows were taken by someone else between our read and
            # this update; find out which ones are now ours to report.
            moved.update(ctx.session.execute(
                sa.select(_nodes.c.uuid).where(
                    _nodes.c.uuid.in_(chunk), _nodes.c.deleted == 0,
                    host_is(to_host))).scalars())
    return moved


@db_api.writer
def update_fields(ctx, host, changes):
    """Write new synced values for rows ``host`` still owns.

    ``changes`` maps uuid -> tuple of SYNCED_FIELDS values.
    """
    # One UPDATE per chunk, each column a CASE over the uuids: an
    # executemany would cost one round trip per row on PostgreSQL and
    # MariaDB (their drivers loop), 10^4 of them when a service takes over
    # a dead peer's nodes.
    now = _utcnow()
    for chunk in chunks(changes.items(), _UPDATE_CHUNK):
        uuids = [uuid for uuid, _ in chunk]
        values = {
            name: _typed(sa.case({uuid: sa.literal(fields[i], _nodes.c[name].type)
                                  for uuid, fields in chunk},
                                 value=_nodes.c.uuid),
                         _nodes.c[name].type)
            for i, name in enumerate(SYNCED_FIELDS)}
        ctx.session.execute(
            _nodes.update()
            .where(_nodes.c.uuid.in_(uuids), _nodes.c.host == host,
                   _nodes.c.deleted == 0)
            .values(updated_at=now, **values))


def _typed(expression, column_type):
    # The CAST keeps a column's type when all its values are NULL; MariaDB
    # has no CAST to a boolean (never NULL here: the CASE is typed enough).
    if isinstance(column_type, sa.Boolean):
        return expression
    return sa.cast(expression, column_type)


def _values(uuid, fields, host, service_id, now):
    return dict(zip(SYNCED_FIELDS, fields, strict=True), uuid=uuid, host=host,
                service_id=service_id, hypervisor_type='ironic',
                created_at=now, updated_at=now, deleted=0)


@db_api.writer
def create_or_revive(ctx, new, host, service_id):
    """Rows for nodes that have no live row; ``new`` maps uuid -> fields.

    A node that comes back gets its newest deleted row back (same uuid, same
    id); the others get a new row. A node another service recorded
    meanwhile is left to it. Returns (created, revived) uuid sets.
    """
    now = _utcnow()
    revived = set()
    for chunk in chunks(new):
        deleted = ctx.session.execute(
            sa.select(_nodes.c.uuid, sa.func.max(_nodes.c.id))
            .where(_nodes.c.uuid.in_(chunk), _nodes.c.deleted != 0)
            .group_by(_nodes.c.uuid)).all()
        for uuid, row_id in deleted:
            values = _values(uuid, new[uuid], host, service_id, now)
            del values['created_at']
            values.update(deleted_at=None)
            if _guarded(ctx, _nodes.update().where(
                    _nodes.c.id == row_id, _nodes.c.deleted != 0)
                    .values(**values)):
                revived.add(uuid)
    rows = [_values(uuid, fields, host, service_id, now)
            for uuid, fields in new.items() if uuid not in revived]
    created = set()
    for chunk in chunks(rows):
        # One statement per chunk; if another service recorded one of these
        # nodes meanwhile, fall back to row by row for that chunk.
        if _guarded(ctx, _nodes.insert(), chunk):
            created.update(r['uuid'] for r in chunk)
            continue
        for row in chunk:
            if _guarded(ctx, _nodes.insert(), [row]):
                created.add(row['uuid'])
    return created, revived


def _guarded(ctx, statement, params=None):
    """Run in a savepoint; False when a unique row exists already."""
    try:
        with ctx.session.begin_nested():
            result = ctx.session.execute(statement, params)
    except db_exc.DBDuplicateEntry:
        return False
    return params is not None or result.rowcount == 1


@db_api.writer
def soft_delete(ctx, uuid, host):
    """Soft-delete the live row of ``uuid`` if ``host`` still owns it."""
    now = _utcnow()
    result = ctx.session.execute(
        _nodes.update()
        .where(_nodes.c.uuid == uuid, _nodes.c.deleted == 0, host_is(host))
        .values(deleted=_nodes.c.id, deleted_at=now, updated_at=now))
    return result.rowcount == 1
