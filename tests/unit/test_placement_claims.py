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

"""Claims in instance create and in the instance flows (issue 28 item 3),
against a Placement held in memory at the keystoneauth Adapter boundary:
the claim comes before the row, which names the claimed node; the build
reserves that node; a failed insert, a failed build, a delete and a reap
give the claim back; a takeover keeps it."""

import uuid as uuidlib

import pytest
from oslo_db import exception as db_exc

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import scheduling as db_scheduling
from ironic_compute.db import services as db_services
from ironic_compute.harness.fake_placement import FakePlacement
from ironic_compute.harness.fake_placement import Response
from ironic_compute.instances import build
from ironic_compute.instances import model as inst
from ironic_compute.instances import teardown
from ironic_compute.placement import claims as placement_claims
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import placing
from ironic_compute.placement import sync as placement_sync
from tests.unit import fakes
from tests.unit import instance_cloud
from tests.unit.db.test_scheduling import add_nodes

SPEC = inst.RequestSpec(resource_class='baremetal')
RC = 'CUSTOM_BAREMETAL'
OWNER = ('project-1', 'user-1')


def ctx():
    return db_api.Context()


def new_uuid():
    return str(uuidlib.uuid4())


def claims_of(placement):
    return placement_claims.Claims(
        placement_client.PlacementClient(None, adapter=placement))


def report(placement, nodes):
    """The providers of ``nodes``, as a service's cycle writes them."""
    placement_sync.ProviderSync(
        placement_client.PlacementClient(None, adapter=placement)).run(
            {n.uuid: n for n in nodes})


@pytest.fixture
def fleet(migrated_engine):
    """Services a and b, two free nodes each, and their providers:
    (placement, {host: [node uuid]})."""
    placement = FakePlacement()
    held = {}
    for host in 'ab':
        db_services.register(ctx(), host)
        nodes = [fakes.make_node() for _ in range(2)]
        add_nodes(host, nodes)
        report(placement, nodes)
        held[host] = sorted(n.uuid for n in nodes)
    return placement, held


def create(placement, uuid=None, host=None, claims=None):
    return placing.schedule_claim_and_create(
        ctx(), claims or claims_of(placement), uuid or new_uuid(), 'vm', SPEC,
        'http://img', 60, OWNER, host=host)


def holders(placement):
    """{provider: [consumers]} of the providers with an allocation."""
    found = {}
    for consumer, held in placement.allocations.items():
        for uuid in held:
            found.setdefault(uuid, []).append(consumer)
    return found


def test_the_claim_comes_before_the_row_which_names_its_node(fleet):
    placement, held = fleet
    uuid = new_uuid()
    rows_at_claim = []

    def at_claim(method, path):
        if method == 'PUT' and path.startswith('/allocations/'):
            rows_at_claim.append(db_instances.get(ctx(), uuid))
    placement.before = at_claim
    row = create(placement, uuid)
    assert rows_at_claim == [None]
    assert row.node in held[row.host]
    assert placement.allocations == {uuid: {row.node: {RC: 1}}}
    assert placement.owners[uuid] == OWNER
    stored = db_instances.get(ctx(), uuid)
    assert (stored.node, stored.host, stored.task_state) == (
        row.node, row.host, inst.SCHEDULED)


def test_creates_for_every_free_node_never_claim_one_twice(fleet):
    """Two schedulers (two Claims on one Placement), taking turns: each
    free node once, and then a refusal that records and claims nothing."""
    placement, held = fleet
    schedulers = [claims_of(placement), claims_of(placement)]
    rows = [create(placement, claims=schedulers[i % 2]) for i in range(4)]
    assert sorted(r.node for r in rows) == sorted(held['a'] + held['b'])
    assert all(len(c) == 1 for c in holders(placement).values())
    uuid = new_uuid()
    with pytest.raises(exception.NoValidHost, match='no free node'):
        create(placement, uuid)
    assert uuid not in placement.allocations
    assert db_instances.get(ctx(), uuid) is None


def test_a_host_whose_nodes_placement_holds_is_skipped(fleet):
    """Another consumer of Placement holds every node of the host the
    scheduler chooses first: the create goes to the other host."""
    placement, held = fleet
    first = db_scheduling.choose_with_free_nodes(ctx(), SPEC, ['a', 'b'], 8)[0]
    other = 'b' if first == 'a' else 'a'
    for node in held[first]:
        placement.allocate(f'nova-{node}', node, RC)
    row = create(placement)
    assert row.host == other and row.node in held[other]
    # Held everywhere: refused in one line, naming Placement.
    for node in held[other]:
        if node != row.node:
            placement.allocate(f'nova-{node}', node, RC)
    uuid = new_uuid()
    with pytest.raises(exception.NoValidHost) as refused:
        create(placement, uuid)
    assert 'Placement has no free node left' in str(refused.value)
    assert '\n' not in str(refused.value)
    assert db_instances.get(ctx(), uuid) is None
    assert uuid not in placement.allocations


def test_a_failed_insert_gives_the_claim_back(fleet, monkeypatch):
    placement, _held = fleet

    def insert_fails(*args, **kwargs):
        raise db_exc.DBConnectionError('the database went away')
    monkeypatch.setattr(db_scheduling, 'create_on_node', insert_fails)
    uuid = new_uuid()
    with pytest.raises(db_exc.DBConnectionError):
        create(placement, uuid)
    assert placement.allocations == {}
    assert ('DELETE', f'/allocations/{uuid}') in placement.requests


