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

"""A fence checks a node on Ironic's answer to the worker's last request
about it only while that answer is fresh, from this worker, about that
node, with no change sent since (Provisioner.fence_node)."""

import threading
import time

import pytest

from ironic_compute import exception
from ironic_compute.instances import answers
from ironic_compute.instances import calls
from ironic_compute.instances import provision
from tests.unit import clocks
from tests.unit import fakes


@pytest.fixture
def clock(monkeypatch):
    # time.monotonic only: a test here sleeps for real, for its threads.
    return clocks.patched(monkeypatch, now=100.0, sleep=False)


@pytest.fixture
def baremetal():
    return fakes.FakeBaremetal([fakes.make_node() for _ in range(2)])


@pytest.fixture
def provisioner(baremetal):
    return provision.Provisioner(baremetal)


def reads_of(baremetal):
    reads = []
    baremetal.on_node_get = reads.append
    return reads


def allocated(baremetal, instance='i-1'):
    node = sorted(baremetal.nodes)[0]
    baremetal.allocation.create(uuid=instance, name=instance,
                                resource_class='baremetal', traits=None,
                                candidate_nodes=[node])
    return node


def test_a_fresh_node_read_is_the_fences_answer(baremetal, provisioner,
                                                clock):
    node = allocated(baremetal)
    provisioner.node(node)
    reads = reads_of(baremetal)
    clock.now += calls.FENCE_ANSWER_AGE
    serving = provisioner.fence_node(node)
    assert reads == []
    assert (serving.instance_uuid, serving.allocation_uuid) == ('i-1', 'i-1')


def test_an_answer_older_than_the_age_is_read_again(baremetal, provisioner,
                                                    clock):
    node = allocated(baremetal)
    provisioner.node(node)
    baremetal.set_node(node, instance_uuid='i-2')  # changed meanwhile
    reads = reads_of(baremetal)
    clock.now += calls.FENCE_ANSWER_AGE + 0.01
    assert provisioner.fence_node(node).instance_uuid == 'i-2'
    assert reads == [node]


def test_the_age_counts_from_when_the_answer_came(baremetal, provisioner,
                                                 clock):
    """However long the request took: a fence's own read is as slow."""
    node = allocated(baremetal)
    baremetal.on_node_get = lambda uuid: setattr(clock, 'now',
                                                 clock.now + 5.0)
    provisioner.node(node)
    reads = reads_of(baremetal)
    clock.now += calls.FENCE_ANSWER_AGE
    provisioner.fence_node(node)
    assert reads == []


def test_no_answer_survives_a_change_sent_since(baremetal, provisioner,
                                                clock):
    node = allocated(baremetal)
    provisioner.node(node)
    provisioner.set_power(node, 'on', fence=lambda: None)
    reads = reads_of(baremetal)
    provisioner.fence_node(node)
    assert reads == [node]


def test_an_answer_about_another_node_is_not_this_ones(baremetal,
                                                      provisioner, clock):
    node, other = sorted(baremetal.nodes)
    provisioner.node(other)
    reads = reads_of(baremetal)
    provisioner.fence_node(node)
    assert reads == [node]


def test_another_workers_answer_is_not_this_ones(baremetal, provisioner,
                                                 clock):
    node = allocated(baremetal)
    worker = threading.Thread(target=provisioner.node, args=(node,))
    worker.start()
    worker.join()
    reads = reads_of(baremetal)
    provisioner.fence_node(node)
    assert reads == [node]


def test_an_active_allocation_says_whom_its_node_serves(baremetal,
                                                       provisioner, clock):
    """Ironic writes an allocation's node with the node's instance_uuid
    and allocation, in one transaction."""
    node = allocated(baremetal)
    assert provisioner.allocation('i-1').node_uuid == node
    reads = reads_of(baremetal)
    serving = provisioner.fence_node(node)
    assert reads == []
    assert (serving.uuid, serving.instance_uuid,
            serving.allocation_uuid) == (node, 'i-1', 'i-1')


def allocate_both(baremetal):
    nodes = sorted(baremetal.nodes)
    for number, node in enumerate(nodes, 1):
        baremetal.allocation.create(uuid=f'i-{number}', name=f'i-{number}',
                                    resource_class='baremetal', traits=None,
                                    candidate_nodes=[node])
    return nodes


def not_active(baremetal, provisioner, node):
    baremetal.allocations['i-1'] = fakes._Record(
        uuid='i-1', state='allocating', node_uuid=None, last_error=None)
    provisioner.allocation('i-1')


def gone(baremetal, provisioner, node):
    del baremetal.nodes[node]
    assert provisioner.node(node) is None


def not_found(baremetal, provisioner, node):
    del baremetal.allocations['i-1']
    assert provisioner.allocation('i-1') is None


@pytest.mark.parametrize('later_read', [not_active, gone, not_found])
def test_a_later_read_that_says_nothing_of_whom_it_serves_ends_the_answer(
        baremetal, provisioner, clock, later_read):
    """Only the answer to the worker's last request counts: an allocation
    not active, or gone, or a node gone, leave the fence nothing to
    reuse."""
    node = allocate_both(baremetal)[0]
    provisioner.node(node)
    later_read(baremetal, provisioner, node)
    reads = reads_of(baremetal)
    provisioner.fence_node(node)
    assert reads == [node]


