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

"""Carry out builds and deletes of the instances this service manages.

A poller thread reads the requests queued for this host (one indexed query
every ``instance_poll_interval``) and hands each to a worker pool of
``max_concurrent_builds`` threads, apart from the heartbeat and the resource
tracker. Every step is idempotent and every state change conditional, so
a worker that dies (the daemon killed, the service stopped) leaves work
that the next attempt — this host after a restart, or the host that took
its instances over — finishes without a second reservation.

Fencing: a worker acts for the instance row it read (host, generation).
Every write is conditional on both, and every Ironic call that changes
something is sent only after a re-check made immediately before it: the
row still has this host, that generation and an expected task state, the
node still serves this instance, and this service's lease is valid. A
worker stopped that way leaves the work as it is; the poller reads the row
(and its generation) again before anything resumes.
"""

import concurrent.futures
import dataclasses
import json
import threading
import time

import sqlalchemy.exc as sa_exc
from oslo_db import exception as db_exc
from oslo_log import log as logging

from ironic_compute import ironic
from ironic_compute.cluster import lease as lease_mod
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import model as inst
from ironic_compute.instances import provision
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

# A request that failed for a reason that may pass (Ironic down, a node
# still cleaning) is tried again after this many seconds, doubling up to
# the cap.
RETRY_FIRST, RETRY_CAP = 2.0, 60.0
# Allocations a build makes while candidates remain free before its fault.
ALLOCATION_ATTEMPTS = 3
# Seconds one allocation may stay "allocating".
ALLOCATION_TIMEOUT = 30
# Seconds a hard power action may take (Ironic's conductor gives the BMC
# [conductor]power_state_change_timeout, 60 s by default, per attempt).
POWER_TIMEOUT = 300
# Seconds past [DEFAULT]shutdown_timeout that Ironic may take to end a soft
# action it was given that timeout for, before the hard one is sent.
SOFT_SETTLE_TIMEOUT = 60
# Seconds between two looks of the power-state sync at its interval.
SYNC_TICK = 1.0


class BuildFailed(Exception):
    """The build cannot succeed; the message is the instance's fault."""


# The task states in which a worker may still reserve and deploy, or tear
# down, for a build; the delete's.
_BUILDING = (inst.SPAWNING,)
_FREEING = (inst.SPAWNING, inst.RELEASING)
_DELETING = (inst.DELETING,)


