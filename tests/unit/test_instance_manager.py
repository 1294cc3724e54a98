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

"""Builds, deletes and reaping by the worker pool, against a fake Ironic.

The fake stands at the adapter boundary (provision.Provisioner's client):
allocations pick the first free candidate and deploys end at once, as
fake-hardware does; the functional tests run the same paths on a real Ironic.
"""

import dataclasses
import logging
import threading
import time

import pytest
from oslo_config import cfg
from oslo_db import exception as db_exc

from ironic_compute import conf as ic_conf
from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import services as db_services
from ironic_compute.instances import build
from ironic_compute.instances import manager as instance_manager
from ironic_compute.instances import model as inst
from ironic_compute.instances import teardown
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import fakes

HOST = 'cmp-1'


def ctx():
    return db_api.Context()


@pytest.fixture
def conf():
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    conf([], project='ironic-compute', default_config_files=[])
    conf.set_override('instance_poll_interval', 0.1)
    conf.set_override('deploy_timeout', 5, group='ironic')
    return conf


@pytest.fixture
def ironic():
    return fakes.FakeBaremetal([
        fakes.make_node(traits={'CUSTOM_GOLD'}),
        fakes.make_node(cpus=2)])


@pytest.fixture
def manager(sqlite_engine, conf, ironic):
    service_id = db_services.register(ctx(), HOST)
    # One cycle records the nodes this host holds (rows with their offers).
    resource_tracker.ResourceTracker(HOST, service_id, ironic).run_cycle(
        resource_tracker.Settings(partition_exponent=8))
    manager = instance_manager.InstanceManager(conf, HOST, ironic, service_id,
                                               lease=fakes.valid_lease())
    manager.provisioner.poll_interval = 0.01
    manager.start()
    yield manager
    manager.stop(5)


def request(uuid_suffix=1, **spec):
    uuid = f'00000000-0000-0000-0000-{uuid_suffix:012d}'
    db_instances.create(ctx(), uuid, f'vm-{uuid_suffix}', HOST,
                        inst.RequestSpec(**{'resource_class': 'baremetal',
                                            **spec}), 'http://img')
    return uuid


