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

"""A cycle's plan (sync_plan.Plan) written to the rows.

Every write is conditional on the owner the cycle saw (db/compute_nodes.py):
a race lost to a peer changes nothing and is counted. A row is deleted only
once Ironic answers 404 for its node.
"""

import dataclasses

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.db import compute_nodes as db_nodes

LOG = logging.getLogger(__name__)

# Above this many rows to confirm, one listing of all nodes is cheaper than
# asking Ironic about each node (e.g. after the partition key changed).
BULK_EXISTS_THRESHOLD = 20


@dataclasses.dataclass
class Applied:
    """Which rows a plan's writes gave to and took from this host."""

    gained: set = dataclasses.field(default_factory=set)  # taken, created
    lost: set = dataclasses.field(default_factory=set)  # released, deleted
    deleted: set = dataclasses.field(default_factory=set)  # after a 404


def release_to_shard_owners(plan, ring, host):
    """Rows ``host`` holds outside its shards go straight to their shard's
    owner rather than to nobody (it deletes them if the node is gone)."""
    for uuid, owner in list(plan.check_gone.items()):
        if owner != host:
            continue
        new_owner = ring.get_hosts(uuid)[:1]
        if new_owner and new_owner[0] != host:
            del plan.check_gone[uuid]
            plan.release[new_owner[0]].append(uuid)


def apply(ctx, plan, host, service_id, services, ironic_client, stats,
          per_node=False):
    """Take, create, update, release and delete as ``plan`` says, as
    ``host``; count in ``stats`` (a tracker.CycleStats). ``services``: the
    services rows of the cycle (the ids of the hosts rows go to). Returns
    Applied."""
    me = host
    applied = Applied()
    lost = set()  # rows we tried to take and did not: not ours to write
    for owner, uuids in plan.take.items():
        moved = db_nodes.move(ctx, uuids, owner, me, service_id)
        stats.taken += len(moved)
        stats.lost_races += len(uuids) - len(moved)
        lost.update(set(uuids) - set(moved))
        applied.gained.update(moved)
        for uuid in uuids:
            LOG.debug('Node %s: %s from %s', uuid,
                      'taken' if uuid in moved else 'lost the race for',
                      owner)
    if plan.create:
        created, revived = db_nodes.create_or_revive(
            ctx, plan.create, me, service_id)
        stats.created, stats.revived = len(created), len(revived)
        applied.gained.update(created, revived)
        stats.lost_races += len(plan.create) - len(created) - len(revived)
        for uuid in revived:
            LOG.debug('Node %s: its deleted row is back', uuid)
    # The update is conditional on our holding the row: a row whose take
    # was lost is not written, so it is not counted.
    changes = {u: f for u, f in plan.update.items() if u not in lost}
    if changes:
        db_nodes.update_fields(ctx, me, changes)
        stats.updated = len(changes)
    service_ids = {s.host: s.id for s in services}
    for new_owner, uuids in plan.release.items():
        moved = db_nodes.move(ctx, uuids, me, new_owner,
                              service_ids.get(new_owner))
        stats.released += len(moved)
        applied.lost.update(moved)
        LOG.debug('Nodes %s released to %s', sorted(moved), new_owner)
    applied.deleted, released = delete_gone(
        ctx, plan.check_gone, host, ironic_client, stats, per_node)
    applied.lost.update(applied.deleted, released)
    return applied


def delete_gone(ctx, check_gone, host, ironic_client, stats, per_node=False):
    """Soft-delete rows only for nodes Ironic says are gone (404).

    ``check_gone``: {node uuid: the row's owner}. ``per_node``: never list
    every node (the shard ring lists a share). Returns (the uuids whose rows
    were deleted, those released).
    """
    deleted, released = set(), set()
    if not check_gone:
        return deleted, released
    try:
        if len(check_gone) > BULK_EXISTS_THRESHOLD and not per_node:
            existing = {n.uuid for n in ironic_client.list_nodes()}
            exists = existing.__contains__
        else:
            exists = ironic_client.node_exists
        verdicts = {uuid: exists(uuid) for uuid in check_gone}
    except exception.IronicUnavailable as exc:
        LOG.warning('Could not confirm that %d unlisted nodes are gone '
                    '(%s); their rows stay', len(check_gone), exc)
        return deleted, released
    for uuid, owner in check_gone.items():
        if not verdicts[uuid]:
            if db_nodes.soft_delete(ctx, uuid, owner):
                stats.deleted += 1
                deleted.add(uuid)
                LOG.debug('Node %s is gone from Ironic; row deleted', uuid)
        elif owner == host:
            # Still in Ironic but no longer listed for us: it moved to
            # another conductor group or shard, whose services take it.
            if db_nodes.move(ctx, [uuid], host, None, None):
                stats.released += 1
                released.add(uuid)
                LOG.debug('Node %s left our partition; released', uuid)
    return deleted, released
