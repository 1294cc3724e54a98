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

"""The lease: valid while the last good heartbeat was sent less than the
margin ago, on a clock that counts suspended time, and the database does
not say the service is fenced."""

import datetime
import time

import pytest

from ironic_compute import exception
from ironic_compute.cluster import lease
from tests.unit import clocks


def make(margin=3.0):
    clock = clocks.Clock(now=100.0)
    return lease.Lease(lambda: margin, clock=clock), clock


def test_a_lease_never_renewed_is_not_valid():
    held, _ = make()
    assert held.problem() == 'the service has not heartbeated yet'
    assert not held.valid


def test_valid_until_the_margin_counted_from_when_the_heartbeat_was_sent():
    held, clock = make(margin=3.0)
    held.renewed(99.0)  # sent at 99, answered at 100
    assert held.valid
    clock.now = 101.9
    assert held.valid
    clock.now = 102.0
    assert held.problem() == ('the last good heartbeat was sent 3.0 s ago '
                              '(the lease lasts 3 s)')
    try:
        held.check()
    except exception.LeaseLost as exc:
        assert 'sent 3.0 s ago' in str(exc)
    else:
        raise AssertionError('check() passed on a lapsed lease')


def test_an_older_heartbeat_answered_late_keeps_the_newer_one():
    held, clock = make()
    held.renewed(100.0)
    held.renewed(98.0)
    clock.now = 102.5
    assert held.valid
    clock.now = 103.0
    assert not held.valid


def test_forced_down_or_gone_ends_it_whatever_the_heartbeats():
    held, _ = make()
    held.renewed(100.0, forced_down=True)
    assert held.problem() == 'the service is forced down'
    held.renewed(100.0, gone=True)
    assert held.problem().startswith('the service has no services row')
    held.renewed(100.0)
    assert held.valid


def test_the_margin_is_read_at_each_check():
    margin = [3.0]
    clock = clocks.Clock(now=100.0)
    held = lease.Lease(lambda: margin[0], clock=clock)
    held.renewed(100.0)
    clock.now = 102.0
    assert held.valid
    margin[0] = 1.0  # service_down_time lowered by SIGHUP
    assert not held.valid


class Machine:
    """The clocks of a machine that can be suspended (or a VM paused):
    CLOCK_BOOTTIME runs on while it sleeps, the monotonic clock stands
    still (so does a paused QEMU guest's kvmclock)."""

    CLOCK_BOOTTIME = time.CLOCK_BOOTTIME

    def __init__(self):
        self.boottime = self.awake = 1000.0

    def run(self, seconds):
        self.boottime += seconds
        self.awake += seconds

    def suspend(self, seconds):
        self.boottime += seconds

    def clock_gettime(self, clock_id):
        assert clock_id == time.CLOCK_BOOTTIME
        return self.boottime

    def monotonic(self):
        return self.awake


@pytest.fixture
def machine(monkeypatch):
    clocks = Machine()
    monkeypatch.setattr(lease, 'time', clocks)
    return clocks


def test_the_lease_lapses_across_a_suspend(machine):
    held = lease.Lease(lambda: 30.0)  # on its own clock, lease.now
    on_monotonic = lease.Lease(lambda: 30.0, clock=machine.monotonic)
    assert held.renewed(lease.now()) is None  # the first: nothing before
    on_monotonic.renewed(machine.monotonic())
    machine.run(10)
    assert held.valid and on_monotonic.valid
    machine.suspend(40)  # the peers' clock (the database's) ran on
    assert held.problem() == ('the last good heartbeat was sent 50.0 s ago '
                              '(the lease lasts 30 s)')
    # What a monotonic lease would have said: valid, while the peers may
    # already count this service's silence.
    assert on_monotonic.valid
    # The first heartbeat after waking renews it and says it had lapsed
    # (the service then rejoins, daemon/service.py).
    assert held.renewed(lease.now()) == 50.0
    assert held.valid
    machine.run(10)
    assert held.renewed(lease.now()) is None


def test_a_pause_no_local_clock_sees_shows_in_the_database_stamps(machine):
    # QEMU stop/cont: the guest's clocks, BOOTTIME included, stand still;
    # the database's clock, which stamps the heartbeats, runs on.
    held = lease.Lease(lambda: 30.0)
    t0 = datetime.datetime(2026, 11, 28, 12, 0, 0)
    assert held.renewed(lease.now(), stamped=t0) is None
    machine.run(10)
    assert held.renewed(lease.now(), stamped=t0 + datetime.timedelta(
        seconds=10)) is None
    machine.run(10)  # paused 300 s in between, unseen here
    assert held.renewed(lease.now(), stamped=t0 + datetime.timedelta(
        seconds=320)) == 310.0
    # A stamp older than the newest (an answer that came late) is kept out.
    assert held.renewed(lease.now(), stamped=t0) is None
    machine.run(10)
    assert held.renewed(lease.now(), stamped=t0 + datetime.timedelta(
        seconds=330)) is None


def test_the_lease_clock_falls_back_to_monotonic_without_boottime(
        machine, monkeypatch):
    assert lease.now() == machine.boottime
    monkeypatch.setattr(lease, '_BOOTTIME', None)
    machine.suspend(40)
    assert lease.now() == machine.awake == 1000.0


def test_the_margin_is_half_of_service_down_time():
    assert lease.margin_for(60) == 30
