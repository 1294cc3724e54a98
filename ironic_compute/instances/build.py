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

"""Builds: reserve a node (an Ironic allocation), deploy it, power it on;
and when a build fails, give the node back.

The flows are plain functions that take the Worker first
(instances/worker.py): build(worker, row) and release(worker, row). Each
returns True when it is finished and False when the manager should try
again later. Every step is idempotent: the allocation's uuid and name are
the instance's uuid, so a second attempt (a daemon killed mid-build, a
host that took the build over) finds what the first made instead of
reserving a second node. Every changing call goes through the fence
(``worker.fence``).
"""

import json

from oslo_db import exception as db_exc
from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import answers
from ironic_compute.instances import model as inst
from ironic_compute.instances import power
from ironic_compute.instances import teardown
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# Allocations a build makes while candidates remain free, before its fault.
ALLOCATION_ATTEMPTS = 3
# Seconds one allocation may stay "allocating".
ALLOCATION_TIMEOUT = 30

# The task states in which a worker may still reserve and deploy for a
# build, and those in which it may tear down for one.
BUILDING = (inst.SPAWNING,)
FREEING = (inst.SPAWNING, inst.RELEASING)


def build(worker, row):
    """Build the instance of ``row`` (task state scheduled or spawning).

    A scheduled row is claimed first (spawning). Then a node is reserved,
    recorded on the row, deployed and powered on, and the instance is
    recorded active. A build that cannot succeed ends in error with its
    fault and nothing left reserved (fail()). Returns False when Ironic is
    unavailable (the build is tried again later), else True, also when the
    row was deleted or taken over meanwhile.
    """
    ctx = db_api.Context()
    first = row.task_state == inst.SCHEDULED
    if first:
        row = db_instances.transition(ctx, row, inst.SCHEDULED,
                                      task_state=inst.SPAWNING)
        if row is None:
            return True  # deleted or taken meanwhile
    try:
        spec = row.spec()
    except exception.InvalidRequest as exc:
        # A row an older release accepted: it can never be built.
        fail(worker, row, row.node, f'invalid request: {exc}')
        return True
    LOG.info('Instance %s: building (%s)', row.uuid, spec.describe())
    node = row.node
    try:
        node, fresh = reserve(worker, row, first)
        if node != row.node:
            recorded = db_instances.record_node(ctx, row, node)
            if recorded is None:
                # A delete or a takeover came: its worker frees the node.
                LOG.info('Instance %s: not recording node %s, the '
                         'instance changed meanwhile', row.uuid, node)
                return True
            row = recorded
        deploy(worker, row, node, fresh)
    except (exception.BuildFailed, exception.NodeTaken) as exc:
        fault = str(exc)
    except exception.IronicUnavailable as exc:
        LOG.error('Instance %s: build paused, Ironic unavailable (%s); '
                  'retrying', row.uuid, one_line(exc))
        return False
    else:
        fault = None
    if fault is not None:
        # Outside the except block: one log line, no traceback.
        fail(worker, row, node, fault)
        return True
    if db_instances.transition(
            ctx, row, inst.SPAWNING, vm_state=inst.ACTIVE,
            task_state=None, fault=None, launched_at=_utcnow(),
            power_state=inst.POWER_ON):
        LOG.info('Instance %s: active on node %s', row.uuid, node)
    return True


