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

"""The instance actions: stop, start, reboot and rebuild.

Each action is one flow function ``action(worker, row)`` (the shape is
described in instances/worker.py). ``row`` is the instance row as the
poller read it, with the action's task state. The function returns True
when the action is finished (done, failed with a fault, or no longer this
worker's) and False when it should be tried again later (Ironic was
unavailable). It ends through action_done(), action_failed() or
action_paused(). Every changing call goes through the fence
(``worker.fence``); a call that must never reach Ironic twice records the
node's mark first and is sent in the same turn (send_once(), which gives
the row the flow writes with from then on).

A new action is one more function here, plus its entries in
instances/model.py (REQUESTS, ACTIONS) and in manager.FLOWS.
"""

import contextlib
import dataclasses
import functools
import json

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import answers
from ironic_compute.instances import calls
from ironic_compute.instances import configdrive
from ironic_compute.instances import model as inst
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# Seconds a hard power action may take. Ironic's conductor gives the BMC
# [conductor]power_state_change_timeout (60 s by default) per attempt.
POWER_TIMEOUT = 300
# Seconds past [DEFAULT]shutdown_timeout that Ironic may take to end a soft
# action it was given that timeout for, before the hard one is sent.
SOFT_SETTLE_TIMEOUT = 60


def power(worker, row):
    """Carry out instance stop (task state powering-off: power the node
    off, soft first unless asked hard) or start (powering-on: power it
    on)."""
    off = row.task_state == inst.POWERING_OFF
    try:
        if off:
            power_off(worker, row, row.node, hard=row.args().get('hard'))
        else:
            power_on(worker, row, row.node, (row.task_state,))
    except exception.ProvisionError as exc:
        return action_failed(worker, row, exc)
    except exception.IronicUnavailable as exc:
        return action_paused(worker, row, exc)
    return action_done(worker, row,
                       inst.POWER_OFF if off else inst.POWER_ON)


def reboot(worker, row):
    """instance reboot: soft unless asked hard, falling back to hard when
    the soft one fails. The reboot call is never sent twice."""
    hard = bool(row.args().get('hard'))
    conf = worker.conf
    try:
        row = send_once(worker, row, 'last_power_state_change',
                        lambda fence, soft, _state: worker.provisioner.set_power(
                            row.node, 'reboot', fence, soft=soft,
                            timeout=conf.shutdown_timeout), soft=not hard)
        if row is None:
            return True  # the row changed, or the refusal is recorded
        try:
            state = worker.provisioner.wait_for_power(
                row.node, answers.POWER_ON,
                POWER_TIMEOUT if hard else conf.shutdown_timeout, 'reboot',
                calls.ACTION_POLL, calls.ACTION_FIRST_READ)
            if not hard and state.last_error:
                # Ironic ended the soft reboot as failed: the OS did not
                # shut down in time, so the node never went off.
                raise exception.ProvisionError(state.last_error)
        except exception.ProvisionError as exc:
            if hard:
                raise
            settled = power_settled(worker, row.node)
            if (settled.power_state == answers.POWER_ON
                    and not settled.last_error):
                # Ironic ended the soft reboot well, after our wait: its
                # timeout counts the power off only, the power on comes
                # after. Rebooted once; not again, hard.
                LOG.info('Instance %s: the soft reboot ended well after '
                         '%s s', row.uuid, conf.shutdown_timeout)
            else:
                LOG.warning('Instance %s: soft reboot not done after %s s '
                            '(%s); rebooting hard', row.uuid,
                            conf.shutdown_timeout, one_line(exc))
                worker.provisioner.set_power(
                    row.node, 'reboot',
                    worker.fence.check(row, (row.task_state,), row.node))
                worker.provisioner.wait_for_power(
                    row.node, answers.POWER_ON, POWER_TIMEOUT, 'reboot',
                    calls.ACTION_POLL, calls.ACTION_FIRST_READ)
    except exception.ProvisionError as exc:
        return action_failed(worker, row, exc)
    except exception.IronicUnavailable as exc:
        return action_paused(worker, row, exc)
    return action_done(worker, row, inst.POWER_ON)


