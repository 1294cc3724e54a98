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

"""The polls of the nodes workers wait on: one listing shared by the polls
of a moment when several nodes are waited on (SharedRead), else a read of
each node; a waiter takes only a read begun after it started
(poll_node)."""

import collections
import contextlib
import threading
import time

from ironic_compute import exception
from ironic_compute.instances import answers
from ironic_compute.instances import calls

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
        self._running_since = 0.0  # time.monotonic() the running read began
        self._last = (0, None, None)  # (number, value, exception)
        self.waiting = 0  # callers waiting for a read to end

    def __call__(self, fresh=True, not_before=None):
        """The result of a read that started after this call; ``fresh``
        False: of the read running now if there is one that began at or
        after ``not_before`` (time.monotonic(); None: whenever), else of the
        next (a poll, which only needs a state newer than its last read and
        its own call, waits less)."""
        with self._changed:
            # The first read to start after now, or the running one.
            join = not fresh and self._running and (
                not_before is None or self._running_since >= not_before)
            wanted = self._started + (0 if join else 1)
            while self._last[0] < wanted:
                if not self._running:
                    self._started = wanted
                    self._running = True
                    self._running_since = time.monotonic()
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



class NodePolls(calls.IronicCalls):
    """IronicCalls, with the polls' shared listing of the nodes that have an
    instance in ``conductor_group``."""

    def __init__(self, ironic_client, conductor_group=None, **kwargs):
        super().__init__(ironic_client, **kwargs)
        # The nodes polls wait on (uuid -> waiters), and the one listing of
        # the nodes with an instance (in this conductor group) that the
        # polls of one moment share, when several wait.
        self._conductor_group = conductor_group
        self._watched = collections.Counter()
        self._prompt_waits = 0  # of them, the waits at an action's pace
        self._watch_lock = threading.Lock()
        self._watch_read = SharedRead(self._list_watched)
        self._watch_size = 0  # nodes in the last shared listing

    @contextlib.contextmanager
    def watching(self, uuid, prompt=False):
        """While inside, ``uuid`` counts as a node a poll waits on; with
        ``prompt``, one an instance action waits on (see _list_watched)."""
        with self._watch_lock:
            self._watched[uuid] += 1
            self._prompt_waits += prompt
        try:
            yield
        finally:
            with self._watch_lock:
                self._watched[uuid] -= 1
                self._prompt_waits -= prompt
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
        """{uuid: answers.NodeState} of the nodes with an instance: one page (the
        server's page size), no more; a node past it is read on its own."""
        started = time.monotonic()
        # While an instance action waits on it, in no turn (Turns): the
        # polls of this service send one such listing at a time
        # (SharedRead), and every wait of the moment ends only when it has
        # come. Behind a burst's calls, each holding a turn for a read and
        # a call, it waited a call or two, and so did every action it
        # would have seen done. Builds alone keep it in a turn: it is one
        # more request in Ironic's one process, which their deploys need
        # (doc/instances.md, "Measured: actions").
        with self._watch_lock:
            prompt = self._prompt_waits > 0
        self._worker.last = None
        raw = (self._send if prompt else self._request)(
            'cannot list nodes', 'node.list', fields=WATCH_FIELDS,
            associated=True, conductor_group=self._conductor_group)
        # allocation_uuid and the change times are not listed: None.
        states = {item.uuid: answers.node_state(item, started) for item in raw}
        self._watch_size = len(states)
        return states

    def polled_node(self, uuid, after=None):
        """The node as a poll waiting on it reads it, by a request that
        began at or after ``after`` (time.monotonic(); None: this call): from the listing the
        polls of this moment share (SharedRead) when that costs Ironic
        less, else on its own. Either is the worker's last answer about
        the node (fence_node())."""
        self._worker.last = None  # this read is the last one now
        after = time.monotonic() if after is None else after
        if self._share_listing():
            try:
                # The listing running now, if it began after the poll did
                # (and so after the call it waits on was answered): it is
                # newer than this poll's last read too.
                state = self._watch_read(fresh=False, not_before=after).get(
                    uuid)
            except exception.IronicUnavailable:
                state = None  # read on its own: the answer that counts
            if state is not None:
                # A listing does not say the node's allocation. Ironic
                # gives an allocation only a node whose instance_uuid is
                # empty or the allocation's own, and sets it to that: a
                # node listed with this instance carries this instance's
                # allocation or none, as a fence wants. Heard as in no
                # turn: the listing was sent in none, maybe by another
                # worker before this one's turn began, so a fence before a
                # call that takes something never checks the node on it.
                self._worker.last = (
                    answers.Serving(uuid, state.instance_uuid, None),
                    time.monotonic(), None)
                return state
        return self.node(uuid)

    def poll_node(self, uuid, finished, timeout, what, interval=None,
                  first_read=None):
        """poll() on the node, read by polled_node(): a state it gives has
        no allocation_uuid (None), nor the times of the last changes.

        Only a read that began after this call counts: a waiter is called
        once the change it waits on was answered, and Ironic records a
        change's target before it answers (the conductor saves the node's
        target power or provision state, then the API answers), so an older
        read may show the state the node was in before (a reboot's "power
        on"), never the change's end. ``first_read``: as poll()'s. A wait
        at an action's pace (``interval`` ACTION_POLL) is a prompt one."""
        after = time.monotonic()
        with self.watching(uuid, prompt=interval == calls.ACTION_POLL):
            return self.poll(
                lambda: self.polled_node(uuid, after),
                lambda n: n is None or (n.read_at >= after and finished(n)),
                timeout, what, interval=interval, first_read=first_read)
