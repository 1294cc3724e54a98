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

"""The threads that carry out the work on this service's instances.

A poller reads the requests queued for this host (one indexed query every
``instance_poll_interval``) and hands each to a pool of
``max_concurrent_builds`` threads, apart from the heartbeat and the
resource tracker. The row's task state names the flow (FLOWS), a function
``flow(worker, row)`` of build.py, power.py, rescue.py or teardown.py (worker.py says
the shape). A flow that returns False is tried again after a back-off. A
timer runs the power-state sync (power_sync.py) with a pool of its own.
"""

import threading
import time

import sqlalchemy.exc as sa_exc
from oslo_db import exception as db_exc
from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import build
from ironic_compute.instances import model as inst
from ironic_compute.instances import power
from ironic_compute.instances import power_sync
from ironic_compute.instances import rescue
from ironic_compute.instances import tasks
from ironic_compute.instances import teardown
from ironic_compute.instances import worker as worker_mod
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# Seconds between two looks of the power-state sync at its interval.
SYNC_TICK = 1.0
# Seconds between two lines saying that the queue cannot be read.
FAILURE_LOG_EVERY = 60.0

# What model.next_action() names -> the flow that carries it out.
FLOWS = {'build': build.build, 'release': build.release,
         'delete': teardown.delete, 'power': power.power,
         'reboot': power.reboot, 'rebuild': power.rebuild,
         'rescue': rescue.rescue, 'unrescue': rescue.unrescue}