def rebuild(worker, row):
    """instance rebuild: redeploy in place, on the same node with the same
    allocation, with the instance's config drive, then power on. The user
    data and SSH keys the request replaces are recorded on the row with
    the mark, as the rebuild is sent. The rebuild call is never sent
    twice."""
    image = row.args().get('image') or row.image_source or ''
    if not image:
        return action_failed(worker, row, 'no image to rebuild with')
    replaced = configdrive.rebuild_columns(row.args())
    drive = dataclasses.replace(row, **replaced).configdrive()
    try:
        # The read that gives the mark says the image too: a rebuild with
        # the same image sends only the rebuild.
        row = send_once(worker, row, 'provision_updated_at',
                        lambda fence, soft, state: worker.provisioner.rebuild(
                            row.node, image, fence, state.image_source,
                            configdrive=drive),
                        image=True, record=replaced)
        if row is None:
            return True  # the row changed, or the refusal is recorded
        # A read at once would find the redeploy the call has just started
        # (Ironic records its target before it answers): the first read
        # comes ACTION_FIRST_READ later, one request fewer for a busy
        # Ironic.
        state = worker.provisioner.wait_for(
            row.node, answers.DEPLOY_DONE, answers.DEPLOY_FAILED,
            worker.conf.ironic.deploy_timeout, 'rebuild', calls.ACTION_POLL,
            first_read=calls.ACTION_FIRST_READ)
        # The read that saw the deploy end says the power too.
        power_on(worker, row, row.node, (row.task_state,), state)
    except exception.ProvisionError as exc:
        return action_failed(worker, row, exc)
    except exception.IronicUnavailable as exc:
        return action_paused(worker, row, exc)
    return action_done(worker, row, inst.POWER_ON, image_source=image)


# --- helpers of the actions (and of the build's power on) ---------------------

def _read(worker, node, image=False):
    """Return the node as Ironic says it now (with ``image``, its
    image_source too); raise ProvisionError when it is gone from Ironic
    (nothing can be done on it)."""
    state = worker.provisioner.node(node, image=image)
    if state is None:
        raise exception.ProvisionError(f'node {node} is gone from Ironic')
    return state


def power_on(worker, claim, node, states, state=None):
    """Power ``node`` on unless it is on or powering on already, and wait
    until Ironic says it is on.

    ``claim`` is the instance row the worker acts for, and ``states`` the
    task states the fence accepts. ``state`` is the node as the caller has
    just read it, after what it waited on (not read again here); the fence
    still checks the node right before the call. A node that ``state``
    shows on, with no power action under way, is on: nothing is sent or
    waited for. Raises exception.ProvisionError when the node is gone or
    does not come on in POWER_TIMEOUT seconds.
    """
    # A read and the call it decides follow each other in one turn; a
    # state given needs no turn unless a call is sent (which takes its own).
    with (worker.provisioner.turn(f'instance {claim.uuid}')
          if state is None else contextlib.nullcontext()):
        if state is None:
            state = _read(worker, node)
        if state.target_power_state is None:
            if state.power_state == answers.POWER_ON:
                return
            worker.provisioner.set_power(
                node, 'on', worker.fence.check(claim, states, node,
                                               answered=True))
    # A build waits at the builds' pace; an action at an action's.
    building = claim.task_state == inst.SPAWNING
    worker.provisioner.wait_for_power(
        node, answers.POWER_ON, POWER_TIMEOUT, 'power on',
        None if building else calls.ACTION_POLL,
        None if building else calls.ACTION_FIRST_READ)


def power_off(worker, claim, node, hard):
    """Power ``node`` off and wait until Ironic says it is off.

    Soft first unless ``hard``; hard when Ironic refuses the soft one or it
    has not ended within [DEFAULT]shutdown_timeout. Returns at once when
    the node is off already. Raises exception.ProvisionError when Ironic
    refuses or the node does not go off in time.
    """
    conf = worker.conf
    fence = worker.fence.check(claim, (claim.task_state,), node)
    soft_failed = None
    # The read that decides and the call follow each other in one turn:
    # the fence checks the node on that read.
    with worker.provisioner.turn(f'instance {claim.uuid}'):
        state = _read(worker, node)
        if state.power_state == answers.POWER_OFF and (
                state.target_power_state is None):
            return
        soft = not hard and state.target_power_state is None
        if soft:
            try:
                worker.provisioner.set_power(node, 'off', fence, soft=True,
                                             timeout=conf.shutdown_timeout)
            except exception.ProvisionError as exc:
                soft_failed = exc
    if soft and soft_failed is None:
        try:
            worker.provisioner.wait_for_power(
                node, answers.POWER_OFF, conf.shutdown_timeout,
                'soft power off', calls.ACTION_POLL, calls.ACTION_FIRST_READ)
            return
        except exception.ProvisionError as exc:
            soft_failed = exc
    if soft_failed is not None:
        LOG.warning('Instance %s: soft power off did not work (%s); '
                    'powering off hard', claim.uuid, one_line(soft_failed))
    state = power_settled(worker, node)
    if state.power_state != answers.POWER_OFF:
        worker.provisioner.set_power(node, 'off', fence)
    worker.provisioner.wait_for_power(node, answers.POWER_OFF,
                                      POWER_TIMEOUT, 'power off',
                                      calls.ACTION_POLL, calls.ACTION_FIRST_READ)


def power_settled(worker, node):
    """Return the node once Ironic has ended the power action in flight.

    Ironic ends a soft action by itself after the timeout it was given, so
    this waits that long plus SOFT_SETTLE_TIMEOUT seconds. Raises
    exception.ProvisionError when the action is still in flight then.
    """
    return worker.provisioner.wait_for_power_settled(
        node, worker.conf.shutdown_timeout + SOFT_SETTLE_TIMEOUT,
        'the soft power action to end', calls.ACTION_POLL)


