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

"""ironic-compute-manage instance ...: ask for instances, and the records.

``create``, ``delete``, ``stop``, ``start``, ``reboot`` and ``rebuild``
write requests to the shared database; the service that manages the
instance carries them out (there is no message bus). ``add`` and
``remove`` are admin tools for records of instances made elsewhere: they
pin or unpin a node without touching Ironic, then or later (``remove
--force`` forgets a built instance the same way).
"""

import dataclasses
import time
import uuid as uuidlib

from ironic_compute.cmd import common
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.cmd.manage_args import new_uuid
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import services as db_services
from ironic_compute.instances import model as inst
from ironic_compute.instances import scheduler
from ironic_compute.nodes import ownership

CONF = common.CONF
WAIT_POLL = 0.5  # seconds between two reads while --wait

LIST_COLUMNS = output.columns(
    ('uuid', 'UUID'), ('name', 'Name'), ('host', 'Host'), ('node', 'Node'),
    ('vm_state', 'VM state'), ('task_state', 'Task state'), ('fault', 'Fault'))
SHOW_COLUMNS = LIST_COLUMNS + output.columns(
    ('partition_key', 'Conductor group'), ('resource_class', 'Resource class'),
    ('vcpus', 'VCPUs'), ('memory_mb', 'Memory (MB)'), ('disk_gb', 'Disk (GB)'),
    ('traits', 'Traits'), ('image_source', 'Image'),
    ('created_at', 'Created (UTC)'), ('updated_at', 'Updated (UTC)'),
    ('launched_at', 'Launched (UTC)'), ('power_state', 'Power state'),
    ('waiting', 'Waiting'))

wait_option = args('--wait', action='store_true', default=False,
                   help='wait until the request is carried out')
timeout_option = args('--timeout', type=float, default=600.0, metavar='S',
                      help='with --wait: give up after S seconds '
                           '(default 600)')


def request_options(func):
    """--wait, --timeout and --format: every command that asks for work."""
    return wait_option(timeout_option(format_option(func)))


hard_option = args('--hard', action='store_true', default=False,
                   help='at once, without asking the operating system first '
                        '(default: soft, falling back to hard after '
                        '[DEFAULT]shutdown_timeout)')


def _non_negative(value, what):
    if value is None:
        return 0
    if value < 0:
        raise common.CommandError(f'{what} must be 0 or more, not {value}')
    return value


def _wait(uuid, done, timeout, what):
    """Poll the instance until ``done(row)``; the last row read."""
    deadline = time.monotonic() + timeout
    while True:
        row = db_instances.get(db_api.Context(), uuid, deleted=True)
        if done(row):
            return row
        if time.monotonic() >= deadline:
            state = (f'{row.vm_state}/{row.task_state or "-"}' if row
                     else 'gone')
            raise common.CommandError(
                f'timed out after {timeout:g} s waiting for instance {uuid} '
                f'to be {what} (it is {state})')
        time.sleep(WAIT_POLL)


def _waiting(row):
    """Why a queued task is not being carried out, or None: its host is
    down, and it waits for a takeover (since when)."""
    if row is None or row.task_state is None or row.host is None:
        return None
    listing = db_services.load_services(db_api.Context(), count_nodes=False)
    record = next((s.record() for s in listing.rows if s.host == row.host),
                  None)
    # A disabled service still carries out the tasks of its instances.
    why = (ownership.down_reason(dataclasses.replace(record, disabled=False),
                                 listing.now, CONF.service_down_time)
           if record is not None else 'not a registered service')
    if why is None:
        return None
    since = row.task_requested_at or row.updated_at
    since = since.isoformat(sep=' ', timespec='seconds') if since else '?'
    return (f'for a takeover since {since}: its host {row.host} is down '
            f'({why})')


def _show(row, fmt):
    values = row.as_dict()
    values['waiting'] = _waiting(row)
    output.show_record(values, SHOW_COLUMNS, fmt)


