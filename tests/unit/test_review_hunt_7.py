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

"""A review of 49a4da5 and 1093d99 (a lapse is flagged inside the
heartbeat's transaction, before its commit; view_fresh refuses a view
once a lapse was flagged after admission).

H1 (fixed with this file): MembershipGate._rejoin cleared ``_lapsed``
*after* its own heartbeat committed, so a lapse the heartbeat thread
flagged in between was lost; after a pause in that window the next cycle
believed the peers saw it up (they cycled after the rejoin's stamp, while
it was paused and judged down) and took rows back. It is cleared before
the heartbeat now.
H2 (fixed, older than the change): the lease that Service.register
renewed had no database stamp, so a hypervisor's pause before the first
heartbeat was not flagged, and the cycle that read the first heartbeat's
stamp took rows back. The first renewal now comes from a heartbeat.
The other tests pin what was checked and found sound: the writer's retry
calls before_commit twice (idempotent, one rejoin), a commit failing
after the flag (a rejoin that was due anyway, bounded), a rejoin that the
heartbeat thread flags again (twice at most, then the cycle acts),
view_fresh's refusal (no wedge: the next cycle rejoins; pinned in
test_recovery.py), and the lease's
arithmetic moved into Lease._lapse (lapse() is pure and agrees with
renewed()).
"""

import datetime
import time
import types

import pytest
from oslo_db import exception as db_exc

from ironic_compute.cluster import lease
from ironic_compute.daemon import heartbeat
from ironic_compute.daemon import watchdog
from ironic_compute.db import services as db_services
from ironic_compute.nodes import gate
from tests.unit.db_rows import live_nodes
from tests.unit.test_recovery import DOWN_TIME
from tests.unit.test_recovery import OneBeat
from tests.unit.test_recovery import ctx
from tests.unit.test_recovery import settled_cluster


@pytest.fixture
def cluster(migrated_engine):
    return settled_cluster(migrated_engine)


def clock_lapsed_heartbeat(cluster, host='a'):
    """A Heartbeat of ``host`` (one beat) whose lease lapsed on its clock
    (SIGSTOP, a suspend), and that clock."""
    clock = [0.0]
    the_lease = lease.Lease(lambda: DOWN_TIME / 2, clock=lambda: clock[0])
    the_lease.renewed(0.0, stamped=db_services.load_services(ctx()).now)
    clock[0] = 10.0
    beat = heartbeat.Heartbeat(types.SimpleNamespace(report_interval=1),
                               the_lease, watchdog.Loops(60), OneBeat())
    beat.service_id = cluster.ids[host]
    beat.tracker = cluster.trackers[host]
    return beat, the_lease, clock


def count_flags(monkeypatch, tracker):
    flags = []
    lapsed = tracker.lease_lapsed

    def counted():
        flags.append(1)
        lapsed()

    monkeypatch.setattr(tracker, 'lease_lapsed', counted)
    return flags


def test_h1_a_lapse_flagged_after_the_rejoin_heartbeat_is_not_lost(
        migrated_engine, cluster, monkeypatch):
    # H1 (finding, medium): gate._rejoin reads _lapsed (in admit), then
    # heartbeats (commit), then sets _lapsed = False. A lapse the heartbeat
    # thread flags after that commit and before the clear (here: a is
    # paused, SIGSTOP or a stall of the commit, for longer than
    # service_down_time right after the rejoin's heartbeat) is
    # overwritten. The peers cycled during the pause, after the rejoin's
    # stamp, with a judged down: _seen_by_peers counts them as having seen
    # a up, so the next cycle takes a's rows back from peers that last saw
    # it down (the CI failure's pattern). Clearing _lapsed before the
    # rejoin's heartbeat (and setting it again if that heartbeat fails)
    # keeps the second lapse, and the next cycle rejoins again.
    a = cluster.trackers['a']
    a.lease_lapsed()  # the heartbeat thread found a first lapse
    real_heartbeat = db_services.heartbeat
    paused = []

    def paused_after_the_rejoin_heartbeat(ctx_, service_id):
        stamped = real_heartbeat(ctx_, service_id)
        if not paused:
            paused.append(stamped)
            # a is paused right after the rejoin's heartbeat committed.
            time.sleep(DOWN_TIME + 0.3)
            # Meanwhile b and c judge a down and take its rows.
            for host in ('b', 'c'):
                real_heartbeat(ctx(), cluster.ids[host])
            assert cluster.cycle('b').skipped is None
            assert cluster.cycle('c').skipped is None
            # a resumes: its heartbeat thread flags the new lapse before it
            # commits its fresh stamp; then the rejoin goes on.
            a.lease_lapsed()
            real_heartbeat(ctx(), cluster.ids['a'])
        return stamped

    monkeypatch.setattr(gate.db_services, 'heartbeat',
                        paused_after_the_rejoin_heartbeat)
    assert cluster.cycle('a').skipped.startswith('rejoining')
    monkeypatch.setattr(gate.db_services, 'heartbeat', real_heartbeat)
    taken = live_nodes(migrated_engine)
    assert 'a' not in taken.values()  # the peers took a's rows
    # b and c have not run a cycle since a's fresh heartbeat: a must not
    # take anything back yet.
    stats = cluster.cycle('a')
    assert live_nodes(migrated_engine) == taken, stats
    assert stats.skipped is not None and stats.skipped.startswith(
        'rejoining'), stats


