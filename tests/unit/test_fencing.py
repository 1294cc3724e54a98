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

"""Fencing, on SQLite, MariaDB and PostgreSQL: a service that its peers
judged dead, and that still runs, never acts on an instance it no longer
manages (generation, lease, a re-check right before every Ironic call).

Host a is the stale one: its worker methods are called directly, at the
moment the test chooses, as a worker resuming after a pause would run them.
Host b is the successor. Ironic is the fake at the adapter boundary.
"""

import dataclasses

import pytest
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.cluster import lease
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import models
from ironic_compute.db import services as db_services
from ironic_compute.db import takeover as db_takeover
from ironic_compute.db.models import _utcnow
from ironic_compute.instances import answers
from ironic_compute.instances import build
from ironic_compute.instances import manager as manager_mod
from ironic_compute.instances import model as inst
from ironic_compute.instances import takeover
from ironic_compute.instances import teardown
from ironic_compute.nodes import ownership
from tests.unit.instance_cloud import GRACE
from tests.unit.instance_cloud import SDT
from tests.unit.instance_cloud import allocate
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import claim
from tests.unit.instance_cloud import ctx
from tests.unit.instance_cloud import request
from tests.unit.instance_cloud import set_service
from tests.unit.instance_cloud import silence
from tests.unit.instance_cloud import take_over

_nodes = models.compute_nodes

# --- the stale owner after a takeover ----------------------------------------

@pytest.mark.parametrize('pause', ['taken over', 'lease lapsed',
                                   'database cut'])
def test_a_stale_owner_resuming_after_its_deadline_never_tears_down(
        cloud, pause, monkeypatch, caplog):
    cut = []  # non-empty: the database no longer answers a
    """a deploys X; it is frozen past the grace; b takes X over and records
    it active; a resumes after its deploy deadline and fails the build. It
    must not tear down the node b has recorded active."""
    a = cloud.managers['a']
    row = claim(request('a'))
    cloud.ironic.deploy_hangs = True

    def frozen_past_the_deadline(node, done, failed, timeout, what):
        # The deploy finishes while a sleeps...
        cloud.ironic.targets.clear()
        cloud.ironic.set_node(node, provision_state='active')
        if pause == 'taken over':
            # ...b took X over meanwhile and recorded it active.
            taken = take_over(row.uuid, 'a', 'b', cloud)
            assert db_instances.transition(
                ctx(), taken, inst.SPAWNING, vm_state=inst.ACTIVE,
                task_state=None, node=node)
        elif pause == 'lease lapsed':
            # ...nobody took it over yet, but a's lease ran out.
            a.lease = lease.Lease(lambda: 0.0)
        else:
            # ...and a cannot read its row any more: unchecked is not sent.
            cut.append(True)
        raise exception.ProvisionError(f'{what}: not done after {timeout} s')
    real_get = db_instances.get

    def get(*args, **kwargs):
        if cut:
            raise db_exc.DBConnectionError('the database is cut')
        return real_get(*args, **kwargs)
    monkeypatch.setattr(db_instances, 'get', get)
    a.provisioner.wait_for = frozen_past_the_deadline
    a._run(row.uuid, build.build, row)
    cut.clear()
    if pause == 'database cut':  # one line, no traceback
        assert not [r for r in caplog.records if r.exc_info]
        assert any('its row cannot be re-checked' in r.getMessage()
                   for r in caplog.records)
    node = next(n for n in cloud.ironic.nodes.values()
                if n.instance_uuid == row.uuid)
    assert node.provision_state == 'active'
    assert (node.uuid, 'deleted') not in cloud.ironic.provision_calls
    assert row.uuid in cloud.ironic.allocations
    current = db_instances.get(ctx(), row.uuid)
    if pause == 'taken over':
        assert (current.host, current.vm_state, current.node) == (
            'b', inst.ACTIVE, node.uuid)
    else:  # left for a, which reads its row again once its lease is back
        assert (current.host, current.task_state) == ('a', inst.SPAWNING)


