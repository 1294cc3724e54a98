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

"""Instance actions (stop, start, reboot, rebuild) and the power-state sync,
on SQLite, MariaDB and PostgreSQL, against the fake Ironic: queued on the
row, carried out by the managing host's workers (and by its successor),
never twice."""

import dataclasses
import threading
import time

import pytest
import sqlalchemy as sa

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import models
from ironic_compute.instances import build
from ironic_compute.instances import manager as manager_mod
from ironic_compute.instances import model as inst
from ironic_compute.instances import power as power_flow
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import claim
from tests.unit.instance_cloud import ctx
from tests.unit.instance_cloud import request
from tests.unit.instance_cloud import take_over

_instances = models.instances
_nodes = models.compute_nodes


def ask(row, action, **args):
    return db_instances.request_action(ctx(), row.uuid, action, **args)


def carry_out(cloud, row, host=None):
    """The managing host's worker runs the queued task once."""
    manager = cloud.managers[host or row.host]
    queued = db_instances.get(ctx(), row.uuid)
    work = {'power': power_flow.power, 'reboot': power_flow.reboot,
            'rebuild': power_flow.rebuild}[inst.next_action(queued.task_state)]
    manager._run(queued.uuid, work, queued)
    return db_instances.get(ctx(), row.uuid)


def power(cloud, row):
    return cloud.ironic.nodes[row.node].power_state


# --- what an action sends -----------------------------------------------------

@pytest.mark.parametrize('action, args, sent', [
    ('stop', {'hard': False},
     ['node.get', 'node.set_power_state', 'node.get']),
    ('reboot', {'hard': True},
     ['node.get', 'node.set_power_state', 'node.get']),
    # The read that sees the rebuild end says the node is on: no power on,
    # and no read after it.
    ('rebuild', {'image': 'http://img-2'},
     ['node.get', 'node.update', 'node.set_provision_state', 'node.get']),
    # The same image: the read says it is the node's already, no patch.
    ('rebuild', {},
     ['node.get', 'node.set_provision_state', 'node.get']),
])
def test_an_action_reads_the_node_once_before_its_call(cloud, action, args,
                                                       sent):
    """The read that decides what to send is the one its fence checks (the
    same turn), and the answer to an image patch the rebuild's; then one
    read after the call sees it done (the fake Ironic ends at once)."""
    row = built(cloud)
    ask(row, action, **args)
    requests = []
    send = cloud.ironic.request

    def recorded(call, /, *call_args, **kwargs):
        requests.append(call)
        return send(call, *call_args, **kwargs)
    cloud.ironic.request = recorded
    done = carry_out(cloud, row)
    assert (done.task_state, done.fault) == (None, None)
    assert requests == sent


# --- asking ---------------------------------------------------------------------

def test_a_build_ends_powered_on(cloud):
    row = built(cloud)
    assert power(cloud, row) == 'power on' and row.power_state == inst.POWER_ON
    assert (row.node, 'on', False) in cloud.ironic.power_calls


def test_one_task_at_a_time_and_only_from_the_right_state(cloud):
    row = built(cloud)
    with pytest.raises(exception.RequestRefused,
                       match='cannot start instance .*: it is active; start '
                             'needs stopped'):
        ask(row, 'start')
    queued = ask(row, 'reboot', hard=False)
    assert queued.task_state == inst.REBOOTING
    assert queued.task_requested_at is not None
    for action in ('stop', 'reboot', 'rebuild'):
        with pytest.raises(exception.RequestRefused,
                           match='it has a task in flight: rebooting'):
            ask(row, action)
    with pytest.raises(exception.NoInstance):
        db_instances.request_action(ctx(), '0' * 36, 'stop')


# --- each action --------------------------------------------------------------

