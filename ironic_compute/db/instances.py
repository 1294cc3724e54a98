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

"""The instance rows: reads, the build request's insert, the action
requests and the workers' conditional writes.

Every change of state or host is conditional on what the writer saw
(``WHERE host = :me AND task_state = :seen``), like the moves of compute
nodes: a delete asked for during a build, or a takeover racing a host that
came back, makes the other writer match nothing instead of overwriting.
Choosing the host of a new instance is db/scheduling.py; giving a dead
host's instances to a live one is db/takeover.py.
"""

import dataclasses
import datetime
import json

import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import clock
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import models
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import configdrive
from ironic_compute.instances import model as inst
from ironic_compute.nodes import ownership

_instances = models.instances


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
    # JSON: the action's arguments, progress; a rescue password too, so
    # never in the row's repr (a log line, a traceback's locals).
    task_args: str | None = dataclasses.field(default=None, repr=False)
    task_requested_at: datetime.datetime | None = None
    # Bumped by every write of the row (VERSION_BUMP): what an observer's
    # write is conditional on.
    version: int = 0
    # The rest of the request (migration 0013): see models.instances.
    capabilities: str | None = None  # JSON object
    ephemeral_gb: int = 0
    ephemeral_format: str | None = None
    swap_mb: int = 0
    image_checksum: str | None = None
    image_kernel: str | None = None
    image_ramdisk: str | None = None
    project_id: str | None = None
    user_id: str | None = None
    # The config drive (migration 0014): see configdrive.ConfigDrive.
    # User data is the tenant's secret: never in the row's repr.
    ssh_keys: str | None = None  # JSON list
    user_data: str | None = dataclasses.field(default=None, repr=False)
    meta: str | None = None  # JSON object
    network_data: str | None = None  # JSON object
    hostname: str | None = None

    def args(self):
        """The action's arguments and progress (task_args) as a dict."""
        return json.loads(self.task_args) if self.task_args else {}

    def spec(self):
        return inst.RequestSpec(
            resource_class=self.resource_class or '', vcpus=self.vcpus,
            memory_mb=self.memory_mb, disk_gb=self.disk_gb,
            traits=inst.parse_traits(self.traits),
            partition_key=self.partition_key,
            capabilities=inst.parse_capabilities(self.capabilities),
            ephemeral_gb=self.ephemeral_gb,
            ephemeral_format=self.ephemeral_format, swap_mb=self.swap_mb)

    def deploy_info(self):
        """What the build patches into the node's instance_info
        (inst.deploy_info); InvalidRequest for a row whose spec is bad."""
        return inst.deploy_info(
            self.spec(), self.name, self.image_source or '',
            image={'image_checksum': self.image_checksum,
                   'kernel': self.image_kernel,
                   'ramdisk': self.image_ramdisk},
            tenant={'project_id': self.project_id, 'user_id': self.user_id})

    def config_drive(self):
        """The config drive the row keeps (a configdrive.ConfigDrive)."""
        return configdrive.ConfigDrive.from_columns(
            self.ssh_keys, self.user_data, self.meta, self.network_data,
            self.hostname)

    def configdrive(self):
        """What the deploy and a rebuild send Ironic as ``configdrive``
        (None: nothing to send)."""
        return self.config_drive().contents(self.uuid, self.name)

    def as_dict(self):
        """The public view (CLI JSON): traits as a list, times as ISO."""
        values = dataclasses.asdict(self)
        values['traits'] = sorted(inst.parse_traits(self.traits))
        values['capabilities'] = dict(inst.parse_capabilities(
            self.capabilities))
        del values['task_args']  # the workers' own notes
        drive = self.config_drive()
        values['ssh_keys'] = list(drive.ssh_keys)
        values['user_data'] = configdrive.summary(self.user_data)
        values['meta'] = dict(drive.meta)
        values['network_data'] = drive.network_data
        del values['version']
        return values


_COLUMNS = [_instances.c[f.name] for f in dataclasses.fields(InstanceRow)]

