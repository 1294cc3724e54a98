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

"""Giving nodes back: instance delete, and the reaping of a node whose
instance was deleted while its host was down.

The flows are plain functions that take the Worker first
(instances/worker.py): delete(worker, row) and reap(worker, node,
instance_uuid). Each returns True when it is finished and False when the
manager should try again later. free() and tear_down() are the steps they
share with a failed build (instances/build.py). Every changing call goes
through the fence (``worker.fence``).
"""

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import answers
from ironic_compute.instances import model as inst
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# The task states in which a delete may tear down.
DELETING = (inst.DELETING,)


def delete(worker, row):
    """instance delete: tear the node down, drop the allocation and the
    claim in Placement, and mark the row deleted.

    The node is the row's, or, for a build that had not recorded it yet,
    the one its allocation names. When Ironic cannot free the node now, the
    row keeps the reason as its fault and False is returned: the manager
    tries again later. Returns True once the instance is deleted (or the
    row changed meanwhile).
    """
    node = row.node
    try:
        if node is None:
            allocation = worker.provisioner.allocation(row.uuid)
            node = allocation.node_uuid if allocation else None
        free(worker, row, node, DELETING)
    except (exception.IronicUnavailable, exception.ProvisionError) as exc:
        LOG.error('Instance %s: delete not finished, retrying: %s',
                  row.uuid, one_line(exc))
        db_instances.transition(db_api.Context(), row, inst.DELETING,
                                fault=one_line(exc)[:2000])
        return False
    if db_instances.soft_delete(db_api.Context(), row):
        LOG.info('Instance %s: deleted; node %s is free', row.uuid, node)
    return True


def reap(worker, node, instance_uuid):
    """Tear down ``node``, whose instance ``instance_uuid`` this database
    knows deleted (it was deleted while the host managing it was down),
    and drop that instance's allocation and its claim in Placement.

    Returns True when done (or nothing was left to do), and False when
    Ironic could not do it now: a later cycle of the resource tracker finds
    the node again and asks again, once the manager's back-off has passed.
    """
    try:
        gone = db_instances.get(db_api.Context(), instance_uuid, deleted=True)
        tear_down(worker, node, instance_uuid,
                  worker.fence.reap_check(node, instance_uuid),
                  project=gone.project_id if gone is not None else None)
        worker.provisioner.delete_allocation(
            instance_uuid,
            worker.fence.reap_check(node, instance_uuid, node_check=False))
        release_claim(worker, instance_uuid, worker.fence.reap_check(
            node, instance_uuid, node_check=False))
    except (exception.IronicUnavailable, exception.ProvisionError) as exc:
        LOG.error('Node %s of deleted instance %s: not torn down yet: %s',
                  node, instance_uuid, one_line(exc))
        return False
    LOG.info('Node %s: torn down; its instance %s was deleted while its '
             'host was down', node, instance_uuid)
    return True


def free(worker, row, node, states):
    """Tear ``node`` down if it still serves the instance of ``row``, then
    drop the instance's allocation and its claim in Placement, while the
    row is still in one of the task ``states`` (the fence checks it before
    each call). ``node`` None: only the allocation and the claim. Raises
    exception.ProvisionError or exception.IronicUnavailable when Ironic (or
    Placement) cannot do it now."""
    free_node(worker, row, node, states)
    release_claim(worker, row.uuid, worker.fence.check(row, states))


def free_node(worker, row, node, states):
    """free() without the claim: the node torn down and the allocation
    dropped."""
    if node is not None:
        tear_down(worker, node, row.uuid,
                  worker.fence.check(row, states, node),
                  project=row.project_id)
    worker.provisioner.delete_allocation(row.uuid,
                                         worker.fence.check(row, states))


def release_claim(worker, instance_uuid, fence):
    """Give back the instance's claim in Placement (worker.claims; None:
    Placement is not configured), once its node and its Ironic allocation
    are free: a claim whose instance nobody manages any more would hold its
    node there for good. ``fence`` runs first: a worker that lost the
    instance (a takeover) leaves the claim to its new manager. Idempotent
    (a claim already gone is done). Raises exception.ProvisionError when
    Placement cannot do it now: the flow is tried again later."""
    if worker.claims is None:
        return
    fence()
    try:
        worker.claims.release(instance_uuid)
    except exception.PlacementError as exc:
        raise exception.ProvisionError(
            f'its claim in Placement is not released: {one_line(exc)}'
        ) from exc
    LOG.info('Instance %s: its claim in Placement is released',
             instance_uuid)


def tear_down(worker, node, instance_uuid, fence, project=None):
    """Bring ``node`` back to available if it still serves the instance,
    and wait until it is; first clear its lessee if it is ``project``
    (the instance's tenant).

    ``fence`` runs right before the undeploy, after any wait: the node may
    have passed to another instance meanwhile. A node that serves another
    instance, or none, is left as it is (and the log says why). Raises
    exception.ProvisionError when the node is in a state it cannot be torn
    down from, or the tear down fails or does not end within
    [ironic]deploy_timeout.
    """
    timeout = worker.conf.ironic.deploy_timeout
    with_lessee = project is not None
    state = worker.provisioner.node(node, lessee=with_lessee)
    if not_torn_down(node, instance_uuid, state):
        return
    if state.target_provision_state is not None:
        # Deploying or cleaning: Ironic takes no new action until it ends.
        state = worker.provisioner.poll(
            lambda: worker.provisioner.node(node, lessee=with_lessee),
            lambda n: n is None or n.target_provision_state is None,
            timeout, f'node {node} to settle')
        if not_torn_down(node, instance_uuid, state):
            return  # it settled into another instance's, or none
    if with_lessee and state.lessee == project:
        # Before the undeploy, not after: the node still serves this
        # instance (the fence checks it right before the call), so the
        # lessee is this tenant's. Once the undeploy is accepted, cleaning
        # ends with the node free, and another build may reserve it and
        # set its own tenant before a clear sent then, which would take
        # the node from that tenant. A lessee that is not this project
        # (set by an operator) is left as it is.
        worker.provisioner.clear_lessee(node, fence)
    if state.provision_state in answers.UNDEPLOYABLE:
        worker.provisioner.undeploy(node, fence)
    elif state.provision_state != answers.UNDEPLOY_DONE:
        raise exception.ProvisionError(
            f'node {node} is {state.provision_state}: it cannot be torn '
            'down from there; an operator must clean it')
    worker.provisioner.wait_for(node, answers.UNDEPLOY_DONE,
                                answers.UNDEPLOY_FAILED, timeout,
                                'tear down')


def not_torn_down(node, instance_uuid, state):
    """Return whether ``node`` is to be left alone: True when ``state``
    (the node as read; None: gone from Ironic) shows it serving neither the
    instance nor its allocation, and then the log says why in one line."""
    if state is not None and instance_uuid in (state.instance_uuid,
                                               state.allocation_uuid):
        return False
    if state is not None and state.instance_uuid is not None:
        # Another instance's now: worth an operator's eye.
        LOG.warning('Node %s: not torn down for instance %s: it serves '
                    '%s now', node, instance_uuid, state.instance_uuid)
    else:
        LOG.info('Node %s: not torn down for instance %s: %s', node,
                 instance_uuid, 'it is gone from Ironic' if state is None
                 else 'it serves no instance (freed already)')
    return True