def wait_for(uuid, predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        row = db_instances.get(ctx(), uuid, deleted=True)
        if predicate(row):
            return row
        assert time.monotonic() < deadline, f'instance is {row}'
        time.sleep(0.02)


def settled(row):
    return row.task_state is None


def test_a_build_reserves_deploys_and_records_the_node(manager, ironic):
    uuid = request(vcpus=4)
    row = wait_for(uuid, settled)
    assert (row.vm_state, row.fault) == (inst.ACTIVE, None)
    assert row.launched_at is not None
    node = ironic.nodes[row.node]
    assert node.properties['cpus'] == 8  # the node that fits 4 vcpus
    assert (node.provision_state, node.instance_uuid) == ('active', uuid)
    # One allocation, named and identified by the instance.
    assert ironic.created_allocations == [uuid]
    assert ironic.patches[row.node] == [[
        {'op': 'add', 'path': '/instance_info/image_source', 'value': 'http://img'},
        {'op': 'add', 'path': '/instance_info/root_gb', 'value': '0'},
        {'op': 'add', 'path': '/instance_info/swap_mb', 'value': '0'},
        {'op': 'add', 'path': '/instance_info/vcpus', 'value': '4'},
        {'op': 'add', 'path': '/instance_info/memory_mb', 'value': '0'},
        {'op': 'add', 'path': '/instance_info/display_name', 'value': 'vm-1'}]]


def test_an_impossible_request_ends_in_error_with_nothing_reserved(manager, ironic):
    uuid = request(traits=frozenset({'CUSTOM_GOLD'}), vcpus=16)
    row = wait_for(uuid, settled)
    assert row.vm_state == inst.ERROR and row.node is None
    assert row.fault == ('no free node for resource class baremetal, 16 vcpus, '
                         'traits CUSTOM_GOLD (2 with too few vcpus)')
    assert ironic.created_allocations == [] and ironic.allocations == {}


def test_a_node_taken_in_ironic_meanwhile_fails_with_ironics_reason(manager, ironic):
    gold = next(n.uuid for n in ironic.nodes.values() if n.traits)
    # The rows still say free; Ironic gave the node to someone else.
    ironic.set_node(gold, instance_uuid='someone-else')
    # ...after our fresh listing said it was free: Ironic's answer decides.
    ironic.list_nodes = lambda *a, **k: [
        dataclasses.replace(n, instance_uuid=None) for n in ironic.nodes.values()]
    uuid = request(traits=frozenset({'CUSTOM_GOLD'}))
    row = wait_for(uuid, settled)
    assert row.vm_state == inst.ERROR
    assert 'none of the requested nodes are available' in row.fault
    assert row.fault.startswith('no free node for resource class baremetal')
    assert ironic.allocations == {}  # the failed allocation is gone


def test_a_failed_deploy_releases_the_node(manager, ironic):
    ironic.deploy_fails = True
    uuid = request()
    row = wait_for(uuid, settled)
    assert row.vm_state == inst.ERROR and 'deploy failed' in row.fault
    assert row.node is None
    assert all(n.provision_state == 'available' and n.instance_uuid is None
               for n in ironic.nodes.values())
    assert ironic.allocations == {}


def test_a_deploy_that_never_ends_fails_at_the_timeout_and_frees_the_node(
        manager, conf, ironic):
    conf.set_override('deploy_timeout', 1, group='ironic')
    ironic.deploy_hangs = True
    uuid = request(vcpus=4)
    # The deploy times out; the node is still deploying, so the tear down
    # cannot start: the instance says so and keeps its node while it waits.
    row = wait_for(uuid, lambda r: r.vm_state == inst.ERROR)
    assert row.task_state == inst.RELEASING and row.node is not None
    assert row.fault.startswith('deploy: not done after 1 s (the node is '
                                'not released yet: ')
    assert ironic.allocations  # still reserved
    # Ironic gives up on the deploy at last: the worker frees the node.
    ironic.targets.clear()
    ironic.set_node(row.node, provision_state='deploy failed')
    row = wait_for(uuid, settled)
    assert (row.vm_state, row.node) == (inst.ERROR, None)
    assert row.fault == 'deploy: not done after 1 s'
    assert ironic.allocations == {}
    assert all(n.provision_state == 'available' and n.instance_uuid is None
               for n in ironic.nodes.values())


def test_ironic_gone_when_a_build_fails_leaves_it_releasing_until_it_is_back(
        manager, ironic, monkeypatch):
    ironic.deploy_fails = True
    real_teardown = teardown.tear_down

    def ironic_goes_away(worker, node, instance_uuid, fence, project=None):
        ironic.unavailable = True  # right after the deploy failed
        return real_teardown(worker, node, instance_uuid, fence, project)
    monkeypatch.setattr(teardown, 'tear_down', ironic_goes_away)
    uuid = request()
    row = wait_for(uuid, lambda r: r.vm_state == inst.ERROR)
    assert row.task_state == inst.RELEASING and row.node is not None
    assert 'deploy failed' in row.fault and 'fake Ironic is down' in row.fault
    time.sleep(0.3)  # retried (and failing) while Ironic is away
    assert db_instances.get(ctx(), uuid).task_state == inst.RELEASING
    monkeypatch.setattr(teardown, 'tear_down', real_teardown)
    ironic.unavailable = False
    row = wait_for(uuid, settled, timeout=15)
    assert (row.vm_state, row.node) == (inst.ERROR, None)
    assert 'deploy failed' in row.fault and 'not released' not in row.fault
    assert ironic.allocations == {}
    assert all(n.provision_state == 'available' and n.instance_uuid is None
               for n in ironic.nodes.values())


def test_a_delete_of_a_releasing_instance_frees_the_node_and_deletes_it(
        manager, conf, ironic):
    conf.set_override('deploy_timeout', 1, group='ironic')
    ironic.deploy_hangs = True
    uuid = request()
    node = wait_for(uuid, lambda r: r.task_state == inst.RELEASING).node
    db_instances.request_delete(ctx(), uuid)
    ironic.targets.clear()
    ironic.set_node(node, provision_state='deploy failed')
    wait_for(uuid, lambda r: r.vm_state == inst.DELETED)
    assert db_instances.get(ctx(), uuid) is None
    assert ironic.nodes[node].provision_state == 'available'
    assert ironic.allocations == {}


def test_a_build_resumed_after_a_crash_reuses_its_allocation(sqlite_engine, conf, ironic):
    service_id = db_services.register(ctx(), HOST)
    resource_tracker.ResourceTracker(HOST, service_id, ironic).run_cycle(
        resource_tracker.Settings(partition_exponent=8))
    uuid = request()
    # The crashed daemon had claimed the build and reserved a node.
    assert db_instances.transition(ctx(), db_instances.get(ctx(), uuid),
                                   inst.SCHEDULED, task_state=inst.SPAWNING)
    first = ironic.allocation.create(uuid=uuid, name=uuid,
                                     resource_class='baremetal', traits=None,
                                     candidate_nodes=list(ironic.nodes))
    manager = instance_manager.InstanceManager(conf, HOST, ironic, service_id,
                                               lease=fakes.valid_lease())
    manager.start()
    try:
        row = wait_for(uuid, settled)
    finally:
        manager.stop(5)
    assert (row.vm_state, row.node) == (inst.ACTIVE, first.node_uuid)
    assert ironic.created_allocations == [uuid]


def test_ironic_down_pauses_a_build_which_resumes_later(manager, ironic):
    ironic.unavailable = True
    uuid = request()
    wait_for(uuid, lambda r: r.task_state == inst.SPAWNING)
    time.sleep(0.2)
    assert db_instances.get(ctx(), uuid).vm_state == inst.BUILDING
    ironic.unavailable = False
    row = wait_for(uuid, settled, timeout=15)
    assert row.vm_state == inst.ACTIVE


def test_delete_tears_down_and_frees_the_node_for_the_next_build(manager, ironic):
    uuid = request(vcpus=4)
    node = wait_for(uuid, settled).node
    db_instances.request_delete(ctx(), uuid)
    row = wait_for(uuid, lambda r: r.vm_state == inst.DELETED)
    assert row.task_state is None and db_instances.get(ctx(), uuid) is None
    assert ironic.nodes[node].provision_state == 'available'
    assert ironic.nodes[node].instance_uuid is None
    assert ironic.allocations == {}
    # The node serves the next build (the rows catch up at the next cycle).
    again = request(2, vcpus=4)
    assert wait_for(again, settled).node == node


def test_a_delete_during_a_build_wins(sqlite_engine, conf, ironic, monkeypatch):
    service_id = db_services.register(ctx(), HOST)
    resource_tracker.ResourceTracker(HOST, service_id, ironic).run_cycle(
        resource_tracker.Settings(partition_exponent=8))
    manager = instance_manager.InstanceManager(conf, HOST, ironic, service_id,
                                               lease=fakes.valid_lease())
    uuid = request()
    row = db_instances.get(ctx(), uuid)
    original = build.deploy

    def deploy_then_delete(worker, row, node, fresh=False):
        original(worker, row, node, fresh)
        db_instances.request_delete(ctx(), uuid)
    monkeypatch.setattr(build, 'deploy', deploy_then_delete)
    assert build.build(manager.worker, row) is True
    # The build could not record "active": the delete owns the instance now.
    assert db_instances.get(ctx(), uuid).task_state == inst.DELETING
    assert teardown.delete(manager.worker,
                           db_instances.get(ctx(), uuid)) is True
    assert db_instances.get(ctx(), uuid, deleted=True).vm_state == inst.DELETED
    assert ironic.allocations == {}


def test_reaping_tears_down_the_node_of_a_deleted_instance(manager, ironic):
    node = next(iter(ironic.nodes))
    ironic.set_node(node, instance_uuid='deleted-one', provision_state='active')
    assert manager.reap(node, 'deleted-one')
    deadline = time.monotonic() + 5
    while ironic.nodes[node].provision_state != 'available':
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert ironic.nodes[node].instance_uuid is None


def test_reaping_leaves_a_node_that_serves_another_instance(manager, ironic):
    node = next(iter(ironic.nodes))
    ironic.set_node(node, instance_uuid='someone-else', provision_state='active')
    teardown.reap(manager.worker, node, 'deleted-one')
    assert ironic.nodes[node].provision_state == 'active'


def stop_in_thread(manager, timeout):
    """``manager.stop(timeout)`` in a thread; (thread, {'result', 'seconds'})."""
    outcome = {}

    def run():
        start = time.monotonic()
        outcome['result'] = manager.stop(timeout)
        outcome['seconds'] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_stop_leaves_a_worker_hung_on_ironic_at_the_timeout(
        sqlite_engine, conf, ironic, monkeypatch):
    service_id = db_services.register(ctx(), HOST)
    resource_tracker.ResourceTracker(HOST, service_id, ironic).run_cycle(
        resource_tracker.Settings(partition_exponent=8))
    hung, gone = threading.Event(), threading.Event()
    real_request = ironic.request

    def hanging(call, /, *args, **kwargs):
        # Once the node is reserved, Ironic accepts requests and never
        # answers, until the daemon is gone and its connection closes.
        if ironic.allocations and not gone.is_set():
            hung.set()
            gone.wait(30)
            raise exception.IronicUnavailable('connection closed')
        return real_request(call, *args, **kwargs)

    monkeypatch.setattr(ironic, 'request', hanging)
    manager = instance_manager.InstanceManager(
        conf, HOST, ironic, service_id, lease=fakes.valid_lease())
    manager.provisioner.poll_interval = 0.01
    manager.start()
    uuid = request()
    assert hung.wait(10)
    stopper, outcome = stop_in_thread(manager, 0.5)
    stopper.join(5)
    try:
        assert not stopper.is_alive(), 'stop() waits for a hung worker'
        assert outcome['result'] is False and outcome['seconds'] < 2
    finally:
        gone.set()
    wait_until(lambda: manager.busy == 0)
    assert db_instances.get(ctx(), uuid).task_state == inst.SPAWNING
    # Started again, this host resumes the build on the node it reserved.
    monkeypatch.setattr(ironic, 'request', real_request)
    again = instance_manager.InstanceManager(
        conf, HOST, ironic, service_id, lease=fakes.valid_lease())
    again.provisioner.poll_interval = 0.01
    again.start()
    try:
        row = wait_for(uuid, settled)
    finally:
        assert again.stop(5) is True
    assert row.vm_state == inst.ACTIVE
    assert ironic.created_allocations == [uuid]  # one reservation


def test_stop_ends_the_wait_on_a_deploy_at_once(manager, ironic):
    ironic.deploy_hangs = True
    uuid = request()
    wait_for(uuid, lambda r: r.node is not None)
    stopper, outcome = stop_in_thread(manager, 30)
    stopper.join(5)
    assert not stopper.is_alive()
    assert outcome['result'] is True and outcome['seconds'] < 2
    # Left as it was: the next manager waits on the same deploy.
    row = db_instances.get(ctx(), uuid)
    assert (row.vm_state, row.task_state) == (inst.BUILDING, inst.SPAWNING)


def wait_until(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_flow_cut_off_from_the_database_is_an_outage_not_a_traceback(
        manager, caplog):
    # The server ended the transaction of a service frozen in it
    # (db/idle_limit.py), or the database went away: one line, and the
    # flow is tried again after its back-off.
    def flow(worker, *args):
        raise db_exc.DBConnectionError(
            Exception('(2013, Lost connection to server during query)'))
    key = 'cut-off'
    assert manager._tasks.take(key)
    with caplog.at_level(logging.ERROR):
        manager._run(key, flow)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        'Work on cut-off stopped: the database is unreachable: '
        '(2013, Lost connection to server during query)']
    assert errors[0].exc_info is None
    # Not finished: it waits for its retry time.
    assert not manager._tasks.take(key, wait_retry=True)
