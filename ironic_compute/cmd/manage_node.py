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

"""ironic-compute-manage node ...: who manages a node, and moving it."""

from ironic_compute import exception
from ironic_compute.cmd import common
from ironic_compute.cmd import manage_placement
from ironic_compute.cmd import manage_ring
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.cmd.manage_args import lookup_uuid
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.nodes import ownership

# placement/client.py (keystoneauth1 under it) is imported where node show
# and node list ask Placement: see "Start-up" in doc/cli.md.

CONF = common.CONF
UNMANAGED = 'unmanaged'  # no live row, or its owner is not up
REAPING = ownership.REAPING
REMOVED = ownership.REMOVED
Reason = ownership.Reason


COLUMNS = output.columns(
    ('uuid', 'UUID'), ('conductor_group', 'Conductor group', lambda g: g or '(none)'),
    ('host', 'Row owner'), ('host_state', 'Owner state'), ('managed_by', 'Managed by'),
    ('reason', 'Why'), ('detail', 'Detail'), ('instance', 'Instance'),
    ('instance_host', 'Instance host'), ('ring_host', 'Ring pick'),
    ('expected_host', 'Rules pick'), ('standby', 'Standby'))


LIST_COLUMNS = output.columns(
    ('uuid', 'UUID'), ('name', 'Name'), ('host', 'Host'),
    ('conductor_group', 'Conductor group', lambda g: g or '(none)'), ('reason', 'Why'),
    ('instance', 'Instance'), ('resource_class', 'Resource class'), ('vcpus', 'VCPUs'),
    ('memory_mb', 'Memory (MB)'), ('local_gb', 'Disk (GB)'))
REASONS = sorted({str(r) for r in Reason} | {UNMANAGED, REAPING, REMOVED})


def _ring_for(view, row):
    """The ring that covers the node, and why there is none."""
    group = row.conductor_group if row is not None else None
    key = view.partition_key
    if key and row is not None and (group or '').lower() != key.lower():
        return None, (f'the node is in conductor group {group or "(none)"!r}, '
                      f'not in partition {key!r}')
    if view.node_ring is None:
        why = view.warnings[0] if view.warnings else 'no live peer'
        return None, f'the ring is empty: {why}'
    return view.node_ring, None


def _manager(owner, state, node, ring, no_ring, by_uuid, by_node,
             deleted=frozenset(), removed=frozenset()):
    """(managed_by, reason, detail) of a node whose row ``owner`` holds:
    what ownership.explain says, when the owner is up.

    ``deleted``: the instances this database built and then deleted;
    ``removed``: those whose record "instance remove" forgot.
    """
    if owner is None:
        return None, UNMANAGED, 'its row has no owner'
    if state == 'not a registered service':
        return None, UNMANAGED, f'{owner} is not a registered service'
    if state != 'up':
        return None, UNMANAGED, f'{owner} is {state}'
    said = ownership.explain(node, ring or ownership.NO_RING, by_uuid,
                             by_node, this_host=owner, deleted=deleted,
                             removed=removed)
    detail = said.why
    if said.why == ownership.NO_RING_COVERS_IT:
        detail = f'{said.why} ({no_ring})'
    return owner, said.label, detail


def _who_takes_it(view, owner, expected, instance, no_ring):
    """What happens next to an unmanaged node, as the end of its detail."""
    if expected is None:
        if instance is not None:
            return (f'; no service manages instance {instance.uuid}: '
                    'nobody takes it')
        return f'; {no_ring}' if no_ring else ''
    state = manage_ring.host_state(view, expected)
    if state == 'up':
        return f'; {expected} takes it at its next cycle'
    where = '' if expected == owner else f', which is {state}'
    return (f'; instance {instance.uuid} pins it to {expected}{where}: '
            '"node move" moves both')


def describe(uuid, row, view, instances, deleted=frozenset(),
             removed=frozenset()):
    """The ``node show`` report of a node (``deleted``, ``removed``: see
    _manager)."""
    ring, no_ring = _ring_for(view, row)
    by_uuid, by_node = ownership.index_instances(instances)
    node = ownership.NodeInfo(
        uuid, instance_uuid=row.ironic_instance if row else None,
        conductor_group=row.conductor_group if row else None)
    # Who the rules give the node, whoever holds its row now.
    expected = ownership.explain(node, ring or ownership.NO_RING, by_uuid,
                                 by_node).host
    owner = row.host if row is not None else None
    state = manage_ring.host_state(view, owner)
    if row is None:
        managed_by, reason, detail = (None, UNMANAGED,
                                      'no live compute_nodes row')
    else:
        managed_by, reason, detail = _manager(owner, state, node, ring,
                                              no_ring, by_uuid, by_node,
                                              deleted, removed)
    if reason == UNMANAGED:
        detail += _who_takes_it(view, owner, expected, by_node.get(uuid),
                                no_ring)
    instance = (by_uuid.get(node.instance_uuid) if node.instance_uuid
                else by_node.get(uuid))
    return {
        'uuid': uuid,
        'conductor_group': row.conductor_group if row else None,
        'host': owner,
        'host_state': state if row is not None else None,
        'managed_by': managed_by,
        'reason': reason,
        'detail': detail,
        'instance': instance.uuid if instance else node.instance_uuid,
        'instance_host': (instance.host or None) if instance else None,
        'ring_host': ring.get_hosts(uuid)[0] if ring else None,
        'expected_host': expected,
        # Who takes the node, in order, if the one before dies.
        'standby': ring.get_hosts(uuid)[1:] if ring else [],
    }


