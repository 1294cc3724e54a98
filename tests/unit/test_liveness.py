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

"""cluster/liveness.py, the pure rules: may a service take new work, does
it keep its work, and when its instances are taken over. Their SQL twins
agree with them: tests/unit/db/test_liveness.py."""

from datetime import UTC
from datetime import datetime
from datetime import timedelta
from datetime import timezone

import pytest

from ironic_compute.cluster import liveness
from ironic_compute.nodes.ownership import ServiceRecord

NOW = datetime(2024, 5, 1, 12, 0, 0)  # naive UTC
DOWN_TIME = 60.0


def svc(age=0.0, **kw):
    """A service record that heartbeated ``age`` seconds before NOW."""
    kw.setdefault('last_seen_up', NOW - timedelta(seconds=age))
    return ServiceRecord(host='a', **kw)


# (record, why it takes no new work, why it lost its work, why it is idle)
STATES = [
    (svc(), None, None, None),
    (svc(disabled=True), 'disabled', None, None),
    (svc(forced_down=True), 'forced down', 'forced down', 'forced down'),
    (svc(disabled=True, forced_down=True), 'disabled', 'forced down',
     'forced down'),
    (svc(stopped=True), 'stopped', None, 'stopped'),
    (svc(last_seen_up=None), 'never reported', 'never reported',
     'never reported'),
    (svc(age=600), 'no heartbeat for 600 s', 'no heartbeat for 600 s',
     'no heartbeat for 600 s'),
    (svc(age=600, disabled=True), 'disabled', 'no heartbeat for 600 s',
     'no heartbeat for 600 s'),
    (None, 'not a registered service', 'not a registered service',
     'not a registered service'),
]


@pytest.mark.parametrize('record, down, dead, idle', STATES)
def test_the_two_questions_and_why(record, down, dead, idle):
    assert liveness.down_reason(record, NOW, DOWN_TIME) == down
    assert liveness.is_up(record, NOW, DOWN_TIME) is (down is None)
    assert liveness.dead_reason(record, NOW, DOWN_TIME) == dead
    assert liveness.is_alive(record, NOW, DOWN_TIME) is (dead is None)
    assert liveness.idle_reason(record, NOW, DOWN_TIME) == idle


def test_service_down_time_boundary():
    for question in (liveness.is_up, liveness.is_alive):
        assert question(svc(age=DOWN_TIME), NOW, DOWN_TIME)
        assert not question(svc(age=DOWN_TIME + 0.001), NOW, DOWN_TIME)


def test_naive_and_aware_datetimes_compare_as_utc():
    cest = timezone(timedelta(hours=2))
    # 14:00 CEST is 12:00 UTC: exactly NOW.
    seen = datetime(2024, 5, 1, 14, 0, 0, tzinfo=cest)
    assert liveness.is_up(svc(last_seen_up=seen), NOW, DOWN_TIME)
    aware_now = NOW.replace(tzinfo=UTC) + timedelta(seconds=DOWN_TIME + 1)
    assert not liveness.is_up(svc(), aware_now, DOWN_TIME)
    assert liveness.is_up(svc(), aware_now - timedelta(seconds=1), DOWN_TIME)


@pytest.mark.parametrize('record, due', [
    (svc(5), False),  # up
    (svc(100), False),  # down, but within the grace
    (svc(301), False),  # the grace counts from being judged down
    (svc(361), True),  # down for longer than the grace
    (svc(5, stopped=True), False),  # stopped just now: a restart, maybe
    (svc(361, stopped=True), True),  # stopped long ago
    (svc(5, forced_down=True), True),  # fenced by an operator
    (svc(5, disabled=True), False),  # disabled, heartbeating: keeps them
    (svc(361, disabled=True), True),  # disabled and dead
    (None, True),  # no services row at all
])
def test_takeover_is_due_only_after_the_grace(record, due):
    assert liveness.takeover_due(record, NOW, service_down_time=60,
                                 grace=300) is due


def test_a_grace_of_zero_never_takes_over():
    assert not liveness.takeover_due(svc(10**6), NOW, 60, grace=0)
    assert not liveness.takeover_due(None, NOW, 60, grace=0)


def test_takeover_compares_naive_and_aware_times():
    aware_now = NOW.replace(tzinfo=UTC)
    assert liveness.takeover_due(svc(361), aware_now, 60, 300)
    assert not liveness.takeover_due(svc(359), aware_now, 60, 300)


def test_half_silent_is_what_the_peers_see_of_a_service():
    assert not liveness.half_silent(svc(30), NOW, 60)
    assert liveness.half_silent(svc(31), NOW, 60)
    assert liveness.half_silent(svc(last_seen_up=None), NOW, 60)
    assert not liveness.half_silent(None, NOW, 60)
