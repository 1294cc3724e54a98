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

"""The machinery under manager.py: its thread pools, what the workers
have in hand, and when work that failed may be handed again.

A key is an instance uuid, or ``('reap', node)`` for the teardown of a
deleted instance's node. While a key is taken (its work runs, or waits for
a thread), no other work is handed for it: the poller, the power-state
sync and the reaper all take the key first. Work that failed for a reason
that may pass (Ironic down, a node still cleaning) is handed again only
after a back-off.
"""

import concurrent.futures
import threading
import time

# A key whose work failed is handed again after this many seconds,
# doubling at each failure up to the cap.
RETRY_FIRST, RETRY_CAP = 2.0, 60.0


class Tasks:
    """The keys taken now, and the retry time of each key whose last work
    failed. ``stopping`` is the service's stop event: once it is set, no
    key is taken any more. Safe to use from any thread."""

    def __init__(self, stopping):
        self._stopping = stopping
        self._lock = threading.Lock()
        self._taken = set()
        self._retry_at = {}  # key -> (monotonic time, the delay it ends)

    def take(self, key, wait_retry=True):
        """Take ``key`` and return True. Return False, and take nothing,
        when it is taken already, when the service stops, or (with
        ``wait_retry``) when its last work failed and its retry time has
        not come yet."""
        with self._lock:
            retry = self._retry_at.get(key) if wait_retry else None
            if (key in self._taken or self._stopping.is_set()
                    or retry is not None and time.monotonic() < retry[0]):
                return False
            self._taken.add(key)
            return True

    def give_back(self, key):
        """Let ``key`` go when its work was not handed after all."""
        with self._lock:
            self._taken.discard(key)

    def finished(self, key, done):
        """Let ``key`` go once its work has run. ``done`` False means that
        it should run again later: after RETRY_FIRST seconds the first
        time, then twice the last delay, up to RETRY_CAP. Otherwise the
        key's retry time is forgotten."""
        with self._lock:
            self._taken.discard(key)
            if done is False:
                delay = min(self._retry_at.get(key, (0, RETRY_FIRST / 2))[1]
                            * 2, RETRY_CAP)
                self._retry_at[key] = (time.monotonic() + delay, delay)
            else:
                self._retry_at.pop(key, None)

    def __len__(self):
        """How many keys are taken now."""
        with self._lock:
            return len(self._taken)

    def taken(self):
        """Return the keys taken now, as sorted text (for a log line)."""
        with self._lock:
            return sorted(map(str, self._taken))


def started(loop, name):
    """Return a daemon thread named ``name`` running ``loop``, started."""
    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def new_pool(name, size):
    """Return a pool of ``size`` threads, named ``name``_0, ``name``_1..."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=size,
                                                 thread_name_prefix=name)


def shut_down(pools, deadline):
    """Shut ``pools`` down (None ones are skipped): the work not started
    is cancelled, and the work under way is waited for until ``deadline``
    (time.monotonic(); None: however long it takes). Return whether all of
    it finished by then. What is still running then is left running."""
    def wait_for_all():
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
    # A pool's own shutdown(wait=True) waits without bound: wait for them
    # in a thread of its own, up to the deadline.
    waiter = threading.Thread(target=wait_for_all,
                              name='instance-workers-stop', daemon=True)
    waiter.start()
    waiter.join(remaining(deadline))
    return not waiter.is_alive()


def remaining(deadline):
    """Return the seconds left until ``deadline`` (time.monotonic()), at
    least 0; None when ``deadline`` is None."""
    return None if deadline is None else max(deadline - time.monotonic(), 0)