def test_stop_then_start(cloud):
    row = built(cloud)
    ask(row, 'stop', hard=False)
    stopped = carry_out(cloud, row)
    assert (stopped.vm_state, stopped.task_state, stopped.power_state) == (
        inst.STOPPED, None, inst.POWER_OFF)
    assert power(cloud, row) == 'power off'
    assert cloud.ironic.power_calls[-1] == (row.node, 'off', True)  # soft
    ask(row, 'start')
    started = carry_out(cloud, row)
    assert (started.vm_state, started.task_state, started.power_state) == (
        inst.ACTIVE, None, inst.POWER_ON)
    assert power(cloud, row) == 'power on'


def test_a_hard_stop_never_asks_softly(cloud):
    row = built(cloud)
    ask(row, 'stop', hard=True)
    assert carry_out(cloud, row).vm_state == inst.STOPPED
    assert cloud.ironic.power_calls[-1] == (row.node, 'off', False)


def test_a_soft_stop_ironic_refuses_falls_back_to_hard(cloud):
    row = built(cloud)
    cloud.ironic.soft_power_refused = True
    ask(row, 'stop', hard=False)
    assert carry_out(cloud, row).vm_state == inst.STOPPED
    assert cloud.ironic.power_calls[-1] == (row.node, 'off', False)


def test_a_soft_stop_not_done_in_time_falls_back_to_hard(cloud):
    row = built(cloud)
    real = cloud.ironic.node_set_power_state

    def soft_ignored(uuid, state, soft=False, timeout=None):
        if soft:  # accepted, ended at once, but the OS never shuts down
            cloud.ironic.power_calls.append((uuid, state, soft))
            return
        real(uuid, state, soft)
    cloud.ironic.node_set_power_state = soft_ignored
    ask(row, 'stop', hard=False)
    stopped = carry_out(cloud, row)  # shutdown_timeout is 1 s
    assert stopped.vm_state == inst.STOPPED and stopped.fault is None
    assert cloud.ironic.power_calls[-2:] == [(row.node, 'off', True),
                                             (row.node, 'off', False)]


def test_a_soft_stop_ironic_still_runs_at_the_timeout_ends_hard(cloud):
    # Ironic is given the timeout and ends the soft action itself; the hard
    # power off is sent once it has (a node in flight refuses any call).
    row = built(cloud)
    cloud.ironic.soft_power_ignored = True
    ask(row, 'stop', hard=False)
    stopped = carry_out(cloud, row)  # shutdown_timeout is 1 s
    assert (stopped.vm_state, stopped.fault) == (inst.STOPPED, None)
    assert power(cloud, row) == 'power off'
    assert cloud.ironic.soft_timeouts == [1]
    assert cloud.ironic.power_calls[-2:] == [(row.node, 'off', True),
                                             (row.node, 'off', False)]


def test_a_soft_reboot_ironic_still_runs_at_the_timeout_ends_hard(cloud):
    row = built(cloud)
    cloud.ironic.soft_power_ignored = True
    ask(row, 'reboot', hard=False)
    rebooted = carry_out(cloud, row)
    assert (rebooted.vm_state, rebooted.task_state, rebooted.fault) == (
        inst.ACTIVE, None, None)
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert reboots == [(row.node, 'reboot', True), (row.node, 'reboot', False)]
    assert cloud.ironic.soft_timeouts == [1]


def test_a_soft_reboot_ironic_refuses_falls_back_to_hard(cloud):
    row = built(cloud)
    cloud.ironic.soft_power_refused = True
    ask(row, 'reboot', hard=False)
    rebooted = carry_out(cloud, row)
    assert (rebooted.vm_state, rebooted.task_state) == (inst.ACTIVE, None)
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert reboots == [(row.node, 'reboot', False)]


def test_a_reboot_of_a_stopped_instance_powers_it_on(cloud):
    row = built(cloud)
    ask(row, 'stop', hard=True)
    carry_out(cloud, row)
    ask(row, 'reboot', hard=True)
    rebooted = carry_out(cloud, row)
    assert rebooted.vm_state == inst.ACTIVE and power(cloud, row) == 'power on'