def _gone_instances(ctx, rows):
    """(deleted, removed) among the instances Ironic names on these rows'
    nodes: built here and deleted (db/instances.deleted_builds, as the
    services ask), and forgotten by "instance remove"."""
    named = {row.ironic_instance for row in rows
             if row is not None and row.ironic_instance}
    if not named:
        return frozenset(), frozenset()
    return (db_instances.deleted_builds(ctx, named),
            admin.removed_instances(ctx, named))


class NodeCommands:
    """The compute node rows: who manages a node, admin moves."""

    @args('uuid', help='UUID of the Ironic node')
    @format_option
    def show(self, uuid, format='table'):
        """Show which service manages a node and why, and the ring's pick."""
        uuid = lookup_uuid(uuid)
        ctx = db_api.Context()
        row = admin.get_node(ctx, uuid)
        if row is None and not admin.node_is_known(ctx, uuid):
            raise exception.CommandError(f'no compute node {uuid}')
        # The ring of the services that list the node (its conductor
        # group's), whatever partition this configuration names.
        view = manage_ring.PartitionViews(ctx).of_node(
            row.conductor_group if row is not None else None)
        # Every instance: Ironic may name one the database has on no node.
        report = describe(uuid, row, view, db_instances.load_all(ctx),
                          *_gone_instances(ctx, [row]))
        columns = COLUMNS
        from ironic_compute.placement import client as placement_client
        if placement_client.configured(CONF):
            report.update(manage_placement.node_report(uuid))
            columns = COLUMNS + manage_placement.NODE_COLUMNS
        output.show_record(report, columns, format)

    @args('--host', help='only the nodes whose row this service holds')
    @args('--partition-key', metavar='KEY',
          help='only the nodes of this conductor group')
    @args('--reason', choices=REASONS,
          help='only the nodes managed for this reason')
    @format_option
    def list(self, host=None, partition_key=None, reason=None,
             format='table'):
        """List the nodes: who manages each, why, and its capacity."""
        ctx = db_api.Context()
        if host is not None:
            host = ownership.normalize_host(host)
        group = (partition_key.strip().lower() or '') if partition_key \
            is not None else None
        listing = admin.list_nodes(ctx, host, group)
        views = manage_ring.PartitionViews(ctx)
        by_node, by_uuid = {}, {}
        for instance in db_instances.load_all(ctx):
            by_uuid[instance.uuid] = instance
            if instance.node:
                by_node.setdefault(instance.node, []).append(instance)
        deleted, removed = _gone_instances(
            ctx, [item.record for item in listing])
        records = []
        for item in listing:
            uuid = item.record.uuid
            named = by_uuid.get(item.record.ironic_instance)
            instances = by_node.get(uuid, []) + ([named] if named else [])
            report = describe(uuid, item.record,
                              views.of_node(item.record.conductor_group),
                              instances, deleted, removed)
            if reason is not None and report['reason'] != reason:
                continue
            records.append({
                'uuid': uuid, 'name': item.name, 'host': item.record.host,
                'conductor_group': item.record.conductor_group or None,
                'reason': report['reason'], 'instance': report['instance'],
                'resource_class': item.resource_class, 'vcpus': item.vcpus,
                'memory_mb': item.memory_mb, 'local_gb': item.local_gb})
        columns = LIST_COLUMNS
        from ironic_compute.placement import client as placement_client
        if placement_client.configured(CONF):
            manage_placement.add_provider_state(records)
            columns = LIST_COLUMNS + manage_placement.LIST_COLUMNS
        output.show_listing(records, columns, format)

    @args('uuid', help='UUID of the Ironic node')
    @args('--to', required=True, metavar='HOST',
          help='the (up) service that gets the node')
    def move(self, uuid, to):
        """Move a node of a dead service, and its instance, to another."""
        uuid = lookup_uuid(uuid)
        destination = ownership.normalize_host(to)
        moved = admin.move_node(db_api.Context(), uuid, destination,
                                CONF.service_down_time)
        source = moved.source or '(no owner)'
        print(f'Node {uuid} moved from {source} ({moved.source_state}) '
              f'to {destination}.')
        if moved.instances:
            print(f'Instance {", ".join(moved.instances)} moved with it.')
        for instance, host in sorted(moved.stayed.items()):
            if host != destination:
                print(f'Instance {instance} stays with {host}, which is '
                      f'alive: {host} takes the node back at its next cycle.')
        if not moved.instances and not moved.stayed:
            print('It has no instance: the ring decides at the next cycle '
                  'whether it stays there.')
