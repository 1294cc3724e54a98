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

"""Findings of review hunt 3 (resends, ABA writes and stale reads in the
config drive, the Placement claims and the idle transaction limit). Each
test reproduces one finding and failed before its fix on this branch:
H1 a create whose COMMIT answer is lost gave the recorded row's claim back;
H2 Ctrl-C after the claim's PUT landed left the claim; H3 a claim no row
names (a PUT landing after the give-back's DELETE, a create killed -9
between claim and record) stayed for good, unseen by ``placement audit``;
H4 a failed build whose last write was lost was built again on a node
whose claim it had given back; H5 a build beaten to its node by a
recorded instance, failing while Ironic was away, broke the unique index
of live nodes at every retry. On the three databases (the fixtures of
test_placement_claims)."""

import pytest
from keystoneauth1 import exceptions as ks_exc
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.cmd import manage_placement
from ironic_compute.db import instances as db_instances
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.harness.fake_placement import FakePlacement
from ironic_compute.harness.fake_placement import Response
from ironic_compute.instances import build
from ironic_compute.instances import manager as instance_manager
from ironic_compute.instances import model as inst
from ironic_compute.placement import audit
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import placing
from tests.unit import fakes
from tests.unit import test_placement as placement_helpers
from tests.unit.test_placement_claims import OWNER
from tests.unit.test_placement_claims import claimed_cloud  # noqa: F401
from tests.unit.test_placement_claims import claimed_request
from tests.unit.test_placement_claims import claims_of
from tests.unit.test_placement_claims import create
from tests.unit.test_placement_claims import ctx
from tests.unit.test_placement_claims import fleet  # noqa: F401 (fixture)
from tests.unit.test_placement_claims import new_uuid
from tests.unit.test_placement_claims import run
from tests.unit.test_resource_tracker import SETTINGS

# --- H1: a create whose COMMIT answer is lost gives back a recorded claim --
# (An insert that did not commit still gives its claim back: test_placement_claims.py,
# test_a_failed_insert_gives_the_claim_back.)

def test_h1_a_row_committed_before_its_answer_was_lost_keeps_its_claim(
        fleet, monkeypatch):  # noqa: F811
    """create_on_node() may fail after the database committed the row (the
    connection drops while COMMIT's answer is on its way back, or Ctrl-C
    arrives just after it). schedule_claim_and_create() gave the claim back
    blind on any error: the row then stands, and its build reserves a node
    that Placement shows free to every other consumer. Read the row back
    before giving anything back: a recorded row keeps its claim, and the
    create is done."""
    placement, _held = fleet
    real = db_scheduling.create_on_node

    def committed_then_lost(*args, **kwargs):
        real(*args, **kwargs)
        raise db_exc.DBConnectionError('lost connection during COMMIT')
    monkeypatch.setattr(db_scheduling, 'create_on_node', committed_then_lost)
    uuid = new_uuid()
    row = create(placement, uuid)
    stored = db_instances.get(ctx(), uuid)
    assert stored is not None and row.node == stored.node
    assert placement.allocations == {uuid: {stored.node: {
        'CUSTOM_BAREMETAL': 1}}}
    assert ('DELETE', f'/allocations/{uuid}') not in placement.requests


def test_h1_a_row_that_cannot_be_read_back_keeps_its_claim_and_says_so(
        fleet, monkeypatch, caplog):  # noqa: F811
    """Unknown (the database is away for the read back too): nothing is
    given back (the row may stand), and the log says which DELETE removes
    the claim if the instance is not recorded."""
    placement, _held = fleet

    def lost(*args, **kwargs):
        raise db_exc.DBConnectionError('the database went away')

    def unreadable(*args, **kwargs):
        raise db_exc.DBConnectionError('still away')
    monkeypatch.setattr(db_scheduling, 'create_on_node', lost)
    monkeypatch.setattr(placing.db_instances, 'get', unreadable)
    uuid = new_uuid()
    with pytest.raises(db_exc.DBConnectionError):
        create(placement, uuid)
    assert list(placement.allocations) == [uuid]
    assert f'DELETE /allocations/{uuid}' in caplog.text


# --- H2: Ctrl-C after the claim's PUT landed leaks the claim ----------------

