"""Queries on ``instances``: requests, their states, and who manages them.

Every change of state or host is conditional on what the writer saw
(``WHERE host = :me AND task_state = :seen``), like the moves of compute
nodes: a delete asked for during a build, or a takeover racing a host that
came back, makes the other writer match nothing instead of overwriting.
"""

import dataclasses
import datetime

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute import instances as inst
from ironic_compute import ownership
from ironic_compute import scheduler
from ironic_compute.db import api as db_api
from ironic_compute.db import clock
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.db.models import _utcnow

_instances = models.Instance.__table__
_nodes = models.ComputeNode.__table__
_services = models.Service.__table__


@dataclasses.dataclass(frozen=True)
class InstanceRow:
    """An instance as the CLI shows it and a worker reads it."""

    uuid: str
    name: str | None
    host: str | None
    node: str | None
    vm_state: str | None
    task_state: str | None
    fault: str | None
    partition_key: str | None
    resource_class: str | None
    vcpus: int
    memory_mb: int
    disk_gb: int
    traits: str | None
    image_source: str | None
    created_at: datetime.datetime | None
    updated_at: datetime.datetime | None
    launched_at: datetime.datetime | None
    # Bumped by every change of host: a worker acts only while the row
    # still has the host and generation it read (the fencing token).
    generation: int = 0

    def spec(self):
        return inst.RequestSpec(
            resource_class=self.resource_class or '', vcpus=self.vcpus,
            memory_mb=self.memory_mb, disk_gb=self.disk_gb,
            traits=inst.parse_traits(self.traits),
            partition_key=self.partition_key)

    def as_dict(self):
        """The public view (CLI JSON): traits as a list, times as ISO."""
        values = dataclasses.asdict(self)
        values['traits'] = sorted(inst.parse_traits(self.traits))
        return values


_COLUMNS = [_instances.c[f.name] for f in dataclasses.fields(InstanceRow)]


def _select():
    return sa.select(*_COLUMNS)


@db_api.context_manager.reader
def load_all(ctx, node=None):
    """Every live instance (on ``node`` only, if given) as InstanceInfo."""
    query = (sa.select(_instances.c.uuid, _instances.c.host, _instances.c.node)
             .where(_instances.c.deleted == 0))
    if node is not None:
        query = query.where(_instances.c.node == node)
    result = ctx.session.execute(query)
    return [ownership.InstanceInfo(uuid, host or '', node)
            for uuid, host, node in result]


@db_api.context_manager.reader
def get(ctx, uuid, deleted=False):
    """The live instance ``uuid`` (or its newest deleted row), or None."""
    query = _select().where(_instances.c.uuid == uuid)
    if deleted:
        query = query.order_by(_instances.c.deleted == 0,
                               _instances.c.id.desc())
    else:
        query = query.where(_instances.c.deleted == 0)
    row = ctx.session.execute(query.limit(1)).first()
    return InstanceRow(*row) if row is not None else None


@db_api.context_manager.reader
def list_instances(ctx, host=None):
    query = (_select().where(_instances.c.deleted == 0)
             .order_by(_instances.c.host, _instances.c.created_at,
                       _instances.c.uuid))
    if host is not None:
        query = query.where(_instances.c.host == host)
    return [InstanceRow(*row) for row in ctx.session.execute(query)]


@db_api.context_manager.reader
def pending(ctx, host):
    """The instances ``host`` has work for (build or delete), oldest first."""
    query = (_select()
             .where(_instances.c.host == host,
                    _instances.c.task_state.in_(inst.PENDING_TASKS),
                    _instances.c.deleted == 0)
             .order_by(_instances.c.created_at, _instances.c.uuid))
    return [InstanceRow(*row) for row in ctx.session.execute(query)]


@db_api.context_manager.reader
def deleted_builds(ctx, uuids):
    """Which of ``uuids`` are instances this service built and then deleted.

    Only instances made by ``instance create`` count (they have a resource
    class): removing a record made by ``instance add`` never leads to a
    node being torn down.
    """
    found = set()
    for chunk in db_nodes.chunks(uuids):
        live = set(ctx.session.execute(
            sa.select(_instances.c.uuid).where(
                _instances.c.uuid.in_(chunk),
                _instances.c.deleted == 0)).scalars())
        found |= set(ctx.session.execute(
            sa.select(_instances.c.uuid).where(
                _instances.c.uuid.in_(chunk),
                _instances.c.resource_class.is_not(None),
                _instances.c.deleted != 0)).scalars()) - live
    return found


@db_api.context_manager.reader
def hosts(ctx):
    """The hosts that manage at least one live instance."""
    return set(ctx.session.execute(
        sa.select(_instances.c.host).where(_instances.c.deleted == 0,
                                           _instances.c.host.is_not(None))
        .distinct()).scalars())


