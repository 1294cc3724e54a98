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

"""A fake clock for the unit tests: time stands still unless a test moves
it (``clock.now = ...``) or the code under test sleeps on it."""

import time


class Clock:
    """time.monotonic and time.sleep of a clock that only sleeping moves.

    Also callable, for the code that takes its clock as an argument
    (``clock=time.monotonic``). ``sleeps`` lists every sleep, rounded to
    the millisecond.
    """

    def __init__(self, now=0.0):
        self.now = now
        self.sleeps = []

    def monotonic(self):
        return self.now

    __call__ = monotonic

    def sleep(self, seconds):
        self.sleeps.append(round(seconds, 3))
        self.now += seconds


def patched(monkeypatch, now=0.0, sleep=True):
    """A Clock that time.monotonic reads and, with ``sleep``, time.sleep
    moves: for a test module's ``clock`` fixture (a fixture imported by
    name would be redefined by every test that takes it, ruff F811)."""
    clock = Clock(now)
    monkeypatch.setattr(time, 'monotonic', clock.monotonic)
    if sleep:
        monkeypatch.setattr(time, 'sleep', clock.sleep)
    return clock
