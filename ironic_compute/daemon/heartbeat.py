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

"""The heartbeat: this service's row stamped every report_interval, and the lease.

Each good heartbeat renews the lease (cluster/lease.py), which says whether
this service may still act on Ironic. A heartbeat that finds the lease had
lapsed (the process was paused, the machine suspended, or the database cut
off for over half of service_down_time) makes the tracker rejoin: the peers
may have judged this service dead and taken its rows meanwhile.
"""

from oslo_log import log as logging

from ironic_compute import outage
from ironic_compute.cluster import lease
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services

LOG = logging.getLogger(__name__)


class Heartbeat:
    """The heartbeat loop of one service.

    ``service_id`` and ``tracker`` are set once the service has registered;
    the loop runs only after that. ``stopping`` (a threading.Event) ends it.
    """

    def __init__(self, conf, the_lease, loops, stopping):
        self.conf = conf
        self.lease = the_lease
        self.loops = loops
        self.service_id = None
        self.tracker = None
        self._stopping = stopping

    def heartbeat_loop(self):
        """Heartbeat every report_interval until stopping; returns then.

        A failed heartbeat is logged and tried again at the next turn; it
        tells the tracker that the database was lost. Raises nothing.
        (The Guru Meditation Report shows this thread by this name.)
        """
        db_outage = outage.Outage('The database (heartbeat)')
        while not self._stopping.wait(self.conf.report_interval):
            self._beat(db_outage)

    def _beat(self, db_outage):
        """One heartbeat, and the lease renewed by it; raises nothing."""
        told = []  # whether the check before the commit found a lapse

        def before_commit(beat):
            told.append(self._lapse_before_commit(beat))

        with self.loops.turn('heartbeat'):
            sent_at = lease.now()
            try:
                beat = db_services.heartbeat_state(
                    db_api.Context(), self.service_id,
                    before_commit=before_commit)
            except db_api.OUTAGE_ERRORS as exc:
                self.tracker.database_lost()
                LOG.error('Heartbeat failed: the database is unreachable '
                          '%s; retrying in %s s', db_outage.failed(exc),
                          self.conf.report_interval)
                return
            except Exception:
                self.tracker.database_lost()
                LOG.exception('Heartbeat failed; retrying in %s s',
                              self.conf.report_interval)
                return
        db_outage.ended(LOG)
        lapsed = self.lease.renewed(sent_at, beat.forced_down, beat.gone,
                                    stamped=beat.now)
        # Told before the commit already, or only now: the renewal reads
        # the clock a little later, so it may find a lapse the check
        # before the commit just missed.
        if lapsed is not None and not any(told):
            self._lapsed(lapsed)

    def _lapse_before_commit(self, beat):
        """Tell the tracker of a lapse before this heartbeat is visible;
        True when there was one.

        Once committed, the new stamp makes this service look freshly up,
        to its own cycle too (gate.py reads it from the database). A cycle
        that read it before the tracker was told of the lapse would act on
        a view where it never left: it would take rows back from peers that
        have not yet seen it up again, and they would take them back.
        """
        gap = self.lease.lapse(stamped=beat.now)
        if gap is None:
            return False
        self._lapsed(gap)
        return True

    def _lapsed(self, gap):
        # Paused (SIGSTOP, a VM paused by its hypervisor), suspended or
        # cut off: the peers may have judged us dead and taken our rows
        # meanwhile.
        LOG.warning('No good heartbeat for %.0f s (the lease, half of '
                    'service_down_time, had lapsed): rejoining', gap)
        self.tracker.lease_lapsed()
