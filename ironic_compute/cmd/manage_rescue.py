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

"""ironic-compute-manage instance rescue, unrescue and console: a way back
into an instance.

The commands are methods of manage_instance.InstanceCommands (which binds
these functions, ``self`` first), kept here so that the class stays small.
``rescue`` and ``unrescue`` queue the action on the row through
InstanceCommands._act(), as ``stop`` does; the password comes from a file
or standard input, never the command line. ``console`` asks Ironic itself
(cmd/instance_console.py says why).
"""

import getpass
import sys

from ironic_compute import exception
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.cmd.manage_args import new_uuid
from ironic_compute.cmd.manage_args import request_options
from ironic_compute.cmd.manage_args import uses_clients
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import model as inst


def _rescue_password(password_file):
    """The rescue password, from ``password_file`` or standard input (a
    prompt without echo on a terminal). Raises CommandError, in one line
    that never quotes it, when it cannot be read or is not one (see
    model.rescue_password)."""
    limit = inst.RESCUE_PASSWORD_MAX + 3  # and a line end: enough to judge
    try:
        if password_file is not None:
            with open(password_file, encoding='utf-8') as source:
                text = source.read(limit)
        elif sys.stdin is not None and sys.stdin.isatty():
            text = getpass.getpass('Rescue password: ')
        else:
            text = sys.stdin.read(limit) if sys.stdin is not None else ''
    except OSError as exc:
        raise exception.CommandError(
            f'cannot read the rescue password from {password_file or "stdin"}'
            f': {exc.strerror or type(exc).__name__}') from None
    except UnicodeDecodeError:
        raise exception.CommandError(
            'the rescue password is not UTF-8 text') from None
    try:
        return inst.rescue_password(text)
    except exception.InvalidRequest as exc:
        raise exception.CommandError(str(exc)) from None


def _console_refusal(row):
    """Why the console of instance ``row`` (None: no live instance) may
    not be touched, or None: it must be built, on a node, with no delete
    in flight."""
    if row is None:
        return 'no such live instance'
    if row.node is None or row.vm_state not in inst.CONSOLE_STATES:
        return (f'it is {row.vm_state or "unknown"}; the console needs '
                + ' or '.join(inst.CONSOLE_STATES))
    if row.task_state == inst.DELETING:
        return 'it is being deleted'
    return None


@args('uuid', help='UUID of the instance')
@args('--password-file', metavar='FILE',
      help='read the rescue password from FILE (default: standard '
           'input; a prompt on a terminal); never give it on the '
           'command line')
@request_options
def rescue(self, uuid, password_file=None, wait=False, timeout=600.0,
           format='table'):
    """Boot an instance into Ironic's rescue ramdisk, where its tenant
    logs in with the password given: it is rescued."""
    password = _rescue_password(password_file)
    return self._act('rescue', uuid, wait, timeout, format,
                     **{inst.RESCUE_PASSWORD: password})


@args('uuid', help='UUID of the instance')
@request_options
def unrescue(self, uuid, wait=False, timeout=600.0, format='table'):
    """Boot a rescued instance back into its own system: it is
    active."""
    return self._act('unrescue', uuid, wait, timeout, format)


@uses_clients
@args('uuid', help='UUID of the instance')
@args('--disable', action='store_true', default=False,
      help='disable the console instead')
@format_option
def console(self, uuid, disable=False, format='table'):
    """Enable (or disable) Ironic's console of the instance's node, and
    show what Ironic says of it."""
    # Imported here: it loads the Ironic client, which the other
    # instance commands do not need.
    from ironic_compute.cmd import instance_console
    uuid = new_uuid(uuid, 'instance')
    row = db_instances.get(db_api.Context(), uuid)
    why = _console_refusal(row)
    if why is not None:
        raise exception.CommandError(
            f'cannot {"disable" if disable else "enable"} the console of '
            f'instance {uuid}: {why}')

    def refusal():
        current = db_instances.get(db_api.Context(), uuid)
        return _console_refusal(current) or (
            None if current.node == row.node
            else f'it is on node {current.node} now')
    output.show_record(instance_console.set_console(
        uuid, row.node, not disable, refusal), instance_console.COLUMNS,
        format)
