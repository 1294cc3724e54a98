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

"""The provisioning adapter's polling: soon at first, then further apart,
on a grid; several waits read one shared listing."""

import threading
import time

import pytest

from ironic_compute import exception
from ironic_compute.instances import calls
from ironic_compute.instances import polls
from ironic_compute.instances import provision
from tests.unit import clocks
from tests.unit import fakes


@pytest.fixture
def clock(monkeypatch):
    return clocks.patched(monkeypatch)


def test_polls_grow_apart_up_to_the_cap(clock):
    provisioner = provision.Provisioner(None, poll_interval=0.5, poll_cap=2.0)
    reads = iter(range(10))
    assert provisioner.poll(lambda: next(reads), lambda n: n == 9, 60, 'x') == 9
    # Every 0.5 s for the first POLL_STEADY (2) seconds, then 0.75, 1.125,
    # 1.688, then the cap, each rounded up to the grid of poll_interval, so
    # that the polls of one moment meet.
    assert calls.POLL_STEADY == 2.0
    assert clock.sleeps == [0.5, 0.5, 0.5, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0]


def test_the_last_read_comes_at_the_deadline_not_after(clock):
    provisioner = provision.Provisioner(None, poll_interval=0.5, poll_cap=5.0)
    with pytest.raises(exception.ProvisionError, match='deploy: not done after 3 s'):
        provisioner.poll(lambda: 'deploying', lambda s: s == 'active', 3, 'deploy')
    assert clock.now == pytest.approx(3.0)
    assert clock.sleeps[-1] < 1.688  # cut short at the deadline


# --- the polls' shared listing -------------------------------------------

def counting(fake):
    """Count node reads on their own (a fence's, or a poll's)."""
    reads = []
    fake.on_node_get = reads.append
    return reads


@pytest.fixture
def baremetal():
    fake = fakes.FakeBaremetal([fakes.make_node(instance_uuid=f'i-{n}')
                                for n in range(3)]
                               + [fakes.make_node()])
    return fake


def test_one_waited_node_is_read_on_its_own(baremetal):
    provisioner = provision.Provisioner(baremetal)
    node = next(u for u, n in baremetal.nodes.items() if n.instance_uuid)
    with provisioner.watching(node):
        assert provisioner.polled_node(node).instance_uuid is not None
    assert getattr(baremetal, 'list_calls', 0) == 0


def test_several_waited_nodes_are_read_from_one_listing(baremetal):
    provisioner = provision.Provisioner(baremetal, conductor_group='')
    nodes = [u for u, n in baremetal.nodes.items() if n.instance_uuid]
    with provisioner.watching(nodes[0]), provisioner.watching(nodes[1]):
        reads = counting(baremetal)
        state = provisioner.polled_node(nodes[0])
        # The listing's reads of each node are the fake's way of making it.
        assert baremetal.list_calls == 1 and len(reads) == 3
        assert (state.uuid, state.instance_uuid) == (
            nodes[0], baremetal.nodes[nodes[0]].instance_uuid)
        assert state.provision_state == 'available'
        # A fence reads the node on its own, never from a listing.
        reads.clear()
        assert provisioner.node(nodes[1]).uuid == nodes[1]
        assert reads == [nodes[1]] and baremetal.list_calls == 1


def test_a_waited_node_missing_from_the_listing_is_read_on_its_own(baremetal):
    provisioner = provision.Provisioner(baremetal)
    free = next(u for u, n in baremetal.nodes.items() if not n.instance_uuid)
    other = next(u for u, n in baremetal.nodes.items() if n.instance_uuid)
    with provisioner.watching(free), provisioner.watching(other):
        reads = counting(baremetal)
        assert provisioner.polled_node(free).uuid == free
        assert baremetal.list_calls == 1 and reads[-1] == free


def test_no_listing_when_it_costs_more_than_reading_the_waited_nodes(
        baremetal, monkeypatch):
    provisioner = provision.Provisioner(baremetal)
    nodes = [u for u, n in baremetal.nodes.items() if n.instance_uuid]
    monkeypatch.setattr(polls, 'WATCH_NODES_PER_READ', 1)
    with provisioner.watching(nodes[0]), provisioner.watching(nodes[1]):
        provisioner.polled_node(nodes[0])  # 3 listed nodes: 2 waited
        assert baremetal.list_calls == 1
        provisioner.polled_node(nodes[0])
        assert baremetal.list_calls == 1  # read on its own now