def test_a_rebuild_keeps_its_node_and_allocation(cloud):
    row = built(cloud)
    allocation = cloud.ironic.allocations[row.uuid]
    ask(row, 'rebuild', image='http://img-2')
    rebuilt = carry_out(cloud, row)
    assert (rebuilt.vm_state, rebuilt.task_state, rebuilt.node) == (
        inst.ACTIVE, None, row.node)
    assert rebuilt.image_source == 'http://img-2'
    assert cloud.ironic.allocations[row.uuid] is allocation
    assert cloud.ironic.created_allocations == [row.uuid]
    assert (row.node, 'rebuild') in cloud.ironic.provision_calls
    assert cloud.ironic.patches[row.node][-1] == [
        {'op': 'add', 'path': '/instance_info/image_source',
         'value': 'http://img-2'}]


def test_an_action_ironic_fails_ends_with_a_fault_and_the_state_kept(cloud):
    row = built(cloud)
    cloud.ironic.soft_power_refused = True
    real = cloud.ironic.node_set_power_state

    def refused(uuid, state, soft=False, timeout=None):
        from ironicclient import exc as ironic_exc
        raise ironic_exc.BadRequest('the BMC says no')
    cloud.ironic.node_set_power_state = refused
    ask(row, 'stop', hard=True)
    failed = carry_out(cloud, row)
    assert (failed.vm_state, failed.task_state) == (inst.ACTIVE, None)
    assert failed.fault.startswith('powering-off: cannot off: ')
    cloud.ironic.node_set_power_state = real
    ask(row, 'stop', hard=True)  # asked again, it works
    assert carry_out(cloud, row).fault is None


# --- never twice ----------------------------------------------------------------

def test_a_reboot_resumed_after_a_kill_is_not_sent_twice(cloud):
    row = built(cloud)
    ask(row, 'reboot', hard=True)
    manager = cloud.managers['a']
    real_wait = manager.provisioner.wait_for_power

    def killed(*args, **kwargs):
        raise exception.Stopped('killed after the call')
    manager.provisioner.wait_for_power = killed
    carry_out(cloud, row)
    assert db_instances.get(ctx(), row.uuid).task_state == inst.REBOOTING
    manager.provisioner.wait_for_power = real_wait
    done = carry_out(cloud, row)  # restarted: the same task again
    assert (done.vm_state, done.task_state) == (inst.ACTIVE, None)
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert reboots == [(row.node, 'reboot', False)]


@pytest.mark.parametrize('action', ['soft reboot', 'rebuild'])
def test_an_action_resumed_after_a_kill_is_not_sent_twice(cloud, action):
    row = built(cloud)
    if action == 'rebuild':
        ask(row, 'rebuild', image='http://img-2')
    else:
        ask(row, 'reboot', hard=False)
    manager = cloud.managers['a']
    waits = ('wait_for', 'wait_for_power')
    real = {name: getattr(manager.provisioner, name) for name in waits}

    def killed(*args, **kwargs):
        raise exception.Stopped('killed after the call')
    for name in waits:
        setattr(manager.provisioner, name, killed)
    carry_out(cloud, row)
    assert db_instances.get(ctx(), row.uuid).task_state is not None
    for name in waits:
        setattr(manager.provisioner, name, real[name])
    done = carry_out(cloud, row)  # restarted: the same task again
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.ACTIVE, None, None)
    if action == 'rebuild':
        assert cloud.ironic.provision_calls.count((row.node, 'rebuild')) == 1
        assert done.image_source == 'http://img-2'
    else:
        reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
        assert reboots == [(row.node, 'reboot', True)]


