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

"""Queries on ``instances``: requests, their states, and who manages them.

Every change of state or host is conditional on what the writer saw
(``WHERE host = :me AND task_state = :seen``), like the moves of compute
nodes: a delete asked for during a build, or a takeover racing a host that
came back, makes the other writer match nothing instead of overwriting.
"""

import dataclasses
import datetime
import functools
import json

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute.db import api as db_api
from ironic_compute.db import clock
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import locks as db_locks
from ironic_compute.db import models
from ironic_compute.db import node_match
from ironic_compute.db import services as db_services
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst
from ironic_compute.instances import scheduler
from ironic_compute.nodes import ownership

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
    power_state: str | None = None  # on, off, unknown; None: not read yet
    task_args: str | None = None  # JSON: the action's arguments, progress
    task_requested_at: datetime.datetime | None = None

    def args(self):
        """The action's arguments and progress (task_args) as a dict."""
        return json.loads(self.task_args) if self.task_args else {}

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
        del values['task_args']  # the workers' own notes
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
def gone_records(ctx, uuids, *conditions):
    """Which of ``uuids`` have a deleted record that meets ``conditions``
    and no live one."""
    found = set()
    for chunk in db_nodes.chunks(uuids):
        live = set(ctx.session.execute(
            sa.select(_instances.c.uuid).where(
                _instances.c.uuid.in_(chunk),
                _instances.c.deleted == 0)).scalars())
        found |= set(ctx.session.execute(
            sa.select(_instances.c.uuid).where(
                _instances.c.uuid.in_(chunk), _instances.c.deleted != 0,
                *conditions)).scalars()) - live
    return found


def deleted_builds(ctx, uuids):
    """Which of ``uuids`` are instances this service built and then deleted.

    Only instances made by ``instance create`` (they have a resource class)
    and deleted as instances (vm_state deleted) count: a record forgotten by
    ``instance remove`` (vm_state removed), or made by ``instance add``,
    never leads to a node being torn down.
    """
    return gone_records(ctx, uuids, _instances.c.resource_class.is_not(None),
                        _instances.c.vm_state == inst.DELETED)


@db_api.context_manager.reader
def hosts(ctx):
    """The hosts that manage at least one live instance."""
    return set(ctx.session.execute(
        sa.select(_instances.c.host).where(_instances.c.deleted == 0,
                                           _instances.c.host.is_not(None))
        .distinct()).scalars())


_FIELDS = frozenset(f.name for f in dataclasses.fields(InstanceRow))


@db_api.writer
def create(ctx, uuid, name, host, spec, image_source):
    """Record a build request for ``host``; DBDuplicateEntry if it exists.

    Returns the row as written, made from the values inserted: reading it
    back would hold the schedulers' lock one more round trip.
    """
    now = _utcnow()
    values = dict(
        uuid=uuid, name=name, host=host, node=None,
        vm_state=inst.BUILDING, task_state=inst.SCHEDULED,
        partition_key=spec.partition_key,
        resource_class=spec.resource_class, vcpus=spec.vcpus,
        memory_mb=spec.memory_mb, disk_gb=spec.disk_gb,
        traits=spec.traits_json(), image_source=image_source,
        created_at=now, updated_at=now, generation=0, deleted=0)
    ctx.session.execute(_instances.insert(), values)
    return InstanceRow(**{key: value for key, value in values.items()
                          if key in _FIELDS},
                       fault=None, launched_at=None)


def lock_schedulers(ctx):
    """Serialise schedulers: each holds the ``scheduler`` row of ``locks``
    from its first statement to its commit, so two schedulers never count
    the same free node (see db/locks.py: an UPDATE, bounded waits).

    A context manager, entered first in the transaction. Heartbeats and
    ``db sync`` never wait for it: nothing else writes that row.
    """
    return db_locks.held(ctx, db_locks.SCHEDULER)


@functools.cache
def _loads_statement(dialect):
    """Per service of the hosts: its builds waiting for a node, and its live
    instances. Counted by correlated subqueries, index ranges only: (host,
    deleted) for the instances, (host, task_state, deleted) for each
    waiting state; a GROUP BY over the instances reads the row of every
    live instance."""
    host = _services.c.host
    live = (sa.select(sa.func.count()).select_from(_instances)
            .where(_instances.c.host == host, _instances.c.deleted == 0))
    waiting = []
    for state in (inst.SCHEDULED, inst.SPAWNING):
        count = (sa.select(sa.func.count()).select_from(_instances)
                 .where(_instances.c.host == host,
                        _instances.c.task_state == state,
                        _instances.c.deleted == 0,
                        _instances.c.node.is_(None)))
        if dialect in ('mysql', 'mariadb'):
            # Not the index on (node, deleted): every waiting build.
            count = count.with_hint(
                _instances, 'FORCE INDEX (instances_host_task_state_idx)',
                dialect)
        waiting.append(count.scalar_subquery())
    return (sa.select(host, waiting[0] + waiting[1],
                      live.scalar_subquery())
            .where(host.in_(sa.bindparam('hosts', expanding=True)),
                   _services.c.binary == db_services.BINARY,
                   _services.c.deleted == 0))