class InstanceManager:
    def __init__(self, conf, host, ironic_client, service_id=None,
                 partition_key=None, lease=None):
        self.conf = conf
        self.host = host
        self.service_id = service_id
        self.partition_key = partition_key
        # Without a lease renewed by heartbeats nothing is ever sent.
        self.lease = lease or lease_mod.Lease(
            lambda: conf.service_down_time / 2)
        self._lease_problem = None  # logged once per spell
        self._ironic = ironic_client
        self._stopping = threading.Event()
        self.provisioner = provision.Provisioner(
            ironic_client, stopping=self._stopping,
            conductor_group=partition_key,
            max_requests=conf.max_concurrent_ironic_requests)
        self._pool = None
        self._poller = None
        self._sync_pool = None  # the power-state sync's power calls
        self._syncer = None
        self._lock = threading.Lock()
        self._in_flight = set()  # instance uuids (or node uuids to reap)
        self._retry_at = {}  # key -> (monotonic time, delay)
        self._wake = threading.Event()

    # --- lifecycle --------------------------------------------------------

    def start(self):
        # Builds, deletes and actions; the power-state sync's power calls.
        # Each pool exists before the loop that submits to it starts.
        self._pool, self._poller = self._loop_and_pool(
            self._poll_loop, 'instance-poller', 'instance-worker',
            self.conf.max_concurrent_builds)
        self._poller.start()
        self._sync_pool, self._syncer = self._loop_and_pool(
            self._sync_loop, 'power-sync', 'power-sync',
            self.conf.sync_power_state_pool_size)
        self._syncer.start()

    @staticmethod
    def _loop_and_pool(loop, name, workers, size):
        """A pool of ``size`` threads, and the (unstarted) loop feeding it."""
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=size, thread_name_prefix=workers)
        return pool, threading.Thread(target=loop, name=name, daemon=True)

    def stop(self, timeout=None):
        """Stop taking work; wait up to ``timeout`` s for the running steps.

        Steps waiting on Ironic give up at their next poll; a step still
        running at the timeout is left running, and whatever it leaves is
        resumed by whoever manages the instance next (the allocation's name
        is the instance's uuid: no second reservation). ``timeout`` None:
        wait for them however long; 0: do not wait. Returns whether every
        worker has finished.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        for loop in (self._poller, self._syncer):
            if loop is not None:
                loop.join(self._remaining(deadline))
        pools = [p for p in (self._pool, self._sync_pool) if p is not None]
        if not pools:
            return True

        def shut_down():
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)
        # A pool's own shutdown(wait=True) waits without bound: wait for
        # them in a thread of its own, up to the deadline.
        waiter = threading.Thread(target=shut_down,
                                  name='instance-workers-stop', daemon=True)
        waiter.start()
        waiter.join(self._remaining(deadline))
        if not waiter.is_alive():
            return True
        with self._lock:
            left = sorted(map(str, self._in_flight))
        if left:
            LOG.warning('Instance work not finished after %.1f s, left as '
                        'it is for whoever manages it next: %s', timeout,
                        ', '.join(left))
        return False

    @staticmethod
    def _remaining(deadline):
        """Seconds left until ``deadline`` (monotonic; None: no bound)."""
        return None if deadline is None else max(
            deadline - time.monotonic(), 0)

    def wake(self):
        """Look for work now (after a takeover, for instance)."""
        self._wake.set()

    @property
    def busy(self):
        """How many builds, deletes and teardowns run or wait for a worker."""
        with self._lock:
            return len(self._in_flight)

    @property
    def alive(self):
        return self._poller is not None and self._poller.is_alive()

    # --- the poller -------------------------------------------------------

    def _poll_loop(self):
        failing_since = None
        while not self._stopping.is_set():
            try:
                self.poll_once()
            except Exception as exc:
                # One line per poll while the database is away.
                failing_since = failing_since or time.monotonic()
                LOG.error('Cannot read the instance requests (failing for '
                          '%.0f s): %s', time.monotonic() - failing_since,
                          one_line(exc))
            else:
                if failing_since is not None:
                    LOG.info('Instance requests readable again')
                failing_since = None
            self._wake.wait(self.conf.instance_poll_interval)
            self._wake.clear()

    def poll_once(self):
        """Hand every queued request of this host to a worker; their count.

        None while the lease is not valid: the rows are read again (with
        their generation) once it is.
        """
        if not self._lease_held():
            return 0
        rows = db_instances.pending(db_api.Context(), self.host)
        submitted = 0
        for row in rows:
            work = {'build': self._build, 'delete': self._delete,
                    'release': self._release, 'power': self._power,
                    'reboot': self._reboot, 'rebuild': self._rebuild,
                    }[inst.next_action(row.task_state)]
            if self._submit(row.uuid, work, row):
                submitted += 1
        return submitted

    def _lease_held(self):
        problem = self.lease.problem()
        if problem is not None and self._lease_problem is None:
            LOG.warning('Instance work paused, nothing is sent to Ironic: '
                        '%s', problem)
        elif problem is None and self._lease_problem is not None:
            LOG.info('Instance work resumed: the lease is valid again')
        self._lease_problem = problem
        return problem is None

    def reap(self, node, instance_uuid):
        """Tear down ``node``, whose instance this database knows deleted."""
        return self._submit(('reap', node), self._reap, node, instance_uuid)

    # --- the power-state sync ---------------------------------------------

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
            except (ironic.IronicUnavailable, db_exc.DBError,
                    sa_exc.SQLAlchemyError) as exc:
                LOG.error('Power-state sync skipped: %s',
                          one_line(exc))
            except Exception:
                LOG.exception('Power-state sync failed')

    def sync_power_states(self):
        """One pass: record what Ironic says of the power of this host's
        instances' nodes (one listing), mark the active ones found off
        stopped, power the stopped ones found on off again. Returns
        {what: count}, or None while the lease is not valid."""
        if not self._lease_held():
            return None
        counts = dict.fromkeys(('recorded', 'stopped', 'powering off',
                                'skipped'), 0)
        ctx = db_api.Context()
        rows = db_instances.of_host(ctx, self.host)
        if not rows:
            return counts
        listed = {node.uuid: node for node in self._ironic.list_nodes(
            conductor_group=self.partition_key, associated=True)}
        for row in rows:
            node = listed.get(row.node)
            if (node is None or node.maintenance or row.task_state is not None
                    or node.instance_uuid != row.uuid):
                # In flight, in maintenance, or not (yet) this instance's
                # in Ironic: the action or the reaper decides, not the sync.
                counts['skipped'] += 1
                continue
            power = inst.power_of(node.power_state)
            action = inst.power_sync(row.vm_state, row.task_state, power,
                                     node.maintenance)
            if action == inst.SYNC_MARK_STOPPED:
                if db_instances.record_power(ctx, row, row.vm_state, power,
                                             vm_state=inst.STOPPED):
                    counts['stopped'] += 1
                    LOG.warning('Instance %s: its node %s is powered off; '
                                'recorded stopped', row.uuid, row.node)
            elif action == inst.SYNC_POWER_OFF:
                if self._sync_power_off(row, power):
                    counts['powering off'] += 1
            elif power != row.power_state and db_instances.record_power(
                    ctx, row, row.vm_state, power):
                counts['recorded'] += 1
        return counts

    def _sync_power_off(self, row, power):
        """Power a stopped instance found running off again, as an
        instance stop would (soft, then hard), in the sync's pool."""
        with self._lock:
            if row.uuid in self._in_flight or self._stopping.is_set():
                return False
            self._in_flight.add(row.uuid)  # the poller leaves it to us
        try:
            if not db_instances.record_power(
                    db_api.Context(), row, inst.STOPPED, power,
                    task_state=inst.POWERING_OFF, task_args='{}',
                    task_requested_at=_utcnow()):
                raise RuntimeError('changed meanwhile')
            LOG.warning('Instance %s: stopped, but its node %s is powered '
                        'on; powering it off again', row.uuid, row.node)
            claim = dataclasses.replace(row, task_state=inst.POWERING_OFF,
                                        task_args='{}')
            self._sync_pool.submit(self._run, row.uuid, self._power, claim)
        except Exception:
            with self._lock:
                self._in_flight.discard(row.uuid)
            return False
        return True

    def _submit(self, key, func, *args):
        now = time.monotonic()
        with self._lock:
            if key in self._in_flight or self._stopping.is_set():
                return False
            retry = self._retry_at.get(key)
            if retry is not None and now < retry[0]:
                return False
            self._in_flight.add(key)
        try:
            self._pool.submit(self._run, key, func, *args)
        except RuntimeError:  # the pool shut down meanwhile
            with self._lock:
                self._in_flight.discard(key)
            return False
        return True

    def _run(self, key, func, *args):
        try:
            done = func(*args)
        except provision.Stopped:
            done = True  # left as it is for the next attempt
        except provision.Fenced as exc:
            # Left as it is: whoever manages it now (this host, once it
            # read the row again) carries on.
            LOG.warning('%s', exc)
            done = True
        except Exception:
            LOG.exception('Unexpected error working on %s', key)
            done = False
        with self._lock:
            self._in_flight.discard(key)
            if done is False:
                delay = min(self._retry_at.get(key, (0, RETRY_FIRST / 2))[1]
                            * 2, RETRY_CAP)
                self._retry_at[key] = (time.monotonic() + delay, delay)
            else:
                self._retry_at.pop(key, None)

    # --- fencing ----------------------------------------------------------

    def _fence(self, claim, states, node=None, answered=False):
        """The check to run right before an Ironic call for the instance of
        ``claim`` (the row as read): it raises provision.Fenced unless the
        row still has this host, the claim's generation and one of
        ``states``, the node (if given) still serves the instance, and the
        lease is valid — checked last, the nearest to the call.

        The node is read anew, or with ``answered`` (a call that builds on
        the node: image, deploy, power on) checked on Ironic's answer to
        this worker's last request about it when that is fresh enough
        (Provisioner.fence_node). A call that takes something from the
        node's tenant (undeploy, power off, reboot, rebuild) always reads."""
        def check():
            if self._stopping.is_set():
                raise provision.Stopped(f'instance {claim.uuid}')
            try:
                current = db_instances.get(db_api.Context(), claim.uuid)
            except (db_exc.DBError, sa_exc.SQLAlchemyError) as exc:
                # Unchecked is not sent; the poller reads the row again
                # once the database answers (and the lease holds).
                raise provision.Fenced(
                    f'Instance {claim.uuid}: its row cannot be re-checked '
                    f'({one_line(exc)})') from exc
            why = inst.fence_refusal(current, claim, self.host, states)
            if why is None and node is not None:
                why = inst.node_refusal(
                    self.provisioner.fence_node(node) if answered
                    else self.provisioner.node(node), claim.uuid)
            if why is None:
                why = self.lease.problem()
            if why is not None:
                raise provision.Fenced(f'Instance {claim.uuid}: {why}')
        return check

    def _reap_fence(self, node, instance_uuid, node_check=True):
        """The check before tearing down ``node`` of a deleted instance:
        this host still holds the node's row, the node still serves that
        instance (if ``node_check``: not for removing the instance's own
        allocation), and the lease is valid."""
        def check():
            if self._stopping.is_set():
                raise provision.Stopped(f'node {node}')
            ctx = db_api.Context()
            try:
                row = db_nodes.load_rows_of(ctx, self.host, [node]).get(node)
                live = db_instances.get(ctx, instance_uuid)
            except (db_exc.DBError, sa_exc.SQLAlchemyError) as exc:
                raise provision.Fenced(
                    f'Node {node} of deleted instance {instance_uuid}: its '
                    f'rows cannot be re-checked ({one_line(exc)})') from exc
            why = None
            if live is not None:
                why = f'instance {instance_uuid} is live again'
            elif row is None or row.host != self.host:
                why = (f'its compute node row is held by '
                       f'{row.host if row else "nobody"} now')
            if why is None and node_check:
                why = inst.node_refusal(self.provisioner.node(node),
                                        instance_uuid)
            if why is None:
                why = self.lease.problem()
            if why is not None:
                raise provision.Fenced(f'Node {node} of deleted instance '
                                       f'{instance_uuid}: {why}')
        return check

    # --- build ------------------------------------------------------------

    def _build(self, row):
        """Returns False when the build should be tried again later."""
        ctx = db_api.Context()
        first = row.task_state == inst.SCHEDULED
        if first:
            if not db_instances.transition(ctx, row, inst.SCHEDULED,
                                           task_state=inst.SPAWNING):
                return True  # deleted or taken meanwhile
            row = dataclasses.replace(row, task_state=inst.SPAWNING)
        try:
            spec = row.spec()
        except inst.InvalidRequest as exc:
            # A row an older release accepted: it can never be built.
            self._fail(row, row.node, f'invalid request: {exc}')
            return True
        LOG.info('Instance %s: building (%s)', row.uuid, spec.describe())
        node = row.node
        try:
            node, fresh = self._reserve(row, first)
            if node != row.node:
                if not db_instances.record_node(ctx, row, node):
                    # A delete or a takeover came: its worker frees the node.
                    LOG.info('Instance %s: not recording node %s, the '
                             'instance changed meanwhile', row.uuid, node)
                    return True
                row = dataclasses.replace(row, node=node)
            self._deploy(row, node, fresh)
        except (BuildFailed, db_instances.NodeTaken) as exc:
            fault = str(exc)
        except ironic.IronicUnavailable as exc:
            LOG.error('Instance %s: build paused, Ironic unavailable (%s); '
                      'retrying', row.uuid, one_line(exc))
            return False
        else:
            fault = None
        if fault is not None:
            # Outside the except block: one log line, no traceback.
            self._fail(row, node, fault)
            return True
        if db_instances.transition(
                ctx, row, inst.SPAWNING, vm_state=inst.ACTIVE,
                task_state=None, fault=None, launched_at=_utcnow(),
                power_state=inst.POWER_ON):
            LOG.info('Instance %s: active on node %s', row.uuid, node)
        return True

    def _reserve(self, row, first=False):
        """(The node of the instance: its allocation's, made if needed;
        whether the allocation was made just now).

        ``first``: this worker has just moved the row from scheduled to
        spawning, so no attempt made an allocation for it before (one is
        made only by a worker whose fence saw the row spawning): none is
        looked for. Were there one, its create would be refused (same
        uuid and name) and allocate() would take it.
        """
        spec = row.spec()
        fence = self._fence(row, _BUILDING)
        # Ironic answers an allocation within a second; one left in
        # "allocating" for longer is stuck, not slow: try again.
        timeout = min(ALLOCATION_TIMEOUT,
                      self.conf.ironic.deploy_timeout / ALLOCATION_ATTEMPTS)
        allocation = None if first else self.provisioner.allocation(row.uuid)
        error = 'it vanished'
        for attempt in range(ALLOCATION_ATTEMPTS):
            try:
                if allocation is None:
                    # Raises BuildFailed once no candidate is left.
                    try:
                        candidates = self._candidates(spec,
                                                      fresh=attempt > 0)
                    except BuildFailed:
                        if first and self.provisioner.allocation(
                                row.uuid) is not None:
                            # One made anyway (by hand?) holds the node:
                            # go on as a resumed build does.
                            return self._reserve(row)
                        raise
                    # Just read (or deleted by us): not read again.
                    allocation = self.provisioner.allocate(
                        row.uuid, spec, candidates, timeout, fence,
                        absent=True)
                elif allocation.state == 'allocating':  # an earlier attempt's
                    allocation = self.provisioner.poll(
                        lambda: self.provisioner.allocation(row.uuid),
                        lambda a: a is None or a.state != 'allocating',
                        timeout, f'allocation {row.uuid}')
            except provision.ProvisionError as exc:
                allocation = self.provisioner.allocation(row.uuid)
                if allocation is None or allocation.state != 'allocating':
                    raise BuildFailed(str(exc)) from exc
                # Stuck: Ironic's conductor failed and could not even
                # record it (SQLite "database is locked", seen in the
                # functional tests).
                error = str(exc)
            else:
                if allocation is not None and allocation.state == 'active':
                    return allocation.node_uuid, allocation.created
                error = allocation.last_error if allocation else error
            # Another build won the candidates, or Ironic failed: try again
            # while a candidate is free. The name must be free for it, and
            # nothing may stay reserved after the last attempt.
            LOG.info('Instance %s: no node reserved (%s)', row.uuid,
                     one_line(error))
            if allocation is not None:
                self.provisioner.delete_allocation(row.uuid, fence)
            allocation = None
        raise BuildFailed(f'no free node for {spec.describe()}: Ironic: '
                          f'{one_line(error)}')

    def _candidates(self, spec, fresh=False):
        """Nodes this host holds that fit the spec and are free: as its rows
        say (the last cycle's listing: Ironic's allocation takes only a
        node free now among them, so a stale one costs nothing), or, when
        the rows name none or ``fresh`` (an allocation among them failed),
        as Ironic lists them now."""
        ctx = db_api.Context()
        with db_api.context_manager.reader.using(ctx):
            held = db_nodes.offers_of(ctx, self.host)
            busy = {i.node for i in db_instances.load_all(ctx) if i.node}
        # What the rows say of every node we hold: the first candidates,
        # and what explains a refusal.
        from_rows = inst.match_nodes(spec, held, busy)
        if not fresh and from_rows.candidates:
            return from_rows.candidates
        held_uuids = {offer.uuid for offer in held}
        listed = [offer_of(node) for node in self.provisioner.free_nodes(
            self.partition_key, spec.resource_class)
            if node.uuid in held_uuids]
        match = inst.match_nodes(spec, listed, busy)
        if match.candidates:
            return match.candidates
        raise BuildFailed(from_rows.fault or (
            f'no free node for {spec.describe()}: the matching nodes of '
            f'{self.host} are not available in Ironic'))

    def _deploy(self, row, node, fresh=False):
        """Deploy ``node`` for the instance and power it on. ``fresh``: its
        allocation was made just now, so Ironic gave a node ``available``
        with nothing under way: it is not read first (the fence before the
        first call reads it, and a refused deploy reads it again)."""
        if fresh:
            state = provision.NodeState(node, 'available', None, row.uuid,
                                        row.uuid, None, False)
        else:
            state = self.provisioner.node(node)
        if state is None:
            raise BuildFailed(f'node {node} is gone from Ironic')
        if state.provision_state == provision.DEPLOY_DONE:
            # Deployed by an earlier attempt (a restart, a takeover): it
            # may still be powered off.
            try:
                self._power_on(row, node, _BUILDING, state)
            except provision.ProvisionError as exc:
                raise BuildFailed(str(exc)) from exc
            return
        if (state.provision_state == 'available'
                and state.target_provision_state is None):
            try:
                # Never onto a node that does not carry this instance.
                self.provisioner.deploy(node, row.image_source or '',
                                        row.disk_gb,
                                        self._fence(row, _BUILDING, node,
                                                    answered=True))
            except provision.ProvisionError as exc:
                # A second worker on this instance (a host that took it
                # over while the first still ran) may have deployed it
                # meanwhile: then wait for that deploy instead of failing.
                state = self.provisioner.node(node)
                if state is None or row.uuid not in (
                        state.instance_uuid, state.allocation_uuid) or (
                        state.provision_state == 'available'
                        and state.target_provision_state is None):
                    raise BuildFailed(str(exc)) from exc
        try:
            state = self.provisioner.wait_for(
                node, provision.DEPLOY_DONE, provision.DEPLOY_FAILED,
                self.conf.ironic.deploy_timeout, 'deploy')
            # A deploy does not change the power (fake hardware leaves a
            # node deployed while off as it was): an instance runs.
            self._power_on(row, node, _BUILDING, state)
        except provision.ProvisionError as exc:
            raise BuildFailed(str(exc)) from exc

    def _fail(self, row, node, fault):
        """Error, with nothing left reserved: tear down, drop the allocation.

        When Ironic cannot free the node now, the instance says so and
        stays ``releasing``: the poller tries again until the node is free.
        """
        fault = one_line(fault)[:1000]
        LOG.error('Instance %s: build failed: %s', row.uuid, fault)
        task_state, shown, args = None, fault, None
        try:
            self._free(row, node, _FREEING)
            node = None
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            task_state = inst.RELEASING
            # The fault shown says why the node is still held; the build's
            # own fault is kept in task_args for when it is released.
            shown = (f'{fault} (the node is not released yet: '
                     f'{one_line(exc)[:900]})')
            args = json.dumps({'fault': fault})
            LOG.error('Instance %s: its node is not released yet, '
                      'retrying: %s', row.uuid, one_line(exc))
        db_instances.transition(
            db_api.Context(), row, inst.SPAWNING, vm_state=inst.ERROR,
            task_state=task_state, fault=shown, task_args=args, node=node)

    def _release(self, row):
        """Free the node of a failed build; False: try again later."""
        try:
            self._free(row, row.node, _FREEING)
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            LOG.error('Instance %s: its node is not released yet, '
                      'retrying: %s', row.uuid, one_line(exc))
            return False
        if db_instances.transition(
                db_api.Context(), row, inst.RELEASING,
                task_state=None, node=None, task_args=None,
                fault=row.args().get('fault', row.fault)):
            LOG.info('Instance %s: the node of its failed build is released',
                     row.uuid)
        return True

    def _free(self, row, node, states):
        """Tear ``node`` down (if it is the instance's) and drop the
        instance's allocation, while ``row`` is still in one of ``states``."""
        if node is not None:
            self._teardown(node, row.uuid, self._fence(row, states, node))
        self.provisioner.delete_allocation(row.uuid,
                                           self._fence(row, states))

    def _power_on(self, claim, node, states, state=None):
        """Power the node on unless it is on (or powering on) already.

        ``state``: the node as just read (not read again); the fence reads
        it once more right before the call."""
        if state is None:
            state = self.provisioner.node(node)
        if state is None:
            raise provision.ProvisionError(f'node {node} is gone from Ironic')
        if state.target_power_state is None and (
                state.power_state != provision.POWER_ON):
            self.provisioner.set_power(node, 'on',
                                       self._fence(claim, states, node,
                                                   answered=True))
        self.provisioner.wait_for_power(node, provision.POWER_ON,
                                        POWER_TIMEOUT, 'power on')

    # --- actions: stop, start, reboot, rebuild ------------------------------

    def _power(self, row):
        """instance stop (powering-off) or start (powering-on)."""
        off = row.task_state == inst.POWERING_OFF
        states = (row.task_state,)
        try:
            if off:
                self._power_off(row, row.node, hard=row.args().get('hard'))
            else:
                self._power_on(row, row.node, states)
        except provision.ProvisionError as exc:
            return self._action_failed(row, exc)
        except ironic.IronicUnavailable as exc:
            return self._action_paused(row, exc)
        return self._action_done(
            row, inst.POWER_OFF if off else inst.POWER_ON)

    def _power_off(self, claim, node, hard):
        """Soft power off, falling back to hard when Ironic refuses it or
        it has not ended within [DEFAULT]shutdown_timeout."""
        state = self.provisioner.node(node)
        if state is None:
            raise provision.ProvisionError(f'node {node} is gone from Ironic')
        if state.power_state == provision.POWER_OFF and (
                state.target_power_state is None):
            return
        fence = self._fence(claim, (claim.task_state,), node)
        if not hard and state.target_power_state is None:
            try:
                self.provisioner.set_power(
                    node, 'off', fence, soft=True,
                    timeout=self.conf.shutdown_timeout)
                self.provisioner.wait_for_power(
                    node, provision.POWER_OFF, self.conf.shutdown_timeout,
                    'soft power off')
                return
            except provision.ProvisionError as exc:
                LOG.warning('Instance %s: soft power off did not work (%s); '
                            'powering off hard', claim.uuid,
                            one_line(exc))
        state = self._power_settled(node)
        if state.power_state != provision.POWER_OFF:
            self.provisioner.set_power(node, 'off', fence)
        self.provisioner.wait_for_power(node, provision.POWER_OFF,
                                        POWER_TIMEOUT, 'power off')

    def _power_settled(self, node):
        """The node once Ironic has ended the power action in flight (a
        soft one ends by itself after the timeout it was given)."""
        return self.provisioner.wait_for_power_settled(
            node, self.conf.shutdown_timeout + SOFT_SETTLE_TIMEOUT,
            'the soft power action to end')

    def _reboot(self, row):
        """instance reboot: soft, falling back to hard; never twice."""
        hard = bool(row.args().get('hard'))
        try:
            sent = self._send_once(row, 'last_power_state_change',
                                   lambda fence, soft: self.provisioner
                                   .set_power(
                                       row.node, 'reboot', fence, soft=soft,
                                       timeout=self.conf.shutdown_timeout),
                                   soft=not hard)
            if sent is None:
                return True  # the row changed: not ours to finish
            try:
                state = self.provisioner.wait_for_power(
                    row.node, provision.POWER_ON,
                    POWER_TIMEOUT if hard else self.conf.shutdown_timeout,
                    'reboot')
                if not hard and state.last_error:
                    # Ironic ended the soft reboot as failed (the OS did
                    # not shut down in time): the node never went off.
                    raise provision.ProvisionError(state.last_error)
            except provision.ProvisionError as exc:
                if hard:
                    raise
                LOG.warning('Instance %s: soft reboot not done after %s s '
                            '(%s); rebooting hard', row.uuid,
                            self.conf.shutdown_timeout, one_line(exc))
                self._power_settled(row.node)
                self.provisioner.set_power(
                    row.node, 'reboot',
                    self._fence(row, (row.task_state,), row.node))
                self.provisioner.wait_for_power(
                    row.node, provision.POWER_ON, POWER_TIMEOUT, 'reboot')
        except provision.ProvisionError as exc:
            return self._action_failed(row, exc)
        except ironic.IronicUnavailable as exc:
            return self._action_paused(row, exc)
        return self._action_done(row, inst.POWER_ON)

    def _rebuild(self, row):
        """instance rebuild: redeploy in place, same node and allocation."""
        image = row.args().get('image') or row.image_source or ''
        if not image:
            return self._action_failed(row, 'no image to rebuild with')
        try:
            sent = self._send_once(
                row, 'provision_updated_at',
                lambda fence, soft: self.provisioner.rebuild(row.node, image,
                                                             fence))
            if sent is None:
                return True
            self.provisioner.wait_for(
                row.node, provision.DEPLOY_DONE, provision.DEPLOY_FAILED,
                self.conf.ironic.deploy_timeout, 'rebuild')
            self._power_on(row, row.node, (row.task_state,))
        except provision.ProvisionError as exc:
            return self._action_failed(row, exc)
        except ironic.IronicUnavailable as exc:
            return self._action_paused(row, exc)
        return self._action_done(row, inst.POWER_ON, image_source=image)

    def _send_once(self, row, mark, send, soft=False):
        """Send the action's call unless an earlier attempt did.

        Before the call, the worker records on the row what the node's
        ``mark`` (a time Ironic sets when it starts such an action) was; a
        worker resuming the action (after a kill, or a takeover) finds the
        record, and if the node's ``mark`` moved since or an action is in
        flight, the call was carried out: it only waits. Returns True when
        sent now, False when an earlier attempt had, None when the row
        changed meanwhile (nothing sent).
        """
        state = self.provisioner.node(row.node)
        if state is None:
            raise provision.ProvisionError(
                f'node {row.node} is gone from Ironic')
        args = row.args()
        if mark in args and (
                getattr(state, mark) != args[mark]
                or state.target_power_state is not None
                or state.target_provision_state is not None):
            LOG.info('Instance %s: %s sent already by an earlier attempt; '
                     'waiting for it', row.uuid, row.task_state)
            return False
        noted = {**args, mark: getattr(state, mark)}
        if not db_instances.transition(
                db_api.Context(), row, row.task_state,
                task_args=json.dumps(noted, sort_keys=True)):
            return None
        fence = self._fence(row, (row.task_state,), row.node)
        if soft:
            try:
                send(fence, True)
                return True
            except provision.ProvisionError as exc:
                # Ironic refuses a soft action the driver cannot do.
                LOG.warning('Instance %s: soft %s refused (%s); hard',
                            row.uuid, row.task_state, one_line(exc))
        send(fence, False)
        return True

    def _action_done(self, row, power_state, **values):
        done = inst.DONE_STATE[row.task_state]
        if db_instances.transition(
                db_api.Context(), row, row.task_state, vm_state=done,
                task_state=None, task_args=None, task_requested_at=None,
                power_state=power_state, fault=None, **values):
            LOG.info('Instance %s: %s done, %s', row.uuid, row.task_state,
                     done)
        return True

    def _action_failed(self, row, exc):
        """Ironic refused or failed: the action ends with a fault, the
        instance keeps its state (an operator may ask again)."""
        fault = one_line(exc)
        LOG.error('Instance %s: %s failed: %s', row.uuid, row.task_state,
                  fault)
        db_instances.transition(
            db_api.Context(), row, row.task_state, task_state=None,
            task_args=None, task_requested_at=None,
            fault=f'{row.task_state}: {fault}'[:2000])
        return True

    def _action_paused(self, row, exc):
        LOG.error('Instance %s: %s paused, Ironic unavailable (%s); '
                  'retrying', row.uuid, row.task_state,
                  one_line(exc))
        return False

    # --- delete and reap --------------------------------------------------

    def _delete(self, row):
        node = row.node
        try:
            if node is None:
                allocation = self.provisioner.allocation(row.uuid)
                node = allocation.node_uuid if allocation else None
            self._free(row, node, _DELETING)
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            LOG.error('Instance %s: delete not finished, retrying: %s',
                      row.uuid, one_line(exc))
            db_instances.transition(db_api.Context(), row, inst.DELETING,
                                    fault=one_line(exc)[:2000])
            return False
        if db_instances.soft_delete(db_api.Context(), row):
            LOG.info('Instance %s: deleted; node %s is free', row.uuid, node)
        return True

    def _reap(self, node, instance_uuid):
        try:
            self._teardown(node, instance_uuid,
                           self._reap_fence(node, instance_uuid))
            self.provisioner.delete_allocation(
                instance_uuid,
                self._reap_fence(node, instance_uuid, node_check=False))
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            LOG.error('Node %s of deleted instance %s: not torn down yet: %s',
                      node, instance_uuid, one_line(exc))
            return False
        LOG.info('Node %s: torn down; its instance %s was deleted while its '
                 'host was down', node, instance_uuid)
        return True

    def _teardown(self, node, instance_uuid, fence):
        """Bring ``node`` back to available if it still serves the instance.

        ``fence`` runs right before the undeploy, after any wait: the node
        may have passed to another instance meanwhile.
        """
        timeout = self.conf.ironic.deploy_timeout
        state = self.provisioner.node(node)
        if self._not_torn_down(node, instance_uuid, state):
            return
        if state.target_provision_state is not None:
            # Deploying or cleaning: Ironic takes no new action until it ends.
            state = self.provisioner.poll(
                lambda: self.provisioner.node(node),
                lambda n: n is None or n.target_provision_state is None,
                timeout, f'node {node} to settle')
            if self._not_torn_down(node, instance_uuid, state):
                return  # it settled into another instance's or none
        if state.provision_state in provision.UNDEPLOYABLE:
            self.provisioner.undeploy(node, fence)
        elif state.provision_state != provision.UNDEPLOY_DONE:
            raise provision.ProvisionError(
                f'node {node} is {state.provision_state}: it cannot be torn '
                'down from there; an operator must clean it')
        self.provisioner.wait_for(node, provision.UNDEPLOY_DONE,
                                  provision.UNDEPLOY_FAILED, timeout,
                                  'tear down')

    @staticmethod
    def _not_torn_down(node, instance_uuid, state):
        """Whether ``state`` shows ``node`` serving neither the instance
        nor its allocation: then it is not torn down (said in one line)."""
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


def offer_of(node):
    """What a node fresh from Ironic offers a build."""
    resources = ironic.node_resources(node)
    return inst.NodeOffer(
        uuid=node.uuid, resource_class=node.resource_class,
        vcpus=resources.vcpus, memory_mb=resources.memory_mb,
        local_gb=resources.local_gb, traits=node.traits,
        available=resources.available)