class InstanceCommands:
    """Instances: ask for builds and deletes; the records of who manages what."""

    @args('--name', required=True, help='a name for the instance')
    @args('--resource-class', required=True, metavar='RC',
          help='the Ironic resource class of the node')
    @args('--vcpus', type=int, default=0, metavar='N',
          help='at least this many CPUs')
    @args('--memory-mb', type=int, default=0, metavar='N',
          help='at least this much memory, in MB')
    @args('--disk-gb', type=int, default=0, metavar='N',
          help='at least this much local disk, in GB (the root size)')
    @args('--trait', action='append', default=[], metavar='TRAIT',
          dest='traits', help='a trait the node must have (repeatable)')
    @args('--image', default='', metavar='URL',
          help='the image source to deploy')
    @args('--host', help='build on this service (no choice; it must pass '
                         "the scheduler's checks)")
    @args('--partition-key', metavar='KEY',
          help='only services and nodes of this conductor group')
    @wait_option
    @timeout_option
    @format_option
    def create(self, name, resource_class, vcpus=0, memory_mb=0, disk_gb=0,
               traits=(), image='', host=None, partition_key=None,
               wait=False, timeout=600.0, format='table'):
        """Ask for an instance: schedule it and record the build request."""
        try:
            spec = inst.RequestSpec(
                resource_class=resource_class.strip(),
                vcpus=_non_negative(vcpus, '--vcpus'),
                memory_mb=_non_negative(memory_mb, '--memory-mb'),
                disk_gb=_non_negative(disk_gb, '--disk-gb'),
                traits=frozenset(t.strip() for t in traits if t.strip()),
                partition_key=(partition_key or '').strip().lower() or None)
        except inst.InvalidRequest as exc:
            raise common.CommandError(str(exc)) from None
        if host is not None:
            host = ownership.normalize_host(host)
        uuid = str(uuidlib.uuid4())
        try:
            row = db_instances.schedule_and_create(
                db_api.Context(), uuid, name, spec, image,
                CONF.service_down_time, host=host)
        except (scheduler.NoValidHost, db_instances.Refused) as exc:
            raise common.CommandError(str(exc)) from None
        if wait:
            row = _wait(uuid, lambda r: r is not None and r.vm_state in (
                inst.ACTIVE, inst.ERROR), timeout, 'active or error')
        _show(row, format)
        return 1 if row.vm_state == inst.ERROR else 0

    @args('uuid', help='UUID of the instance')
    @format_option
    def show(self, uuid, format='table'):
        """Show an instance (also a deleted one)."""
        uuid = new_uuid(uuid, 'instance')
        row = db_instances.get(db_api.Context(), uuid, deleted=True)
        if row is None:
            raise common.CommandError(f'no instance {uuid}')
        _show(row, format)

    @args('--host', help='only the instances this service manages')
    @format_option
    def list(self, host=None, format='table'):
        """List the instances (not the deleted ones)."""
        if host is not None:
            host = ownership.normalize_host(host)
        rows = db_instances.list_instances(db_api.Context(), host)
        output.show_listing([r.as_dict() for r in rows], LIST_COLUMNS, format)

    @args('uuid', help='UUID of the instance')
    @wait_option
    @timeout_option
    @format_option
    def delete(self, uuid, wait=False, timeout=600.0, format='table'):
        """Ask for an instance to be deleted: its host tears its node down."""
        uuid = new_uuid(uuid, 'instance')
        row = db_instances.request_delete(db_api.Context(), uuid)
        if row is None:
            raise common.CommandError(f'no instance {uuid}')
        if wait:
            row = _wait(uuid, lambda r: r is None or r.vm_state == inst.DELETED,
                        timeout, 'deleted')
        _show(row, format)

    def _act(self, action, uuid, wait, timeout, fmt, **action_args):
        """Queue ``action`` on the instance; with ``wait``, until it is
        carried out. Exit 1 if it ends with a fault or the time runs out."""
        uuid = new_uuid(uuid, 'instance')
        try:
            row = db_instances.request_action(db_api.Context(), uuid, action,
                                              **action_args)
        except db_instances.Refused as exc:
            raise common.CommandError(str(exc)) from None
        if wait:
            task = row.task_state
            row = _wait(uuid, lambda r: r is None or r.task_state != task,
                        timeout, f'done with {task}')
            if row is None or row.vm_state == inst.DELETED:
                raise common.CommandError(f'instance {uuid} was deleted')
        _show(row, fmt)
        return 1 if wait and row.fault else 0

    @args('uuid', help='UUID of the instance')
    @hard_option
    @request_options
    def stop(self, uuid, hard=False, wait=False, timeout=600.0,
             format='table'):
        """Power an active instance off (soft, then hard): it is stopped."""
        return self._act('stop', uuid, wait, timeout, format, hard=hard)

    @args('uuid', help='UUID of the instance')
    @request_options
    def start(self, uuid, wait=False, timeout=600.0, format='table'):
        """Power a stopped instance on: it is active."""
        return self._act('start', uuid, wait, timeout, format)

    @args('uuid', help='UUID of the instance')
    @hard_option
    @request_options
    def reboot(self, uuid, hard=False, wait=False, timeout=600.0,
               format='table'):
        """Reboot an instance (soft, falling back to hard); once, even if
        its host dies meanwhile."""
        return self._act('reboot', uuid, wait, timeout, format, hard=hard)

    @args('uuid', help='UUID of the instance')
    @args('--image', metavar='URL',
          help='the image source to deploy (default: the current one)')
    @request_options
    def rebuild(self, uuid, image=None, wait=False, timeout=600.0,
                format='table'):
        """Redeploy an instance on its node (same node, same allocation)."""
        row = db_instances.get(db_api.Context(), new_uuid(uuid, 'instance'))
        if row is not None and not (image or row.image_source):
            # Ironic cannot deploy without one (39.0 even fails with 500).
            raise common.CommandError(
                f'instance {row.uuid} has no image to rebuild with: pass '
                '--image URL')
        return self._act('rebuild', uuid, wait, timeout, format,
                         image=image or None)

    @args('uuid', help='UUID of the instance')
    @args('--host', required=True, help='the service that manages it')
    @args('--node', required=True, metavar='NODE_UUID',
          help='UUID of the Ironic node it is on')
    @args('--vm-state', default='active', metavar='S',
          help='its vm_state (default: active)')
    def add(self, uuid, host, node, vm_state='active'):
        """Record an instance built elsewhere on a node, managed by a service."""
        uuid = new_uuid(uuid, 'instance')
        node = new_uuid(node, 'node')
        host = ownership.normalize_host(host)
        admin.add_instance(db_api.Context(), uuid, host, node, vm_state)
        print(f'Instance {uuid} recorded on node {node}, managed by {host}.')

    @args('uuid', help='UUID of the instance')
    @args('--force', action='store_true', default=False,
          help='also forget an instance that "instance create" built: its '
               'node and allocation are left as they are, never torn down')
    def remove(self, uuid, force=False):
        """Forget an instance record; Ironic is not touched, now or later.

        The record is soft-deleted (vm_state removed) and its node and
        allocation are left as they are: no service tears them down. An
        instance that "instance create" built is refused without --force:
        "instance delete" is what tears its node down.
        """
        uuid = new_uuid(uuid, 'instance')
        removed = admin.remove_instance(db_api.Context(), uuid, force=force)
        if removed.built and removed.node:
            print(f'Instance {uuid} removed; node {removed.node} and its '
                  'allocation are left as they are.')
        elif removed.built:
            print(f'Instance {uuid} removed; its allocation, if any, is '
                  'left as it is.')
        else:
            print(f'Instance {uuid} removed.')
