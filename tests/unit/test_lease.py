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
margin ago, and the database does not say the service is fenced."""

from ironic_compute.cluster import lease


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def make(margin=3.0):
    clock = Clock()
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
    except lease.LeaseLost as exc:
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
    clock = Clock()
    held = lease.Lease(lambda: margin[0], clock=clock)
    held.renewed(100.0)
    clock.now = 102.0
    assert held.valid
    margin[0] = 1.0  # service_down_time lowered by SIGHUP
    assert not held.valid