def test_a_build_resumed_after_its_deploy_ends_powered_on(cloud, monkeypatch):
    # Killed between the deploy and the power on: the next attempt (a
    # restart, or the host that took it over) finds the node active but
    # off, and powers it on before recording the instance active.
    row = claim(request('a'))
    manager = cloud.managers['a']
    real_power_on = power_flow.power_on

    def killed(*args, **kwargs):
        raise exception.Stopped('killed after the deploy')
    monkeypatch.setattr(power_flow, 'power_on', killed)
    manager._run(row.uuid, build.build, row)
    node = db_instances.get(ctx(), row.uuid).node
    assert cloud.ironic.nodes[node].provision_state == 'active'
    assert cloud.ironic.nodes[node].power_state == 'power off'
    monkeypatch.setattr(power_flow, 'power_on', real_power_on)
    resumed = db_instances.get(ctx(), row.uuid)
    assert resumed.task_state == inst.SPAWNING
    manager._run(row.uuid, build.build, resumed)
    done = db_instances.get(ctx(), row.uuid)
    assert (done.vm_state, done.power_state) == (inst.ACTIVE, inst.POWER_ON)
    assert cloud.ironic.nodes[node].power_state == 'power on'
    assert cloud.ironic.provision_calls.count((node, 'active')) == 1


def test_a_reboot_killed_before_its_call_is_sent_once_on_resume(cloud):
    row = built(cloud)
    ask(row, 'reboot', hard=True)
    manager = cloud.managers['a']
    real_set_power = manager.provisioner.set_power

    def killed(*args, **kwargs):
        raise exception.Stopped('killed before the call')
    manager.provisioner.set_power = killed
    carry_out(cloud, row)
    manager.provisioner.set_power = real_set_power
    done = carry_out(cloud, row)
    assert done.vm_state == inst.ACTIVE
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert reboots == [(row.node, 'reboot', False)]


def test_the_successor_carries_out_an_action_asked_while_the_host_was_down(
        cloud):
    row = built(cloud)
    ask(row, 'reboot', hard=True)  # a is down: nobody carries it out...
    taken = take_over(row.uuid, 'a', 'b', cloud)
    assert taken.task_state == inst.REBOOTING
    done = carry_out(cloud, taken, host='b')
    assert (done.host, done.vm_state, done.task_state) == (
        'b', inst.ACTIVE, None)
    # ...and a, resuming with its stale row, sends nothing.
    stale = dataclasses.replace(db_instances.get(ctx(), row.uuid),
                                host='a', generation=row.generation,
                                task_state=inst.REBOOTING)
    cloud.managers['a']._run(row.uuid, power_flow.reboot, stale)
    reboots = [c for c in cloud.ironic.power_calls if c[1] == 'reboot']
    assert reboots == [(row.node, 'reboot', False)]


# --- the power-state sync -------------------------------------------------------

def test_an_active_instance_found_off_is_recorded_stopped(cloud):
    row = built(cloud)
    cloud.ironic.set_node(row.node, power_state='power off')
    counts = cloud.managers['a'].sync_power_states()
    assert counts['stopped'] == 1
    synced = db_instances.get(ctx(), row.uuid)
    assert (synced.vm_state, synced.power_state) == (inst.STOPPED,
                                                     inst.POWER_OFF)


def test_a_stopped_instance_found_on_is_powered_off_again(cloud):
    row = built(cloud)
    ask(row, 'stop', hard=True)
    carry_out(cloud, row)
    cloud.ironic.set_node(row.node, power_state='power on')
    manager = cloud.managers['a']
    manager._sync_pool = _Inline()
    counts = manager.sync_power_states()
    assert counts['powering off'] == 1
    synced = db_instances.get(ctx(), row.uuid)
    assert (synced.vm_state, synced.task_state) == (inst.STOPPED, None)
    assert power(cloud, row) == 'power off'


@pytest.mark.parametrize('why', ['task in flight', 'maintenance'])
def test_the_sync_skips_tasks_in_flight_and_maintenance(cloud, why):
    row = built(cloud)
    if why == 'task in flight':
        ask(row, 'reboot')
    else:
        cloud.ironic.set_node(row.node, maintenance=True)
    cloud.ironic.set_node(row.node, power_state='power off')
    counts = cloud.managers['a'].sync_power_states()
    assert counts == {'recorded': 0, 'stopped': 0, 'powering off': 0,
                      'skipped': 1}
    assert db_instances.get(ctx(), row.uuid).vm_state == inst.ACTIVE


