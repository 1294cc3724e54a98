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

"""polls.SharedRead: callers that ask at once share one read, and
each gets a read that started after it asked."""

import threading
import time

import pytest

from ironic_compute.instances import polls
from ironic_compute.instances import provision


class GatedRead:
    """A read that returns its number, each held until the test opens it."""

    def __init__(self):
        self.started = 0
        self.gates = {}
        self.lock = threading.Lock()
        self.fail = None

    def __call__(self):
        with self.lock:
            self.started += 1
            number = self.started
            gate = self.gates.setdefault(number, threading.Event())
        assert gate.wait(10), f'read {number} never opened'
        if self.fail is not None:
            raise self.fail
        return number

    def open(self, number):
        with self.lock:
            self.gates.setdefault(number, threading.Event()).set()


def until(predicate, what):
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def call_in_thread(shared, results, name):
    def run():
        try:
            results[name] = shared()
        except Exception as exc:
            results[name] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def a_read_under_way():
    """A SharedRead whose first caller's read has started, held at the gate:
    (the read, the SharedRead, the results by caller, that caller's thread)."""
    read = GatedRead()
    shared = polls.SharedRead(read)
    results = {}
    first = call_in_thread(shared, results, 'first')
    until(lambda: read.started == 1, 'the first read never started')
    return read, shared, results, first


def test_calls_one_after_the_other_each_read_afresh():
    read = GatedRead()
    read.open(1)
    read.open(2)
    shared = polls.SharedRead(read)
    assert (shared(), shared()) == (1, 2)
    assert read.started == 2


def test_callers_during_a_read_share_the_next_one_not_the_running_one():
    read, shared, results, first = a_read_under_way()
    later = [call_in_thread(shared, results, name) for name in ('b', 'c', 'd')]
    until(lambda: shared.waiting == 3, 'the later callers never waited')
    read.open(1)
    first.join(10)
    # The read that started before they asked is not theirs: one more.
    until(lambda: read.started == 2, 'the second read never started')
    read.open(2)
    for thread in later:
        thread.join(10)
    assert results == {'first': 1, 'b': 2, 'c': 2, 'd': 2}
    assert read.started == 2


def test_an_error_goes_to_every_caller_of_that_read_and_is_not_kept():
    read = GatedRead()
    shared = polls.SharedRead(read)
    read.fail = RuntimeError('Ironic is down')
    results = {}
    first = call_in_thread(shared, results, 'first')
    until(lambda: read.started == 1, 'the first read never started')
    second = call_in_thread(shared, results, 'second')
    until(lambda: shared.waiting == 1, 'the second caller never waited')
    read.open(1)
    first.join(10)
    until(lambda: read.started == 2, 'the second read never started')
    read.open(2)
    second.join(10)
    assert all(isinstance(results[n], RuntimeError) for n in ('first', 'second'))
    read.fail = None
    read.open(3)
    assert shared() == 3


def test_free_nodes_is_shared_per_group_and_resource_class():
    calls = []

    class Ironic:
        def list_nodes(self, **filters):
            calls.append(filters)
            return [filters['resource_class']]

    provisioner = provision.Provisioner(Ironic())
    assert provisioner.free_nodes('g', 'gold') == ['gold']
    assert provisioner.free_nodes('g', 'silver') == ['silver']
    assert provisioner.free_nodes(None, 'gold') == ['gold']
    assert [(c['conductor_group'], c['resource_class']) for c in calls] == [
        ('g', 'gold'), ('g', 'silver'), (None, 'gold')]
    assert all(c['provision_state'] == 'available' and c['associated'] is False
               and c['maintenance'] is False for c in calls)


@pytest.mark.parametrize('callers', [8])
def test_many_callers_at_once_all_get_an_answer(callers):
    count = [0]
    lock = threading.Lock()

    def read():
        with lock:
            count[0] += 1
            return count[0]
    shared = polls.SharedRead(read)
    results = {}
    threads = [call_in_thread(shared, results, i) for i in range(callers)]
    for thread in threads:
        thread.join(10)
    assert len(results) == callers and count[0] <= callers
    assert all(isinstance(v, int) for v in results.values())


def test_a_caller_that_needs_no_fresh_read_joins_the_running_one():
    read, shared, results, first = a_read_under_way()
    joining = threading.Thread(
        target=lambda: results.update(joined=shared(fresh=False)), daemon=True)
    joining.start()
    until(lambda: shared.waiting == 1, 'the joining caller never waited')
    read.open(1)
    first.join(10)
    joining.join(10)
    assert results == {'first': 1, 'joined': 1} and read.started == 1
    # With none running, it starts one.
    read.open(2)
    assert shared(fresh=False) == 2
