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

"""The fence: may this worker act now, and if not, why.

A worker acts for the instance row it read (its host and its generation).
Every write it makes is conditional on both, and every Ironic call that
changes something is sent only after a check made right before it. The
check passes when the node still serves the instance, the row still has
this host, that generation and an expected task state, and this service's
lease is valid. A worker that is refused leaves the work as it is: the
poller reads the row (and its generation) again before anything resumes.

The check does its slow read first and its quick ones last. It reads the
node from Ironic first, which can take minutes when Ironic is slow and the
adapter retries. Only then does it read the instance row (one indexed
query) and ask the lease (in memory). So a row moved to another service
(``node move``, a takeover) while the node read was under way is seen, and
nothing is sent.

One Fence object serves every flow of a service (instances/build.py,
power.py, power_sync.py, teardown.py): each flow reaches it as
``worker.fence`` (instances/worker.py). ``provision.Provisioner`` runs the
check that ``check()`` or ``reap_check()`` returns immediately before each
changing call.
"""

import sqlalchemy.exc as sa_exc
from oslo_db import exception as db_exc
from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import model as inst
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# A database error while re-checking a row: what is unchecked is not sent.
_DB_ERRORS = (db_exc.DBError, sa_exc.SQLAlchemyError)


class Fence:
    """What the workers of one service may do now, and if not, why.

    ``lease`` is this service's lease (cluster/lease.py); it may be
    replaced while the service runs, and every check reads the current one.
    ``stopping`` is the service's stop event: once it is set, every check
    raises exception.Stopped and the work is left for the next attempt.
    """

    def __init__(self, host, provisioner, lease, stopping):
        self.host = host
        self.provisioner = provisioner
        self.lease = lease
        self.stopping = stopping
        self._lease_problem = None  # logged once per spell

    def lease_held(self):
        """Return whether the lease is valid now.

        The first time it is not, one warning says why; the first time it
        is valid again, one line says the work resumes. Nothing in between,
        so that a long spell does not fill the log.
        """
        problem = self.lease.problem()
        if problem is not None and self._lease_problem is None:
            LOG.warning('Instance work paused, nothing is sent to Ironic: '
                        '%s', problem)
        elif problem is None and self._lease_problem is not None:
            LOG.info('Instance work resumed: the lease is valid again')
        self._lease_problem = problem
        return problem is None

    # --- an instance this service manages ---------------------------------

    def refusal(self, claim, states, node=None, answered=False):
        """Return why this worker may not act for the instance of ``claim``
        now, in one line, or None when it may.

        ``claim`` is the instance row as the worker read it. The worker may
        act when ``node`` (if given) still serves the instance, the row
        still has this host, the claim's generation and a task state among
        ``states``, and the lease is valid.

        The node is read first, because that read is slow; the row and the
        lease are read after it, nearest to the call. With ``answered`` (a
        call that builds on the node: the image, the deploy, a power on)
        the node may be checked on Ironic's answer to this worker's last
        request about it, when that answer is fresh enough
        (Provisioner.fence_node). Before a call that takes something from
        the node's tenant (undeploy, power off, reboot, rebuild) only an
        answer of the last FENCE_READ_AGE seconds counts: the read the flow
        made to decide what to send, in the same turn; an older one, the
        fence reads anew.

        A row that cannot be read (the database is away) is a refusal:
        what is not checked is not sent. Raises what the node read raises
        (exception.IronicUnavailable when Ironic does not answer).
        """
        return self._refusal(claim, states, node, answered)[0]

    def _refusal(self, claim, states, node, answered):
        """refusal(), and whether it is the node's (NodeFenced)."""
        serving = None
        if node is not None:
            serving = self.provisioner.fence_node(node,
                                                  taking=not answered)
        try:
            current = db_instances.get(db_api.Context(), claim.uuid)
        except _DB_ERRORS as exc:
            # The poller reads the row again once the database answers
            # (and the lease holds).
            return f'its row cannot be re-checked ({one_line(exc)})', False
        why = inst.fence_refusal(current, claim, self.host, states)
        if why is None and node is not None:
            why = inst.node_refusal(serving, claim.uuid)
            if why is not None:
                return why, True
        return (why if why is not None else self.lease.problem()), False

    def check(self, claim, states, node=None, answered=False):
        """Return the check that provision.Provisioner runs right before a
        changing call for the instance of ``claim`` (see refusal()).

        The check raises exception.Stopped when the service is stopping,
        and exception.Fenced, with the reason in one line, when this worker
        may not act; then the call is not sent.
        """
        def check():
            if self.stopping.is_set():
                raise exception.Stopped(f'instance {claim.uuid}')
            why, node_refused = self._refusal(claim, states, node,
                                              answered)
            if why is not None:
                refused = (exception.NodeFenced if node_refused
                           else exception.Fenced)
                raise refused(f'Instance {claim.uuid}: {why}')
        return check

    # --- the node of an instance deleted while its host was down ----------

    def reap_refusal(self, node, instance_uuid, node_check=True):
        """Return why this worker may not tear down ``node`` of the deleted
        instance ``instance_uuid`` now, in one line, or None when it may.

        It may when the node still serves that instance (checked only with
        ``node_check``: not when the call removes the instance's own
        allocation), this host still holds the node's compute node row,
        the instance has not come back to life, and the lease is valid.
        As in refusal(), the slow node read comes first. Rows that cannot
        be read are a refusal.
        """
        serving = self.provisioner.node(node) if node_check else None
        ctx = db_api.Context()
        try:
            row = db_nodes.load_rows_of(ctx, self.host, [node]).get(node)
            live = db_instances.get(ctx, instance_uuid)
        except _DB_ERRORS as exc:
            return f'its rows cannot be re-checked ({one_line(exc)})'
        if live is not None:
            return f'instance {instance_uuid} is live again'
        if row is None or row.host != self.host:
            return ('its compute node row is held by '
                    f'{row.host if row else "nobody"} now')
        if node_check:
            why = inst.node_refusal(serving, instance_uuid)
            if why is not None:
                return why
        return self.lease.problem()

    def reap_check(self, node, instance_uuid, node_check=True):
        """Return the check run right before a changing call that tears
        down ``node`` of the deleted instance (see reap_refusal()). It
        raises exception.Stopped or exception.Fenced as check()'s does."""
        def check():
            if self.stopping.is_set():
                raise exception.Stopped(f'node {node}')
            why = self.reap_refusal(node, instance_uuid, node_check)
            if why is not None:
                raise exception.Fenced(f'Node {node} of deleted instance '
                                       f'{instance_uuid}: {why}')
        return check