def test_a_wait_counts_its_node_only_while_it_waits(baremetal, clock):
    provisioner = provision.Provisioner(baremetal)
    node = next(iter(baremetal.nodes))
    seen = []

    def finished(state):
        seen.append(dict(provisioner._watched))
        return True
    provisioner.poll_node(node, finished, 10, 'x')
    assert seen == [{node: 1}] and not provisioner._watched


def test_polls_wake_on_the_grid_of_the_poll_interval(clock):
    provisioner = provision.Provisioner(None, poll_interval=0.5, poll_cap=5.0)
    clock.now = 0.3  # a poll that began between two ticks
    reads = iter(range(3))
    provisioner.poll(lambda: next(reads), lambda n: n == 2, 60, 'x')
    assert clock.now == pytest.approx(1.5)  # 0.3 -> 1.0 -> 1.5


def test_an_actions_first_read_comes_a_tick_after_its_call(clock):
    # Ironic records a power action's target before it answers the call, so
    # a read at once finds it begun: the first read comes ACTION_FIRST_READ
    # later, on its grid (where the first reads of the calls of that moment
    # meet), then every ACTION_POLL on that same grid (not rounded up to a
    # grid of ACTION_POLL: 10.6, 10.8).
    provisioner = provision.Provisioner(None, poll_interval=0.5, poll_cap=5.0)
    clock.now = 10.13  # the call was answered between two ticks
    reads = []
    provisioner.poll(lambda: reads.append(clock.now) or len(reads),
                     lambda n: n == 3, 60, 'x', interval=calls.ACTION_POLL,
                     first_read=calls.ACTION_FIRST_READ)
    assert calls.ACTION_FIRST_READ == 0.1 and calls.ACTION_POLL == 0.2
    assert reads == [pytest.approx(10.3), pytest.approx(10.5),
                     pytest.approx(10.7)]
    clock.now, reads[:] = 20.0, []  # on a tick: the next one, not at once
    provisioner.poll(lambda: reads.append(clock.now) or len(reads),
                     lambda n: n == 1, 60, 'x', interval=calls.ACTION_POLL,
                     first_read=calls.ACTION_FIRST_READ)
    assert reads == [pytest.approx(20.1)]


def test_an_actions_power_wait_reads_nothing_at_once(baremetal, clock):
    # wait_for_power() as the actions call it: no read before
    # ACTION_FIRST_READ, and only a read that began after the wait counts.
    provisioner = provision.Provisioner(baremetal)
    node = next(u for u, n in baremetal.nodes.items() if n.instance_uuid)
    read_at = []
    baremetal.on_node_get = lambda uuid: read_at.append((uuid, clock.now))
    state = provisioner.wait_for_power(node, 'power off', 10, 'power off',
                                       calls.ACTION_POLL,
                                       calls.ACTION_FIRST_READ)
    assert state.power_state == 'power off'
    assert read_at == [(node, pytest.approx(0.1))]


def test_a_failed_listing_falls_back_to_reading_the_node(baremetal):
    provisioner = provision.Provisioner(baremetal)
    nodes = [u for u, n in baremetal.nodes.items() if n.instance_uuid]

    def refused(**kwargs):
        raise RuntimeError('HTTP 500')
    baremetal.node_list = refused
    with provisioner.watching(nodes[0]), provisioner.watching(nodes[1]):
        reads = counting(baremetal)
        assert provisioner.polled_node(nodes[0]).uuid == nodes[0]
        assert reads == [nodes[0]]


def test_an_allocation_ironic_says_is_allocating_is_read_after_a_pause(
        baremetal, clock):
    """Ironic answers the create with "allocating": no read at once."""
    node = next(u for u, n in baremetal.nodes.items() if not n.instance_uuid)
    made = baremetal.allocation_create
    gets = []

    def allocating(**kwargs):
        made(**kwargs)
        return fakes._Record(uuid=kwargs['uuid'], state='allocating',
                             node_uuid=None, last_error=None)
    baremetal.allocation_create = allocating
    got = baremetal.allocation_get

    def counted(uuid):
        gets.append(clock.now)
        return got(uuid)
    baremetal.allocation_get = counted
    provisioner = provision.Provisioner(baremetal, poll_interval=0.5)
    spec = type('Spec', (), {'resource_class': 'baremetal', 'traits': ()})()
    allocation = provisioner.allocate('i-new', spec, [node], 30, lambda: None,
                                      absent=True)
    assert (allocation.state, allocation.node_uuid) == ('active', node)
    assert gets == [0.5]  # one read, one poll interval after the create