# Every UPDATE of an instance row sets this too: a row that changed and
# came back to the values an observer saw (ABA) has another version.
VERSION_BUMP = {'version': _instances.c.version + 1}


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
def list_instances(ctx, host=None, project_id=None):
    """The live instances (of ``host``, of ``project_id``, if given),
    as InstanceRow, by host and age."""
    query = (_select().where(_instances.c.deleted == 0)
             .order_by(_instances.c.host, _instances.c.created_at,
                       _instances.c.uuid))
    if host is not None:
        query = query.where(_instances.c.host == host)
    if project_id is not None:
        query = query.where(_instances.c.project_id == project_id)
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
def claim_holders(ctx, consumers):
    """(the database's time, [(uuid, node, task_state, built, deleted_at)]):
    every live instance (deleted_at None), and the newest deleted row of each
    of ``consumers`` that has no live one. ``built``: made by instance create
    (it has a resource class), not an instance add record."""
    t = _instances
    columns = (t.c.uuid, t.c.node, t.c.task_state, t.c.resource_class.is_not(None),
               t.c.deleted_at)
    found = [tuple(r) for r in ctx.session.execute(
        sa.select(*columns).where(t.c.deleted == 0))]
    live = {r[0] for r in found}
    gone = {}
    for chunk in db_nodes.chunks(sorted(set(consumers) - live)):
        for row in ctx.session.execute(
                sa.select(*columns).where(t.c.uuid.in_(chunk), t.c.deleted != 0)
                .order_by(t.c.id)):
            gone[row[0]] = tuple(row)
    return clock.now(ctx), found + list(gone.values())


@db_api.context_manager.reader
def hosts(ctx):
    """The hosts that manage at least one live instance."""
    return set(ctx.session.execute(
        sa.select(_instances.c.host).where(_instances.c.deleted == 0,
                                           _instances.c.host.is_not(None))
        .distinct()).scalars())


_FIELDS = frozenset(f.name for f in dataclasses.fields(InstanceRow))


@db_api.writer
def create(ctx, uuid, name, host, spec, image_source, node=None, **extra):
    """Record a build request for ``host``; DBDuplicateEntry if it exists
    (or if a live instance is recorded on ``node``).

    ``node``: the node claimed for it in Placement, which its build then
    reserves (None: its host picks one). ``extra``: the columns of the
    request that the scheduler does not match (image_checksum,
    image_kernel, image_ramdisk, project_id, user_id).

    Returns the row as written, made from the values inserted: reading it
    back would hold the schedulers' lock one more round trip.
    """
    now = _utcnow()
    values = dict(
        uuid=uuid, name=name, host=host, node=node,
        vm_state=inst.BUILDING, task_state=inst.SCHEDULED,
        partition_key=spec.partition_key,
        resource_class=spec.resource_class, vcpus=spec.vcpus,
        memory_mb=spec.memory_mb, disk_gb=spec.disk_gb,
        traits=spec.traits_json(), image_source=image_source,
        capabilities=spec.capabilities_json(),
        ephemeral_gb=spec.ephemeral_gb,
        ephemeral_format=spec.ephemeral_format, swap_mb=spec.swap_mb,
        created_at=now, updated_at=now, generation=0, deleted=0, **extra)
    ctx.session.execute(_instances.insert(), values)
    return InstanceRow(**{key: value for key, value in values.items()
                          if key in _FIELDS},
                       fault=None, launched_at=None)


@db_api.writer
def request_delete(ctx, uuid):
    """Mark the instance for deletion; the row as it is now, or None.

    The task it replaces loses its arguments: the delete needs none, and
    a rescue's password must not outlive its rescue."""
    now = _utcnow()
    result = ctx.session.execute(
        _instances.update()
        .where(_instances.c.uuid == uuid, _instances.c.deleted == 0,
               sa.or_(_instances.c.task_state.is_(None),
                      _instances.c.task_state != inst.DELETING))
        .values(task_state=inst.DELETING, task_args=None, updated_at=now,
                **VERSION_BUMP))
    row = get(ctx, uuid)
    if row is None and not result.rowcount:
        return None
    return row