def reserve(worker, row, first=False):
    """Return (the instance's node, whether its allocation was made just
    now): the node of the instance's allocation, made if there is none.

    ``first`` says that this worker has just moved the row from scheduled
    to spawning. Then no earlier attempt made an allocation for it (only a
    worker whose fence saw the row spawning makes one), so none is looked
    for. Were there one anyway, its create would be refused (same uuid and
    name) and allocate() would take it.

    Up to ALLOCATION_ATTEMPTS allocations are made while candidates remain
    (only the row's node when it names one: claimed_or_candidates).
    Raises BuildFailed when none gave a node.
    """
    spec = row.spec()
    fence = worker.fence.check(row, BUILDING)
    # Ironic answers an allocation within a second; one left in
    # "allocating" for longer is stuck, not slow: try again.
    timeout = min(ALLOCATION_TIMEOUT,
                  worker.conf.ironic.deploy_timeout / ALLOCATION_ATTEMPTS)
    allocation = None if first else worker.provisioner.allocation(row.uuid)
    error = 'it vanished'
    for attempt in range(ALLOCATION_ATTEMPTS):
        try:
            if allocation is None:
                try:
                    found = claimed_or_candidates(worker, row, attempt > 0)
                except exception.BuildFailed:
                    if first and worker.provisioner.allocation(
                            row.uuid) is not None:
                        # One made anyway (by hand?) holds the node: go
                        # on as a resumed build does.
                        return reserve(worker, row)
                    raise
                # Just read as absent (or deleted by us): not read again.
                allocation = worker.provisioner.allocate(
                    row.uuid, spec, found, timeout, fence, absent=True)
            elif allocation.state == 'allocating':  # an earlier attempt's
                allocation = worker.provisioner.poll(
                    lambda: worker.provisioner.allocation(row.uuid),
                    lambda a: a is None or a.state != 'allocating',
                    timeout, f'allocation {row.uuid}')
        except exception.ProvisionError as exc:
            allocation = worker.provisioner.allocation(row.uuid)
            if allocation is None or allocation.state != 'allocating':
                raise exception.BuildFailed(str(exc)) from exc
            # Stuck: Ironic's conductor failed and could not even record
            # it (SQLite "database is locked", seen in the functional
            # tests).
            error = str(exc)
        else:
            if allocation is not None and allocation.state == 'active':
                return allocation.node_uuid, allocation.created
            error = allocation.last_error if allocation else error
        # Another build won the candidates, or Ironic failed: try again
        # while a candidate is free. The name must be free for that, and
        # nothing may stay reserved after the last attempt.
        LOG.info('Instance %s: no node reserved (%s)', row.uuid,
                 one_line(error))
        if allocation is not None:
            worker.provisioner.delete_allocation(row.uuid, fence)
        allocation = None
    raise exception.BuildFailed(f'no free node for {spec.describe()}: Ironic: '
                                f'{one_line(error)}')


def claimed_or_candidates(worker, row, fresh=False):
    """The nodes the build of ``row`` may reserve: the node its row names
    (claimed for it in Placement by ``instance create``, or reserved by an
    earlier attempt), and no other; else candidates()."""
    if row.node is not None:
        return [row.node]
    return candidates(worker, row.spec(), fresh)


def candidates(worker, spec, fresh=False):
    """Return the nodes this host holds that fit ``spec`` and are free.

    First as this host's rows say (the last cycle's listing). A stale
    candidate costs nothing: Ironic's allocation takes only a node that is
    free now among them. When the rows name none, or with ``fresh`` (an
    allocation among them failed), as Ironic lists them now. Raises
    BuildFailed, saying why no node fits, when there is none.
    """
    ctx = db_api.Context()
    with db_api.context_manager.reader.using(ctx):
        held = db_nodes.offers_of(ctx, worker.host)
        busy = {i.node for i in db_instances.load_all(ctx) if i.node}
    # What the rows say of every node we hold: the first candidates, and
    # what explains a refusal.
    from_rows = inst.match_nodes(spec, held, busy)
    if not fresh and from_rows.candidates:
        return from_rows.candidates
    held_uuids = {offer.uuid for offer in held}
    listed = [offer_of(node) for node in worker.provisioner.free_nodes(
        worker.partition_key, spec.resource_class)
        if node.uuid in held_uuids]
    match = inst.match_nodes(spec, listed, busy)
    if match.candidates:
        return match.candidates
    raise exception.BuildFailed(from_rows.fault or (
        f'no free node for {spec.describe()}: the matching nodes of '
        f'{worker.host} are not available in Ironic'))


