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

"""Queries of ironic-compute-manage: what an operator looks at and changes.

Every change here is a conditional statement like the service's own: a
service flag is set only on the live row of that host, a node is moved only
while it is still held by the owner that was checked and that owner is
still dead, and a node with the instances on it moves in one transaction
(all or nothing). Only a dead service loses its work (cluster/liveness.py):
a disabled one that still heartbeats keeps it.
"""

import dataclasses
import datetime
import json

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.cluster import liveness
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import liveness as db_liveness
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst

_services = models.services
_nodes = models.compute_nodes
_instances = models.instances


def no_service(host):
    return exception.AdminNotFound(f'no {db_services.BINARY} service on host {host!r}')


# --- services ---------------------------------------------------------------

@db_api.writer
def update_service(ctx, host, **values):
    """Set ``values`` on the live service row of ``host``; AdminNotFound if none."""
    result = ctx.session.execute(
        _services.update()
        .where(_services.c.host == host,
               _services.c.binary == db_services.BINARY,
               _services.c.deleted == 0)
        .values(updated_at=_utcnow(), **values))
    if result.rowcount != 1:
        raise no_service(host)


# --- compute nodes ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NodeRecord:
    uuid: str
    host: str | None
    service_id: int | None
    conductor_group: str | None
    hypervisor_hostname: str | None
    updated_at: datetime.datetime | None
    # The node's instance as Ironic listed it at the last cycle.
    ironic_instance: str | None = None


def _stats(text):
    return json.loads(text) if text else {}


@db_api.context_manager.reader
def get_node(ctx, uuid):
    """The live compute_nodes row of ``uuid`` as a NodeRecord, or None."""
    row = ctx.session.execute(
        sa.select(_nodes.c.uuid, _nodes.c.host, _nodes.c.service_id,
                  _nodes.c.conductor_group, _nodes.c.hypervisor_hostname,
                  _nodes.c.updated_at, _nodes.c.stats)
        .where(_nodes.c.uuid == uuid, _nodes.c.deleted == 0)).first()
    if row is None:
        return None
    *record, stats = row
    return NodeRecord(*record, _stats(stats).get('instance_uuid'))


@dataclasses.dataclass(frozen=True)
class NodeListing:
    record: NodeRecord
    name: str | None
    vcpus: int
    memory_mb: int
    local_gb: int
    resource_class: str | None


@db_api.context_manager.reader
def list_nodes(ctx, host=None, conductor_group=None):
    """The live compute_nodes rows with their capacity, by uuid."""
    query = (sa.select(_nodes.c.uuid, _nodes.c.host, _nodes.c.service_id,
                       _nodes.c.conductor_group, _nodes.c.hypervisor_hostname,
                       _nodes.c.updated_at, _nodes.c.stats, _nodes.c.vcpus,
                       _nodes.c.memory_mb, _nodes.c.local_gb,
                       _nodes.c.resource_class)
             .where(_nodes.c.deleted == 0).order_by(_nodes.c.uuid))
    if host is not None:
        query = query.where(_nodes.c.host == host)
    if conductor_group is not None:
        query = query.where(sa.func.lower(_nodes.c.conductor_group)
                            == conductor_group.lower())
    listing = []
    for *record, stats, vcpus, memory_mb, local_gb, rc in ctx.session.execute(
            query):
        facts = _stats(stats)
        listing.append(NodeListing(
            NodeRecord(*record, facts.get('instance_uuid')), facts.get('name'),
            vcpus, memory_mb, local_gb, rc))
    return listing


@db_api.context_manager.reader
def node_is_known(ctx, uuid):
    """Whether any row (live or deleted) or live instance names ``uuid``."""
    rows = sa.select(_nodes.c.id).where(_nodes.c.uuid == uuid)
    instances = sa.select(_instances.c.id).where(
        _instances.c.node == uuid, _instances.c.deleted == 0)
    return ctx.session.execute(
        sa.select(sa.or_(sa.exists(rows), sa.exists(instances)))).scalar()


@db_api.context_manager.reader
def partition_nodes(ctx, conductor_group=None):
    """(uuid, conductor_group, shard) of the live rows of a group (None:
    all)."""
    query = sa.select(_nodes.c.uuid, _nodes.c.conductor_group,
                      _nodes.c.shard).where(_nodes.c.deleted == 0)
    if conductor_group:
        query = query.where(sa.func.lower(_nodes.c.conductor_group)
                            == conductor_group.lower())
    return ctx.session.execute(query).all()