def test_an_allocation_found_made_is_read_at_once(baremetal, clock):
    node = next(u for u, n in baremetal.nodes.items() if not n.instance_uuid)
    provisioner = provision.Provisioner(baremetal, poll_interval=0.5)
    spec = type('Spec', (), {'resource_class': 'baremetal', 'traits': ()})()
    provisioner.allocate('i-new', spec, [node], 30, lambda: None)
    assert clock.sleeps == []


# --- requests under way at once --------------------------------------------

def test_no_more_requests_under_way_than_allowed(baremetal):
    """max_concurrent_ironic_requests: the others wait their turn here."""
    provisioner = provision.Provisioner(baremetal, max_requests=2)
    nodes = sorted(baremetal.nodes)
    lock = threading.Lock()
    inside, most = [0], [0]
    release = threading.Event()

    def slow_read(uuid):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        release.wait(5)
        with lock:
            inside[0] -= 1
    baremetal.on_node_get = slow_read
    workers = [threading.Thread(target=provisioner.node, args=(n,))
               for n in nodes]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 5
    while inside[0] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # a third request, were it let through, would be in
    assert inside[0] == 2
    release.set()
    for worker in workers:
        worker.join(5)
    assert most[0] == 2 and inside[0] == 0


def test_waiting_for_a_turn_ends_when_the_service_stops(baremetal):
    """Against a hung Ironic each request under way may take [ironic]timeout:
    a stop does not wait for every queued request to take its own."""
    stopping = threading.Event()
    provisioner = provision.Provisioner(baremetal, stopping=stopping,
                                        max_requests=1)
    node = sorted(baremetal.nodes)[0]
    release = threading.Event()
    baremetal.on_node_get = lambda uuid: release.wait(5)
    under_way = threading.Thread(target=provisioner.node, args=(node,))
    under_way.start()
    outcome = []

    def queued():
        try:
            provisioner.node(node)
        except exception.Stopped as exc:
            outcome.append(exc)
    waiter = threading.Thread(target=queued)
    waiter.start()
    time.sleep(0.1)
    stopping.set()
    waiter.join(2)
    assert not waiter.is_alive() and len(outcome) == 1
    release.set()
    under_way.join(5)


@pytest.mark.parametrize('prompt', [True, False])
def test_the_polls_shared_listing_waits_for_no_turn_while_an_action_waits(
        baremetal, prompt):
    """Every turn is held (a burst's reads and calls). While an instance
    action waits on a node (``prompt``), the polls' one listing still goes
    and the waits it ends end; builds' polls alone wait for a turn."""
    provisioner = provision.Provisioner(baremetal, max_requests=1)
    watched = [u for u, n in baremetal.nodes.items() if n.instance_uuid][:2]
    listings, got = [], []
    list_nodes = baremetal.node_list

    def listed(**kwargs):
        listings.append(kwargs)
        return list_nodes(**kwargs)
    baremetal.node_list = listed

    def poll():
        with provisioner.watching(watched[0], prompt=prompt), \
                provisioner.watching(watched[1]):
            got.append(provisioner.polled_node(watched[0]))
    poller = threading.Thread(target=poll)
    with provisioner.turn('a burst call'):  # the only turn, held here
        poller.start()
        poller.join(0.5 if not prompt else 2)
        assert poller.is_alive() is not prompt  # done while the turn is held?
    poller.join(5)
    assert [state.uuid for state in got] == [watched[0]]
    assert len(listings) == 1 and listings[0]['associated'] is True


def test_an_actions_wait_is_a_prompt_one_and_a_builds_is_not(baremetal):
    provisioner = provision.Provisioner(baremetal)
    node = next(u for u, n in baremetal.nodes.items() if n.instance_uuid)
    prompt_waits = []

    def finished(state):
        prompt_waits.append(provisioner._prompt_waits)
        return True
    provisioner.poll_node(node, finished, 10, 'an action', calls.ACTION_POLL)
    provisioner.poll_node(node, finished, 10, 'a build')
    assert prompt_waits == [1, 0] and provisioner._prompt_waits == 0