def send_once(worker, row, mark, send, soft=False, image=False,
              record=None):
    """Send an action's call that must never reach Ironic twice, and
    return the row the worker acts for from then on (None: nothing more to
    do, as the row changed meanwhile and nothing was sent, or Ironic
    refused the call and the action ended with that fault).

    ``mark`` names a time Ironic sets on the node when it starts such an
    action (``last_power_state_change``, ``provision_updated_at``). The
    first attempt records the node's mark on the row (a new version, which
    the worker's next write names), then sends ``send(fence, soft,
    state)`` by send_soft_first(), in the same turn: the fence checks the
    node on ``state``, the read that gave the mark (with ``image``, the
    node's image_source too). ``record``: more columns written with the
    mark (what the call sends, kept on the row from then on). A worker
    resuming the action (after a kill, or a takeover) finds the record;
    if the node's mark has moved since, the call was carried out, and it
    only waits. An action under way with
    the mark unmoved proves nothing (an operator's power on; ours, not
    stamped yet): it waits for it to end, outside its turn, then decides
    by the mark. Raises exception.ProvisionError, before writing anything,
    when the node is gone, and what send_soft_first() raises but a refusal
    (exception.IronicUnavailable: the flow pauses, and its resume reads the
    row again).
    """
    args, uuid = row.args(), row.uuid
    while True:
        with worker.provisioner.turn(f'instance {row.uuid}'):
            state = _read(worker, row.node, image)
            if mark in args and getattr(state, mark) != args[mark]:
                LOG.info('Instance %s: %s sent already by an earlier '
                         'attempt; waiting for it', row.uuid, row.task_state)
                return row
            if mark not in args or (
                    state.target_power_state is None
                    and state.target_provision_state is None):
                row = db_instances.transition(
                    db_api.Context(), row, row.task_state,
                    task_args=json.dumps({**args, mark: getattr(state, mark)},
                                         sort_keys=True), **(record or {}))
                if row is None:
                    LOG.warning('Instance %s: its row changed meanwhile '
                                '(moved, or asked again); nothing sent', uuid)
                    return None
                try:
                    send_soft_first(worker, row, functools.partial(
                        _with_state, send, state), soft)
                except exception.ProvisionError as exc:
                    # Recorded here, with the row the mark's write
                    # returned: the caller's row names an older version,
                    # and a write naming it would match nothing.
                    action_failed(worker, row, exc)
                    return None
                return row
        # Only the mark, once nothing is under way, tells.
        worker.provisioner.poll_node(
            row.node, lambda n: n is None or (
                n.target_power_state is None
                and n.target_provision_state is None),
            worker.conf.ironic.deploy_timeout, 'the action under way to end',
            calls.ACTION_POLL)


def _with_state(send, state, fence, soft):
    return send(fence, soft, state)


def send_soft_first(worker, row, send, soft=False):
    """Send the action's call, ``send(fence, soft)``, through the fence.

    With ``soft``, a soft call is tried first, and a hard one is sent when
    Ironic refuses it (the driver cannot do it). Raises
    exception.ProvisionError when Ironic refuses the call.
    """
    fence = worker.fence.check(row, (row.task_state,), row.node)
    if soft:
        try:
            send(fence, True)
            return
        except exception.ProvisionError as exc:
            LOG.warning('Instance %s: soft %s refused (%s); hard',
                        row.uuid, row.task_state, one_line(exc))
    send(fence, False)


def action_done(worker, row, power_state, **values):
    """Record the action done: the instance takes the action's end state,
    ``power_state`` and ``values``, and loses its fault. Returns True (the
    request is finished, even when the row changed meanwhile and nothing
    was written)."""
    done = inst.DONE_STATE[row.task_state]
    if db_instances.transition(
            db_api.Context(), row, row.task_state, vm_state=done,
            task_state=None, task_args=None, task_requested_at=None,
            power_state=power_state, fault=None, **values):
        LOG.info('Instance %s: %s done, %s', row.uuid, row.task_state, done)
    return True


def action_failed(worker, row, exc):
    """Record that Ironic refused or failed the action: it ends with a
    fault, and the instance keeps its state, so that an operator may ask
    again. Returns True (the request is finished)."""
    fault = one_line(exc)
    LOG.error('Instance %s: %s failed: %s', row.uuid, row.task_state, fault)
    db_instances.transition(
        db_api.Context(), row, row.task_state, task_state=None,
        task_args=None, task_requested_at=None,
        fault=f'{row.task_state}: {fault}'[:2000])
    return True


def action_paused(worker, row, exc):
    """Log that Ironic is unavailable; returns False, so that the manager
    tries the action again later."""
    LOG.error('Instance %s: %s paused, Ironic unavailable (%s); '
              'retrying', row.uuid, row.task_state, one_line(exc))
    return False
