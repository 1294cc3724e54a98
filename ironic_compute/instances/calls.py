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

"""Requests to Ironic for the instance workers: the limit on requests under
way, the fence run right before each change, the read-and-decide after a
lost answer, the worker's last answer about a node (what a fence may check
instead of reading again), and a poll's timing.

The base of provision.Provisioner (polls.NodePolls adds the shared
listing). Nothing here reads the database: a fence is a callable given by
the flow.
"""

import contextlib
import math
import threading
import time

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute import redaction
from ironic_compute.instances import answers
from ironic_compute.text import one_line

LOG = logging.getLogger(__name__)

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
# Before a call that takes something from the node's tenant (power off,
# reboot, rebuild, undeploy), the same holds only for an answer that came
# less than this many seconds ago: in practice the read the flow itself
# made, within the same turn, to decide what to send (or the answer to its
# image patch, before a rebuild). A second read a few milliseconds later
# would say nothing newer, and cost Ironic a third of an action's requests.
FENCE_READ_AGE = 0.2


# After a change whose answer was lost, Ironic may still be carrying the
# request out: its API waits for the conductor to take a change (an RPC
# call; rpc_response_timeout is 60 s by default) and the conductor records
# the change's target before the API answers. A change that no read shows
# within this many seconds of the lost answer was not taken, and is sent
# again (through the fence), at most LOST_ANSWER_SENDS times in all.
LOST_ANSWER_SETTLE = 60.0
LOST_ANSWER_SENDS = 3
# Seconds between two reads of the node an instance action waits on (stop,
# start, reboot, rebuild), at first. Ironic ends a power action in well
# under a second, and a tenant waits for it: a build's polls (every
# poll_interval, 0.5 s) would add a quarter of a second on average. Few
# actions wait at once, and their polls share one listing when several do.
ACTION_POLL = 0.2
# Seconds from an action's call to its first read. Ironic records the
# action's target before it answers the call, so a read at once only finds
# the action begun (a request for nothing, to a busy Ironic); and a read
# a whole ACTION_POLL later, rounded up to the polls' grid, came 0.3 s
# after Ironic had ended it: Ironic ends a power action on fake hardware
# about 0.11 s after it answered the call (doc/instances.md, "Traced:
# where the last tenths went").
ACTION_FIRST_READ = 0.1
# Seconds a poll reads every poll_interval before it backs off: fake
# hardware and a quiet Ironic end an allocation, a deploy or a power action
# within them, and a tick late is what a build then waits for.
POLL_STEADY = 2.0


class Turns:
    """The requests to Ironic a service's workers have under way at once
    (``max_requests``; None: no limit), handed out as turns: a worker
    sends a request only inside a turn, and a request it sends inside one
    (a fence's read within a change's turn) needs no other. The one
    exception is the polls' shared listing while an instance action waits
    on it (polls.NodePolls), one at a time per service."""

    def __init__(self, max_requests, stopping=None):
        # The rest wait here, not in Ironic's queue, where the resource
        # tracker's listing would wait behind them.
        self._slots = (threading.BoundedSemaphore(max_requests)
                       if max_requests else None)
        self._stopping = stopping  # a threading.Event, or None
        self._local = threading.local()

    @contextlib.contextmanager
    def take(self, what):
        """Inside: a turn for this thread. Waiting for one ends with
        exception.Stopped (said with ``what``) when the service stops (the
        requests under way may each take [ironic]timeout against a hung
        Ironic)."""
        if self.current() is not None:
            yield
            return
        self._acquire(what)
        try:
            yield
        finally:
            # Not when set_aside() gave it back and could not take it again.
            if self.current() is not None:
                self._release()

    @contextlib.contextmanager
    def set_aside(self, what):
        """Inside: this thread's turn, if it is inside one, given back to
        the others (a wait of seconds, whose requests each take a turn of
        their own); taken again on the way out, as a new turn, so that an
        answer heard before or meanwhile is not this turn's. Raises
        exception.Stopped (said with ``what``) when the service stops
        before the turn is taken again."""
        if self.current() is None:
            yield
            return
        self._release()
        try:
            yield
        finally:
            self._acquire(what)

    def _acquire(self, what):
        while self._slots is not None and not self._slots.acquire(
                timeout=0.2):
            if self._stopping is not None and self._stopping.is_set():
                raise exception.Stopped(what)
        self._local.taken = getattr(self._local, 'taken', 0) + 1
        self._local.inside = True

    def _release(self):
        self._local.inside = False
        if self._slots is not None:
            self._slots.release()

    def current(self):
        """The number of this thread's turn it is inside (each new turn
        has a higher one), or None outside a turn."""
        return self._local.taken if getattr(self._local, 'inside',
                                            False) else None