def deploy(worker, row, node, fresh=False):
    """Deploy ``node`` for the instance of ``row`` and power it on; wait
    until both are done.

    With ``fresh`` the allocation was made just now, so Ironic gave a node
    that is ``available`` with nothing under way: it is not read first
    (the fence before the first call reads it, and a refused deploy reads
    it again). A node deployed by an earlier attempt is only powered on.
    Raises BuildFailed when the node is gone, or Ironic refuses or fails
    the deploy or the power on.
    """
    if fresh:
        state = answers.NodeState(node, 'available', None, row.uuid,
                                    row.uuid, None, False)
    else:
        state = worker.provisioner.node(node)
    if state is None:
        raise exception.BuildFailed(f'node {node} is gone from Ironic')
    if state.provision_state == answers.DEPLOY_DONE:
        # Deployed by an earlier attempt (a restart, a takeover): it may
        # still be powered off.
        try:
            power.power_on(worker, row, node, BUILDING, state)
        except exception.ProvisionError as exc:
            raise exception.BuildFailed(str(exc)) from exc
        return
    if (state.provision_state == 'available'
            and state.target_provision_state is None):
        try:
            # Never onto a node that does not carry this instance.
            # The lessee in the same patch as the instance_info: the
            # tenant's from before the deploy starts, in one request. The
            # config drive with the deploy, which Ironic builds it for.
            worker.provisioner.deploy(
                node, row.deploy_info(),
                worker.fence.check(row, BUILDING, node, answered=True),
                lessee=row.project_id, configdrive=row.configdrive())
        except exception.ProvisionError as exc:
            # A second worker on this instance (a host that took it over
            # while the first still ran) may have deployed it meanwhile:
            # then wait for that deploy instead of failing.
            state = worker.provisioner.node(node)
            if state is None or row.uuid not in (
                    state.instance_uuid, state.allocation_uuid) or (
                    state.provision_state == 'available'
                    and state.target_provision_state is None):
                raise exception.BuildFailed(str(exc)) from exc
    try:
        state = worker.provisioner.wait_for(
            node, answers.DEPLOY_DONE, answers.DEPLOY_FAILED,
            worker.conf.ironic.deploy_timeout, 'deploy')
        # A deploy does not change the power (fake hardware leaves a node
        # deployed while off as it was): an instance runs.
        power.power_on(worker, row, node, BUILDING, state)
    except exception.ProvisionError as exc:
        raise exception.BuildFailed(str(exc)) from exc


def fail(worker, row, node, fault):
    """Record the build failed with ``fault``, with nothing left reserved:
    tear ``node`` down, drop the allocation, then the claim in Placement.

    When Ironic cannot free the node now, the instance says so in its fault
    and stays ``releasing``: the poller runs release() until the node is
    free. The claim goes last, once the failure is recorded (``releasing``
    until Placement takes the release): a build retried because that write
    was lost (a kill, the database cut off) still holds its claim, and
    never builds on a node whose claim it gave back. Returns nothing.
    """
    fault = one_line(fault)[:1000]
    LOG.error('Instance %s: build failed: %s', row.uuid, fault)
    held = None
    try:
        teardown.free_node(worker, row, node, FREEING)
    except (exception.IronicUnavailable, exception.ProvisionError) as exc:
        held = exc
        LOG.error('Instance %s: its node is not released yet, '
                  'retrying: %s', row.uuid, one_line(exc))
    # The fault shown says why the node is still held; the build's own
    # fault is kept in task_args for when it is released.
    shown = fault if held is None else (
        f'{fault} (the node is not released yet: {one_line(held)[:900]})')
    releasing = held is not None or worker.claims is not None
    failed = dict(vm_state=inst.ERROR,
                  task_state=inst.RELEASING if releasing else None, fault=shown,
                  task_args=json.dumps({'fault': fault}) if releasing else None,
                  node=None if held is None else node)
    try:
        row = db_instances.transition(db_api.Context(), row, inst.SPAWNING, **failed)
    except db_exc.DBDuplicateEntry:
        # Another live instance is recorded on the node: the race this
        # build lost before its deploy (NodeTaken). It only holds Ironic's
        # allocation there, which release() drops by the instance's uuid.
        row = db_instances.transition(db_api.Context(), row, inst.SPAWNING,
                                      **{**failed, 'node': None})
    if row is not None and releasing and held is None:
        release(worker, row)  # the claim only; False leaves it releasing


def release(worker, row):
    """Free the node of a failed build (task state releasing); the
    instance then shows the build's own fault again. Returns False while
    Ironic cannot free the node (tried again later), else True."""
    try:
        teardown.free(worker, row, row.node, FREEING)
    except (exception.IronicUnavailable, exception.ProvisionError) as exc:
        LOG.error('Instance %s: its node is not released yet, '
                  'retrying: %s', row.uuid, one_line(exc))
        return False
    if db_instances.transition(
            db_api.Context(), row, inst.RELEASING,
            task_state=None, node=None, task_args=None,
            fault=row.args().get('fault', row.fault)):
        LOG.info('Instance %s: the node of its failed build is released',
                 row.uuid)
    return True


def offer_of(node):
    """Return what a node fresh from Ironic offers a build (a NodeOffer)."""
    resources = ironic.node_resources(node)
    return inst.NodeOffer(
        uuid=node.uuid, resource_class=node.resource_class,
        vcpus=resources.vcpus, memory_mb=resources.memory_mb,
        local_gb=resources.local_gb, traits=node.traits,
        available=resources.available, capabilities=resources.capabilities)