@db_api.writer
def create(ctx, uuid, name, host, spec, image_source):
    """Record a build request for ``host``; DBDuplicateEntry if it exists."""
    now = _utcnow()
    ctx.session.execute(_instances.insert().values(
        uuid=uuid, name=name, host=host, node=None,
        vm_state=inst.BUILDING, task_state=inst.SCHEDULED,
        partition_key=spec.partition_key,
        resource_class=spec.resource_class, vcpus=spec.vcpus,
        memory_mb=spec.memory_mb, disk_gb=spec.disk_gb,
        traits=spec.traits_json(), image_source=image_source,
        created_at=now, updated_at=now, deleted=0))
    return get(ctx, uuid)


_alembic_version = sa.table('alembic_version', sa.column('version_num'))


def lock_schedulers(ctx):
    """Serialise schedulers: each takes one lock until its commit, so two
    schedulers never count the same free node.

    On MariaDB and PostgreSQL the lock is the row of ``alembic_version``,
    which only migrations write. Not the services rows: every heartbeat
    updates its row, and schedulers slowed down while holding those rows
    (30 ``instance create`` at once on a 2-core host) held heartbeats back
    for 5 s, long enough for the peers to judge live services down and
    take their nodes and instances. On SQLite a write takes the database
    lock (it changes nothing).
    """
    if ctx.session.get_bind().dialect.name == 'sqlite':
        ctx.session.execute(
            _services.update().where(_services.c.deleted == 0)
            .values(report_count=_services.c.report_count))
        return
    ctx.session.execute(sa.select(_alembic_version.c.version_num)
                        .with_for_update())


@db_api.context_manager.reader
def host_loads(ctx, hosts, partition_key=None):
    """Per host: (its compute_nodes rows as NodeOffers, busy node uuids,
    builds waiting for a node, live instance count)."""
    hosts = list(hosts)
    if not hosts:
        return {}
    query = (sa.select(_nodes.c.host, _nodes.c.uuid, _nodes.c.resource_class,
                       _nodes.c.vcpus, _nodes.c.memory_mb, _nodes.c.local_gb,
                       _nodes.c.vcpus_used, _nodes.c.stats)
             .where(_nodes.c.host.in_(hosts), _nodes.c.deleted == 0))
    if partition_key is not None:
        query = query.where(_nodes.c.conductor_group == partition_key)
    offers = {host: [] for host in hosts}
    for host, *row in ctx.session.execute(query):
        offers[host].append(db_nodes.offer(*row))
    busy = set(ctx.session.execute(
        sa.select(_instances.c.node).where(
            _instances.c.node.is_not(None),
            _instances.c.deleted == 0)).scalars())
    waiting = dict.fromkeys(hosts, 0)
    counts = dict.fromkeys(hosts, 0)
    # A build that has no node yet will take one of its host's free nodes.
    building = sa.and_(_instances.c.node.is_(None),
                       _instances.c.task_state.in_((inst.SCHEDULED,
                                                    inst.SPAWNING)))
    for host, is_building, count in ctx.session.execute(
            sa.select(_instances.c.host, building, sa.func.count())
            .where(_instances.c.host.in_(hosts), _instances.c.deleted == 0)
            .group_by(_instances.c.host, building)):
        counts[host] += count
        if is_building:
            waiting[host] += count
    return {host: (offers[host], busy, waiting[host], counts[host])
            for host in hosts}


def _services_and_now(ctx):
    listing = db_services.load_services(ctx, count_nodes=False)
    return listing.rows, listing.now  # the database's clock


class Refused(Exception):
    """A request that cannot be recorded; the message is one line."""


class NodeTaken(Exception):
    """Another live instance is recorded on the node (one per node)."""


@db_api.writer
def schedule_and_create(ctx, uuid, name, spec, image_source,
                        service_down_time, host=None):
    """Choose the host (unless given) and record the request, atomically.

    Schedulers are serialised (:func:`lock_schedulers`), so two requests
    made at once never count the same free node. Raises scheduler.NoValidHost
    (nothing written) when no live service can take it.
    """
    lock_schedulers(ctx)
    services, now = _services_and_now(ctx)
    live = {s.host: s for s in services
            if ownership.is_up(s.record(), now, service_down_time)
            and (spec.partition_key is None
                 or (s.partition_key or None) == spec.partition_key)}
    if host is not None:
        if not any(s.host == host for s in services):
            raise Refused(f'no ironic-compute service {host!r}')
        chosen = host
    else:
        loads = host_loads(ctx, live, spec.partition_key)
        states, every_offer, busy = [], [], set()
        for candidate, (offers, busy, waiting, count) in loads.items():
            free = len(inst.match_nodes(spec, offers, busy).candidates)
            states.append(scheduler.HostState(candidate, free - waiting,
                                              count))
            every_offer += offers
        # The refusal names what did not match, over every live node.
        why = (inst.match_nodes(spec, every_offer, busy).fault
               or f'no free node for {spec.describe()} (all are being built on)')
        chosen = scheduler.pick_host(states, why)
    return create(ctx, uuid, name, chosen, spec, image_source)