@db_api.writer
def request_action(ctx, uuid, action, **args):
    """Queue ``action`` (instances.REQUESTS: stop, start, reboot, rebuild)
    on the instance; the row as it is now.

    One conditional UPDATE: only while no other task is in flight and the
    instance is in a state the action may be asked in; RequestRefused (one
    line, naming the task in flight) otherwise, NoInstance if there is
    none.
    """
    row = get(ctx, uuid)
    if row is None:
        raise exception.NoInstance(f'no instance {uuid}')
    why = inst.request_refusal(action, row.vm_state, row.task_state, row.node)
    if why is None:
        result = ctx.session.execute(
            _instances.update()
            .where(_instances.c.uuid == uuid, _instances.c.deleted == 0,
                   _instances.c.task_state.is_(None),
                   _instances.c.vm_state == row.vm_state,
                   _instances.c.generation == row.generation,
                   _instances.c.version == row.version)
            .values(task_state=inst.REQUESTS[action].task_state,
                    task_args=json.dumps(args, sort_keys=True),
                    task_requested_at=_utcnow(), updated_at=_utcnow(),
                    **VERSION_BUMP))
        if result.rowcount == 1:
            return get(ctx, uuid)
        why = 'it changed meanwhile; look again'
    raise exception.RequestRefused(f'cannot {action} instance {uuid}: {why}')


@db_api.writer
def record_power(ctx, seen, power_state, **values):
    """The power-state sync's write: only while the instance row is still
    the one the sync read (``seen``: its host, generation and version).
    Any write since (an action asked, done or failed, a takeover) bumped
    the version: the sync's view is stale, and nothing is written. Returns
    whether it was written."""
    result = ctx.session.execute(
        _instances.update()
        .where(_held(seen), _instances.c.version == seen.version)
        .values(power_state=power_state, **values, **VERSION_BUMP))
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
    """The row of ``claim``, while it is also still in ``task_state`` and
    has the claim's version: nothing wrote it since the worker read or
    wrote it (a request that ended and was asked again, ABA, does not
    match)."""
    return sa.and_(_held(claim), _instances.c.task_state == task_state,
                   _instances.c.version == claim.version)


@db_api.writer
def transition(ctx, claim, seen_state, **values):
    """Change the instance if it still has the host, generation and
    version of ``claim`` (the row as the worker read or last wrote it) and
    task_state ``seen_state``.

    Returns the row as written (the worker's claim from now on: its next
    write names this version), or None: a delete, a takeover or another
    writer came first, and the worker must stop there.
    """
    values.setdefault('updated_at', _utcnow())
    result = ctx.session.execute(
        _instances.update().where(_mine(claim, seen_state))
        .values(**values, **VERSION_BUMP))
    if result.rowcount != 1:
        return None
    return dataclasses.replace(
        claim, version=claim.version + 1,
        **{key: value for key, value in values.items() if key in _FIELDS})


def record_node(ctx, claim, node):
    """Record the node a build reserved; the row as written, or None when
    it was no longer the claim's. NodeTaken if another live instance is
    recorded on it."""
    try:
        return transition(ctx, claim, inst.SPAWNING, node=node)
    except db_exc.DBDuplicateEntry as exc:
        raise exception.NodeTaken(f'node {node} is recorded for another live '
                                  'instance') from exc


@db_api.writer
def soft_delete(ctx, claim):
    """End a delete: the row is kept, marked deleted."""
    now = _utcnow()
    result = ctx.session.execute(
        _instances.update().where(_mine(claim, inst.DELETING))
        .values(deleted=_instances.c.id, deleted_at=now, updated_at=now,
                vm_state=inst.DELETED, task_state=None, task_args=None,
                **VERSION_BUMP))
    return result.rowcount == 1
