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

"""The resource tracker's timer: one cycle at start, then one every interval.

Only the tracker thread runs cycles, so cycles never overlap. A SIGHUP that
applied new options wakes it for a cycle at once. The first cycle decides
when the service is ready: systemd gets READY=1 after it, and the watchdog
is fed only from then on.
"""

import threading

from oslo_db import exception as db_exc
from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute import outage
from ironic_compute.db import api as db_api

LOG = logging.getLogger(__name__)


class Cycles:
    """The tracker loop of one service, with the settings its cycles use.

    ``settings`` (resource_tracker.Settings) and ``interval`` (seconds) may
    be replaced while it runs (SIGHUP); ``tracker`` is set once the service
    has registered. ``stopping`` (a threading.Event) ends the loop.
    """

    def __init__(self, settings, interval, loops, notifier, stopping):
        self.settings = settings
        self.interval = interval
        self.tracker = None
        self.last_stats = None  # the last cycle's figures, for the report
        self.loops = loops
        self.notifier = notifier
        # The first cycle has run (READY=1 was sent unless stopping).
        self.started = threading.Event()
        self._stopping = stopping
        self._wake = threading.Event()
        self._db_outage = outage.Outage('The database (cycles)')

    def wake(self):
        """Run the next cycle now rather than at the end of the interval."""
        self._wake.set()

    def tracker_loop(self):
        """Run the first cycle, tell systemd, then a cycle every interval
        until stopping; returns then. Raises nothing of a cycle's.
        (The Guru Meditation Report shows this thread by this name.)"""
        try:
            self._run_cycle()
            if not self._stopping.is_set():
                self.notifier.ready()
        finally:
            self.started.set()
        while True:
            self._wake.wait(self.interval)
            if self._stopping.is_set():
                return
            self._wake.clear()
            self._run_cycle()

    def _run_cycle(self):
        # Cycles never overlap: only the tracker thread runs them.
        with self.loops.turn('resource-tracker'):
            try:
                self.last_stats = self.tracker.run_cycle(self.settings)
            except exception.PeerListError as exc:
                LOG.error('Cycle skipped: %s', exc)
            except db_api.OUTAGE_ERRORS as exc:
                self.tracker.database_lost()
                LOG.error('Cycle failed: the database is unreachable %s; the '
                          'next one runs in %s s',
                          self._db_outage.failed(exc), self.interval)
            except Exception as exc:
                if isinstance(exc, db_exc.DBError):
                    self.tracker.database_lost()
                LOG.exception('Cycle failed; the next one runs in %s s',
                              self.interval)
            else:
                self._db_outage.ended(LOG)