def test_a_poll_served_from_the_shared_listing_is_the_last_answer(
        baremetal, provisioner, clock):
    """What the listing says of the node replaces an older read: a node
    listed with another instance is refused without a read of its own."""
    node, other = allocate_both(baremetal)
    provisioner.node(node)  # serves i-1
    baremetal.set_node(node, instance_uuid='i-3')
    with provisioner.watching(node), provisioner.watching(other):
        provisioner.polled_node(node)
    assert baremetal.list_calls == 1
    reads = reads_of(baremetal)
    serving = provisioner.fence_node(node)
    assert reads == [] and serving.instance_uuid == 'i-3'


def test_the_deploy_is_fenced_on_the_node_the_image_patch_returned(
        baremetal, provisioner, clock):
    node = allocated(baremetal)
    provisioner.allocation('i-1')
    checked = []

    def fence():
        checked.append(provisioner.fence_node(node))
    reads = reads_of(baremetal)
    provisioner.deploy(node, {'image_source': 'image', 'root_gb': '10'}, fence)
    assert reads == []  # the allocation's answer, then the patch's
    # The allocation's answer (whom the node serves), then the patch's (the
    # node as patched).
    assert [type(c) for c in checked] == [answers.Serving, answers.NodeState]
    assert baremetal.provision_calls == [(node, 'active')]


def test_a_patch_answer_naming_another_instance_stops_the_deploy(
        baremetal, provisioner, clock):
    node = allocated(baremetal)
    provisioner.allocation('i-1')
    patched = baremetal.node_update

    def taken_as_patched(uuid, patch):
        baremetal.set_node(uuid, instance_uuid='i-2')
        return patched(uuid, patch)
    baremetal.node_update = taken_as_patched

    def fence():
        serving = provisioner.fence_node(node)
        if serving.instance_uuid != 'i-1':
            raise exception.Fenced(f'node serves {serving.instance_uuid}')
    with pytest.raises(exception.Fenced, match='serves i-2'):
        provisioner.deploy(node, {'image_source': 'image', 'root_gb': '10'}, fence)
    assert baremetal.provision_calls == []


# --- the turn among the requests under way ---------------------------------

def test_a_change_takes_its_turn_before_its_fence(baremetal, clock):
    """No wait for a turn between the fence and the call."""
    provisioner = provision.Provisioner(baremetal, max_requests=1)
    node = allocated(baremetal)
    release, reading = threading.Event(), threading.Event()

    def slow(uuid):
        reading.set()
        release.wait(5)
    baremetal.on_node_get = slow
    under_way = threading.Thread(target=provisioner.node, args=(node,))
    under_way.start()
    assert reading.wait(5)
    fenced = []
    change = threading.Thread(target=provisioner.set_power, args=(
        node, 'on', lambda: fenced.append(release.is_set())))
    change.start()
    time.sleep(0.3)
    assert fenced == []  # waiting for its turn, not fenced yet
    release.set()
    change.join(5)
    under_way.join(5)
    assert fenced == [True] and baremetal.power_calls == [(node, 'on', False)]


def test_a_fences_own_read_goes_within_the_changes_turn(baremetal, clock):
    """The fence's node read does not wait for a second turn (with one turn
    it would wait for ever)."""
    provisioner = provision.Provisioner(baremetal, max_requests=1)
    node = allocated(baremetal)
    reads = reads_of(baremetal)
    worker = threading.Thread(target=provisioner.set_power, args=(
        node, 'on', lambda: provisioner.fence_node(node)))
    worker.start()
    worker.join(5)
    assert not worker.is_alive()
    assert reads == [node] and baremetal.power_calls == [(node, 'on', False)]


# --- a call that takes something from the node's tenant ---------------------

def test_a_taking_fence_checks_the_read_made_in_the_calls_turn(
        baremetal, provisioner, clock):
    """Before a power off, a reboot, a rebuild or an undeploy the fence
    checks the node on the flow's own read when it came in the same turn,
    within FENCE_READ_AGE: one read, not two."""
    node = allocated(baremetal)
    reads = reads_of(baremetal)
    with provisioner.turn('test'):
        provisioner.node(node)
        clock.now += calls.FENCE_READ_AGE / 2
        serving = provisioner.fence_node(node, taking=True)
    assert reads == [node]
    assert serving.instance_uuid == 'i-1'


@pytest.mark.parametrize('when', ['in an earlier turn', 'too long ago'])
def test_a_taking_fence_reads_anew_otherwise(baremetal, provisioner, clock,
                                             when):
    """A read of an earlier turn (other requests may have waited between)
    or older than FENCE_READ_AGE is not the fence's: it reads the node."""
    node = allocated(baremetal)
    reads = reads_of(baremetal)
    if when == 'in an earlier turn':
        provisioner.node(node)  # a turn of its own
        with provisioner.turn('test'):
            provisioner.fence_node(node, taking=True)
    else:
        with provisioner.turn('test'):
            provisioner.node(node)
            clock.now += calls.FENCE_READ_AGE + 0.01
            provisioner.fence_node(node, taking=True)
    assert reads == [node, node]
    # A building call's fence takes the same read (FENCE_ANSWER_AGE).
    assert provisioner.fence_node(node) is not None and reads == [node, node]