@db_api.writer
def request_delete(ctx, uuid):
    """Mark the instance for deletion; the row as it is now, or None."""
    now = _utcnow()
    result = ctx.session.execute(
        _instances.update()
        .where(_instances.c.uuid == uuid, _instances.c.deleted == 0,
               sa.or_(_instances.c.task_state.is_(None),
                      _instances.c.task_state != inst.DELETING))
        .values(task_state=inst.DELETING, updated_at=now))
    row = get(ctx, uuid)
    if row is None and not result.rowcount:
        return None
    return row


def _mine(claim, task_state):
    """The row ``claim`` (an InstanceRow as a worker read it) names, while
    it still has that host, generation and ``task_state``."""
    return sa.and_(_instances.c.uuid == claim.uuid,
                   _instances.c.host == claim.host,
                   _instances.c.generation == claim.generation,
                   _instances.c.deleted == 0,
                   _instances.c.task_state == task_state)


@db_api.writer
def transition(ctx, claim, seen_state, **values):
    """Change the instance if it still has the host and generation of
    ``claim`` (the row as the worker read it) and task_state ``seen_state``.

    Returns whether it changed: False means a delete, a takeover or
    another worker came first, and the worker must stop there.
    """
    values.setdefault('updated_at', _utcnow())
    result = ctx.session.execute(
        _instances.update().where(_mine(claim, seen_state))
        .values(**values))
    return result.rowcount == 1


def record_node(ctx, claim, node):
    """Record the node a build reserved; whether the row still was the
    claim's. NodeTaken if another live instance is recorded on it."""
    try:
        return transition(ctx, claim, inst.SPAWNING, node=node)
    except db_exc.DBDuplicateEntry as exc:
        raise NodeTaken(f'node {node} is recorded for another live '
                        'instance') from exc


@db_api.writer
def soft_delete(ctx, claim):
    """End a delete: the row is kept, marked deleted."""
    now = _utcnow()
    result = ctx.session.execute(
        _instances.update().where(_mine(claim, inst.DELETING))
        .values(deleted=_instances.c.id, deleted_at=now, updated_at=now,
                vm_state=inst.DELETED, task_state=None))
    return result.rowcount == 1


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
    """SQL: ``host`` has not heartbeated for ``down_for`` seconds on the
    database's clock, or is forced down, or has no live services row."""
    cutoff = clock.now(ctx) - datetime.timedelta(seconds=down_for)
    alive = (sa.select(sa.literal(1))
             .where(_services.c.host == host,
                    _services.c.binary == db_services.BINARY,
                    _services.c.deleted == 0,
                    _services.c.forced_down == sa.false(),
                    _services.c.last_seen_up > cutoff)
             .exists())
    return ~alive


@db_api.writer
def take_over(ctx, seen, host, service_id, down_for, node_owner=None):
    """Give the instance ``seen`` (an of_hosts row of a dead host) and its
    node's row to ``host``; whether the instance moved.

    One transaction of conditional updates. The instance moves only if it
    still has the dead host and the generation seen, and only if that host
    is still down in the database itself (silent for ``down_for`` seconds
    on the database's clock, or forced down), not merely in the caller's
    view, which may be old; its generation is bumped, so the dead host's
    workers match nothing if it comes back. The node's row moves only if
    ``node_owner`` (the holder we saw) still holds it; a row that changed
    hands meanwhile follows its instance at the next cycle.
    """
    now = _utcnow()
    moved = ctx.session.execute(
        _instances.update()
        .where(_instances.c.uuid == seen.uuid,
               _instances.c.host == seen.host,
               _instances.c.generation == seen.generation,
               _instances.c.deleted == 0,
               host_still_down(ctx, seen.host, down_for))
        .values(host=host, generation=_instances.c.generation + 1,
                updated_at=now)).rowcount == 1
    if moved and seen.node is not None and node_owner != host:
        ctx.session.execute(
            _nodes.update()
            .where(_nodes.c.uuid == seen.node, _nodes.c.deleted == 0,
                   db_nodes.host_is(node_owner))
            .values(host=host, service_id=service_id, updated_at=now))
    return moved

