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

"""ironic-compute-manage instance console: Ironic's console of an
instance's node, asked of Ironic by the command itself.

Not queued on the row like the actions, because the operator wants what
Ironic answers (the console's type and address) when the command returns,
and because enabling a console twice is the same as once: it neither
needs the exactly-once rule of the actions nor takes anything from the
tenant's machine. It still acts only on a live instance's own node: right
before the call (ironic.IronicClient.request's ``before``) it reads the
node, which must serve the instance (model.node_refusal, the workers'
rule), then the instance row, which must still be live, built, on that
node and not being deleted.
"""

import time

from ironic_compute import exception
from ironic_compute import ironic
from ironic_compute import redaction
from ironic_compute.cmd import common
from ironic_compute.cmd import output
from ironic_compute.instances import answers
from ironic_compute.instances import model as inst

CONF = common.CONF
# Seconds Ironic's conductor may take to start or stop the console after
# the API accepted the change (it answers 202 and works on), and between
# two reads meanwhile.
WAIT = 30.0
POLL = 0.2

COLUMNS = output.columns(
    ('instance', 'Instance'), ('node', 'Node'),
    ('console_enabled', 'Console enabled'), ('console_type', 'Type'),
    ('console_url', 'URL'))


def _client():
    return ironic.IronicClient(CONF)


def set_console(instance_uuid, node, enabled, refusal):
    """Enable (``enabled``) or disable the console of ``node``, the node of
    instance ``instance_uuid``; return what Ironic then says of it, as a
    record (instance, node, console_enabled, console_type, console_url,
    console_info).

    ``refusal()`` re-reads the instance row and says why it may no longer
    be acted on (or None); it runs right before the call, after the node
    read. Raises exception.CommandError, in one line, when the instance or
    its node refuses, Ironic refuses or does not answer, or the console
    is not in the state asked for within WAIT seconds.
    """
    client = _client()

    def fence():
        try:
            raw = client.request('node.get', node, fields=[
                'uuid', 'instance_uuid', 'allocation_uuid'])
            serving = answers.Serving(raw.uuid, raw.instance_uuid,
                                      getattr(raw, 'allocation_uuid', None))
        except exception.IronicNotFound:
            serving = None
        why = inst.node_refusal(serving, instance_uuid) or refusal()
        if why is not None:
            raise exception.Fenced(why)

    what = f'{"enable" if enabled else "disable"} the console of instance ' \
           f'{instance_uuid}'
    try:
        client.request('node.set_console_mode', node, enabled, before=fence)
        info = _wait(client, node, enabled)
    except exception.Fenced as exc:
        raise exception.CommandError(f'cannot {what}: {exc}') from None
    except exception.MaybeSent:
        raise exception.CommandError(
            f'cannot {what}: Ironic did not answer, and may have taken the '
            'change; run the command again') from None
    except exception.IronicComputeError as exc:
        raise exception.CommandError(
            f'cannot {what}: {common.driver_message(exc)}') from None
    details = info.get('console_info') or {}
    return {'instance': instance_uuid, 'node': node,
            'console_enabled': bool(info.get('console_enabled')),
            'console_type': details.get('type'),
            'console_url': redaction.url_credentials(details.get('url')),
            'console_info': {key: (redaction.url_credentials(value)
                                   if key == 'url' else value)
                             for key, value in details.items()} or None}


def _wait(client, node, enabled):
    """Ironic's console of ``node`` once it is ``enabled`` (a dict with
    console_enabled and console_info); raises exception.ProvisionError
    when it is not within WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        info = client.request('node.get_console', node) or {}
        if bool(info.get('console_enabled')) == enabled:
            return info
        if time.monotonic() >= deadline:
            raise exception.ProvisionError(
                f'Ironic has not {"enabled" if enabled else "disabled"} the '
                f'console of node {node} after {WAIT:g} s')
        time.sleep(POLL)
