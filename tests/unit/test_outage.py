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

"""An outage: one line per failure saying since when, then how long."""

import logging

from ironic_compute import outage


def test_a_failing_streak_says_since_when_and_ends_once(monkeypatch, caplog):
    clock = [100.0]
    monkeypatch.setattr(outage.time, 'monotonic', lambda: clock[0])
    database = outage.Outage('The database')
    assert database.ended() == 0.0  # nothing failed: nothing to say
    first = database.failed(OSError('connection\n  refused'))
    assert first.endswith(' UTC (0 s): connection refused')
    since = database.since
    clock[0] = 142.4
    second = database.failed(OSError('x' * 400))
    assert database.since == since and ' UTC (42 s): ' in second
    assert second.endswith('x...') and len(second.split(': ', 1)[1]) == 300
    log = logging.getLogger('test-outage')
    with caplog.at_level(logging.WARNING, logger='test-outage'):
        assert round(database.ended(log), 6) == 42.4
    assert caplog.messages == ['The database reachable again after 42 s']
    assert database.since is None and database.seconds == 0.0


def test_an_error_without_text_is_named_by_its_class():
    assert outage.Outage('Ironic').failed(TimeoutError()).endswith(
        ': TimeoutError')