def test_a_stale_reserve_retry_never_deletes_the_successors_allocation(cloud):
    """a's first allocation failed; before its retry removes it, b took X
    over and holds the allocation (same name: the instance uuid)."""
    a = cloud.managers['a']
    row = claim(request('a'))
    node = cloud.node()

    def first_attempt_fails(instance_uuid, spec, candidates, timeout, fence,
                            absent=False):
        take_over(row.uuid, 'a', 'b', cloud)
        allocate(cloud, row.uuid, node)  # b's
        return answers.Allocation(row.uuid, 'error', None, 'no node')
    a.provisioner.allocate = first_attempt_fails
    a._run(row.uuid, build.build, row)
    assert cloud.ironic.allocations[row.uuid].node_uuid == node
    assert db_instances.get(ctx(), row.uuid).host == 'b'


def test_a_stale_reserve_never_recreates_an_allocation_after_the_successor_failed(
        cloud):
    """b took X over, its build failed and released the node; a's stale
    worker must not reserve a node again."""
    a = cloud.managers['a']
    row = claim(request('a'))
    taken = take_over(row.uuid, 'a', 'b', cloud)
    assert db_instances.transition(ctx(), taken, inst.SPAWNING,
                                   vm_state=inst.ERROR, task_state=None,
                                   fault='b failed it')
    a._run(row.uuid, build.build, row)
    assert cloud.ironic.created_allocations == []
    assert cloud.ironic.allocations == {}
    assert db_instances.get(ctx(), row.uuid).fault == 'b failed it'



def test_a_stale_owner_resuming_a_deployed_build_never_powers_it(cloud):
    """a's build is deployed but not powered on when a freezes; b takes it
    over. a, resuming the same build with its stale row, finds the node
    deployed and must not send the power on (the successor's to send)."""
    a = cloud.managers['a']
    row = claim(request('a'))
    node = cloud.node()
    allocate(cloud, row.uuid, node)
    assert db_instances.record_node(ctx(), row, node)
    cloud.ironic.set_node(node, provision_state='active')  # off, as deployed
    take_over(row.uuid, 'a', 'b', cloud)
    stale = dataclasses.replace(db_instances.get(ctx(), row.uuid), host='a',
                                generation=row.generation)
    a._run(row.uuid, build.build, stale)
    assert cloud.ironic.power_calls == []
    assert cloud.ironic.nodes[node].power_state == 'power off'
    current = db_instances.get(ctx(), row.uuid)
    assert (current.host, current.task_state) == ('b', inst.SPAWNING)

# --- the node changed under a worker -----------------------------------------

@pytest.mark.parametrize('when', ['during the settle wait',
                                  'between the last read and the call'])
