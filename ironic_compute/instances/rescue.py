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

"""The way back in: instance rescue and unrescue.

A rescue boots the instance's node into Ironic's rescue ramdisk, where the
tenant logs in with the password given (``instance rescue``); an unrescue
boots it back into its own system. Both are flows ``action(worker, row)``
like those of power.py, queued on the row (task states rescuing,
unrescuing) and carried out by the host that manages the instance, or by
its successor after a takeover. Each call is fenced and sent once
(power.send_once() with Ironic's ``provision_updated_at`` as the mark): a
worker that resumes the action after a kill waits for the call sent
before instead of sending it again.

The password is the one secret here. It travels in the row's task_args
(model.RESCUE_PASSWORD) from the request to the call, so that a kill or a
takeover between them loses nothing; every end of the action (done,
failed, the row deleted) writes task_args away with it. It is never
logged: the lines below name the instance, the node and the states only,
and _scrubbed() takes it out of what the call raises.
"""

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute import redaction
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import answers
from ironic_compute.instances import calls
from ironic_compute.instances import model as inst
from ironic_compute.instances import power
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# Where a rescue and an unrescue end, and where they fail. A rescue with a
# ramdisk passes through "rescue wait" (target "rescue") until the ramdisk
# calls back; fake hardware goes to "rescue" at once.
RESCUE_DONE, RESCUE_FAILED = 'rescue', ('rescue failed', 'error')
UNRESCUE_DONE, UNRESCUE_FAILED = answers.DEPLOY_DONE, ('unrescue failed',
                                                       'error')


def rescue(worker, row):
    """instance rescue (task state rescuing): boot the node into the
    rescue ramdisk with the row's password and wait until Ironic says
    ``rescue``. The rescue call is never sent twice. Returns True when the
    request is finished, False when Ironic was unavailable (tried again).
    """
    password = row.args().get(inst.RESCUE_PASSWORD)
    if not password:
        return power.action_failed(worker, row, 'no rescue password')
    return _carry_out(
        worker, row,
        lambda fence, _soft, _state: _scrubbed(
            worker.provisioner.rescue, row.node, fence, password),
        RESCUE_DONE, RESCUE_FAILED)


def unrescue(worker, row):
    """instance unrescue (task state unrescuing): boot the node back into
    its own system and wait until Ironic says ``active``. Never sent
    twice. Returns as rescue() does."""
    return _carry_out(
        worker, row,
        lambda fence, _soft, _state: worker.provisioner.rescue(
            row.node, fence),
        UNRESCUE_DONE, UNRESCUE_FAILED)


def _scrubbed(call, node, fence, password):
    """``call(node, fence, password)``; what it raises never quotes the
    password (an error whose text holds it is raised again without it,
    and without its cause, which a traceback would print)."""
    with redaction.secret_kept_out(password):
        return call(node, fence, password)


def _carry_out(worker, row, send, done, failed):
    """Send ``send`` once (power.send_once), wait for the node to reach
    ``done`` (or one of ``failed``), and record the end.

    Ironic refusing the call changes nothing: the instance keeps its state
    with a fault (power.action_failed). A call Ironic took and that failed
    or did not end in time leaves the node out of the tenant's system:
    the instance is recorded rescued with the fault (_failed_in_rescue),
    so that an unrescue, or a rescue again, is what may be asked next, as
    Ironic allows from "rescue failed" and "unrescue failed".
    """
    what = row.task_state
    try:
        sent = power.send_once(worker, row, 'provision_updated_at', send)
    except exception.ProvisionError as exc:  # the node is gone
        return power.action_failed(worker, row, exc)
    except exception.IronicUnavailable as exc:
        return power.action_paused(worker, row, exc)
    if sent is None:
        # The row changed (not ours to finish), or Ironic refused the call
        # and send_once() recorded the fault.
        return True
    try:
        state = worker.provisioner.wait_for(
            sent.node, done, failed, worker.conf.ironic.deploy_timeout, what,
            calls.ACTION_POLL)
    except exception.ProvisionError as exc:
        return _failed_in_rescue(sent, exc)
    except exception.IronicUnavailable as exc:
        return power.action_paused(worker, sent, exc)
    # What Ironic says of the power once it is done: fake hardware rescues
    # a node that is off without powering it on.
    return power.action_done(worker, sent, inst.power_of(state.power_state))


def _failed_in_rescue(row, exc):
    """Record a rescue or an unrescue that Ironic took and that failed:
    rescued, with the fault; the password goes with task_args. Returns
    True (the request is finished)."""
    fault = one_line(exc)
    LOG.error('Instance %s: %s failed: %s', row.uuid, row.task_state, fault)
    db_instances.transition(
        db_api.Context(), row, row.task_state, vm_state=inst.RESCUED,
        task_state=None, task_args=None, task_requested_at=None,
        fault=f'{row.task_state}: {fault}'[:2000])
    return True
