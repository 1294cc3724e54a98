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

"""A review of ffeebdd (an action's first read ACTION_FIRST_READ after its
call, poll()'s first_read, the polls' shared listing outside the turns).

K1 is a finding, latent (no flow polls inside a turn today), fixed on
this branch (polled_node() hears the listing as in no turn): a shared
listing joined by a thread inside a turn was remembered as an answer of
that turn, which a fence before a call that takes something trusted. The other tests pin what the
change must keep: which reads an action, a build and an allocation wait
for, a deadline shorter than the first read, thread-local answers, and
turns neither held nor given back twice by the listing. SQLite only where
a database is needed: the rules under test are in the flows.
"""

import threading
import time

import pytest

from ironic_compute import exception
from ironic_compute.instances import calls
from ironic_compute.instances import provision
from tests.unit import clocks
from tests.unit import fakes
from tests.unit import instance_cloud
from tests.unit.instance_cloud import built
from tests.unit.test_instance_actions import ask
from tests.unit.test_instance_actions import carry_out


@pytest.fixture
def clock(monkeypatch):
    return clocks.patched(monkeypatch)


@pytest.fixture
def baremetal():
    """Two nodes with an instance (so that two waits share a listing) and
    one free node."""
    return fakes.FakeBaremetal([fakes.make_node(instance_uuid=f'i-{n}')
                                for n in range(2)] + [fakes.make_node()])


@pytest.fixture
def cloud(sqlite_engine):
    """Services a and b on the fake Ironic, on SQLite only."""
    return instance_cloud.make_cloud()


def watched(baremetal):
    return sorted(u for u, n in baremetal.nodes.items() if n.instance_uuid)


def reads_by_thread(baremetal):
    """Every node read, as (the reading thread's name, the node): a
    listing of the fake reads each node it lists."""
    reads = []
    baremetal.on_node_get = lambda uuid: reads.append(
        (threading.current_thread().name, uuid))
    return reads


# --- K1: a listing joined inside a turn is not that turn's answer ------------

def test_k1_a_listing_joined_inside_a_turn_is_no_taking_fences_answer(
        baremetal, clock):
    """The shared listing is sent in no turn (ffeebdd), and may have begun
    before this thread's turn, in another thread; polled_node() remembered
    its answer with the turn of the thread that heard it. A poll made
    inside a turn then left an answer that a fence before a call taking
    something from the tenant (power off, reboot, rebuild, undeploy)
    accepts as the flow's own read of that turn, and it read nothing."""
    provisioner = provision.Provisioner(baremetal, max_requests=1)
    nodes = watched(baremetal)
    reads = reads_by_thread(baremetal)
    with provisioner.watching(nodes[0]), provisioner.watching(nodes[1]):
        with provisioner.turn('a flow'):
            assert provisioner.polled_node(nodes[0]).uuid == nodes[0]
            listed = list(reads)
            provisioner.fence_node(nodes[0], taking=True)
    assert len(listed) == 2  # the listing's own reads of the two nodes
    assert reads[len(listed):] == [('MainThread', nodes[0])], (
        'the taking fence checked the node on a shared listing')


def test_k1_a_fence_building_on_the_node_still_takes_the_listings_answer(
        baremetal, clock):
    """What the listing's answer is for: the power on after a rebuild is
    fenced on the poll that saw the deploy end (doc/instances.md,
    Fencing), in a turn or not."""
    provisioner = provision.Provisioner(baremetal, max_requests=1)
    nodes = watched(baremetal)
    with provisioner.watching(nodes[0]), provisioner.watching(nodes[1]):
        provisioner.polled_node(nodes[0])
        reads = reads_by_thread(baremetal)
        serving = provisioner.fence_node(nodes[0])
        with provisioner.turn('a flow'):
            provisioner.polled_node(nodes[1])
            reads.clear()
            provisioner.fence_node(nodes[1])
    assert reads == []
    assert serving.instance_uuid == baremetal.nodes[nodes[0]].instance_uuid


# --- the listing's answer is the polling thread's only -----------------------

def test_a_listing_started_by_one_poll_is_each_joining_polls_own_answer(
        baremetal, clock):
    """SharedRead runs the listing in the thread that starts it; each poll
    that shares it hears it in its own thread. A worker that did not poll
    (another flow's thread) reads the node anew for its fence."""
    provisioner = provision.Provisioner(baremetal)
    nodes = watched(baremetal)
    listing_began, release = threading.Event(), threading.Event()
    listed = baremetal.node_list

    def slow_listing(**kwargs):
        listing_began.set()
        release.wait(5)
        return listed(**kwargs)
    baremetal.node_list = slow_listing
    fenced = {}

    def poll_then_fence(node):
        provisioner.polled_node(node)
        before = len(reads)
        provisioner.fence_node(node)
        fenced[node] = [r for r in reads[before:]
                        if r[0] == threading.current_thread().name]
    reads = reads_by_thread(baremetal)
    with provisioner.watching(nodes[0]), provisioner.watching(nodes[1]):
        starter = threading.Thread(target=poll_then_fence, args=(nodes[0],),
                                   name='starter')
        starter.start()
        assert listing_began.wait(5)
        joiner = threading.Thread(target=poll_then_fence, args=(nodes[1],),
                                  name='joiner')
        joiner.start()
        deadline = time.perf_counter() + 5
        while provisioner._watch_read.waiting < 1:
            assert time.perf_counter() < deadline
            threading.Event().wait(0.01)
        release.set()
        starter.join(5)
        joiner.join(5)
    assert baremetal.list_calls == 1  # one listing, shared
    assert fenced == {nodes[0]: [], nodes[1]: []}
    reads.clear()
    provisioner.fence_node(nodes[1])
    assert reads == [('MainThread', nodes[1])]


