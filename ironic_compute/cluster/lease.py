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

"""This service's lease: its right to change anything in Ironic now.

The peers judge a service by its heartbeats on the database's clock and
take its instances over once it has been silent for longer than
``service_down_time + instance_takeover_grace``. The service judges itself
by the same heartbeats on its own monotonic clock: the lease is valid while
the last heartbeat that succeeded was *sent* less than ``margin`` seconds
ago (``service_down_time / 2``), and the database did not answer it that
the service is forced down or gone. Counting from the moment the heartbeat
was sent, before the database stamped it, makes the lease end before the
peers' count starts: they act ``margin + instance_takeover_grace`` seconds
at least after it ended (doc/instances.md, "Fencing").

Pure: the clock is injected; no database, no Ironic.
"""

import threading
import time


class LeaseLost(Exception):
    """No Ironic call that changes anything may be sent now; why, in one
    line."""


class Lease:
    def __init__(self, margin, clock=time.monotonic):
        """``margin``: a callable giving the lease's length in seconds (read
        at each check: ``service_down_time`` is mutable)."""
        self._margin = margin
        self._clock = clock
        self._lock = threading.Lock()
        self._sent_at = None  # clock() when the last good heartbeat was sent
        self._forced_down = False
        self._gone = False

    def renewed(self, sent_at, forced_down=False, gone=False):
        """A heartbeat sent at ``sent_at`` (clock()) succeeded; the database
        said whether the service is forced down, or its row is gone."""
        with self._lock:
            if self._sent_at is None or sent_at > self._sent_at:
                self._sent_at = sent_at
            self._forced_down, self._gone = forced_down, gone

    def problem(self):
        """Why the lease is not valid now, or None when it is."""
        with self._lock:
            sent_at, forced_down, gone = (self._sent_at, self._forced_down,
                                          self._gone)
        if gone:
            return 'the service has no services row (deleted by an operator)'
        if forced_down:
            return 'the service is forced down'
        if sent_at is None:
            return 'the service has not heartbeated yet'
        age, margin = self._clock() - sent_at, self._margin()
        if age >= margin:
            return (f'the last good heartbeat was sent {age:.1f} s ago '
                    f'(the lease lasts {margin:g} s)')
        return None

    @property
    def valid(self):
        return self.problem() is None

    def check(self):
        """Raise LeaseLost unless the lease is valid now."""
        problem = self.problem()
        if problem is not None:
            raise LeaseLost(problem)