@db_api.context_manager.reader
def host_loads(ctx, hosts):
    """Per host: (builds waiting for a node, live instances), one statement
    whose cost grows with the number of hosts and their instances' index
    entries, not rows.

    A build that has no node yet will take one of its host's free nodes.
    """
    hosts = sorted(hosts)
    loads = dict.fromkeys(hosts, (0, 0))
    if not hosts:
        return loads
    statement = _loads_statement(ctx.session.get_bind().dialect.name)
    for host, waits, count in ctx.session.execute(statement, {'hosts': hosts}):
        loads[host] = (int(waits or 0), count)
    return loads


def _services_and_now(ctx):
    listing = db_services.load_services(ctx, count_nodes=False)
    return listing.rows, listing.now  # the database's clock


class Refused(Exception):
    """A request that cannot be recorded; the message is one line."""


class NodeTaken(Exception):
    """Another live instance is recorded on the node (one per node)."""


class _NoRoom(Exception):
    """No candidate host has a free matching node (nothing written)."""

    def __init__(self, hosts, some_fit):
        super().__init__()
        self.hosts = hosts
        self.some_fit = some_fit  # nodes fit, but builds wait for them all


def _live_hosts(ctx, spec, service_down_time):
    """The live services of the request's conductor group: what
    ownership.is_up says, asked in SQL on the database's clock, so that
    only their names are read (a pure-Python driver decodes every value)."""
    rows = ctx.session.execute(
        sa.select(_services.c.host, _services.c.partition_key)
        .where(_services.c.binary == db_services.BINARY,
               _services.c.deleted == 0,
               _services.c.disabled == sa.false(),
               _services.c.forced_down == sa.false(),
               _services.c.stopped_at.is_(None),
               _services.c.last_seen_up >= clock.utc_ago(service_down_time)))
    return sorted(host for host, group in rows
                  if spec.partition_key is None
                  or (group or None) == spec.partition_key)


@db_api.context_manager.reader
def _candidates(ctx, spec, service_down_time, host):
    """The hosts a request may go to, judged on the database's clock.

    Without ``host``: the live services (not disabled, not forced down)
    of the request's conductor group. With ``host``: that one, or Refused
    saying which of those checks it fails.
    """
    if host is None:
        return _live_hosts(ctx, spec, service_down_time)
    services, now = _services_and_now(ctx)
    service = next((s for s in services if s.host == host), None)
    if service is None:
        raise Refused(f'no ironic-compute service {host!r}')
    reason = ownership.down_reason(service.record(), now, service_down_time)
    if reason == 'disabled' and service.disabled_reason:
        reason = f'disabled ({service.disabled_reason})'
    if reason is not None:
        raise Refused(f'ironic-compute service {host!r} takes no builds: '
                      f'{reason}')
    group = service.partition_key or None
    if spec.partition_key is not None and group != spec.partition_key:
        manages = (f'conductor group {group}' if group is not None
                   else 'every conductor group')
        raise Refused(f'ironic-compute service {host!r} manages {manages}, '
                      f'not conductor group {spec.partition_key}')
    return [host]


def _free_counts(ctx, spec, loads):
    """{host: free matching nodes} of the hosts of ``loads``, counted up to
    FREE_NODES_COUNTED beyond each host's waiting builds."""
    return node_match.free_counts(
        ctx, spec, {host: waiting + scheduler.FREE_NODES_COUNTED
                    for host, (waiting, _) in loads.items()},
        spec.partition_key)


def _choose(ctx, spec, hosts):
    """The host for ``spec`` among ``hosts``; _NoRoom when none fits.

    Reads O(hosts) rows: the instance counts, and at most
    FREE_NODES_COUNTED free nodes beyond its waiting builds per host. The
    free nodes of the hosts with the fewest instances are counted first:
    when one of them has room, pick_host chooses among them whatever the
    others have, and the others are not read (usually half of the hosts
    or fewer; a second statement counts them when none of the first has
    room).
    """
    loads = host_loads(ctx, hosts)
    first = scheduler.fewest_instances(
        {host: count for host, (_, count) in loads.items()})
    free = _free_counts(ctx, spec, {host: loads[host] for host in first})
    if not any(free.get(host, 0) > loads[host][0] for host in first):
        free.update(_free_counts(ctx, spec, {
            host: load for host, load in loads.items() if host not in first}))
        first = list(loads)
    states = [scheduler.HostState(host, free.get(host, 0) - loads[host][0],
                                  loads[host][1]) for host in first]
    if not any(state.free_nodes > 0 for state in states):
        raise _NoRoom(hosts, some_fit=any(free.values()))
    return scheduler.pick_host(states)


