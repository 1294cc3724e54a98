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

"""Reserve, deploy and tear down Ironic nodes for instances (the adapter).

Thin: each method is one Ironic request (with the adapter's retries), or a
poll of one node or allocation until it leaves a transitional state. A
request that changes anything takes a ``fence``: a callable run immediately
before it is sent, which raises Fenced when the caller may no longer act
(instance_manager.py decides; nothing here reads the database). The
reservation is an Ironic allocation whose uuid *and* name are the
instance's uuid: a second request for the same instance (a daemon killed
mid-build, a host that took the build over) finds the allocation made by
the first instead of reserving a second node, and the node's
``instance_uuid`` is the instance's uuid, so every service sees whose node
it is.
"""

import collections
import contextlib
import dataclasses
import math
import threading
import time

from ironic_compute import ironic
from ironic_compute import redaction
from ironic_compute.text import one_line

# Provision states a deploy or undeploy ends in, and those that mean it failed.
DEPLOY_DONE, DEPLOY_FAILED = 'active', ('deploy failed', 'error')
UNDEPLOY_DONE, UNDEPLOY_FAILED = 'available', ('clean failed', 'error',
                                               'manageable')
# A node in these can be undeployed ('deleted').
UNDEPLOYABLE = ('active', 'deploy failed', 'error', 'wait call-back',
                'rescue', 'rescue failed', 'rescue wait', 'unrescue failed')


class ProvisionError(Exception):
    """Ironic refused or failed an action; the message is Ironic's, one line."""


class Stopped(ironic.NotSent):
    """The service is stopping: the work is left for the next owner."""


class Fenced(ironic.NotSent):
    """This service may not act for the instance now (another service
    manages it, the node serves another instance, or the lease is not
    valid): the call was not sent. The message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class Allocation:
    uuid: str
    state: str  # allocating, active, error
    node_uuid: str | None
    last_error: str | None
    # Made by this call of allocate() (not found made by an earlier one):
    # Ironic gave it a node that was available, with no action under way.
    created: bool = False


@dataclasses.dataclass(frozen=True)
class NodeState:
    uuid: str
    provision_state: str | None
    target_provision_state: str | None
    instance_uuid: str | None
    allocation_uuid: str | None
    last_error: str | None
    maintenance: bool
    power_state: str | None = None  # Ironic's: 'power on', 'power off'...
    target_power_state: str | None = None
    # When Ironic last began a power action on the node
    # (driver_internal_info), and last changed its provision state: what
    # an action records before its call, so that a worker resuming it sees
    # whether the call was carried out already.
    last_power_state_change: str | None = None
    provision_updated_at: str | None = None


# Power states Ironic ends a power action in.
POWER_ON, POWER_OFF = 'power on', 'power off'


@dataclasses.dataclass(frozen=True)
class Serving:
    """Whom a node serves, as an answer about it says (what a fence checks
    of a node): the node's instance_uuid and allocation_uuid."""
    uuid: str
    instance_uuid: str | None
    allocation_uuid: str | None


# A fence checks a node on Ironic's answer to this worker's last request
# about it, instead of reading it again, while that answer came less than
# this many seconds ago and no other request was sent since: the node a
# read, a poll's shared listing or an image patch returned, or the node an
# active allocation of the instance names. A fence's own read says the
# node as it was at some moment of its request, which a burst of builds
# makes last as long (a node read took 120 to 440 ms in
# tools/bench_instances.py); older, the fence reads. A pause longer than
# that (SIGSTOP) is the lease's to catch, checked last.
FENCE_ANSWER_AGE = 0.5