def test_a_teardown_never_undeploys_a_node_reused_meanwhile(cloud, when,
                                                            caplog):
    a = cloud.managers['a']
    row = request('a')
    node = cloud.node()
    allocate(cloud, row.uuid, node)
    assert db_instances.record_node(ctx(), claim(row), node)
    cloud.ironic.set_node(node, provision_state='deploying')
    cloud.ironic.targets[node] = 'active'
    db_instances.request_delete(ctx(), row.uuid)
    deleting = db_instances.get(ctx(), row.uuid)
    other = '00000000-0000-0000-0000-0000000000ff'
    reads = []

    def node_read(uuid):
        reads.append(uuid)
        settle_read, fence_read = 2, 3
        if len(reads) == (settle_read if when == 'during the settle wait'
                          else fence_read):
            # X's deploy failed and its allocation went; Y got the node.
            cloud.ironic.targets.clear()
            del cloud.ironic.allocations[row.uuid]
            cloud.ironic.set_node(node, instance_uuid=None,
                                  provision_state='available')
            allocate(cloud, other, node)
            cloud.ironic.set_node(node, provision_state='active')
        elif len(reads) == 2:  # the settle wait ends: X's node is active
            cloud.ironic.targets.clear()
            cloud.ironic.set_node(node, provision_state='active')
    cloud.ironic.on_node_get = node_read
    a._run(row.uuid, teardown.delete, deleting)
    assert cloud.ironic.provision_calls == []
    state = cloud.ironic.nodes[node]
    assert (state.provision_state, state.instance_uuid) == ('active', other)
    assert other in cloud.ironic.allocations
    # What was skipped and why, in the log.
    assert any(f'serves {other}' in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize('action', ['reboot', 'rebuild', 'stop', 'reap'])
def test_a_move_during_the_fences_node_read_sends_nothing(cloud, action,
                                                          caplog):
    """The fence's node read (the flow's own, in the call's turn, for an
    action) comes first (the node, from Ironic: minutes while Ironic is
    slow and the adapter retries), then the rows and the lease are checked.
    So a move to another service during that read (a node move, a
    takeover) is seen, and nothing reaches Ironic."""
    a = cloud.managers['a']
    moved = []
    if action == 'reap':
        # A node this host holds, whose instance was deleted while its
        # host was down: its compute node row moves to b.
        node, instance = cloud.node(), 'deleted-one'
        hold_node_row(node, 'a')
        cloud.ironic.set_node(node, instance_uuid=instance,
                              provision_state='active')
        key, flow, args = ('reap', node), teardown.reap, (node, instance)
        why = 'its compute node row is held by b now'

        def move():
            moved.append(hold_node_row(node, 'b'))
    else:
        row = built(cloud)
        node = row.node
        extra = {'rebuild': {'image': 'http://img-2'},
                 'reboot': {'hard': True}, 'stop': {'hard': False}}[action]
        queued = db_instances.request_action(ctx(), row.uuid, action, **extra)
        key, flow = row.uuid, manager_mod.FLOWS[
            inst.next_action(queued.task_state)]
        args = (queued,)
        # stop: its fence checks the node on the flow's own read, then the
        # row. reboot, rebuild: the row changed under the mark's record.
        why = ('it is managed by b now' if action == 'stop'
               else 'its row changed meanwhile')

        def move():
            moved.append(take_over(row.uuid, 'a', 'b', cloud))
    def calls():
        fake = cloud.ironic
        return (list(fake.power_calls), list(fake.provision_calls),
                {uuid: list(p) for uuid, p in fake.patches.items()})
    sent = calls()
    reads = []

    # The read the fence checks the node on: an action's own read, made
    # in the turn its call is sent in; a reap's fence reads the node anew.
    fence_read = 2 if action == 'reap' else 1

    def node_read(uuid):
        reads.append(uuid)
        if len(reads) == fence_read:
            move()
    cloud.ironic.on_node_get = node_read
    a._run(key, flow, *args)
    assert moved, 'the move did not happen during the fence'
    assert calls() == sent
    assert any(why in r.getMessage() for r in caplog.records)


def hold_node_row(node, host):
    """``host`` holds the compute node row of ``node`` now."""
    with db_api.get_engine().begin() as conn:
        assert conn.execute(_nodes.update().where(
            _nodes.c.uuid == node, _nodes.c.deleted == 0)
            .values(host=host)).rowcount == 1
    return host


def test_a_deploy_never_goes_to_a_node_that_carries_another_instance(cloud):
    a = cloud.managers['a']
    row = claim(request('a'))
    node = cloud.node()
    allocate(cloud, row.uuid, node)  # the allocation a found...
    cloud.ironic.set_node(node, instance_uuid='someone-else')  # ...is stale
    a._run(row.uuid, build.build, row)
    assert cloud.ironic.patches == {} and cloud.ironic.provision_calls == []
    assert cloud.ironic.nodes[node].instance_uuid == 'someone-else'


# --- generations --------------------------------------------------------------

def test_aba_a_stale_worker_of_a_host_that_took_the_instance_back_matches_nothing(
        cloud):
    """X goes a -> b -> a; a worker that read it at the first a (generation
    0) is stale although the host is a again."""
    a = cloud.managers['a']
    stale = claim(request('a'))
    take_over(stale.uuid, 'a', 'b', cloud)
    db_services.heartbeat(ctx(), cloud.ids['a'])
    back = take_over(stale.uuid, 'b', 'a', cloud)
    assert (back.host, back.generation) == ('a', stale.generation + 2)
    assert not db_instances.transition(ctx(), stale, inst.SPAWNING,
                                       vm_state=inst.ERROR)
    a._run(stale.uuid, build.build, stale)
    assert cloud.ironic.created_allocations == []
    # The current claim works.
    assert db_instances.transition(ctx(), back, inst.SPAWNING,
                                   fault='current')


def test_a_takeover_on_a_stale_view_of_a_host_that_just_heartbeated_fails(cloud):
    row = claim(request('a'))
    silence('a', SDT + GRACE + 5)
    # b's view: a silent for long enough...
    records = {s.host: s.record() for s in db_services.list_services(ctx())}
    # ...but a heartbeats before b acts on that view.
    db_services.heartbeat(ctx(), cloud.ids['a'])
    keeper = takeover.InstanceKeeper('b', cloud.ids['b'])
    view = takeover.CycleView(
        now=_utcnow(), judge_peers=True, service_down_time=SDT, grace=GRACE,
        records=records, ring=ownership.build_ring(['b'], 8),
        partition_key=None, rows={}, owned=frozenset(), unknown_instance={})
    assert keeper.run(ctx(), view).taken_over == 0
    current = db_instances.get(ctx(), row.uuid)
    assert (current.host, current.generation) == ('a', row.generation)
    # Once it is silent again for long enough, the same view takes it.
    silence('a', SDT + GRACE + 5)
    assert keeper.run(ctx(), view).taken_over == 1
    assert db_instances.get(ctx(), row.uuid).generation == row.generation + 1


def test_a_forced_down_host_is_taken_over_at_once(cloud):
    row = claim(request('a'))
    set_service('a', forced_down=True)
    seen = db_takeover.of_hosts(ctx(), ['a'])[0]
    assert db_takeover.take_over(ctx(), seen, 'b', cloud.ids['b'],
                                 SDT + GRACE)
    assert db_instances.get(ctx(), row.uuid).host == 'b'


# --- one live instance per node ----------------------------------------------

def test_recording_a_node_another_live_instance_has_is_refused(cloud):
    node = cloud.node()
    first = claim(request('a', 1))
    second = claim(request('b', 2))
    assert db_instances.record_node(ctx(), first, node)
    with pytest.raises(exception.NodeTaken, match=node):
        db_instances.record_node(ctx(), second, node)
    assert db_instances.get(ctx(), second.uuid).node is None


def test_a_build_whose_node_is_recorded_elsewhere_fails_and_frees_it(
        cloud, monkeypatch):
    a = cloud.managers['a']
    row = claim(request('a', 1))
    # Recorded by another writer after a chose its candidates.
    other = claim(request('b', 2))
    real_candidates = build.candidates
    chosen = []

    def candidates_then_recorded(worker, spec, fresh=False):
        chosen.append(real_candidates(worker, spec, fresh)[0])
        assert db_instances.record_node(ctx(), other, chosen[0])
        return chosen
    monkeypatch.setattr(build, 'candidates', candidates_then_recorded)
    a._run(row.uuid, build.build, row)
    node = chosen[0]
    failed = db_instances.get(ctx(), row.uuid)
    assert failed.vm_state == inst.ERROR and failed.node is None
    assert failed.fault == f'node {node} is recorded for another live instance'
    assert row.uuid not in cloud.ironic.allocations
    assert cloud.ironic.nodes[node].instance_uuid is None