@db_api.context_manager.reader
def shard_counts(ctx):
    """{shard (None: no shard): number of live rows}, over every conductor
    group, as Ironic counts its shards for the shard ring."""
    query = (sa.select(_nodes.c.shard, sa.func.count())
             .where(_nodes.c.deleted == 0).group_by(_nodes.c.shard))
    return dict(ctx.session.execute(query).all())


@db_api.context_manager.reader
def node_counts(ctx, conductor_group=None):
    """{host: number of live rows} (None: rows without owner).

    With ``conductor_group``, only the rows of that group (the names are
    compared without regard to case, as Ironic does).
    """
    query = (sa.select(_nodes.c.host, sa.func.count())
             .where(_nodes.c.deleted == 0).group_by(_nodes.c.host))
    if conductor_group:
        query = query.where(sa.func.lower(_nodes.c.conductor_group)
                            == conductor_group.lower())
    return dict(ctx.session.execute(query).all())


@dataclasses.dataclass(frozen=True)
class MoveResult:
    uuid: str
    source: str | None
    source_state: str  # why the source lost its work (liveness.dead_reason)
    destination: str
    instances: list  # the instances that moved with the node
    # instance uuid -> its own host, alive: the instance stayed there.
    stayed: dict = dataclasses.field(default_factory=dict)


def _source_alive(uuid, host, record, now, service_down_time):
    """AdminRefused: the one line saying that ``host`` is alive, and what to do."""
    state = ', '.join(word for word, applies in (
        ('disabled', record.disabled), ('stopped', record.stopped))
        if applies) or 'up'
    heard = liveness.age(record.last_seen_up, now)
    return exception.AdminRefused(
        f'cannot move node {uuid} from {host}: that service is alive '
        f'({state}, last heartbeat {heard:.0f} s ago): a service keeps its '
        'work while it heartbeats, disabled or not; stop it and wait until '
        f'it has been silent for service_down_time ({service_down_time:g} '
        f's), or run "service force-down {host}" first')


def _move_instances(ctx, node_uuid, host, now, service_down_time):
    """Give the live instances on ``node_uuid`` whose own host is dead
    (liveness.dead_reason, asked in SQL) to ``host``.

    Returns (the uuids that moved, {uuid: host} of those that stayed with
    their live host). An instance moves for its host's death, never for
    the node's row: a live host keeps managing it, and takes the node's
    row back at its next cycle (its instance pins the node). AdminRefused,
    so that the whole move is rolled back, when an instance changed or its
    host came back between the read and the update.
    """
    host_dead = ~db_liveness.host_alive(_instances.c.host, service_down_time)
    on_node = sa.and_(_instances.c.node == node_uuid, _instances.c.deleted == 0)
    rows = ctx.session.execute(
        sa.select(_instances.c.uuid, _instances.c.host,
                  host_dead.label('dead')).where(on_node)).all()
    moving = sorted(row.uuid for row in rows if row.dead)
    stayed = {row.uuid: row.host for row in rows if not row.dead}
    if moving:
        count = ctx.session.execute(
            _instances.update()
            .where(_instances.c.uuid.in_(moving), on_node, host_dead)
            # A new manager: the old one's workers must match nothing.
            .values(host=host, generation=_instances.c.generation + 1,
                    updated_at=now, version=_instances.c.version + 1)
        ).rowcount
        if count != len(moving):
            raise exception.AdminRefused(f'an instance on node {node_uuid} changed, or its '
                                         'host came back, during the move; nothing was '
                                         'changed, look again')
    return moving, stayed


