"""Carry out builds and deletes of the instances this service manages.

A poller thread reads the requests queued for this host (one indexed query
every ``instance_poll_interval``) and hands each to a worker pool of
``max_concurrent_builds`` threads, apart from the heartbeat and the resource
tracker. Every step is idempotent and every state change conditional, so
a worker that dies (the daemon killed, the service stopped) leaves work
that the next attempt — this host after a restart, or the host that took
its instances over — finishes without a second reservation.
"""

import concurrent.futures
import threading
import time

from oslo_log import log as logging

from ironic_compute import instances as inst
from ironic_compute import ironic
from ironic_compute import provision
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db.models import _utcnow

LOG = logging.getLogger(__name__)

# A request that failed for a reason that may pass (Ironic down, a node
# still cleaning) is tried again after this many seconds, doubling up to
# the cap.
RETRY_FIRST, RETRY_CAP = 2.0, 60.0
# Allocations a build makes while candidates remain free before its fault.
ALLOCATION_ATTEMPTS = 3
# Seconds one allocation may stay "allocating".
ALLOCATION_TIMEOUT = 30
# What a failed build's fault says while its node is not free yet.
NOT_RELEASED = ' (the node is not released yet: '


class BuildFailed(Exception):
    """The build cannot succeed; the message is the instance's fault."""


