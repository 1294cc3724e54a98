"""ironic-compute-manage instance ...: the instance records.

A scheduler normally writes these; the commands let an operator (or a test)
record which service manages the instance on a node, which pins the node to
that service whatever the ring says.
"""

import dataclasses

from ironic_compute import ownership
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.cmd.manage_args import lookup_uuid
from ironic_compute.cmd.manage_args import new_uuid
from ironic_compute.db import admin
from ironic_compute.db import api as db_api

COLUMNS = [
    output.Column('uuid', 'UUID'),
    output.Column('host', 'Host'),
    output.Column('node', 'Node'),
    output.Column('vm_state', 'VM state'),
    output.Column('task_state', 'Task state'),
    output.Column('created_at', 'Created (UTC)'),
]


class InstanceCommands:
    """Instance records: which service manages the instance on a node."""

    @args('uuid', help='UUID of the instance')
    @args('--host', required=True, help='the service that manages it')
    @args('--node', required=True, metavar='NODE_UUID',
          help='UUID of the Ironic node it is on')
    @args('--vm-state', default='active', metavar='S',
          help='its vm_state (default: active)')
    def add(self, uuid, host, node, vm_state='active'):
        """Record an instance on a node, managed by a service."""
        uuid = new_uuid(uuid, 'instance')
        node = new_uuid(node, 'node')
        host = ownership.normalize_host(host)
        admin.add_instance(db_api.Context(), uuid, host, node, vm_state)
        print(f'Instance {uuid} recorded on node {node}, managed by {host}.')

    @args('uuid', help='UUID of the instance')
    def remove(self, uuid):
        """Delete an instance record (soft delete)."""
        uuid = lookup_uuid(uuid)
        admin.remove_instance(db_api.Context(), uuid)
        print(f'Instance {uuid} removed.')

    @args('--host', help='only the instances this service manages')
    @format_option
    def list(self, host=None, format='table'):
        """List the instance records."""
        if host is not None:
            host = ownership.normalize_host(host)
        rows = admin.list_instances(db_api.Context(), host)
        output.show_listing([dataclasses.asdict(r) for r in rows], COLUMNS, format)