def test_the_writer_retry_calls_before_commit_twice_and_rejoins_once(
        migrated_engine, cluster, monkeypatch):
    # Checked, sound: a deadlock after the flag makes @db_api.writer run
    # heartbeat_state again, and before_commit with it. The flag is only
    # set (idempotent), the lease is not renewed by the failed attempt, so
    # the second check finds the lapse too; ``told`` holds both and the
    # renewal does not flag a third time. The cycle rejoins once.
    before = live_nodes(migrated_engine)
    beat, the_lease, _ = clock_lapsed_heartbeat(cluster)
    a = cluster.trackers['a']
    flags = count_flags(monkeypatch, a)
    checks = []
    check = heartbeat.Heartbeat._lapse_before_commit

    def then_a_deadlock(self, the_beat):
        told = check(self, the_beat)
        checks.append(told)
        if len(checks) == 1:
            raise db_exc.DBDeadlock()
        return told

    monkeypatch.setattr(heartbeat.Heartbeat, '_lapse_before_commit',
                        then_a_deadlock)
    beat.heartbeat_loop()
    assert checks == [True, True]
    assert len(flags) == 2  # once per attempt, none after the commit
    assert the_lease.valid
    assert cluster.cycle('a').skipped.startswith('rejoining')
    assert a.gate._lapsed is False
    assert cluster.seen_up_again('a').skipped is None
    assert live_nodes(migrated_engine) == before


def test_a_commit_failing_after_the_flag_rejoins_at_most_twice(
        migrated_engine, cluster, monkeypatch):
    # Checked, sound: the heartbeat fails after before_commit flagged the
    # lapse. The lapse was real (the check reads the lease, it does not
    # guess), so the rejoin is not spurious. The rejoin's own heartbeat
    # does not renew the lease, so the thread's next good beat finds the
    # same lapse and flags again: a second rejoin, a delay, then the lease
    # is renewed and no beat flags; no loop.
    before = live_nodes(migrated_engine)
    beat, the_lease, clock = clock_lapsed_heartbeat(cluster)
    a = cluster.trackers['a']
    flags = count_flags(monkeypatch, a)
    check = heartbeat.Heartbeat._lapse_before_commit
    failing = [True]

    def then_the_commit_fails(self, the_beat):
        told = check(self, the_beat)
        if failing:
            raise db_exc.DBConnectionError()
        return told

    monkeypatch.setattr(heartbeat.Heartbeat, '_lapse_before_commit',
                        then_the_commit_fails)
    beat.heartbeat_loop()
    assert len(flags) == 1 and not the_lease.valid
    assert cluster.cycle('a').skipped.startswith('rejoining')
    # The thread's next beat succeeds: the same lapse, flagged again.
    failing.clear()
    beat._stopping = OneBeat()
    beat.heartbeat_loop()
    assert len(flags) == 2 and the_lease.valid
    assert cluster.cycle('a').skipped.startswith('rejoining')
    # A beat within the lease flags nothing; the peers see a; a acts.
    clock[0] += 0.1
    beat._stopping = OneBeat()
    beat.heartbeat_loop()
    assert len(flags) == 2
    assert cluster.seen_up_again('a').skipped is None
    assert live_nodes(migrated_engine) == before


