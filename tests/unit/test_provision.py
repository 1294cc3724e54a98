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

"""The provisioning adapter's polling: soon at first, then further apart."""

import pytest

from ironic_compute.instances import provision


class Clock:
    """time.monotonic and time.sleep of a clock that only sleeping moves."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(round(seconds, 3))
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(provision.time, 'monotonic', clock.monotonic)
    monkeypatch.setattr(provision.time, 'sleep', clock.sleep)
    return clock


def test_polls_grow_apart_up_to_the_cap(clock):
    provisioner = provision.Provisioner(None, poll_interval=0.5, poll_cap=2.0)
    reads = iter(range(8))
    assert provisioner.poll(lambda: next(reads), lambda n: n == 7, 60, 'x') == 7
    assert clock.sleeps == [0.5, 0.75, 1.125, 1.688, 2.0, 2.0, 2.0]


def test_the_last_read_comes_at_the_deadline_not_after(clock):
    provisioner = provision.Provisioner(None, poll_interval=0.5, poll_cap=5.0)
    with pytest.raises(provision.ProvisionError, match='deploy: not done after 3 s'):
        provisioner.poll(lambda: 'deploying', lambda s: s == 'active', 3, 'deploy')
    assert clock.now == pytest.approx(3.0)
    assert clock.sleeps[-1] < 1.688  # cut short at the deadline