class IronicCalls:
    """One worker's requests to Ironic (a thread-local record per worker)."""

    def __init__(self, ironic_client, poll_interval=0.5, stopping=None,
                 poll_cap=5.0, max_requests=None):
        self._ironic = ironic_client
        # Requests under way at once ([DEFAULT]max_concurrent_ironic_requests).
        self._turns = Turns(max_requests, stopping)
        # The first read comes soon (fake hardware deploys in 0.3 s); later
        # ones 1.5 times further apart up to ``poll_cap``: a real deploy
        # takes minutes, and every build worker polls the same Ironic API
        # that the resource-tracker cycle lists the nodes from.
        self.poll_interval = poll_interval
        self.poll_cap = poll_cap
        self.lost_answer_settle = LOST_ANSWER_SETTLE
        self._stopping = stopping  # a threading.Event, or None
        # Per worker thread: ``last``, (the answer, when it came, the turn
        # it came in), the last answer about a node (fence_node());
        # ``fenced``, the answer the last fence checked the node on.
        self._worker = threading.local()

    def _request(self, what, call, /, *args, **kwargs):
        """One request of the adapter (``call``: 'allocation.create'...);
        exception.IronicNotFound as it is, the other errors said with ``what``. What
        this worker was told of a node before is forgotten: only the answer
        to its last request counts (fence_node())."""
        self._worker.last = None
        with self._turns.take(what):
            return self._send(what, call, *args, **kwargs)

    def _send(self, what, call, /, *args, **kwargs):
        try:
            return self._ironic.request(call, *args, **kwargs)
        except (exception.IronicNotFound, exception.NotSent, exception.MaybeSent):
            raise
        except exception.ServiceStopping as exc:
            raise exception.Stopped(what) from exc  # left for the next attempt
        except exception.IronicConflict as exc:
            if not call.startswith('node.'):
                raise exception.ProvisionError(
                    f'{what}: {redaction.url_credentials(one_line(exc))}'
                ) from exc
            # The node is locked by a task of its conductor: busy, not a
            # refusal of what was asked (a soft action must not turn hard).
            raise exception.IronicBusy(
                f'{what}: {redaction.url_credentials(one_line(exc))}'
            ) from exc
        except exception.IronicRefused as exc:
            raise exception.ProvisionError(
                f'{what}: {redaction.url_credentials(one_line(exc))}'
            ) from exc
        except Exception as exc:
            raise exception.IronicUnavailable(
                f'{what}: {redaction.url_credentials(one_line(exc))}'
            ) from exc

    def _change(self, fence, what, call, /, *args, landed=None, **kwargs):
        """A request that changes something in Ironic; Ironic's answer, or
        None when the answer was lost but Ironic took the change.

        Each attempt (the first, and each retry after a 409 or 503) is sent
        only after ``fence()`` (which raises exception.Fenced) let it, immediately
        before: the turn among the requests under way is taken first, so
        that no wait comes between. Any answer about a node heard before is
        forgotten once the fence has used it: the change may make it untrue.

        A change is never sent again after Ironic may have received it.
        When the answer is lost (exception.MaybeSent: a read timeout, a reset
        after sending), ``landed(before)`` gives (read, took): what to read
        and how to tell from it that Ironic took the change (done or under
        way); ``before`` is the node as the fence checked it before the
        send (its own read, or the flow's of the same turn), or None. The
        change is sent again, through the fence, only when no read within
        lost_answer_settle seconds shows it taken.
        Without ``landed``, or when ``landed`` cannot decide (it returns
        None), MaybeSent is raised: the flow's own resume decides. Raises
        exception.ProvisionError, IronicUnavailable, exception.Fenced or
        exception.Stopped otherwise.
        """
        before = {}

        def checked():
            self._worker.fenced = None
            fence()
            self._worker.last = None
            # The node as the fence checked it for this attempt, if it did
            # and the answer says the node's marks.
            fenced = self._worker.fenced
            before['node'] = fenced if isinstance(
                fenced, answers.NodeState) else None
        for _send in range(LOST_ANSWER_SENDS):
            sent_at = time.monotonic()
            try:
                with self._turns.take(what):
                    answer = self._send(what, call, *args, before=checked,
                                        **kwargs)
            except exception.MaybeSent:
                decide = landed(before.get('node')) if landed else None
                if decide is None:
                    raise
                # What the log names: the call and its node or allocation.
                change = f'{call} {args[0] if args else kwargs.get("uuid")}'
                # Up to lost_answer_settle seconds of reads and pauses: a
                # turn the flow holds (send_once()) is the others' meanwhile.
                with self._turns.set_aside(what):
                    taken = self._taken(change, what, *decide)
                if taken:
                    return None
                LOG.warning('%s: the answer was lost and Ironic did not take '
                            'the change within %.0f s; sending it again',
                            change, self.lost_answer_settle)
                continue
            if call == 'node.update' and getattr(answer, 'uuid', None):
                # Ironic answers a patch with the node as patched: the fence
                # of the next call (the deploy after the image) checks that.
                self._heard_node(answers.node_state(answer, sent_at))
            return answer
        raise exception.IronicUnavailable(
            f'{what}: no answer to {LOST_ANSWER_SENDS} sends')

    def _taken(self, change, what, read, took):
        """Whether Ironic took ``change`` (a call and what it names, for the
        log), whose answer was lost: ``took(read())`` for a read within
        lost_answer_settle seconds (Ironic may still be carrying the request
        out). IronicUnavailable (said with ``what``) when no read succeeds
        to the end: then it is unknown, and nothing may be sent."""
        deadline = time.monotonic() + self.lost_answer_settle
        while True:
            try:
                if took(read()):
                    LOG.info('%s: the answer was lost, but Ironic took the '
                             'change', change)
                    return True
                known = True
            except exception.IronicUnavailable:
                known = False
            if time.monotonic() >= deadline:
                if not known:
                    raise exception.IronicUnavailable(
                        f'{what}: the answer was lost and Ironic cannot be '
                        'read to tell whether it took the change')
                return False
            self._pause(self.poll_interval, deadline, what)

    def _heard(self, answer):
        """Remember the answer about a node that this worker has just had
        (for fence_node()): an answers.NodeState, or an answers.Serving
        when the answer does not say the node's marks (a listing, an
        allocation)."""
        self._worker.last = (answer, time.monotonic(), self._turns.current())

    def _heard_node(self, state):
        self._heard(state)
        return state

    def fence_node(self, uuid, taking=False):
        """The node as a fence checks it, right before a call: Ironic's
        answer to this worker's last request about it, if it came within
        FENCE_ANSWER_AGE seconds with no other request sent since; when the
        call is ``taking`` something from the node's tenant, only if it
        came within FENCE_READ_AGE seconds and in the turn the call is sent
        in. Else the node read now (None: gone). Either is an
        answers.NodeState or an answers.Serving; the change's landed() gets
        it as ``before`` when it is a NodeState."""
        answer, came, turn = getattr(self._worker, 'last', None) or (
            None, None, None)
        if answer is not None and answer.uuid == uuid and (
                time.monotonic() - came <= FENCE_READ_AGE
                and turn is not None and turn == self._turns.current()
                if taking else
                time.monotonic() - came <= FENCE_ANSWER_AGE):
            self._worker.fenced = answer
            return answer
        state = self.node(uuid)
        self._worker.fenced = state
        return state

    def turn(self, what):
        """A context: inside, one turn for this worker (Turns.take), so
        that a flow's read, its fence and its call follow each other with
        no wait for a turn between."""
        return self._turns.take(what)

    def node(self, uuid, image=False, lessee=False):
        """The node read now (a answers.NodeState), or None when Ironic answers 404;
        with ``image``, its image_source too, with ``lessee`` its lessee (API
        1.65). It is this worker's last answer about the node (fence_node())."""
        started = time.monotonic()
        try:
            raw = self._request('cannot read node', 'node.get', uuid, fields=[
                'uuid', 'provision_state', 'target_provision_state',
                'instance_uuid', 'allocation_uuid', 'last_error',
                'maintenance', 'power_state', 'target_power_state',
                'driver_internal_info', 'provision_updated_at',
                *(['instance_info'] if image else []),
                *(['lessee'] if lessee else [])])
        except exception.IronicNotFound:
            return None
        return self._heard_node(answers.node_state(raw, started))

    def poll(self, read, finished, timeout, what, interval=None,
             first_read=None):
        """Read until ``finished(value)``; the value. ``first_read``: the
        first read comes that many seconds later (on the next tick of a
        grid of that many seconds, where other polls' first reads meet),
        not at once, when the caller knows a read at once would find the
        state it has just been told; later reads keep to that grid.

        Every ``interval`` seconds (poll_interval when None) for the first
        POLL_STEADY seconds (what Ironic ends in a second or two is seen
        within a tick), then 1.5 times further apart up to poll_cap (a real
        deploy takes minutes). Raises exception.ProvisionError when
        ``timeout`` seconds pass first, exception.Stopped when the service
        stops."""
        started = time.monotonic()
        deadline = started + timeout
        interval = interval or self.poll_interval
        tick = min(interval, self.poll_interval,
                   interval if first_read is None else max(first_read, 0.01))
        if first_read is not None:
            self._pause(first_read, deadline, what, tick)
        while True:
            value = read()
            if finished(value):
                return value
            if time.monotonic() >= deadline:
                raise exception.ProvisionError(f'{what}: not done after {timeout} s')
            self._pause(interval, deadline, what, tick)
            interval = self._longer(interval, started)

    def _longer(self, interval, started):
        if time.monotonic() - started < POLL_STEADY:
            return interval
        return min(interval * 1.5, max(self.poll_cap, self.poll_interval))

    def _pause(self, interval, deadline, what, tick=None):
        """Sleep about ``interval``, until the next tick of the grid of
        ``tick`` seconds (poll_interval when None), so that the polls of a
        moment meet (and share a listing); never past the deadline: the
        last read comes at it."""
        now = time.monotonic()
        tick = tick or self.poll_interval
        wake = math.ceil((now + interval) / tick - 1e-9) * tick
        pause = min(max(wake - now, 0.01), max(deadline - now, 0.01))
        if self._stopping is not None:
            if self._stopping.wait(pause):
                raise exception.Stopped(what)
        else:
            time.sleep(pause)
