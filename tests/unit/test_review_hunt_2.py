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

"""Findings of a review of 2fd92f0 (an action sends fewer requests: one
turn for the read and the call, send_once(), the taking fence on the
flow's own read). Each test reproduces one finding (G1...), marked
xfail(strict=True) until it is fixed. Fixed on this branch: G1 (send_once()
records the refusal itself), G2 (_change() sets its turn aside while a
lost answer settles), G3 (power_on() takes a turn only to read). SQLite
only: the rules under test are in the flows, not in SQL.
"""

import threading
import time

import pytest
from ironicclient import exc as ironic_exc

from ironic_compute.instances import calls
from tests.unit import instance_cloud
from tests.unit.instance_cloud import built
from tests.unit.test_exactly_once import behind_the_adapter
from tests.unit.test_instance_actions import ask
from tests.unit.test_instance_actions import carry_out


@pytest.fixture
def cloud(sqlite_engine):
    """Services a and b on the fake Ironic, on SQLite only."""
    return instance_cloud.make_cloud()


# --- G1: a refused call leaves the action stuck, and sent again forever ----

@pytest.mark.parametrize('action', ['reboot', 'rebuild'])
def test_g1_an_action_ironic_refuses_ends_with_a_fault(cloud, action):
    """send_once() records the mark (the row's version moves) and then
    sends; when Ironic refuses the call (a 400: the driver cannot reboot,
    the node cannot be rebuilt from where it is), send_once() raises the
    ProvisionError before it returns the new row. reboot()/rebuild() then
    call action_failed() with the row as it was BEFORE the mark's write:
    its version-conditional write matches nothing, the fault is lost, the
    task stays and the flow returns True. The poller hands the row again at
    the next poll: a new mark, the refused call again, forever (before
    2fd92f0 note_mark() returned the row before anything was sent)."""
    row = built(cloud)
    if action == 'reboot':
        def refused(uuid, state, soft=False, timeout=None):
            raise ironic_exc.BadRequest(f'node {uuid} cannot {state}')
        cloud.ironic.node_set_power_state = refused
        ask(row, 'reboot', hard=True)
    else:
        def refused(uuid, target):
            raise ironic_exc.BadRequest(f'node {uuid} cannot {target}')
        cloud.ironic.node_set_provision_state = refused
        ask(row, 'rebuild')
    done = carry_out(cloud, row)
    assert done.task_state is None and done.fault, (
        f'task {done.task_state}, fault {done.fault!r}: the refusal was '
        'not recorded, and the poller sends the call again')


# --- G2: a lost answer holds a turn for the whole settle window -------------

def test_g2_a_lost_answer_does_not_hold_a_turn_while_it_settles(cloud):
    """send_once() holds one turn across its read, the mark's write and the
    call, and _change()'s read-and-decide after a lost answer runs inside
    it: the worker sleeps between its reads for up to lost_answer_settle
    (60 s), then sends again and waits for that answer, all in the turn.
    With max_concurrent_ironic_requests turns (2 by default; 1 here), as
    many lost answers, exactly when Ironic is slow, stop every other
    request of the service's workers (builds' polls, deletes, the sync's
    power calls) for a minute or more. Before 2fd92f0 each read of the
    settle took a turn of its own: another worker waited one read."""
    row = built(cloud)
    ask(row, 'reboot', hard=True)
    client = behind_the_adapter(cloud, lose={'node.set_power_state'},
                                taken=False)  # Ironic never got it
    provisioner = cloud.managers['a'].provisioner
    provisioner.lost_answer_settle = 1.5
    provisioner._turns = calls.Turns(1)
    worker = threading.Thread(target=carry_out, args=(cloud, row),
                              daemon=True)
    worker.start()
    deadline = time.monotonic() + 5
    while 'node.set_power_state' not in client.attempts:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)  # the reboot's worker settles, reading the node
    started = time.monotonic()
    provisioner.node(row.node)  # another worker's read (a build's poll)
    waited = time.monotonic() - started
    worker.join(10)
    assert not worker.is_alive()
    assert waited < 0.5, (
        f'another worker waited {waited:.1f} s for a turn while the '
        'reboot\'s lost answer settled')


def _take_and_leave(turns):
    with turns.take('other'):
        return turns.current() is not None


def test_g2_a_turn_set_aside_is_taken_again_as_a_new_turn():
    """Turns.set_aside(): the slot is the others' meanwhile; on the way out
    the thread is inside a turn again, with a new number (a taking fence
    then reads the node anew); outside any turn it changes nothing."""
    turns = calls.Turns(1)
    with turns.set_aside('test'):
        assert turns.current() is None
    with turns.take('test'):
        first = turns.current()
        with turns.set_aside('test'):
            assert turns.current() is None
            took = []
            other = threading.Thread(target=lambda: took.append(
                _take_and_leave(turns)))
            other.start()
            other.join(5)
            assert took == [True]  # the others' meanwhile
        assert turns.current() not in (None, first)
    assert turns.current() is None


def test_g2_a_stop_while_a_turn_is_set_aside_gives_back_nothing_twice():
    """When the service stops before the set-aside turn is taken again,
    Stopped is raised and the turn, not held, is not given back again (a
    BoundedSemaphore would raise ValueError, and the count would drift)."""
    from ironic_compute import exception
    stopping = threading.Event()
    turns = calls.Turns(1, stopping)
    with pytest.raises(exception.Stopped):
        with turns.take('test'):
            with turns.set_aside('test'):
                held = threading.Event()
                release = threading.Event()

                def hold():
                    with turns.take('other'):
                        held.set()
                        release.wait(5)
                other = threading.Thread(target=hold)
                other.start()
                assert held.wait(5)
                stopping.set()
    release.set()
    other.join(5)
    stopping.clear()
    with turns.take('again'):  # one slot, free again
        assert turns.current() is not None


# --- G3: a power on with nothing to send waits for a turn --------------------

def test_g3_a_rebuild_that_ended_on_does_not_wait_for_a_turn(cloud):
    """power_on() takes a turn before it looks at the state it was given:
    the rebuild hands it the read that saw the deploy end, and a node on
    needs nothing sent, but the rebuild still waits for one of the
    max_concurrent_ironic_requests turns (2 by default; 1 here), behind
    every build's read and call, to send nothing. A turn is needed only
    when power_on() reads or sends."""
    from ironic_compute.instances import answers
    from ironic_compute.instances import power as power_flow
    row = built(cloud)
    worker = cloud.managers['a'].worker
    worker.provisioner._turns = calls.Turns(1)
    held, release = threading.Event(), threading.Event()

    def other_worker():
        with worker.provisioner.turn('a build'):
            held.set()
            release.wait(5)
    thread = threading.Thread(target=other_worker, daemon=True)
    thread.start()
    assert held.wait(5)
    threading.Timer(1.0, release.set).start()
    on = answers.NodeState(row.node, 'active', None, row.uuid, row.uuid,
                           None, False, answers.POWER_ON)
    started = time.monotonic()
    power_flow.power_on(worker, row, row.node, (None,), on)
    waited = time.monotonic() - started
    release.set()
    thread.join(5)
    assert waited < 0.5, f'waited {waited:.1f} s for a turn to send nothing'