# --- turns: the listing neither holds one nor gives one back -----------------

@pytest.mark.parametrize('listing_fails', [False, True])
def test_a_listing_inside_the_only_turn_leaves_the_turns_whole(
        baremetal, listing_fails):
    """A poll in a thread holding the one turn: the listing (in no turn)
    and the read on its own after a failed listing (within the thread's
    turn) neither wait for a second turn nor give one back; then another
    thread takes the turn, and a second give-back (a BoundedSemaphore
    raises ValueError) never happened."""
    provisioner = provision.Provisioner(baremetal, max_requests=1)
    nodes = watched(baremetal)
    if listing_fails:
        def down(**kwargs):
            raise exception.IronicUnavailable('listing: 503')
        baremetal.node_list = down
    got = []

    def poll_in_a_turn():
        with provisioner.turn('a flow'):
            got.append(provisioner.polled_node(nodes[0]).uuid)
            got.append(provisioner._turns.current() is not None)
    with provisioner.watching(nodes[0]), provisioner.watching(nodes[1]):
        worker = threading.Thread(target=poll_in_a_turn)
        worker.start()
        worker.join(5)
    assert not worker.is_alive() and got == [nodes[0], True]
    other = threading.Thread(target=lambda: got.append(
        provisioner.node(nodes[1]).uuid))
    other.start()
    other.join(5)
    assert not other.is_alive() and got[-1] == nodes[1]
    with pytest.raises(ValueError):
        provisioner._turns._slots.release()  # all the slots are free


# --- which read a wait counts, and when it comes -----------------------------

def test_a_wait_shorter_than_the_first_read_reads_once_at_its_deadline(
        clock):
    """first_read never pushes a read past the deadline: one read at it,
    then the wait ends as not done."""
    provisioner = provision.Provisioner(None, poll_interval=0.5)
    clock.now = 10.0
    reads = []
    with pytest.raises(exception.ProvisionError, match='x: not done'):
        provisioner.poll(lambda: reads.append(clock.now), lambda _: False,
                         0.05, 'x', interval=calls.ACTION_POLL,
                         first_read=calls.ACTION_FIRST_READ)
    assert reads == [pytest.approx(10.05)]


def test_an_allocating_allocation_is_read_as_before_first_read(
        baremetal, clock):
    """The allocation poll after a create answered "allocating" keeps the
    old wait_first: a first pause of poll_interval up to its grid, then a
    read every poll_interval on it."""
    node = next(u for u, n in baremetal.nodes.items() if not n.instance_uuid)
    made = baremetal.allocation_create
    got = baremetal.allocation_get
    reads = []

    def allocating(**kwargs):
        made(**kwargs)
        return fakes._Record(uuid=kwargs['uuid'], state='allocating',
                             node_uuid=None, last_error=None)

    def read(uuid):
        reads.append(clock.now)
        if len(reads) < 3:  # the conductor has not allocated yet
            return fakes._Record(uuid=uuid, state='allocating',
                                 node_uuid=None, last_error=None)
        return got(uuid)
    baremetal.allocation_create = allocating
    baremetal.allocation_get = read
    provisioner = provision.Provisioner(baremetal, poll_interval=0.5)
    clock.now = 10.2  # the create answered between two ticks
    spec = type('Spec', (), {'resource_class': 'baremetal', 'traits': ()})()
    done = provisioner.allocate('i-new', spec, [node], 30, lambda: None,
                                absent=True)
    assert (done.state, done.node_uuid, done.created) == ('active', node, True)
    assert reads == [pytest.approx(11.0), pytest.approx(11.5),
                     pytest.approx(12.0)]


def _recording_waits(cloud, host='a'):
    """(what, interval, first_read) of every poll of ``host``'s worker."""
    provisioner = cloud.managers[host].worker.provisioner
    waits = []
    poll = provisioner.poll

    def recorded(read, finished, timeout, what, interval=None,
                 first_read=None):
        waits.append((what, interval, first_read))
        return poll(read, finished, timeout, what, interval=interval,
                    first_read=first_read)
    provisioner.poll = recorded
    return waits


def test_a_build_keeps_the_builds_pace_and_an_action_waits_its_first_read(
        cloud):
    """A build's deploy and power on read at once, then every poll_interval
    (None: the builds' pace); the power on of an action, its power off,
    its reboot and its rebuild's deploy read first ACTION_FIRST_READ after
    the call, then every ACTION_POLL."""
    waits = _recording_waits(cloud)
    row = built(cloud)
    assert [w for w in waits if not w[0].startswith('allocation')] == [
        ('deploy', None, None), ('power on', None, None)]
    action = (calls.ACTION_POLL, calls.ACTION_FIRST_READ)
    for ask_args, what in [(('stop',), 'soft power off'),
                           (('start',), 'power on'),
                           (('reboot',), 'reboot'),
                           (('rebuild',), 'rebuild')]:
        waits.clear()
        ask(row, *ask_args)
        done = carry_out(cloud, row)
        assert (done.task_state, done.fault) == (None, None), ask_args
        assert waits == [(what, *action)], ask_args
