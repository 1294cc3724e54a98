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

"""What one cycle must change in ``compute_nodes``: pure, no I/O.

Given who manages which listed node (``ownership.owned_nodes``), what each
node's row should hold, and the rows as they are, decide which rows to
create, take, release, update and which to ask Ironic about before
deleting. The resource tracker carries the plan out with conditional
updates.
"""

import collections
import dataclasses


@dataclasses.dataclass
class Plan:
    # uuid -> synced fields, for listed nodes of ours without a live row
    create: dict = dataclasses.field(default_factory=dict)
    # owner we saw (None = unowned) -> uuids of ours held elsewhere
    take: dict = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))
    # new owner (None = nobody) -> uuids we hold but no longer manage
    release: dict = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))
    # uuid -> synced fields, for rows of ours whose values changed
    update: dict = dataclasses.field(default_factory=dict)
    # uuid -> owner we saw, for rows Ironic did not list: delete on 404
    check_gone: dict = dataclasses.field(default_factory=dict)
    # uuids of rows we hold whose node has an instance nobody knows
    unknown_kept: list = dataclasses.field(default_factory=list)
    # uuids of ours held by a live service outside our ring
    waiting: list = dataclasses.field(default_factory=list)


def plan(me, ownership, listed, fields, rows, live, ring, partition_key,
         my_instance_nodes):
    """Build the Plan of one cycle.

    :param me: this host, normalised
    :param ownership: ownership.Ownership of the listed nodes
    :param listed: uuids of every node Ironic listed
    :param fields: uuid -> synced fields, for the listed nodes that are ours
        or whose row we hold (the only ones whose row we may write)
    :param rows: uuid -> compute_nodes.NodeRow, every live row
    :param live: the services that are up, in any partition: a row one of
        them holds outside our ring is left for it to release, and rows of
        the others are orphans
    :param ring: the ring over the peers of this partition
    :param partition_key: the conductor group listed, or None for all
    :param my_instance_nodes: uuids of nodes of instances this host manages
    """
    result = Plan()
    for uuid in listed:
        row = rows.get(uuid)
        if uuid in ownership.owned:
            if row is None:
                result.create[uuid] = fields[uuid]
                continue
            if row.host != me:
                if _held_elsewhere(row, live, ring):
                    # A live service of another partition holds it: taking it
                    # would start a tug of war; it releases the row itself
                    # once the node is no longer in its partition.
                    result.waiting.append(uuid)
                    continue
                result.take[row.host].append(uuid)
            # Rows held elsewhere come without values: write them once taken.
            if row.fields != fields[uuid]:
                result.update[uuid] = fields[uuid]
        elif row is not None and row.host == me:
            new_owner = (ownership.others.get(uuid)
                         or ownership.foreign.get(uuid))
            if new_owner is not None:
                result.release[new_owner].append(uuid)
            else:
                # Not claiming a node is not dropping it: keep what we hold
                # until the unknown instance is sorted out.
                result.unknown_kept.append(uuid)
                if row.fields != fields[uuid]:
                    result.update[uuid] = fields[uuid]

    for uuid, row in rows.items():
        if uuid in listed:
            continue
        if row.host == me:
            if uuid not in my_instance_nodes:
                result.check_gone[uuid] = me
        elif _orphan_in_partition(row, live, partition_key):
            # Someone must clean up after a service that is gone; the ring
            # says who, so that only one service asks Ironic.
            if ring.get_hosts(uuid)[:1] == [me]:
                result.check_gone[uuid] = row.host
    return result


def _held_elsewhere(row, live, ring):
    return row.host is not None and row.host in live and row.host not in ring.hosts


def _orphan_in_partition(row, live, partition_key):
    if row.host is not None and row.host in live:
        return False
    return partition_key is None or (row.conductor_group or '') == partition_key