def test_h2_an_interrupt_after_the_claim_landed_gives_it_back(fleet):  # noqa: F811
    """claim_one() checks each claim after its PUT (the provider must hold
    it alone). A KeyboardInterrupt there (or anywhere after the PUT landed
    and before the insert) left the claim: _claim() gave back only on a
    PlacementError, and no row names the instance, so no service ever
    releases it."""
    placement, _held = fleet
    uuid = new_uuid()

    def interrupted(method, path):
        if method == 'GET' and path.endswith('/allocations') and (
                path.startswith('/resource_providers/')):
            raise KeyboardInterrupt
    placement.before = interrupted
    with pytest.raises(KeyboardInterrupt):
        create(placement, uuid)
    placement.before = None
    assert db_instances.get(ctx(), uuid) is None
    assert placement.allocations == {}


# --- H3: a claim no row names is left for good, and nothing says so ---------

def _audit(ironic_fake, placement):
    """The findings of ``placement audit`` on the fakes."""
    client = placement_client.PlacementClient(None, adapter=placement)
    found, _nodes, _listed = manage_placement.survey(
        ctx(), ironic_fake, client, None)
    return {f.node: f for f in found}


@pytest.fixture
def audited(migrated_engine):
    """Service a's cycle has written the providers of its 3 nodes:
    (fake Ironic, fake Placement, node uuids)."""
    ironic_fake = fakes.FakeIronic(placement_helpers.node() for _ in range(3))
    placement = FakePlacement()
    placement_helpers.tracker('a', ironic_fake, placement).run_cycle(SETTINGS)
    return ironic_fake, placement, sorted(ironic_fake.nodes)


def test_h3_a_claim_that_landed_after_its_give_back_is_found_by_the_audit(
        audited):
    """A claim whose answer is lost (a read timeout) is given back with a
    DELETE, but the PUT may still be under way in Placement and land after
    the DELETE found nothing (or the command is killed -9 between its claim
    and its record): no row names the consumer, so no service releases it,
    and Placement never offers the node again. The audit must say so."""
    ironic_fake, placement, nodes = audited
    uuid = new_uuid()
    late = []

    def put_lost(method, path):
        if method == 'PUT' and path == f'/allocations/{uuid}':
            late.append(path)
            raise ks_exc.ConnectTimeout('read timed out')
    placement.before = put_lost
    with pytest.raises(exception.PlacementUnavailable):
        placing.schedule_claim_and_create(
            ctx(), claims_of(placement), uuid, 'vm',
            inst.RequestSpec(resource_class='baremetal.gold'), 'http://img',
            60, OWNER)
    placement.before = None
    assert late and ('DELETE', f'/allocations/{uuid}') in placement.requests
    # The PUT lands now, after the DELETE that found nothing.
    placement.allocate(uuid, nodes[0], 'CUSTOM_BAREMETAL_GOLD')
    found = _audit(ironic_fake, placement)
    assert found[nodes[0]].problem == audit.LEAKED
    assert uuid in found[nodes[0]].detail and found[nodes[0]].instance == uuid
    assert f'DELETE /allocations/{uuid}' in found[nodes[0]].fix
    assert not found[nodes[0]].fixable


def test_h3_the_audit_judges_each_claim_by_its_instance_row(audited):
    """A live instance's claim on its own node is no finding; the claim of
    a deleted instance, or of a live one recorded on another node, is."""
    ironic_fake, placement, nodes = audited
    spec = inst.RequestSpec(resource_class='baremetal.gold')
    live, gone, moved = new_uuid(), new_uuid(), new_uuid()
    db_instances.create(ctx(), live, 'vm', 'a', spec, 'http://img',
                        node=nodes[0])
    db_instances.create(ctx(), moved, 'vm', 'a', spec, 'http://img',
                        node=nodes[2])
    for consumer, node in ((live, nodes[0]), (gone, nodes[1]),
                           (moved, nodes[1])):
        placement.allocate(consumer, node, 'CUSTOM_BAREMETAL_GOLD')
    client = placement_client.PlacementClient(None, adapter=placement)
    found, _nodes, _listed = manage_placement.survey(ctx(), ironic_fake, client, None)
    # The instance recorded on nodes[2] also lacks its claim there.
    assert {(f.node, f.problem, f.instance) for f in found} == {
        (nodes[1], audit.LEAKED, gone), (nodes[1], audit.LEAKED, moved),
        (nodes[2], audit.UNCLAIMED, moved)}


