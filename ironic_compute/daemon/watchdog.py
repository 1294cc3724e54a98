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

"""What the systemd watchdog watches: the daemon's own loops.

``WATCHDOG=1`` says "this process works", not "Ironic and the database
answer": an outage of either must not make systemd kill every service of
the cluster at once. So the pings go on while each watched loop's thread is
alive and no call of it (a cycle, a heartbeat) has been running for longer
than ``[DEFAULT]loop_stuck_timeout``; they stop when a loop died or hangs,
and systemd restarts the service after ``WatchdogSec``.
"""

import contextlib
import threading
import time

from oslo_log import log as logging

LOG = logging.getLogger(__name__)


class Loops:
    """The watched threads and the call each is in; thread-safe."""

    def __init__(self, stuck_after):
        self.stuck_after = stuck_after  # seconds
        self._threads = {}  # name -> threading.Thread
        self._busy = {}  # name -> time.monotonic() the current call began
        self._lock = threading.Lock()

    def watch(self, name, thread):
        with self._lock:
            self._threads[name] = thread

    @contextlib.contextmanager
    def turn(self, name):
        """Mark one call of loop ``name`` (a cycle, a heartbeat)."""
        with self._lock:
            self._busy[name] = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._busy[name] = None

    def problem(self, now=None):
        """Why the daemon is not healthy, or None when every loop turns."""
        now = time.monotonic() if now is None else now
        with self._lock:
            threads, busy = dict(self._threads), dict(self._busy)
        for name, thread in sorted(threads.items()):
            if not thread.is_alive():
                return f'the {name} thread has ended'
            began = busy.get(name)
            if began is not None and now - began > self.stuck_after:
                return (f'the {name} loop is stuck: its call has not '
                        f'returned for {now - began:.0f} s (loop_stuck_timeout '
                        f'is {self.stuck_after} s)')
        return None


def ping_loop(notifier, loops, started, stopping):
    """Send WATCHDOG=1 while every loop of ``loops`` turns, until ``stopping``.

    Runs in its own thread once systemd asked for a watchdog; nothing is
    sent before ``started`` (the first cycle ran and READY=1 was sent).
    Returns when ``stopping`` is set; raises nothing of its own.
    """
    # systemd advises pinging at half WatchdogSec; a third leaves room
    # for a loaded host.
    interval = notifier.watchdog_usec / 3e6
    reported = None
    while not stopping.wait(interval):
        if not started.is_set():
            continue
        problem = loops.problem()
        if problem is None:
            notifier.watchdog()
        elif reported is None:  # once per spell, not every check
            LOG.error('Watchdog: %s; WATCHDOG=1 is no longer sent, so '
                      'systemd restarts the service after WatchdogSec',
                      problem)
        reported = problem
