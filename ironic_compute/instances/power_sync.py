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

"""The periodic power-state sync: what Ironic says of the power of this
host's instances' nodes, recorded on their rows.

Its functions take the Worker first (instances/worker.py), as the flows
do. manager.py runs sync_power_states() on its timer
([DEFAULT]sync_power_state_interval); a stopped instance found running is
powered off again by power.power(), in the sync's own pool, through the
same fence as an instance stop.
"""

import dataclasses

from oslo_log import log as logging

from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst

LOG = logging.getLogger(__name__)


def sync_power_states(worker, power_off):
    """Make one pass over this host's instances, with one listing of the
    nodes that have an instance.

    An active instance whose node is found off is recorded stopped. A
    stopped one whose node is found on is handed to ``power_off(row,
    power)`` (the manager's: it powers it off again in the sync's pool and
    returns whether it took it). For the others, the power state read is
    recorded. An instance with a task in flight, a rescued one, or one
    whose node is in maintenance or not (yet) its own in Ironic, is
    skipped.

    Returns {'recorded', 'stopped', 'powering off', 'skipped': count}, or
    None while the lease is not valid. Raises exception.IronicUnavailable when
    the listing fails, and the database's errors.
    """
    if not worker.fence.lease_held():
        return None
    counts = dict.fromkeys(('recorded', 'stopped', 'powering off',
                            'skipped'), 0)
    ctx = db_api.Context()
    rows = db_instances.of_host(ctx, worker.host)
    if not rows:
        return counts
    listed = {node.uuid: node for node in worker.ironic.list_nodes(
        conductor_group=worker.partition_key, associated=True)}
    for row in rows:
        node = listed.get(row.node)
        if (node is None or node.maintenance or row.task_state is not None
                or node.instance_uuid != row.uuid
                or row.vm_state in inst.SYNC_LEFT_ALONE):
            # A task in flight, a node in maintenance, or a node not (yet)
            # this instance's in Ironic: the action or the reaper decides.
            # A rescued node runs the rescue ramdisk: its power is not the
            # tenant's system's.
            counts['skipped'] += 1
            continue
        power = inst.power_of(node.power_state)
        action = inst.power_sync(row.vm_state, row.task_state, power,
                                 node.maintenance)
        if action == inst.SYNC_POWER_OFF:
            if power_off(row, power):
                counts['powering off'] += 1
            continue
        if action == inst.SYNC_MARK_STOPPED:
            key, values = 'stopped', {'vm_state': inst.STOPPED}
        elif power != row.power_state:
            key, values = 'recorded', {}
        else:
            continue
        if not db_instances.record_power(ctx, row, power, **values):
            _stale(row)
        else:
            counts[key] += 1
            if key == 'stopped':
                LOG.warning('Instance %s: its node %s is powered off; '
                            'recorded stopped', row.uuid, row.node)
    return counts


def _stale(row):
    """Say (at DEBUG) that the sync wrote nothing for ``row``: it was
    written since the sync read it (an action asked or ended, a takeover),
    so what the sync listed may be older than that write."""
    LOG.debug('Instance %s: changed since the power-state sync read it '
              '(version %d); nothing recorded', row.uuid, row.version)


def claim_power_off(worker, row, power):
    """Queue a power off on a stopped instance found running (``power`` is
    what the sync read), as an instance stop would: soft, then hard.

    Returns the row as claimed (task state powering-off), which
    power.power() then carries out, or None when the row changed since the
    sync read it (nothing is queued). Raises the database's errors.
    """
    if not db_instances.record_power(
            db_api.Context(), row, power,
            task_state=inst.POWERING_OFF, task_args='{}',
            task_requested_at=_utcnow()):
        _stale(row)
        return None
    LOG.warning('Instance %s: stopped, but its node %s is powered '
                'on; powering it off again', row.uuid, row.node)
    return dataclasses.replace(row, task_state=inst.POWERING_OFF,
                               task_args='{}', version=row.version + 1)