def test_a_node_recorded_meanwhile_is_given_back_and_another_claimed(fleet):
    """A scheduler that claims nothing recorded the node after our choice:
    the insert is refused (one live instance per node), our claim goes
    back and the next choice takes another node."""
    placement, held = fleet
    real = db_scheduling.create_on_node
    taken = []

    def someone_records_it_first(ctx_, uuid, name, spec, image, host, node,
                                 **extra):
        if not taken:
            taken.append(node)
            db_instances.create(ctx_, new_uuid(), 'other', host, spec, image,
                                node=node)
        return real(ctx_, uuid, name, spec, image, host, node, **extra)
    db_scheduling.create_on_node, saved = someone_records_it_first, real
    try:
        row = create(placement)
    finally:
        db_scheduling.create_on_node = saved
    assert row.node != taken[0]
    assert list(placement.allocations) == [row.uuid]


def test_placement_down_at_create_records_nothing(fleet):
    placement, _held = fleet
    placement.before = lambda method, path: Response(503)
    uuid = new_uuid()
    with pytest.raises(exception.PlacementUnavailable):
        create(placement, uuid)
    assert db_instances.get(ctx(), uuid) is None


def test_a_host_given_is_the_only_one_tried(fleet):
    placement, held = fleet
    for node in held['a']:
        placement.allocate(f'nova-{node}', node, RC)
    with pytest.raises(exception.RequestRefused, match='Placement has no free'):
        create(placement, host='a')
    assert create(placement, host='b').node in held['b']


# -- the flows: the build reserves the claimed node; the claim goes with
# the instance

@pytest.fixture
def claimed_cloud(cloud):
    """The two-service cloud with Placement: its nodes' providers, and the
    workers releasing claims there. (cloud, placement)."""
    placement = FakePlacement()
    report(placement, cloud.ironic.nodes.values())
    for manager in cloud.managers.values():
        manager.worker.claims = claims_of(placement)
    return cloud, placement


def claimed_request(cloud, placement, index=-1):
    """A build request on a node claimed for it: the last of the nodes the
    build would otherwise try first (index -1)."""
    host, node = sorted((h, o.uuid) for h in 'ab'
                        for o in db_nodes.offers_of(ctx(), h))[index]
    uuid = new_uuid()
    assert claims_of(placement).claim(uuid, node, SPEC.resource_class, *OWNER)
    row = db_instances.create(ctx(), uuid, 'vm', host, SPEC, 'http://img',
                              node=node)
    return cloud.managers[host], row


def run(manager, flow, uuid):
    manager._run(uuid, flow, db_instances.get(ctx(), uuid))
    return db_instances.get(ctx(), uuid, deleted=True)


def test_the_build_reserves_the_claimed_node_and_keeps_the_claim(claimed_cloud):
    cloud, placement = claimed_cloud
    manager, row = claimed_request(cloud, placement)
    done = run(manager, build.build, row.uuid)
    assert (done.vm_state, done.node) == (inst.ACTIVE, row.node)
    assert cloud.ironic.allocations[row.uuid].node_uuid == row.node
    assert placement.allocations == {row.uuid: {row.node: {RC: 1}}}


def test_a_failed_build_releases_its_claim_once(claimed_cloud):
    cloud, placement = claimed_cloud
    cloud.ironic.deploy_fails = True
    manager, row = claimed_request(cloud, placement)
    done = run(manager, build.build, row.uuid)
    assert (done.vm_state, done.task_state, done.node) == (inst.ERROR, None,
                                                           None)
    assert placement.allocations == {}
    assert placement.requests.count(('DELETE', f'/allocations/{row.uuid}')) == 1


def test_a_delete_releases_the_claim_and_waits_for_placement(claimed_cloud):
    cloud, placement = claimed_cloud
    manager, row = claimed_request(cloud, placement)
    run(manager, build.build, row.uuid)
    db_instances.request_delete(ctx(), row.uuid)
    placement.before = lambda method, path: Response(503)
    waiting = run(manager, teardown.delete, row.uuid)
    # Not deleted while the claim stays: tried again, the reason shown.
    assert waiting.task_state == inst.DELETING
    assert 'claim in Placement is not released' in waiting.fault
    assert row.uuid in placement.allocations
    placement.before = None
    done = run(manager, teardown.delete, row.uuid)
    assert done.vm_state == inst.DELETED
    assert placement.allocations == {}


def test_a_takeover_keeps_the_claim_and_the_new_host_releases_it(claimed_cloud):
    cloud, placement = claimed_cloud
    manager, row = claimed_request(cloud, placement)
    run(manager, build.build, row.uuid)
    dead = row.host
    new = 'b' if dead == 'a' else 'a'
    instance_cloud.take_over(row.uuid, dead, new, cloud)
    assert placement.allocations == {row.uuid: {row.node: {RC: 1}}}
    db_instances.request_delete(ctx(), row.uuid)
    # The dead host's worker, back late, is fenced: the claim stays.
    run(cloud.managers[dead], teardown.delete, row.uuid)
    assert row.uuid in placement.allocations
    assert run(cloud.managers[new], teardown.delete,
               row.uuid).vm_state == inst.DELETED
    assert placement.allocations == {}


def test_without_placement_no_claim_is_touched(cloud):
    placement = FakePlacement()
    row = instance_cloud.built(cloud)
    db_instances.request_delete(ctx(), row.uuid)
    assert run(cloud.managers[row.host], teardown.delete,
               row.uuid).vm_state == inst.DELETED
    assert placement.requests == []
