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

"""Takeover: a dead host's instances, and their nodes' rows, given to a
live host.

Every move is conditional: on the host and generation the caller read, and
on the dead host still being dead in the database itself (on its clock, at
the statement), not merely in the caller's view, which may be old. The
generation is bumped, so the dead host's workers match nothing if it comes
back.
"""

import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import liveness as db_liveness
from ironic_compute.db import models
from ironic_compute.db.models import _utcnow

_instances = models.instances


@db_api.context_manager.reader
def of_hosts(ctx, hosts):
    """The live instances managed by ``hosts``: (uuid, host, node,
    partition_key, generation) rows."""
    hosts = list(hosts)
    if not hosts:
        return []
    return ctx.session.execute(
        sa.select(_instances.c.uuid, _instances.c.host, _instances.c.node,
                  _instances.c.partition_key, _instances.c.generation)
        .where(_instances.c.host.in_(hosts),
               _instances.c.deleted == 0)).all()


def host_still_down(ctx, host, down_for):
    """SQL: ``host`` is dead for a limit of ``down_for`` seconds, on the
    database's clock at the statement: silent for longer, or forced down,
    or without a live services row (liveness.dead_reason, in SQL)."""
    return ~db_liveness.host_alive(host, down_for)


# Instances of one bulk takeover statement: two parameters each (uuid,
# generation), far within every backend's limit on bound parameters.
TAKEOVER_CHUNK = 500


def take_over_many(ctx, dead_host, seen, host, service_id, down_for,
                   node_owners=None, chunk=TAKEOVER_CHUNK):
    """Give the instances ``seen`` (of_hosts rows of ``dead_host``) and
    their nodes' rows to ``host``; returns the rows that moved.

    The bulk form of take_over, with the same conditions, one transaction
    per chunk of ``chunk`` instances: one UPDATE moves the chunk's rows
    that still have ``dead_host`` and the generation seen (a row a worker
    or another takeover changed meanwhile is left alone), while the host
    is still down on the database's clock. The nodes' rows then move in
    one conditional UPDATE per holder seen (``node_owners``: node uuid ->
    the holder we saw, absent: held by nobody), and one from the dead
    host. A few statements per chunk, never one round trip per instance.
    """
    node_owners = node_owners or {}
    moved = []
    for part in db_nodes.chunks(
            (row for row in seen if row.host == dead_host), chunk):
        moved.extend(_take_over_chunk(ctx, dead_host, part, host,
                                      service_id, down_for, node_owners))
    return moved


@db_api.writer
def _take_over_chunk(ctx, dead_host, part, host, service_id, down_for,
                     node_owners):
    """One chunk of take_over_many, in one transaction."""
    now = _utcnow()
    pairs = [(row.uuid, row.generation) for row in part]
    count = ctx.session.execute(
        _instances.update()
        # The plain IN on uuid lets every backend use the unique index;
        # the tuple IN is the condition: the generation each row had.
        .where(_instances.c.uuid.in_([uuid for uuid, _ in pairs]),
               sa.tuple_(_instances.c.uuid,
                         _instances.c.generation).in_(pairs),
               _instances.c.host == dead_host, _instances.c.deleted == 0,
               host_still_down(ctx, dead_host, down_for))
        .values(host=host, generation=_instances.c.generation + 1,
                updated_at=now, **db_instances.VERSION_BUMP)).rowcount
    if count == len(part):
        moved = list(part)
    elif count:
        # Some rows changed between our read and this update: the ones
        # that moved are ours now, one generation past what we saw.
        ours = {tuple(found) for found in ctx.session.execute(
            sa.select(_instances.c.uuid, _instances.c.generation)
            .where(_instances.c.uuid.in_([row.uuid for row in part]),
                   _instances.c.host == host, _instances.c.deleted == 0))}
        moved = [row for row in part
                 if (row.uuid, row.generation + 1) in ours]
    else:
        return []
    # Each node's row moves if the holder seen still holds it, or if the
    # dead host does (the cycle may have handed it back to its instance's
    # host since the caller read it); a row that went elsewhere meanwhile
    # follows its instance at the next cycle, as with take_over.
    by_holder = {}
    for row in moved:
        if row.node is None:
            continue
        for holder in {node_owners.get(row.node), dead_host} - {host}:
            by_holder.setdefault(holder, []).append(row.node)
    for holder, nodes in sorted(by_holder.items(),
                                key=lambda item: item[0] != dead_host):
        db_nodes.move(ctx, nodes, holder, host, service_id)
    return moved


def take_over(ctx, seen, host, service_id, down_for, node_owner=None):
    """Give the instance ``seen`` (an of_hosts row of a dead host) and its
    node's row to ``host``; whether the instance moved.

    take_over_many for one instance: it moves only if it still has the
    dead host and the generation seen, and only if that host is still down
    in the database itself (silent for ``down_for`` seconds on the
    database's clock, or forced down), not merely in the caller's view,
    which may be old; its generation is bumped, so the dead host's workers
    match nothing if it comes back. The node's row moves only if
    ``node_owner`` (the holder we saw) still holds it.
    """
    return bool(take_over_many(ctx, seen.host, [seen], host, service_id,
                               down_for, {seen.node: node_owner}))
