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

The one lease of a service. The peers judge a service by its heartbeats
on the database's clock and take its instances over once it has been
silent for longer than ``service_down_time + instance_takeover_grace``.
The service judges itself by the same heartbeats on its own clock,
:func:`now`: the lease is valid while the last heartbeat that succeeded
was *sent* less than ``margin`` seconds ago (``service_down_time / 2``,
:func:`margin_for`), and the database did not answer it that the service
is forced down or gone. Counting from the moment the heartbeat was sent,
before the database stamped it, makes the lease end before the peers'
count starts: they act ``margin + instance_takeover_grace`` seconds at
least after it ended (doc/instances.md, "Fencing").

The clock must run while the process or the machine is suspended: a
machine suspended for longer than the margin must find its lease lapsed
when it wakes, since its peers' clock (the database's) ran on.
``time.monotonic()`` does not advance during a system suspend on Linux;
``CLOCK_BOOTTIME`` is monotonic and counts the suspended time. Everything
that feeds the lease or measures against it uses :func:`now`.

No clock of a KVM guest sees a pause by its hypervisor (QEMU ``stop`` and
``cont``, a snapshot, a migration's downtime): QEMU holds the guest's
kvmclock still, and every guest clock, BOOTTIME and the wall clock
included, reads as if no time had passed. The database's clock does run
on, so each renewal also compares the database's stamps of two heartbeats
in a row (:meth:`Lease.renewed`): a gap of ``margin`` or more there is a
lapse too, seen at the first heartbeat after the pause.

Pure: the clock is injected (by default :func:`now`); no database, no
Ironic.
"""

import threading
import time

from ironic_compute import exception

# Linux has CLOCK_BOOTTIME (Python 3.7+); other systems fall back to the
# monotonic clock, which may stand still while the machine is suspended:
# there, a suspend longer than the margin is not seen by the lease (the
# peers still act only after service_down_time + instance_takeover_grace,
# and the generation bump of a takeover still fences the workers).
_BOOTTIME = getattr(time, 'CLOCK_BOOTTIME', None)


def now():
    """Seconds on the lease's clock: CLOCK_BOOTTIME where the system has
    it (suspended time included), else time.monotonic(). Only differences
    between two values mean anything."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


def margin_for(service_down_time):
    """The length of the lease in seconds: half of ``service_down_time``."""
    return service_down_time / 2


class Lease:
    def __init__(self, margin, clock=now):
        """``margin``: a callable giving the lease's length in seconds (read
        at each check: ``service_down_time`` is mutable); ``clock``: the
        lease's clock (tests inject their own)."""
        self._margin = margin
        self._clock = clock
        self._lock = threading.Lock()
        self._sent_at = None  # clock() when the last good heartbeat was sent
        self._stamped = None  # the database's time it was written
        self._forced_down = False
        self._gone = False

    def renewed(self, sent_at, forced_down=False, gone=False, stamped=None):
        """A heartbeat sent at ``sent_at`` (clock()) succeeded; the database
        said whether the service is forced down, or its row is gone, and
        ``stamped`` it at that time of its own (a datetime; None: unknown).

        Returns None, or, when the lease had lapsed before this renewal
        came, the gap in seconds (``margin`` or more) since the previous
        good heartbeat: on the lease's clock (its age now), or between the
        database's stamps of the two, whichever is longer. Either means
        that the process was paused, suspended or cut off, and that its
        peers may have judged it down. The first renewal has no earlier
        one to lapse from.
        """
        with self._lock:
            lapsed = self._lapse(stamped)
            if self._sent_at is None or sent_at > self._sent_at:
                self._sent_at = sent_at
            if stamped is not None and (self._stamped is None
                                        or stamped > self._stamped):
                self._stamped = stamped
            self._forced_down, self._gone = forced_down, gone
            return lapsed

    def lapse(self, stamped=None):
        """What :meth:`renewed` would return for a heartbeat stamped
        ``stamped`` now, without renewing anything: the gap in seconds when
        the lease has lapsed, else None. The heartbeat asks it before its
        stamp is committed (daemon/heartbeat.py)."""
        with self._lock:
            return self._lapse(stamped)

    def _lapse(self, stamped):
        # Called with the lock held.
        gaps = []
        if self._sent_at is not None:
            gaps.append(self._clock() - self._sent_at)
        if stamped is not None and self._stamped is not None:
            gaps.append((stamped - self._stamped).total_seconds())
        gap = max(gaps, default=None)
        return gap if gap is not None and gap >= self._margin() else None

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
            raise exception.LeaseLost(problem)