class InstanceManager:
    """The instance work of one service: made by the daemon
    (daemon/service.py), started once, stopped with a deadline."""

    def __init__(self, conf, host, ironic_client, service_id=None,
                 partition_key=None, lease=None, claims=None):
        self.conf = conf
        self.host = host
        self.service_id = service_id
        self._stopping = threading.Event()
        self.worker = worker_mod.Worker.of_service(
            conf, host, ironic_client, partition_key, lease, self._stopping,
            claims)
        self.provisioner = self.worker.provisioner
        # The poller and its pool; the power-state sync's timer and pool.
        self._pool = self._poller = self._sync_pool = self._syncer = None
        self._tasks = tasks.Tasks(self._stopping)  # what workers have now
        self._wake = threading.Event()

    # The lease (the fence reads it at each check) and the partition key
    # (the daemon sets it on SIGHUP) live where the flows read them.
    lease = property(
        lambda self: self.worker.fence.lease,
        lambda self, lease: setattr(self.worker.fence, 'lease', lease))
    partition_key = property(
        lambda self: self.worker.partition_key,
        lambda self, key: setattr(self.worker, 'partition_key', key))

    # --- lifecycle --------------------------------------------------------

    def start(self):
        """Start the poller (builds, deletes, actions) and the power-state
        sync's timer, each with its pool, made before the loop that feeds
        it starts."""
        self._pool = tasks.new_pool('instance-worker',
                                    self.conf.max_concurrent_builds)
        self._poller = tasks.started(self._poll_loop, 'instance-poller')
        self._sync_pool = tasks.new_pool(
            'power-sync', self.conf.sync_power_state_pool_size)
        self._syncer = tasks.started(self._sync_loop, 'power-sync')

    def stop(self, timeout=None):
        """Stop taking work; wait up to ``timeout`` seconds (None: without
        bound, 0: not at all) for the steps under way, which give up at
        their next poll of Ironic. Return whether every worker finished.
        Whoever manages an instance next resumes what a step still running
        leaves (the allocation is named by the instance: no second one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        for loop in (self._poller, self._syncer):
            if loop is not None:
                loop.join(tasks.remaining(deadline))
        if tasks.shut_down((self._pool, self._sync_pool), deadline):
            return True
        left = self._tasks.taken()
        if left:
            LOG.warning('Instance work not finished after %.1f s, left as '
                        'it is for whoever manages it next: %s', timeout,
                        ', '.join(left))
        return False

    def wake(self):
        """Look for work now (after a takeover, for instance)."""
        self._wake.set()

    @property
    def busy(self):
        """How many builds, deletes and teardowns run or wait for a worker."""
        return len(self._tasks)

    @property
    def alive(self):
        """Whether the poller thread runs."""
        return self._poller is not None and self._poller.is_alive()

    # --- the poller and the power-state sync's timer ----------------------

    def _poll_loop(self):
        failing_since = logged_at = None
        while not self._stopping.is_set():
            try:
                self.poll_once()
            except Exception as exc:
                # The first failure, then one line a minute while the
                # database is away (the queue is read 5 times a second).
                now = time.monotonic()
                failing_since = failing_since or now
                if logged_at is None or now - logged_at >= FAILURE_LOG_EVERY:
                    logged_at = now
                    LOG.error('Cannot read the instance requests (failing '
                              'for %.0f s): %s', now - failing_since,
                              one_line(exc))
            else:
                if failing_since is not None:
                    LOG.info('Instance requests readable again')
                failing_since = logged_at = None
            self._wake.wait(self.conf.instance_poll_interval)
            self._wake.clear()

    def poll_once(self):
        """Hand every request queued for this host to a worker; return how
        many were handed (0 while the lease is not valid: the rows are read
        again, with their generation, once it is)."""
        if not self.worker.fence.lease_held():
            return 0
        rows = db_instances.pending(db_api.Context(), self.host)
        submitted = 0
        for row in rows:
            flow = FLOWS[inst.next_action(row.task_state)]
            if self._submit(row.uuid, flow, row):
                submitted += 1
        return submitted

    def reap(self, node, instance_uuid):
        """Tear down ``node``, whose instance this database knows deleted,
        in the pool; return whether it was handed to a worker now."""
        return self._submit(('reap', node), teardown.reap, node,
                            instance_uuid)

    def _sync_loop(self):
        # The interval is read at every tick, so that a SIGHUP that changes,
        # disables (<= 0) or enables it takes effect within a tick.
        last = time.monotonic()
        while not self._stopping.wait(SYNC_TICK):
            interval = self.conf.sync_power_state_interval
            if interval <= 0 or time.monotonic() - last < interval:
                continue
            last = time.monotonic()
            try:
                self.sync_power_states()
            except (exception.IronicUnavailable, db_exc.DBError,
                    sa_exc.SQLAlchemyError) as exc:
                LOG.error('Power-state sync skipped: %s', one_line(exc))
            except Exception:
                LOG.exception('Power-state sync failed')

    def sync_power_states(self):
        """One pass of the power-state sync (power_sync.sync_power_states);
        its counts, or None while the lease is not valid."""
        return power_sync.sync_power_states(self.worker, self._sync_power_off)

    def _sync_power_off(self, row, power_read):
        """Have the sync's pool power a stopped instance found running off
        again; return whether it did. Not when a worker has the instance,
        the service stops, or the row changed since the sync read it."""
        # Taken before the row is claimed: the poller then leaves the
        # claimed row (powering-off) to the sync.
        if not self._tasks.take(row.uuid, wait_retry=False):
            return False
        try:
            claim = power_sync.claim_power_off(self.worker, row, power_read)
            if claim is not None:
                self._sync_pool.submit(self._run, row.uuid, power.power,
                                       claim)
        except Exception:
            claim = None  # the database is away or the pool shut down
        if claim is None:
            self._tasks.give_back(row.uuid)
        return claim is not None

    # --- running a flow, and its retries ----------------------------------

    def _submit(self, key, flow, *args):
        """Hand ``flow(worker, *args)`` to the workers' pool; return whether
        it was handed (not while ``key`` is taken or waits for its retry
        time: tasks.py)."""
        if not self._tasks.take(key):
            return False
        try:
            self._pool.submit(self._run, key, flow, *args)
        except RuntimeError:  # the pool shut down meanwhile
            self._tasks.give_back(key)
            return False
        return True

    def _run(self, key, flow, *args):
        """Run ``flow(worker, *args)`` in this thread. A flow that returns
        False, or fails unexpectedly, is tried again after a back-off."""
        try:
            done = flow(self.worker, *args)
        except exception.Stopped:
            done = True  # left as it is for the next attempt
        except exception.NodeFenced as exc:
            # The row is still ours but the node is not the instance's:
            # tried again after the back-off, not at every poll.
            LOG.warning('%s', exc)
            done = False
        except exception.Fenced as exc:
            # Left as it is: whoever manages it now (this host, once it
            # read the row again) carries on.
            LOG.warning('%s', exc)
            done = True
        except db_api.OUTAGE_ERRORS as exc:
            # The database went away, or ended this service's transaction
            # (db/idle_limit.py: it was frozen in it): an outage, logged in
            # one line like the heartbeat's, tried again after the back-off.
            LOG.error('Work on %s stopped: the database is unreachable: %s',
                      key, one_line(exc))
            done = False
        except Exception:
            LOG.exception('Unexpected error working on %s', key)
            done = False
        self._tasks.finished(key, done)