@db_api.writer
def _place(ctx, uuid, name, spec, image_source, hosts):
    """Choose among ``hosts`` and record the request, under the lock."""
    with lock_schedulers(ctx):
        chosen = _choose(ctx, spec, hosts)
        return create(ctx, uuid, name, chosen, spec, image_source)


@db_api.context_manager.reader
def _why_no_room(ctx, spec, no_room):
    """What did not match, over every node of the candidate hosts."""
    if no_room.some_fit:
        return f'no free node for {spec.describe()} (all are being built on)'
    failed, total = node_match.fail_counts(ctx, spec, no_room.hosts,
                                           spec.partition_key)
    return inst.no_match_fault(spec, failed, total)


def schedule_and_create(ctx, uuid, name, spec, image_source,
                        service_down_time, host=None):
    """Choose the host (or check the one given) and record the request.

    The candidates are read first, in a transaction of their own; the
    choice and the insert are made under the schedulers' lock
    (:func:`lock_schedulers`), so two requests made at once never count
    the same free node. Raises scheduler.NoValidHost, or Refused for
    ``host`` (and when the lock stays busy), writing nothing.
    """
    hosts = _candidates(ctx, spec, service_down_time, host)
    if not hosts:
        raise scheduler.NoValidHost(
            'no live ironic-compute service to build on')
    try:
        return _place(ctx, uuid, name, spec, image_source, hosts)
    except db_locks.Busy as exc:
        raise Refused(str(exc)) from None
    except _NoRoom as no_room:
        # Worded outside the lock: this reads every node of the hosts.
        why = _why_no_room(ctx, spec, no_room)
    if host is not None:
        raise Refused(f'{why}, on ironic-compute service {host!r}')
    raise scheduler.NoValidHost(f'{why}, on the {len(hosts)} live services')


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


class NoInstance(Refused):
    """No live instance has this uuid."""


@db_api.writer
def request_action(ctx, uuid, action, **args):
    """Queue ``action`` (instances.REQUESTS: stop, start, reboot, rebuild)
    on the instance; the row as it is now.

    One conditional UPDATE: only while no other task is in flight and the
    instance is in a state the action may be asked in; Refused (one line,
    naming the task in flight) otherwise, NoInstance if there is none.
    """
    row = get(ctx, uuid)
    if row is None:
        raise NoInstance(f'no instance {uuid}')
    why = inst.request_refusal(action, row.vm_state, row.task_state, row.node)
    if why is None:
        result = ctx.session.execute(
            _instances.update()
            .where(_instances.c.uuid == uuid, _instances.c.deleted == 0,
                   _instances.c.task_state.is_(None),
                   _instances.c.vm_state == row.vm_state,
                   _instances.c.generation == row.generation)
            .values(task_state=inst.REQUESTS[action].task_state,
                    task_args=json.dumps(args, sort_keys=True),
                    task_requested_at=_utcnow(), updated_at=_utcnow()))
        if result.rowcount == 1:
            return get(ctx, uuid)
        why = 'it changed meanwhile; look again'
    raise Refused(f'cannot {action} instance {uuid}: {why}')


@db_api.writer
def record_power(ctx, claim, seen_vm_state, power_state, **values):
    """The power-state sync's write: only while the instance still has the
    claim's host and generation, ``seen_vm_state`` and no task in flight
    (an action asked meanwhile wins). Whether it was written."""
    result = ctx.session.execute(
        _instances.update()
        .where(_held(claim), _instances.c.vm_state == seen_vm_state,
               _instances.c.task_state.is_(None))
        .values(power_state=power_state, **values))
    return result.rowcount == 1


@db_api.context_manager.reader
def of_host(ctx, host):
    """The live instances ``host`` manages that have a node."""
    query = (_select().where(_instances.c.host == host,
                             _instances.c.node.is_not(None),
                             _instances.c.deleted == 0))
    return [InstanceRow(*row) for row in ctx.session.execute(query)]


def _held(claim):
    """The live row ``claim`` (a row as a worker or a takeover read it)
    names, while it still has that host and generation."""
    return sa.and_(_instances.c.uuid == claim.uuid,
                   _instances.c.host == claim.host,
                   _instances.c.generation == claim.generation,
                   _instances.c.deleted == 0)


def _mine(claim, task_state):
    """The row of ``claim``, while it is also still in ``task_state``."""
    return sa.and_(_held(claim), _instances.c.task_state == task_state)


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
                updated_at=now)).rowcount
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