class SharedRead:
    """A read that callers asking at once share: each caller gets the result
    (or the error) of a read that *started after* it asked, never an older
    one, and at most one read runs at a time.

    While a read runs, every caller that asks meanwhile waits for it to end,
    then all of them share the one read that starts next. Under a burst of
    builds, a service sends one listing of its free nodes at a time instead
    of one per build, each as fresh as the build's own would have been.
    """

    def __init__(self, read):
        self._read = read
        self._changed = threading.Condition()
        self._started = 0  # reads started so far; the n-th read is number n
        self._running = False
        self._last = (0, None, None)  # (number, value, exception)
        self.waiting = 0  # callers waiting for a read to end

    def __call__(self, fresh=True):
        """The result of a read that started after this call; ``fresh``
        False: of the read running now if there is one (a poll, which only
        needs a state newer than its last read, waits less)."""
        with self._changed:
            # The first read to start after now, or the running one.
            wanted = self._started + (0 if not fresh and self._running
                                      else 1)
            while self._last[0] < wanted:
                if not self._running:
                    self._started = wanted
                    self._running = True
                    break
                self.waiting += 1
                try:
                    self._changed.wait()
                finally:
                    self.waiting -= 1
            else:
                return self._result(self._last)
        value = error = None
        try:
            value = self._read()
        except BaseException as exc:
            error = exc
        with self._changed:
            self._last = (wanted, value, error)
            self._running = False
            self._changed.notify_all()
        return self._result(self._last)

    @staticmethod
    def _result(last):
        _number, value, error = last
        if error is not None:
            raise error
        return value


# Seconds a poll reads every poll_interval before it backs off: fake
# hardware and a quiet Ironic end an allocation, a deploy or a power action
# within them, and a tick late is what a build then waits for.
POLL_STEADY = 2.0
# What a poll needs of a node, in one listing for every waiting build.
# (Not allocation_uuid: Ironic 39 answers a listing that asks for it with
# HTTP 500; a poll does not need it, a fence reads the node on its own.)
WATCH_FIELDS = ['uuid', 'provision_state', 'target_provision_state',
                'instance_uuid', 'last_error', 'maintenance', 'power_state',
                'target_power_state']
# Ironic serves a listing of this many nodes for about the cost of one
# node read (measured on the standalone Ironic: a listing of 200 nodes took
# about twice a node read, under a burst of builds): the polls share a
# listing only while it saves reads.
WATCH_NODES_PER_READ = 50


def _node_state(raw):
    """The NodeState of a node as ironicclient gives it (read or listed);
    a field it was not asked for is None."""
    internal = getattr(raw, 'driver_internal_info', None) or {}
    return NodeState(raw.uuid, raw.provision_state,
                     raw.target_provision_state, raw.instance_uuid,
                     getattr(raw, 'allocation_uuid', None),
                     redaction.url_credentials(raw.last_error),
                     bool(raw.maintenance),
                     getattr(raw, 'power_state', None),
                     getattr(raw, 'target_power_state', None),
                     internal.get('last_power_state_change'),
                     getattr(raw, 'provision_updated_at', None))