def test_a_rejoin_before_the_heartbeat_thread_beats_rejoins_twice_at_most(
        migrated_engine, cluster, monkeypatch):
    # Checked, sound (a harmless delay): after a hypervisor's pause the
    # cycle may run first, see its own stamp old (half_silent) and rejoin;
    # the thread's first beat then finds the lapse in the stamps (the
    # rejoin's heartbeat renews no lease) and flags it: the next cycle
    # rejoins again. Once renewed, the lease flags nothing more.
    before = live_nodes(migrated_engine)
    cluster.paused('a', migrated_engine)  # the database's clock ran on
    a = cluster.trackers['a']
    flags = count_flags(monkeypatch, a)
    clock = [0.0]  # the guest's clocks did not move
    the_lease = lease.Lease(lambda: DOWN_TIME / 2, clock=lambda: clock[0])
    the_lease.renewed(0.0, stamped=db_services.load_services(ctx()).now
                      - datetime.timedelta(seconds=60))
    beat = heartbeat.Heartbeat(types.SimpleNamespace(report_interval=1),
                               the_lease, watchdog.Loops(60), OneBeat())
    beat.service_id, beat.tracker = cluster.ids['a'], a
    assert cluster.cycle('a').skipped.startswith('rejoining')  # half silent
    beat.heartbeat_loop()
    assert len(flags) == 1
    assert cluster.cycle('a').skipped.startswith('rejoining')  # flagged
    beat._stopping = OneBeat()
    beat.heartbeat_loop()
    assert len(flags) == 1
    assert cluster.seen_up_again('a').skipped is None
    cluster.settle()
    assert live_nodes(migrated_engine) == before


@pytest.mark.parametrize('clock_gap, stamp_gap', [
    (0.4, 0.4), (1.0, 0.0), (0.0, 1.0), (0.99, 0.2), (0.2, 5.0), (3.0, 3.0)])
def test_lapse_is_pure_and_agrees_with_renewed(clock_gap, stamp_gap):
    # Checked, sound: Lease._lapse is the old gap arithmetic unchanged
    # (the larger of the clock's and the stamps' gaps, from margin on);
    # lapse() changes nothing and says what renewed() then returns.
    margin = 1.0
    clock = [100.0]
    the_lease = lease.Lease(lambda: margin, clock=lambda: clock[0])
    first = datetime.datetime(2026, 1, 1)
    assert the_lease.lapse(stamped=first) is None  # nothing to lapse from
    assert the_lease.renewed(100.0, stamped=first) is None
    clock[0] += clock_gap
    stamped = first + datetime.timedelta(seconds=stamp_gap)
    gap = max(clock_gap, stamp_gap)
    expected = gap if gap >= margin else None
    problem = the_lease.problem()
    assert the_lease.lapse(stamped=stamped) == pytest.approx(expected)
    assert the_lease.lapse(stamped=stamped) == pytest.approx(expected)
    assert the_lease.problem() == problem  # nothing renewed
    assert the_lease.renewed(clock[0], stamped=stamped) == pytest.approx(
        expected)
    assert the_lease.lapse(stamped=stamped) is None


def test_h2_a_hypervisor_pause_before_the_first_heartbeat_is_seen(
        migrated_engine, cluster, monkeypatch):
    # H2 (finding, low; older than this change, a window it left open):
    # Service.register renewed the lease with no ``stamped``, so
    # Lease._stamped was None until the first heartbeat, and that
    # heartbeat's check before the commit compared no stamps. A KVM guest
    # paused by its hypervisor within the first report_interval after
    # start (its clocks held still) resumed, its heartbeat thread
    # committed a fresh stamp with no lapse flagged, and a cycle that read
    # that stamp took its rows back from peers that judged it down during
    # the pause. Service.register now renews the lease from a heartbeat,
    # with its stamp (test_service.py pins that register does).
    registered = db_services.heartbeat_state(ctx(), cluster.ids['a'])
    # The pause: the database's clock ran on.
    taken = cluster.paused('a', migrated_engine)
    clock = [0.0]  # the guest's clocks did not move
    the_lease = lease.Lease(lambda: DOWN_TIME / 2, clock=lambda: clock[0])
    # As Service.register leaves it, 60 s before now on the database's
    # clock: the pause below.
    the_lease.renewed(0.0, stamped=registered.now
                      - datetime.timedelta(seconds=60))
    beat = heartbeat.Heartbeat(types.SimpleNamespace(report_interval=1),
                               the_lease, watchdog.Loops(60), OneBeat())
    beat.service_id, beat.tracker = cluster.ids['a'], cluster.trackers['a']
    beat.heartbeat_loop()  # the first heartbeat after start
    stats = cluster.cycle('a')
    assert live_nodes(migrated_engine) == taken, stats
    assert stats.skipped is not None and stats.skipped.startswith(
        'rejoining'), stats