@db_api.writer
def move_node(ctx, uuid, destination, service_down_time):
    """Move the row of ``uuid`` to ``destination``, with the instances on
    the node whose own host is dead; returns a MoveResult.

    One transaction. Only a dead service loses its work: refused (and
    nothing changed) unless the row's owner is dead on the database's
    clock (forced down, or silent for longer than ``service_down_time``;
    disabled or stopped are not enough), gone, or there is none, and
    unless the destination may take new work. The database checks the
    owner again in the UPDATE itself, like a takeover: a service that
    heartbeats meanwhile keeps its node.
    """
    node = get_node(ctx, uuid)
    if node is None:
        raise exception.AdminNotFound(f'no compute node {uuid}')
    listing = db_services.load_services(ctx)
    # Judged on the database's clock, like the services judge each other.
    now = listing.now
    services = {s.host: s for s in listing.rows}
    target = services.get(destination)
    if target is None:
        raise no_service(destination)
    if node.host == destination:
        raise exception.AdminRefused(f'node {uuid} is already on {destination}')
    why = liveness.down_reason(target.record(), now, service_down_time)
    if why is not None:
        raise exception.AdminRefused(f'cannot move node {uuid} to {destination}: '
                                     f'that service is down ({why})')
    held_by = compute_nodes.host_is(node.host)
    if node.host is None:
        source_state = 'no owner'
    else:
        source = services.get(node.host)
        record = source.record() if source is not None else None
        source_state = liveness.dead_reason(record, now, service_down_time)
        if source_state is None:
            raise _source_alive(uuid, node.host, record, now,
                                service_down_time)
        held_by = sa.and_(held_by, ~db_liveness.host_alive(
            node.host, service_down_time))
    result = ctx.session.execute(
        _nodes.update()
        .where(_nodes.c.uuid == uuid, _nodes.c.deleted == 0, held_by)
        .values(host=destination, service_id=target.id, updated_at=now))
    if result.rowcount != 1:
        raise exception.AdminRefused(f'node {uuid} changed owner, or its owner came back, '
                                     'during the move; nothing was changed, look again')
    moved, stayed = _move_instances(ctx, uuid, destination, now,
                                    service_down_time)
    return MoveResult(uuid, node.host, source_state, destination, moved,
                      stayed)


# --- instances --------------------------------------------------------------

@db_api.writer
def add_instance(ctx, uuid, host, node, vm_state=None):
    """Record that ``host`` manages instance ``uuid`` on node ``node``."""
    if db_services.get_by_host(ctx, host) is None:
        raise no_service(host)
    other = ctx.session.execute(
        sa.select(_instances.c.uuid).where(
            _instances.c.node == node, _instances.c.deleted == 0)).first()
    if other is not None and other.uuid == uuid:
        raise exception.AdminRefused(f'instance {uuid} exists already')
    if other is not None:
        raise exception.AdminRefused(f'node {node} already has instance {other.uuid}')
    now = _utcnow()
    try:
        ctx.session.execute(_instances.insert().values(
            uuid=uuid, host=host, node=node, vm_state=vm_state,
            created_at=now, updated_at=now, deleted=0))
    except db_exc.DBDuplicateEntry as exc:
        # The uuid exists (live or deleted), or another command recorded an
        # instance on the node since the check above (one live per node).
        if 'node' in (exc.columns or ()):
            raise exception.AdminRefused(f'node {node} got another instance meanwhile'
                                         ) from exc
        raise exception.AdminRefused(f'instance {uuid} exists already') from exc


@dataclasses.dataclass(frozen=True)
class RemovedInstance:
    uuid: str
    node: str | None
    built: bool  # made by "instance create" (it has a resource class)


def _built_here(uuid):
    return exception.AdminRefused(
        f"instance {uuid} was built by ironic-compute: 'instance delete "
        f"{uuid}' tears its node down; 'instance remove --force {uuid}' only "
        'forgets the record and leaves the node and its allocation as they '
        'are')


@db_api.writer
def remove_instance(ctx, uuid, force=False):
    """Forget the live instance ``uuid``: a soft delete, vm_state removed.

    Ironic is not touched, now or later: the reaper tears down only the
    nodes of instances deleted as instances (vm_state deleted), so a node
    whose record was removed stays as it is. An instance this database
    built is refused unless ``force``: its owner would otherwise stop
    managing a node it deployed, which is rarely what was meant.
    """
    row = ctx.session.execute(
        sa.select(_instances.c.id, _instances.c.node,
                  _instances.c.resource_class)
        .where(_instances.c.uuid == uuid, _instances.c.deleted == 0)).first()
    if row is None:
        raise exception.AdminNotFound(f'no instance {uuid}')
    built = row.resource_class is not None
    if built and not force:
        raise _built_here(uuid)
    now = _utcnow()
    result = ctx.session.execute(
        _instances.update()
        .where(_instances.c.id == row.id, _instances.c.deleted == 0)
        .values(deleted=_instances.c.id, deleted_at=now, updated_at=now,
                vm_state=inst.REMOVED, task_state=None,
                # A task queued on it ends here: its arguments (a rescue
                # password) go with it, as at every other end of a task.
                task_args=None, version=_instances.c.version + 1))
    if result.rowcount != 1:
        raise exception.AdminNotFound(f'no instance {uuid}')  # deleted meanwhile
    return RemovedInstance(uuid, row.node, built)


def removed_instances(ctx, uuids):
    """Which of ``uuids`` have a removed record and no live one."""
    return db_instances.gone_records(ctx, uuids,
                                     _instances.c.vm_state == inst.REMOVED)