class Provisioner:
    def __init__(self, ironic_client, poll_interval=0.5, stopping=None,
                 poll_cap=5.0, conductor_group=None, max_requests=None):
        self._ironic = ironic_client
        # Requests under way at once ([DEFAULT]max_concurrent_ironic_requests):
        # the rest wait here, not in Ironic's queue, where the resource
        # tracker's listing would wait behind them.
        self._requests = (threading.BoundedSemaphore(max_requests)
                          if max_requests else None)
        # The nodes polls wait on (uuid -> waiters), and the one listing of
        # the nodes with an instance (in this conductor group) that the
        # polls of one moment share, when several wait.
        self._conductor_group = conductor_group
        self._watched = collections.Counter()
        self._watch_lock = threading.Lock()
        self._watch_read = SharedRead(self._list_watched)
        self._watch_size = 0  # nodes in the last shared listing
        # The free nodes of each (conductor group, resource class), one
        # listing at a time shared by the builds that ask meanwhile.
        self._free_reads = {}
        self._free_lock = threading.Lock()
        # The first read comes soon (fake hardware deploys in 0.3 s); later
        # ones 1.5 times further apart up to ``poll_cap``: a real deploy
        # takes minutes, and every build worker polls the same Ironic API
        # that the resource-tracker cycle lists the nodes from.
        self.poll_interval = poll_interval
        self.poll_cap = poll_cap
        self._stopping = stopping  # a threading.Event, or None
        # Per worker thread: ``last``, (Serving, when it came), the last
        # answer about a node (fence_node()); ``turn``, whether it holds a
        # turn among the requests under way.
        self._worker = threading.local()

    @contextlib.contextmanager
    def _turn(self, what):
        """Inside: one of the requests under way (max_requests), for this
        worker and the requests it sends inside (a fence's read within a
        change's turn). Waiting for a turn ends with Stopped when the
        service stops (the requests under way may each take
        [ironic]timeout against a hung Ironic)."""
        if self._requests is None or getattr(self._worker, 'turn', False):
            yield
            return
        while not self._requests.acquire(timeout=0.2):
            if self._stopping is not None and self._stopping.is_set():
                raise Stopped(what)
        self._worker.turn = True
        try:
            yield
        finally:
            self._worker.turn = False
            self._requests.release()

    def _request(self, what, call, /, *args, **kwargs):
        """One request of the adapter (``call``: 'allocation.create'...);
        ironic.NotFound as it is, the other errors said with ``what``. What
        this worker was told of a node before is forgotten: only the answer
        to its last request counts (fence_node())."""
        self._worker.last = None
        with self._turn(what):
            return self._send(what, call, *args, **kwargs)

    def _send(self, what, call, /, *args, **kwargs):
        try:
            return self._ironic.request(call, *args, **kwargs)
        except (ironic.NotFound, ironic.NotSent):
            raise
        except ironic.ServiceStopping as exc:
            raise Stopped(what) from exc  # left for the next attempt
        except ironic.Refused as exc:
            raise ProvisionError(
                f'{what}: {redaction.url_credentials(one_line(exc))}'
            ) from exc
        except Exception as exc:
            raise ironic.IronicUnavailable(
                f'{what}: {redaction.url_credentials(one_line(exc))}'
            ) from exc

    def _change(self, fence, what, call, /, *args, **kwargs):
        """A request that changes something in Ironic: each attempt (the
        first, and each retry after a 409 or 503) is sent only after
        ``fence()`` (which raises Fenced) let it, immediately before: the
        turn among the requests under way is taken first, so that no wait
        comes between. Any answer about a node heard before is forgotten
        once the fence has used it: the change may make it untrue."""
        def checked():
            fence()
            self._worker.last = None
        with self._turn(what):
            answer = self._send(what, call, *args, before=checked, **kwargs)
        if call == 'node.update' and getattr(answer, 'uuid', None):
            # Ironic answers a patch with the node as patched: the fence of
            # the next call (the deploy after the image) checks that.
            self._heard_node(_node_state(answer))
        return answer

    def _heard(self, serving):
        """Remember the answer about a node that this worker has just had
        (for fence_node())."""
        self._worker.last = (serving, time.monotonic())

    def fence_node(self, uuid):
        """The node as a fence checks it, right before a call: Ironic's
        answer to this worker's last request about it, if it came within
        FENCE_ANSWER_AGE seconds with no other request sent since (a Serving);
        else the node read now (a NodeState, None: gone)."""
        last = getattr(self._worker, 'last', None)
        if last is not None:
            serving, came = last
            if (serving.uuid == uuid
                    and time.monotonic() - came <= FENCE_ANSWER_AGE):
                return serving
        return self.node(uuid)

    def free_nodes(self, conductor_group, resource_class):
        """The nodes a build may reserve now, fresh from Ironic: from a
        listing that started after the call, shared with the builds of this
        service that ask while it runs (SharedRead)."""
        self._worker.last = None  # a request about other nodes
        key = (conductor_group, resource_class)
        with self._free_lock:
            read = self._free_reads.get(key)
            if read is None:
                read = self._free_reads[key] = SharedRead(
                    lambda: self._list_free(conductor_group, resource_class))
        return list(read())

    def _list_free(self, conductor_group, resource_class):
        with self._turn('cannot list free nodes'):
            return self._ironic.list_nodes(
                conductor_group=conductor_group,
                resource_class=resource_class, provision_state='available',
                associated=False, maintenance=False)

    def allocation(self, uuid):
        try:
            raw = self._request('cannot read allocation', 'allocation.get',
                                uuid)
        except ironic.NotFound:
            return None
        if raw.state == 'active' and raw.node_uuid:
            # Ironic writes an allocation's node together with that node's
            # instance_uuid (the allocation's uuid) and allocation, and
            # drops the allocation when instance_uuid is removed: the
            # answer says whom the node serves.
            self._heard(Serving(raw.node_uuid, raw.uuid, raw.uuid))
        return Allocation(raw.uuid, raw.state, raw.node_uuid,
                          redaction.url_credentials(raw.last_error))

    def allocate(self, instance_uuid, spec, candidates, timeout, fence,
                 absent=False):
        """Reserve one of ``candidates`` for the instance; the Allocation.

        Finds the allocation of an earlier attempt instead of making a
        second one (``absent``: the caller has just read that there is
        none, and it is not read again; a create that finds one made
        meanwhile still takes it). Returns once it is no longer
        ``allocating``.
        """
        existing = None if absent else self.allocation(instance_uuid)
        created = None
        if existing is None:
            try:
                created = self._change(
                    fence, 'cannot reserve a node', 'allocation.create',
                    uuid=instance_uuid, name=instance_uuid,
                    resource_class=spec.resource_class,
                    traits=sorted(spec.traits) or None,
                    candidate_nodes=list(candidates))
            except ProvisionError:
                # Made by another attempt between our read and our create.
                if self.allocation(instance_uuid) is None:
                    raise
        # Ironic answers the create before its conductor allocates: a read
        # at once would find the "allocating" the answer says.
        done = self.poll(lambda: self.allocation(instance_uuid),
                         lambda a: a is None or a.state != 'allocating',
                         timeout, f'allocation {instance_uuid}',
                         wait_first=getattr(created, 'state',
                                            None) == 'allocating')
        if done is not None and created is not None:
            done = dataclasses.replace(done, created=True)
        return done

    def delete_allocation(self, uuid, fence):
        """Remove the allocation if there is one (a 404 is success)."""
        try:
            self._change(fence, 'cannot remove allocation',
                         'allocation.delete', uuid)
        except ironic.NotFound:
            pass

    @contextlib.contextmanager
    def watching(self, uuid):
        """While inside, ``uuid`` counts as a node a poll waits on."""
        with self._watch_lock:
            self._watched[uuid] += 1
        try:
            yield
        finally:
            with self._watch_lock:
                self._watched[uuid] -= 1
                if self._watched[uuid] <= 0:
                    del self._watched[uuid]

    def _share_listing(self):
        """Whether the polls of this moment read one shared listing: when
        several nodes are waited on and the listing costs Ironic less than
        reading each of them."""
        with self._watch_lock:
            waited = len(self._watched)
        return waited >= 2 and (
            waited * WATCH_NODES_PER_READ >= self._watch_size)

    def _list_watched(self):
        """{uuid: NodeState} of the nodes with an instance: one page (the
        server's page size), no more; a node past it is read on its own."""
        raw = self._request('cannot list nodes', 'node.list',
                            fields=WATCH_FIELDS, associated=True,
                            conductor_group=self._conductor_group)
        # allocation_uuid and the change times are not listed: None.
        states = {item.uuid: _node_state(item) for item in raw}
        self._watch_size = len(states)
        return states

    def polled_node(self, uuid):
        """The node as a poll waiting on it reads it: from the listing the
        polls of this moment share (SharedRead) when that costs Ironic
        less, else on its own. Either is the worker's last answer about
        the node (fence_node())."""
        self._worker.last = None  # this read is the last one now
        if self._share_listing():
            try:
                # The listing running now, if one is: it started after
                # this poll's last read ended, so it is newer.
                state = self._watch_read(fresh=False).get(uuid)
            except ironic.IronicUnavailable:
                state = None  # read on its own: the answer that counts
            if state is not None:
                # A listing does not say the node's allocation. Ironic
                # gives an allocation only a node whose instance_uuid is
                # empty or the allocation's own, and sets it to that: a
                # node listed with this instance carries this instance's
                # allocation or none, as a fence wants.
                self._heard(Serving(uuid, state.instance_uuid, None))
                return state
        return self.node(uuid)

    def poll_node(self, uuid, finished, timeout, what):
        """poll() on the node, read by polled_node(): a state it gives has
        no allocation_uuid (None), nor the times of the last changes."""
        with self.watching(uuid):
            return self.poll(lambda: self.polled_node(uuid), finished,
                             timeout, what)

    def node(self, uuid):
        try:
            raw = self._request('cannot read node', 'node.get', uuid, fields=[
                'uuid', 'provision_state', 'target_provision_state',
                'instance_uuid', 'allocation_uuid', 'last_error',
                'maintenance', 'power_state', 'target_power_state',
                'driver_internal_info', 'provision_updated_at'])
        except ironic.NotFound:
            return None
        return self._heard_node(_node_state(raw))

    def _heard_node(self, state):
        self._heard(Serving(state.uuid, state.instance_uuid,
                            state.allocation_uuid))
        return state

    def deploy(self, node, image_source, root_gb, fence):
        patch = [{'op': 'add', 'path': '/instance_info/image_source',
                  'value': image_source},
                 {'op': 'add', 'path': '/instance_info/root_gb',
                  'value': str(root_gb)}]
        self._change(fence, 'cannot set the image', 'node.update', node,
                     patch)
        self._change(fence, 'cannot deploy', 'node.set_provision_state',
                     node, 'active')

    def undeploy(self, node, fence):
        self._change(fence, 'cannot tear down', 'node.set_provision_state',
                     node, 'deleted')

    def set_power(self, node, target, fence, soft=False, timeout=None):
        """Ask Ironic to power the node ``target`` ('on', 'off', 'reboot'),
        gracefully if ``soft``; a soft action that has not ended after
        ``timeout`` seconds is ended by Ironic itself (as failed)."""
        extra = {'timeout': max(int(timeout), 1)} if soft and timeout else {}
        self._change(fence, f'cannot {"soft " if soft else ""}{target}',
                     'node.set_power_state', node, target, soft=soft,
                     **extra)

    def wait_for_power_settled(self, node, timeout, what):
        """Poll the node until no power action is in flight; the node."""
        state = self.poll_node(
            node, lambda n: n is None or n.target_power_state is None,
            timeout, what)
        if state is None:
            raise ProvisionError(f'{what}: node {node} is gone from Ironic')
        return state

    def rebuild(self, node, image_source, fence):
        """Redeploy the node in place (same node, same allocation)."""
        self._change(fence, 'cannot set the image', 'node.update', node,
                     [{'op': 'add', 'path': '/instance_info/image_source',
                       'value': image_source}])
        self._change(fence, 'cannot rebuild', 'node.set_provision_state',
                     node, 'rebuild')

    def wait_for_power(self, node, power_state, timeout, what):
        """Poll the node until Ironic says ``power_state`` with no power
        action in flight; ProvisionError when the time is up."""
        state = self.poll_node(
            node, lambda n: n is None or (n.target_power_state is None
                                          and n.power_state == power_state),
            timeout, what)
        if state is None:
            raise ProvisionError(f'{what}: node {node} is gone from Ironic')
        return state

    def wait_for(self, node, done, failed, timeout, what):
        """Poll the node until it reaches ``done``; ProvisionError if it
        reaches one of ``failed`` or the time is up."""
        state = self.poll_node(
            node, lambda n: n is None or (n.target_provision_state is None and (
                n.provision_state == done or n.provision_state in failed)),
            timeout, what)
        if state is None:
            raise ProvisionError(f'{what}: node {node} is gone from Ironic')
        if state.provision_state != done:
            raise ProvisionError(
                f'{what}: node {node} is {state.provision_state}'
                + (f': {one_line(state.last_error)}'
                   if state.last_error else ''))
        return state

    def poll(self, read, finished, timeout, what, wait_first=False):
        """Read until ``finished(value)``; the value. ``wait_first``: the
        first read comes after one interval, not at once (the caller knows
        it would find the state it has just been told).

        Every poll_interval for the first POLL_STEADY seconds (what Ironic
        ends in a second or two is seen within a tick), then 1.5 times
        further apart up to poll_cap (a real deploy takes minutes)."""
        started = time.monotonic()
        deadline = started + timeout
        interval = self.poll_interval
        if wait_first:
            self._pause(interval, deadline, what)
            interval = self._longer(interval, started)
        while True:
            value = read()
            if finished(value):
                return value
            if time.monotonic() >= deadline:
                raise ProvisionError(f'{what}: not done after {timeout} s')
            self._pause(interval, deadline, what)
            interval = self._longer(interval, started)

    def _longer(self, interval, started):
        if time.monotonic() - started < POLL_STEADY:
            return interval
        return min(interval * 1.5, max(self.poll_cap, self.poll_interval))

    def _pause(self, interval, deadline, what):
        """Sleep about ``interval``, until the next tick of the grid of
        poll_interval, so that the polls of a moment meet (and share a
        listing); never past the deadline: the last read comes at it."""
        now = time.monotonic()
        tick = self.poll_interval
        wake = math.ceil((now + interval) / tick - 1e-9) * tick
        pause = min(max(wake - now, 0.01), max(deadline - now, 0.01))
        if self._stopping is not None:
            if self._stopping.wait(pause):
                raise Stopped(what)
        else:
            time.sleep(pause)
