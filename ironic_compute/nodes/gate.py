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

"""The membership gate of a cycle: may it judge its peers, and act at all?

Three rules (doc/architecture.md, "One cycle", step 1):

- **Recovery**: after this service lost the database, a peer that was up
  before is not judged by the age of its heartbeat until it heartbeats
  again or service_down_time has passed (ownership.Recovery).
- **Rejoin**: when this service's lease lapsed (the heartbeat thread saw
  it, cluster/lease.py), or its own heartbeat is older than
  service_down_time / 2 as its peers read it on the database's clock
  (liveness.half_silent), it heartbeats and rejoins like a new service:
  no row changes until every live peer has run a cycle since.
- **View age**: a view of the peers older than service_down_time / 2 when
  the rows are to be written is dropped (the process was paused). Its age
  is counted on the lease's clock (lease.now), which counts the time the
  machine was suspended.

Only the first of these is about the peers; the other two are this
service's check of itself. None of them is the lease: that is
cluster/lease.Lease, the right to change anything in Ironic.
"""

from oslo_log import log as logging

from ironic_compute.cluster import lease
from ironic_compute.cluster import liveness
from ironic_compute.db import services as db_services
from ironic_compute.nodes import ownership

LOG = logging.getLogger(__name__)


class MembershipGate:
    """The recovery, lease and rejoin state of one service's cycles."""

    def __init__(self, host, service_id):
        self.host = host
        self.service_id = service_id
        # The database's time of the last view of the peers (naive UTC), and
        # whether that cycle judged its peers by their heartbeats: False
        # while the recovery gate is in force, when nothing may be taken
        # from a peer for being silent.
        self.db_now = None
        self.peers_judged = True
        self._recovery = None  # ownership.Recovery while the gate is in force
        self._database_lost = False  # set by the service on a DB error
        self._lapsed = False  # our lease lapsed: heartbeat, then rejoin
        self._rejoined_at = None  # DB time of the heartbeat that rejoined
        self._last_up = None  # the up hosts of the last view

    def database_lost(self):
        """A database call failed: judge no peer until the gate opens."""
        self._database_lost = True

    def lease_lapsed(self):
        """This service's lease lapsed (the heartbeat thread saw it,
        cluster/lease.py: paused, suspended or cut off): its peers may have
        judged it dead. The next cycle heartbeats and rejoins instead of
        acting on an old view."""
        self._lapsed = True

    def admit(self, ctx, listing, down_time, stats):
        """(records, spared, up) of the services ``listing`` when this cycle
        may go on; None (``stats.skipped`` says why) when it must stop.

        ``spared``: the peers not judged by their heartbeat (recovery);
        ``up``: the up services of any partition, spared ones included.
        """
        now = listing.now
        records = [s.record() for s in listing.rows]
        own = next((r for r in records if r.host == self.host), None)
        if self._lapsed or liveness.half_silent(own, now, down_time):
            self._rejoin(ctx, own, now, records, stats)
            return None
        if self._database_lost:
            self._database_lost = False
            self._begin_recovery(records, now, 'the database was unreachable')
        spared = self._spared(records, now, down_time)
        # Up anywhere: whose rows are orphans, whose rows to leave alone.
        up = ownership.live_peers(records, self.host, now, down_time,
                                  spared=spared)
        if self._rejoined_at is not None and not self._seen_by_peers(
                listing.rows, up, now, down_time, stats):
            return None
        self.db_now, self.peers_judged = now, self._recovery is None
        self._last_up = up
        return records, spared, up

    def _rejoin(self, ctx, own, now, records, stats):
        """Heartbeat first; take nothing until the peers have seen it."""
        age = ('never' if own is None or own.last_seen_up is None else
               f'{(now - own.last_seen_up).total_seconds():.0f} s ago')
        # Cleared before the heartbeat: a lapse the heartbeat thread finds
        # once this heartbeat is committed (another pause right after it)
        # must make the next cycle rejoin again, not be cleared with this
        # one.
        lapsed, self._lapsed = self._lapsed, False
        try:
            self._rejoined_at = db_services.heartbeat(ctx, self.service_id)
        except Exception:
            self._lapsed = self._lapsed or lapsed
            raise
        self._begin_recovery(records, now, 'its own lease lapsed')
        stats.skipped = f'rejoining: last own heartbeat {age}'
        LOG.warning('This service heartbeated %s (paused, or cut off from '
                    'the database): its peers may have judged it down. It '
                    'heartbeated again and rejoins like a new service: no '
                    'compute node changes until every live peer has run a '
                    'cycle since', age)

    def _seen_by_peers(self, rows, up, now, down_time, stats):
        """Whether the peers have run a cycle since we rejoined."""
        starts = {row.host: row.cycle_started_at for row in rows}
        waited = (now - self._rejoined_at).total_seconds()
        if (ownership.peers_caught_up(starts, up, self.host, self._rejoined_at)
                or waited >= down_time):
            LOG.info('Rejoined: the peers have seen this service up')
            self._rejoined_at = None
            return True
        stats.skipped = 'rejoining: waiting for the peers to see this service'
        LOG.info('Rejoining: %.0f s since the heartbeat; waiting for every '
                 'live peer to run a cycle; no compute node changed', waited)
        return False

    def _begin_recovery(self, records, now, why):
        before = self._last_up or frozenset()
        heartbeats = {r.host: r.last_seen_up for r in records
                      if r.host in before and r.host != self.host}
        self._recovery = ownership.Recovery(now, heartbeats)
        self.peers_judged = False
        if heartbeats:
            LOG.warning('Recovering (%s): peers %s are not judged by their '
                        'heartbeats until they heartbeat again or '
                        'service_down_time has passed', why,
                        sorted(heartbeats))

    def _spared(self, records, now, down_time):
        """Peers not to judge by their heartbeat this cycle (recovery)."""
        if self._recovery is None:
            return frozenset()
        spared = self._recovery.spared(records, now, down_time)
        if not spared:
            self._recovery = None
            LOG.info('Recovery over: peers are judged by their heartbeats')
        return spared

    def view_fresh(self, loaded_at, down_time, stats):
        """Whether a view of the peers read at ``loaded_at`` (lease.now())
        is young enough to act on: at most ``down_time / 2`` seconds old.

        A process paused between reading the peers and writing the rows
        (SIGSTOP, a suspended machine) must not write what it decided
        before: its peers may have judged it dead meanwhile. The heartbeat
        thread may renew the lease right after the pause, before this
        check, so the lease alone does not catch it. (A VM paused by its
        hypervisor sees no time pass here: the heartbeat's database stamps
        catch that, cluster/lease.py.) False also when the heartbeat
        thread found a lapse since the view was admitted. False makes the
        next cycle rejoin.
        """
        if self._lapsed:
            # The heartbeat thread found a lapse after this view was
            # admitted: the lapse may predate the view.
            stats.skipped = 'the lease lapsed while the cycle ran'
            LOG.warning('Cycle stopped before any write: the lease lapsed '
                        'while it ran; the next cycle heartbeats and rejoins')
            return False
        age = lease.now() - loaded_at
        if age <= down_time / 2:
            return True
        self._lapsed = True
        stats.skipped = f'the view of the peers is {age:.0f} s old'
        LOG.warning('Cycle stopped before any write: the view of the peers '
                    'is %.0f s old (was the process paused?); the next cycle '
                    'heartbeats and rejoins', age)
        return False