class InstanceManager:
    def __init__(self, conf, host, ironic_client, service_id=None,
                 partition_key=None):
        self.conf = conf
        self.host = host
        self.service_id = service_id
        self.partition_key = partition_key
        self._ironic = ironic_client
        self._stopping = threading.Event()
        self.provisioner = provision.Provisioner(
            ironic_client, stopping=self._stopping)
        self._pool = None
        self._poller = None
        self._lock = threading.Lock()
        self._in_flight = set()  # instance uuids (or node uuids to reap)
        self._retry_at = {}  # key -> (monotonic time, delay)
        self._wake = threading.Event()

    # --- lifecycle --------------------------------------------------------

    def start(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.conf.max_concurrent_builds,
            thread_name_prefix='instance-worker')
        self._poller = threading.Thread(target=self._poll_loop,
                                        name='instance-poller', daemon=True)
        self._poller.start()

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
        if self._poller is not None:
            self._poller.join(self._remaining(deadline))
        if self._pool is None:
            return True
        # The pool's own shutdown(wait=True) waits without bound: wait for
        # it in a thread of its own, up to the deadline.
        waiter = threading.Thread(
            target=self._pool.shutdown, name='instance-workers-stop',
            kwargs={'wait': True, 'cancel_futures': True}, daemon=True)
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
                          provision.one_line(exc))
            else:
                if failing_since is not None:
                    LOG.info('Instance requests readable again')
                failing_since = None
            self._wake.wait(self.conf.instance_poll_interval)
            self._wake.clear()

    def poll_once(self):
        """Hand every queued request of this host to a worker; their count."""
        rows = db_instances.pending(db_api.Context(), self.host)
        submitted = 0
        for row in rows:
            work = {'build': self._build, 'delete': self._delete,
                    'release': self._release}[inst.next_action(row.task_state)]
            if self._submit(row.uuid, work, row):
                submitted += 1
        return submitted

    def reap(self, node, instance_uuid):
        """Tear down ``node``, whose instance this database knows deleted."""
        return self._submit(('reap', node), self._reap, node, instance_uuid)

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

    # --- build ------------------------------------------------------------

    def _build(self, row):
        """Returns False when the build should be tried again later."""
        ctx = db_api.Context()
        if row.task_state == inst.SCHEDULED and not db_instances.transition(
                ctx, row.uuid, self.host, inst.SCHEDULED,
                task_state=inst.SPAWNING):
            return True  # deleted or taken meanwhile
        LOG.info('Instance %s: building (%s)', row.uuid, row.spec().describe())
        node = row.node
        try:
            node = self._reserve(row)
            if node != row.node and not db_instances.transition(
                    ctx, row.uuid, self.host, inst.SPAWNING, node=node):
                return True  # a delete came: it tears the node down
            self._deploy(row, node)
        except BuildFailed as exc:
            fault = str(exc)
        except ironic.IronicUnavailable as exc:
            LOG.error('Instance %s: build paused, Ironic unavailable (%s); '
                      'retrying', row.uuid, provision.one_line(exc))
            return False
        else:
            fault = None
        if fault is not None:
            # Outside the except block: one log line, no traceback.
            self._fail(row, node, fault)
            return True
        if db_instances.transition(
                ctx, row.uuid, self.host, inst.SPAWNING, vm_state=inst.ACTIVE,
                task_state=None, fault=None, launched_at=_utcnow()):
            LOG.info('Instance %s: active on node %s', row.uuid, node)
        return True

    def _reserve(self, row):
        """The node of the instance: its allocation's, made if needed."""
        spec = row.spec()
        # Ironic answers an allocation within a second; one left in
        # "allocating" for longer is stuck, not slow: try again.
        timeout = min(ALLOCATION_TIMEOUT,
                      self.conf.ironic.deploy_timeout / ALLOCATION_ATTEMPTS)
        allocation = self.provisioner.allocation(row.uuid)
        error = 'it vanished'
        for _ in range(ALLOCATION_ATTEMPTS):
            try:
                if allocation is None:
                    # Raises BuildFailed once no candidate is left.
                    candidates = self._candidates(spec)
                    allocation = self.provisioner.allocate(
                        row.uuid, spec, candidates, timeout)
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
                    return allocation.node_uuid
                error = allocation.last_error if allocation else error
            # Another build won the candidates, or Ironic failed: try again
            # while a candidate is free. The name must be free for it, and
            # nothing may stay reserved after the last attempt.
            LOG.info('Instance %s: no node reserved (%s)', row.uuid,
                     provision.one_line(error))
            if allocation is not None:
                self.provisioner.delete_allocation(row.uuid)
            allocation = None
        raise BuildFailed(f'no free node for {spec.describe()}: Ironic: '
                          f'{provision.one_line(error)}')

    def _candidates(self, spec):
        """Nodes this host holds that fit the spec and are free in Ironic."""
        ctx = db_api.Context()
        with db_api.context_manager.reader.using(ctx):
            held = db_nodes.offers_of(ctx, self.host)
            busy = {i.node for i in db_instances.load_all(ctx) if i.node}
        held_uuids = {offer.uuid for offer in held}
        fresh = [offer_of(node) for node in self.provisioner.free_nodes(
            self.partition_key, spec.resource_class)
            if node.uuid in held_uuids]
        match = inst.match_nodes(spec, fresh, busy)
        if match.candidates:
            return match.candidates
        # Explain with what the rows say of every node we hold.
        explained = inst.match_nodes(spec, held, busy)
        raise BuildFailed(explained.fault or (
            f'no free node for {spec.describe()}: the matching nodes of '
            f'{self.host} are not available in Ironic'))

    def _deploy(self, row, node):
        state = self.provisioner.node(node)
        if state is None:
            raise BuildFailed(f'node {node} is gone from Ironic')
        if state.provision_state == provision.DEPLOY_DONE:
            return
        if (state.provision_state == 'available'
                and state.target_provision_state is None):
            try:
                self.provisioner.deploy(node, row.image_source or '',
                                        row.disk_gb)
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
            self.provisioner.wait_for(
                node, provision.DEPLOY_DONE, provision.DEPLOY_FAILED,
                self.conf.ironic.deploy_timeout, 'deploy')
        except provision.ProvisionError as exc:
            raise BuildFailed(str(exc)) from exc

    def _fail(self, row, node, fault):
        """Error, with nothing left reserved: tear down, drop the allocation.

        When Ironic cannot free the node now, the instance says so and
        stays ``releasing``: the poller tries again until the node is free.
        """
        fault = provision.one_line(fault)
        LOG.error('Instance %s: build failed: %s', row.uuid, fault)
        task_state = None
        try:
            self._free(node, row.uuid)
            node = None
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            task_state = inst.RELEASING
            fault += f'{NOT_RELEASED}{provision.one_line(exc)})'
            LOG.error('Instance %s: its node is not released yet, '
                      'retrying: %s', row.uuid, provision.one_line(exc))
        db_instances.transition(
            db_api.Context(), row.uuid, self.host, inst.SPAWNING,
            vm_state=inst.ERROR, task_state=task_state, fault=fault[:2000],
            node=node)

    def _release(self, row):
        """Free the node of a failed build; False: try again later."""
        try:
            self._free(row.node, row.uuid)
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            LOG.error('Instance %s: its node is not released yet, '
                      'retrying: %s', row.uuid, provision.one_line(exc))
            return False
        if db_instances.transition(
                db_api.Context(), row.uuid, self.host, inst.RELEASING,
                task_state=None, node=None,
                fault=(row.fault or '').split(NOT_RELEASED)[0] or None):
            LOG.info('Instance %s: the node of its failed build is released',
                     row.uuid)
        return True

    def _free(self, node, instance_uuid):
        """Tear ``node`` down (if it is the instance's) and drop the
        instance's allocation."""
        if node is not None:
            self._teardown(node, instance_uuid)
        self.provisioner.delete_allocation(instance_uuid)

    # --- delete and reap --------------------------------------------------

    def _delete(self, row):
        node = row.node
        try:
            if node is None:
                allocation = self.provisioner.allocation(row.uuid)
                node = allocation.node_uuid if allocation else None
            self._free(node, row.uuid)
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            LOG.error('Instance %s: delete not finished, retrying: %s',
                      row.uuid, provision.one_line(exc))
            db_instances.transition(db_api.Context(), row.uuid, self.host,
                                    inst.DELETING,
                                    fault=provision.one_line(exc)[:2000])
            return False
        if db_instances.soft_delete(db_api.Context(), row.uuid, self.host):
            LOG.info('Instance %s: deleted; node %s is free', row.uuid, node)
        return True

    def _reap(self, node, instance_uuid):
        try:
            self._free(node, instance_uuid)
        except (ironic.IronicUnavailable, provision.ProvisionError) as exc:
            LOG.error('Node %s of deleted instance %s: not torn down yet: %s',
                      node, instance_uuid, provision.one_line(exc))
            return False
        LOG.info('Node %s: torn down; its instance %s was deleted while its '
                 'host was down', node, instance_uuid)
        return True

    def _teardown(self, node, instance_uuid):
        """Bring ``node`` back to available if it still serves the instance."""
        timeout = self.conf.ironic.deploy_timeout
        state = self.provisioner.node(node)
        if state is None or instance_uuid not in (state.instance_uuid,
                                                  state.allocation_uuid):
            return  # not (or no longer) this instance's node
        if state.target_provision_state is not None:
            # Deploying or cleaning: Ironic takes no new action until it ends.
            state = self.provisioner.poll(
                lambda: self.provisioner.node(node),
                lambda n: n is None or n.target_provision_state is None,
                timeout, f'node {node} to settle')
            if state is None:
                return
        if state.provision_state in provision.UNDEPLOYABLE:
            self.provisioner.undeploy(node)
        elif state.provision_state != provision.UNDEPLOY_DONE:
            raise provision.ProvisionError(
                f'node {node} is {state.provision_state}: it cannot be torn '
                'down from there; an operator must clean it')
        self.provisioner.wait_for(node, provision.UNDEPLOY_DONE,
                                  provision.UNDEPLOY_FAILED, timeout,
                                  'tear down')


def offer_of(node):
    """What a node fresh from Ironic offers a build."""
    resources = ironic.node_resources(node)
    return inst.NodeOffer(
        uuid=node.uuid, resource_class=node.resource_class,
        vcpus=resources.vcpus, memory_mb=resources.memory_mb,
        local_gb=resources.local_gb, traits=node.traits,
        available=resources.available)