# --- H4: a failed build whose record is lost is built again, claim-less ------

def test_h4_a_failed_build_whose_record_is_lost_keeps_its_claim_for_the_retry(
        claimed_cloud, monkeypatch):  # noqa: F811
    """fail() gave everything back (the node torn down, the allocation
    and the claim released) and only then recorded the failure. When that
    one write is lost (the database cut the flow off, or a kill -9 before
    it), the row is still spawning, and the retry ran build() again: a new
    allocation on the claimed node and a deploy, for an instance whose
    claim was given back (Placement shows the node free while it runs).
    The claim must go only once the failure is recorded: a retried build
    then still holds it."""
    cloud, placement = claimed_cloud
    cloud.ironic.deploy_fails = True
    manager, row = claimed_request(cloud, placement)
    real = db_instances.transition
    lost = []

    def record_lost(ctx_, claim, seen, **values):
        if values.get('vm_state') == inst.ERROR and not lost:
            lost.append(claim.uuid)
            raise db_exc.DBConnectionError('the database went away')
        return real(ctx_, claim, seen, **values)
    monkeypatch.setattr(db_instances, 'transition', record_lost)
    run(manager, build.build, row.uuid)
    assert lost  # the failure's write was cut off
    cloud.ironic.deploy_fails = False  # the retry's deploy would work
    # The retry, as the poller hands it: the flow of the row's task state.
    task_state = db_instances.get(ctx(), row.uuid).task_state
    done = run(manager, instance_manager.FLOWS[inst.next_action(task_state)],
               row.uuid)
    # Built again (the failure was never recorded), but with its claim.
    assert (done.vm_state, done.node) == (inst.ACTIVE, row.node)
    assert placement.allocations == {row.uuid: {row.node: {
        'CUSTOM_BAREMETAL': 1}}}


def test_h4_a_failure_recorded_gives_its_claim_back_even_later(
        claimed_cloud):  # noqa: F811
    """The claim goes after the failure's write; Placement down then leaves
    the instance in error, releasing, until the claim is released."""
    cloud, placement = claimed_cloud
    cloud.ironic.deploy_fails = True
    manager, row = claimed_request(cloud, placement)
    placement.before = lambda method, path: (
        Response(503) if method == 'DELETE' else None)
    failed = run(manager, build.build, row.uuid)
    assert (failed.vm_state, failed.task_state, failed.node) == (
        inst.ERROR, inst.RELEASING, None)
    assert 'deploy' in failed.fault and row.uuid in placement.allocations
    placement.before = None
    done = run(manager, build.release, row.uuid)
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.ERROR, None, failed.fault)
    assert placement.allocations == {}


# --- H5: a build that lost its node to a recorded instance, Ironic away ------

def test_h5_a_build_beaten_to_its_node_fails_while_ironic_is_away(cloud, caplog):
    """Ironic allocated node N to build A while another live instance was
    recorded on N (the race record_node() loses: NodeTaken). With Ironic
    away, fail() kept N on A's row to free it later, and that write broke
    the unique index of live nodes: a traceback at every retry until Ironic
    came back. A never deployed N; dropping its allocation (by A's uuid)
    frees it: the row keeps no node."""
    from tests.unit import instance_cloud
    node = cloud.node()
    other = instance_cloud.claim(instance_cloud.request('b', 2))
    assert db_instances.record_node(ctx(), other, node) is not None
    row = instance_cloud.claim(instance_cloud.request('a', 1))
    instance_cloud.allocate(cloud, row.uuid, node)
    cloud.ironic.unavailable = True
    build.fail(cloud.managers['a'].worker, row, node, 'node taken')
    failed = db_instances.get(ctx(), row.uuid)
    assert (failed.vm_state, failed.task_state, failed.node) == (
        inst.ERROR, inst.RELEASING, None)
    assert 'not released yet' in failed.fault
    cloud.ironic.unavailable = False
    assert build.release(cloud.managers['a'].worker, failed)
    done = db_instances.get(ctx(), row.uuid)
    assert (done.vm_state, done.task_state, done.fault) == (
        inst.ERROR, None, 'node taken')
    assert row.uuid not in cloud.ironic.allocations
    assert db_instances.get(ctx(), other.uuid).node == node
