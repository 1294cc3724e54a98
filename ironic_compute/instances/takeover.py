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

"""The instance part of a cycle: take over the dead, reap, report strays.

Runs in the resource-tracker cycle after the rows are synced, on the same
view (the peers, the ring, the database's clock, the listing):

- **takeover**: the instances of a service that has been silent for longer
  than ``service_down_time + instance_takeover_grace`` (and the builds and
  deletes queued for it) go to the live service the ring gives their node
  to (a build without a node: its own uuid). Only that service acts, so the
  others do not even try. It takes them in bulk, a conditional UPDATE per
  chunk of instances (db.takeover.take_over_many), which checks the
  silence again on the database's clock and bumps each instance's
  generation (the fencing token, see fencing.py).
- **reaping**: a node whose Ironic ``instance_uuid`` is an instance this
  database built and knows as deleted is torn down by the node's owner
  (in the worker pool, not in the cycle).
- **strays**: a node whose instance this database does not know is never
  touched (another tool may own it); it is reported once, not every cycle.
"""

import dataclasses

from oslo_log import log as logging

from ironic_compute.cluster import liveness
from ironic_compute.db import instances as db_instances
from ironic_compute.db import takeover as db_takeover
from ironic_compute.instances import model as inst

LOG = logging.getLogger(__name__)
# The instance uuids named in the one warning of a takeover.
_LOGGED_UUIDS = 5


@dataclasses.dataclass
class InstanceStats:
    taken_over: int = 0
    reaping: int = 0


class InstanceKeeper:
    """What one service remembers between cycles about instances."""

    def __init__(self, host, service_id, manager=None):
        self.host = host
        self.service_id = service_id
        self.manager = manager  # InstanceManager: runs the teardowns
        self._reported = {}  # node uuid -> unknown instance uuid

    def run(self, ctx, view):
        """One pass over ``view`` (a CycleView); returns InstanceStats."""
        stats = InstanceStats()
        if view.judge_peers and view.grace > 0:
            stats.taken_over = self._take_over(ctx, view)
        stats.reaping = self._reap_and_report(ctx, view)
        if stats.taken_over and self.manager is not None:
            self.manager.wake()
        return stats

    def _take_over(self, ctx, view):
        instance_hosts = db_instances.hosts(ctx) - {self.host}
        dead = {host for host in instance_hosts if liveness.takeover_due(
            view.records.get(host), view.now, view.service_down_time,
            view.grace)}
        if not dead:
            return 0
        mine = {}  # dead host -> the of_hosts rows this service takes
        owners = {}  # node uuid -> its holder as this cycle saw it
        for seen in db_takeover.of_hosts(ctx, dead):
            row = view.rows.get(seen.node) if seen.node else None
            if not self._in_partition(view, row, seen.node, seen.partition_key,
                                      view.records.get(seen.host)):
                continue
            key = inst.takeover_key(seen.node, seen.uuid)
            if view.ring.get_hosts(key)[:1] != [self.host]:
                continue
            mine.setdefault(seen.host, []).append(seen)
            if row is not None:
                owners[seen.node] = row.host
        down_for = view.service_down_time + view.grace
        taken = 0
        for dead_host, seen in sorted(mine.items()):
            # The database checks again that the host is still down: this
            # view may be a cycle old, and the host may have come back.
            moved = db_takeover.take_over_many(
                ctx, dead_host, seen, self.host, self.service_id, down_for,
                owners)
            taken += len(moved)
            self._log_taken(dead_host, moved, len(seen), down_for)
        return taken

    @staticmethod
    def _log_taken(dead_host, moved, tried, down_for):
        """One line per dead host (10^4 instances must not make 10^4
        warnings), each instance at DEBUG."""
        for seen in moved:
            LOG.debug('Instance %s (node %s) taken over from %s', seen.uuid,
                      seen.node or '-', dead_host)
        if moved:
            first = ', '.join(seen.uuid for seen in moved[:_LOGGED_UUIDS])
            more = (f' and {len(moved) - _LOGGED_UUIDS} more'
                    if len(moved) > _LOGGED_UUIDS else '')
            LOG.warning('%d instance(s) taken over from %s, silent for '
                        'longer than service_down_time + '
                        'instance_takeover_grace (%s s): %s%s', len(moved),
                        dead_host, down_for, first, more)
        if len(moved) < tried:
            LOG.info('%d instance(s) of %s were left alone: they changed, '
                     'or the host came back, since this cycle read them',
                     tried - len(moved), dead_host)

    @staticmethod
    def _in_partition(view, row, node, partition_key, dead_record):
        """Whether this service's partition covers the instance."""
        if view.partition_key is None:
            return True
        if node is not None:
            # The node's conductor group decides; a node without a row is
            # not one any service of ours listed.
            return row is not None and (row.conductor_group or '') == (
                view.partition_key)
        # A build without a node stays in the conductor group it was asked
        # for, else in its dead host's: another group's services hold no
        # node it may take. A host that had no group (or no services row
        # any more) leaves it to any partition, so it never waits for ever.
        group = partition_key or (dead_record.partition_key
                                  if dead_record is not None else None)
        return not group or group == view.partition_key

    def _reap_and_report(self, ctx, view):
        unknown = dict(view.unknown_instance)
        for node in list(self._reported):
            if unknown.get(node) != self._reported[node]:
                del self._reported[node]
        if not unknown:
            return 0
        deleted = db_instances.deleted_builds(ctx, set(unknown.values()))
        reaping = 0
        for node, instance in sorted(unknown.items()):
            if instance in deleted:
                if node in view.owned and self.manager is not None:
                    reaping += bool(self.manager.reap(node, instance))
            elif node in view.owned and self._reported.get(node) != instance:
                # Only the service that holds the row says it, once.
                self._reported[node] = instance
                LOG.warning('Node %s has instance %s, which this database '
                            'does not know: the node is left as it is',
                            node, instance)
        return reaping


@dataclasses.dataclass(frozen=True)
class CycleView:
    """What the cycle saw, as the instance pass needs it."""

    now: object  # the database's time (naive UTC)
    judge_peers: bool  # False while recovering: nobody is judged dead
    service_down_time: float
    grace: float
    records: dict  # host -> ServiceRecord
    ring: object
    partition_key: str | None
    rows: dict  # node uuid -> compute_nodes.NodeRow (every live row)
    owned: frozenset  # node uuids this service manages this cycle
    unknown_instance: dict  # node uuid -> instance uuid nobody manages
