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

``create``, ``delete``, ``stop``, ``start``, ``reboot``, ``rebuild``,
``rescue`` and ``unrescue`` write requests to the shared database; the
service that manages the instance carries them out (there is no message
bus); ``rescue``, ``unrescue`` and ``console`` are in cmd/manage_rescue.py.
``add`` and ``remove`` are admin tools for records of instances made elsewhere: they
pin or unpin a node without touching Ironic, then or later (``remove
--force`` forgets a built instance the same way).
"""

import time
import uuid as uuidlib

from ironic_compute import exception
from ironic_compute.cluster import liveness
from ironic_compute.cmd import common
from ironic_compute.cmd import manage_configdrive
from ironic_compute.cmd import manage_rescue
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.cmd.manage_args import new_uuid
from ironic_compute.cmd.manage_args import request_options
from ironic_compute.cmd.manage_args import timeout_option
from ironic_compute.cmd.manage_args import uses_clients_if
from ironic_compute.cmd.manage_args import wait_option
from ironic_compute.conf import placement as placement_conf
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.db import services as db_services
from ironic_compute.instances import model as inst
from ironic_compute.nodes import ownership
from ironic_compute.text import one_line

CONF = common.CONF
WAIT_POLL = 0.5  # seconds between two reads while --wait

LIST_COLUMNS = output.columns(
    ('uuid', 'UUID'), ('name', 'Name'), ('host', 'Host'), ('node', 'Node'),
    ('vm_state', 'VM state'), ('task_state', 'Task state'), ('fault', 'Fault'))
SHOW_COLUMNS = LIST_COLUMNS + output.columns(
    ('partition_key', 'Conductor group'), ('resource_class', 'Resource class'),
    ('vcpus', 'VCPUs'), ('memory_mb', 'Memory (MB)'), ('disk_gb', 'Disk (GB)'),
    ('traits', 'Traits'),
    ('capabilities', 'Capabilities', lambda value: ', '.join(
        f'{key}={text}' for key, text in sorted(value.items())) or '-'),
    ('ephemeral_gb', 'Ephemeral (GB)'), ('ephemeral_format', 'Ephemeral format'),
    ('swap_mb', 'Swap (MB)'), ('image_source', 'Image'),
    ('image_checksum', 'Image checksum'), ('image_kernel', 'Image kernel'),
    ('image_ramdisk', 'Image ramdisk'), ('project_id', 'Project'),
    ('user_id', 'User')) + manage_configdrive.SHOW_COLUMNS + output.columns(
    ('created_at', 'Created (UTC)'), ('updated_at', 'Updated (UTC)'),
    ('launched_at', 'Launched (UTC)'), ('power_state', 'Power state'),
    ('waiting', 'Waiting'))

hard_option = args('--hard', action='store_true', default=False,
                   help='at once, without asking the operating system first '
                        '(default: soft, falling back to hard after '
                        '[DEFAULT]shutdown_timeout)')


def _non_negative(value, what):
    if value is None:
        return 0
    if value < 0:
        raise exception.CommandError(f'{what} must be 0 or more, not {value}')
    return value


def _capabilities(items):
    """{key: value} of the --capability KEY=VALUE given; InvalidRequest
    for one that is not, or a key given twice with two values."""
    found = {}
    for item in items:
        key, value = inst.parse_capability(item.strip())
        if found.setdefault(key, value) != value:
            raise exception.InvalidRequest(
                f'capability {key} given twice: {found[key]} and {value}')
    return found


def _optional(value, what=None, limit=None):
    """An optional text option, stripped (None: not given or empty);
    CommandError when it holds a space or a control character inside, or
    is longer than ``limit``."""
    value = (value or '').strip() or None
    if value is not None and what is not None and (
            any(c.isspace() or not c.isprintable() for c in value)
            or (limit is not None and len(value) > limit)):
        raise exception.CommandError(
            f'{what} must be one word{f" of up to {limit} characters" if limit else ""}'
            f', not {value[:60]!r}')
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
            raise exception.CommandError(
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
    why = liveness.idle_reason(record, listing.now, CONF.service_down_time)
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


def _schedule(uuid, name, spec, image, host, extra):
    """Choose the host and record the build request; with [placement],
    claim its node in Placement first (placement/placing.py). The row
    recorded; NoValidHost or RequestRefused when there is no room."""
    if not placement_conf.configured(CONF):
        return db_scheduling.schedule_and_create(
            db_api.Context(), uuid, name, spec, image, CONF.service_down_time,
            host=host, **extra)
    # Only with [placement]: keystoneauth1 under them costs a start-up.
    from ironic_compute.placement import claims as placement_claims
    from ironic_compute.placement import placing
    owner = (extra['project_id'] or CONF.placement.claim_project_id,
             extra['user_id'] or CONF.placement.claim_user_id)
    try:
        return placing.schedule_claim_and_create(
            db_api.Context(), placement_claims.Claims.from_conf(CONF), uuid,
            name, spec, image, CONF.service_down_time, owner, host=host,
            **extra)
    except exception.PlacementError as exc:
        raise exception.CommandError(
            f'Placement: {one_line(exc)}; nothing recorded') from None


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
    @args('--capability', action='append', default=[], metavar='KEY=VALUE',
          dest='capabilities',
          help="a capability the node must have, exactly as in its "
               "properties/capabilities; also sent to Ironic's deploy "
               '(for example boot_mode=uefi; repeatable)')
    @args('--ephemeral-gb', type=int, default=0, metavar='N',
          help='an ephemeral partition of N GB beside the root (partition '
               'images)')
    @args('--ephemeral-format', metavar='FS',
          help='with --ephemeral-gb: its file system (ext4, xfs...)')
    @args('--swap-mb', type=int, default=0, metavar='N',
          help='a swap partition of N MB (partition images)')
    @args('--image', default='', metavar='URL',
          help='the image source to deploy')
    @args('--image-checksum', metavar='VALUE',
          help="the image's checksum, or a URL of a checksum file (Ironic's "
               'direct deploy refuses an http image without one)')
    @args('--image-kernel', metavar='URL',
          help='the kernel of a partition image')
    @args('--image-ramdisk', metavar='URL',
          help='the ramdisk of a partition image')
    @args('--project', metavar='ID',
          help="the tenant's project: the node's lessee while the "
               'instance lives')
    @args('--user', metavar='ID', help='the user it is built for')
    @manage_configdrive.create_options
    @args('--host', help='build on this service (no choice; it must pass '
                         "the scheduler's checks)")
    @args('--partition-key', metavar='KEY',
          help='only services and nodes of this conductor group')
    @wait_option
    @timeout_option
    @format_option
    @uses_clients_if(placement_conf.auth_type_set)
    def create(self, name, resource_class, vcpus=0, memory_mb=0, disk_gb=0,
               traits=(), capabilities=(), ephemeral_gb=0,
               ephemeral_format=None, swap_mb=0, image='',
               image_checksum=None, image_kernel=None, image_ramdisk=None,
               project=None, user=None, ssh_keys=(), user_data=None, meta=(),
               network_data=None, hostname=None, host=None,
               partition_key=None, wait=False, timeout=600.0,
               format='table'):
        """Ask for an instance: schedule it and record the build request."""
        try:
            spec = inst.RequestSpec(
                resource_class=resource_class.strip(),
                vcpus=_non_negative(vcpus, '--vcpus'),
                memory_mb=_non_negative(memory_mb, '--memory-mb'),
                disk_gb=_non_negative(disk_gb, '--disk-gb'),
                traits=frozenset(t.strip() for t in traits if t.strip()),
                partition_key=(partition_key or '').strip().lower() or None,
                capabilities=_capabilities(capabilities),
                ephemeral_gb=_non_negative(ephemeral_gb, '--ephemeral-gb'),
                ephemeral_format=_optional(ephemeral_format),
                swap_mb=_non_negative(swap_mb, '--swap-mb'))
        except exception.InvalidRequest as exc:
            raise exception.CommandError(str(exc)) from None
        extra = {
            'image_checksum': _optional(image_checksum),
            'image_kernel': _optional(image_kernel, '--image-kernel'),
            'image_ramdisk': _optional(image_ramdisk, '--image-ramdisk'),
            'project_id': _optional(project, '--project', 255),
            'user_id': _optional(user, '--user', 255)}
        if bool(extra['image_kernel']) != bool(extra['image_ramdisk']):
            raise exception.CommandError(
                'a partition image needs both --image-kernel and '
                '--image-ramdisk')
        drive = manage_configdrive.config_drive(
            ssh_keys, user_data, meta, network_data, hostname)
        if host is not None:
            host = ownership.normalize_host(host)
        uuid = str(uuidlib.uuid4())
        manage_configdrive.check_size(drive, uuid, name)
        extra.update(drive.columns())
        try:
            row = _schedule(uuid, name, spec, image, host, extra)
        except (exception.NoValidHost, exception.RequestRefused) as exc:
            raise exception.CommandError(str(exc)) from None
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
            raise exception.CommandError(f'no instance {uuid}')
        _show(row, format)

    @args('--host', help='only the instances this service manages')
    @args('--project', metavar='ID', help='only the instances of this project')
    @format_option
    def list(self, host=None, project=None, format='table'):
        """List the instances (not the deleted ones)."""
        if host is not None:
            host = ownership.normalize_host(host)
        rows = db_instances.list_instances(db_api.Context(), host,
                                           _optional(project, '--project'))
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
            raise exception.CommandError(f'no instance {uuid}')
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
        except exception.RequestRefused as exc:
            raise exception.CommandError(str(exc)) from None
        if wait:
            task = row.task_state
            row = _wait(uuid, lambda r: r is None or r.task_state != task,
                        timeout, f'done with {task}')
            if row is None or row.vm_state == inst.DELETED:
                raise exception.CommandError(f'instance {uuid} was deleted')
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
    @manage_configdrive.rebuild_options
    @request_options
    def rebuild(self, uuid, image=None, user_data=None, ssh_keys=(),
                wait=False, timeout=600.0, format='table'):
        """Redeploy an instance on its node (same node, same allocation),
        with its config drive; --user-data and --ssh-key replace those."""
        row = db_instances.get(db_api.Context(), new_uuid(uuid, 'instance'))
        if row is not None and not (image or row.image_source):
            # Ironic cannot deploy without one (39.0 even fails with 500).
            raise exception.CommandError(
                f'instance {row.uuid} has no image to rebuild with: pass '
                '--image URL')
        replacing = manage_configdrive.rebuild_request(row, user_data,
                                                       ssh_keys)
        return self._act('rebuild', uuid, wait, timeout, format,
                         image=image or None, **replacing)

    # instance rescue, unrescue and console (cmd/manage_rescue.py).
    rescue = manage_rescue.rescue
    unrescue = manage_rescue.unrescue
    console = manage_rescue.console

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