def test_the_sync_records_the_power_state_it_reads(cloud):
    row = built(cloud)
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == row.uuid)
                     .values(power_state=None))
    reads = []
    cloud.ironic.on_node_get = reads.append
    listings = []
    real_list = cloud.ironic.list_nodes

    def list_nodes(*args, **kwargs):
        listings.append(kwargs)
        return real_list(*args, **kwargs)
    cloud.ironic.list_nodes = list_nodes
    assert cloud.managers['a'].sync_power_states()['recorded'] == 1
    # One listing of the nodes with an instance; no request per node.
    assert reads == [] and listings == [{'conductor_group': None,
                                         'associated': True}]
    assert db_instances.get(ctx(), row.uuid).power_state == inst.POWER_ON
    assert cloud.managers['b'].sync_power_states() == {
        'recorded': 0, 'stopped': 0, 'powering off': 0, 'skipped': 0}


def test_a_row_an_older_release_accepted_fails_its_build(cloud):
    row = db_instances.create(ctx(), '0' * 35 + '9', 'vm', 'a',
                              inst.RequestSpec(resource_class='baremetal'),
                              'http://img')
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == row.uuid)
                     .values(resource_class='bare metal?'))
    manager = cloud.managers['a']
    manager._run(row.uuid, build.build, db_instances.get(ctx(), row.uuid))
    failed = db_instances.get(ctx(), row.uuid)
    assert failed.vm_state == inst.ERROR and failed.task_state is None
    assert failed.fault.startswith('invalid request: ')


def test_the_sync_interval_applies_as_it_changes(cloud, monkeypatch):
    # Disabled (<= 0) it never runs; enabled by a SIGHUP (a mutated option)
    # it runs within a tick, without a restart.
    monkeypatch.setattr(manager_mod, 'SYNC_TICK', 0.01)
    manager = cloud.managers['a']
    passes = []
    manager.sync_power_states = lambda: passes.append(1)
    cloud.conf.set_override('sync_power_state_interval', 0)
    loop = threading.Thread(target=manager._sync_loop, daemon=True)
    loop.start()
    try:
        time.sleep(0.3)
        assert passes == []
        cloud.conf.set_override('sync_power_state_interval', 1)
        deadline = time.monotonic() + 10
        while not passes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert passes
    finally:
        manager._stopping.set()
        loop.join(5)
    assert not loop.is_alive()


class _Inline:
    """A pool that runs what it is given at once (in the test's thread)."""

    def submit(self, func, *args):
        func(*args)


def test_a_rebuild_without_any_image_fails_with_a_fault(cloud):
    row = built(cloud)
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == row.uuid)
                     .values(image_source=None))
    ask(row, 'rebuild')
    failed = carry_out(cloud, row)
    assert (failed.vm_state, failed.task_state) == (inst.ACTIVE, None)
    assert failed.fault == 'rebuilding: no image to rebuild with'
    assert (row.node, 'rebuild') not in cloud.ironic.provision_calls


def test_a_node_reserved_by_a_build_not_recorded_yet_stays_free_for_the_scheduler(
        cloud):
    """The scheduler counts a build without a node as waiting for one of
    its host's free nodes: the node that build reserved must not also
    count as taken (it would be counted twice, and a request refused)."""
    from ironic_compute.nodes import tracker as resource_tracker
    row = claim(request('a'))
    node = next(u for u, n in cloud.ironic.nodes.items())
    cloud.ironic.allocation.create(uuid=row.uuid, name=row.uuid,
                                   resource_class='baremetal', traits=None,
                                   candidate_nodes=[node])

    def available():
        with db_api.get_engine().connect() as conn:
            return conn.execute(sa.select(_nodes.c.available).where(
                _nodes.c.uuid == node, _nodes.c.deleted == 0)).scalar_one()

    def cycle():
        for host in 'ab':
            resource_tracker.ResourceTracker(
                host, cloud.ids[host], cloud.ironic).run_cycle(
                    resource_tracker.Settings(partition_exponent=8))
    cycle()
    assert available() is True  # reserved, the build not recorded yet
    assert db_instances.record_node(ctx(), row, node)
    cycle()
    assert available() is False
