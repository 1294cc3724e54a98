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

"""nodes/plan_application: a cycle's plan written to the rows; deletes only
after Ironic's 404."""

from ironic_compute import ironic
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services
from ironic_compute.nodes import plan_application
from ironic_compute.nodes import sync_plan
from ironic_compute.nodes import tracker as resource_tracker
from ironic_compute.ring import hash_ring
from tests.unit import db_rows
from tests.unit import fakes

SETTINGS = resource_tracker.Settings(partition_exponent=8)


def held_by_a(count):
    """``count`` nodes whose rows service a holds; (fake Ironic, nodes)."""
    nodes = [fakes.make_node() for _ in range(count)]
    fake = fakes.FakeIronic(nodes)
    tracker = resource_tracker.ResourceTracker(
        'a', db_services.register(db_api.Context(), 'a'), fake)
    tracker.run_cycle(SETTINGS)
    return fake, nodes


def test_a_row_is_deleted_on_a_404_and_released_when_the_node_moved(
        sqlite_engine):
    fake, (gone, moved, kept) = held_by_a(3)
    del fake.nodes[gone.uuid]
    stats = resource_tracker.CycleStats()
    plan_application.delete_gone(db_api.Context(), {
        gone.uuid: 'a', moved.uuid: 'a'}, 'a', fake, stats)
    assert db_rows.live_nodes(sqlite_engine) == {moved.uuid: None,
                                                 kept.uuid: 'a'}
    assert (stats.deleted, stats.released) == (1, 1)


def test_no_row_is_deleted_while_ironic_cannot_answer(sqlite_engine):
    fake, nodes = held_by_a(2)
    fake.fail = True
    stats = resource_tracker.CycleStats()
    plan_application.delete_gone(db_api.Context(), {
        n.uuid: 'a' for n in nodes}, 'a', fake, stats)
    assert set(db_rows.live_nodes(sqlite_engine)) == {n.uuid for n in nodes}
    assert stats.deleted == 0


def test_many_rows_are_confirmed_by_one_listing_unless_per_node(
        sqlite_engine):
    count = plan_application.BULK_EXISTS_THRESHOLD + 1
    fake, nodes = held_by_a(count)
    check = {n.uuid: 'b' for n in nodes}  # another's rows: nothing moves
    plan_application.delete_gone(db_api.Context(), check, 'a', fake,
                                 resource_tracker.CycleStats())
    assert fake.exists_calls == 0
    plan_application.delete_gone(db_api.Context(), check, 'a', fake,
                                 resource_tracker.CycleStats(), per_node=True)
    assert fake.exists_calls == count


def test_a_plan_takes_creates_and_releases_with_conditional_writes(
        sqlite_engine):
    fake, (ours, theirs) = held_by_a(2)
    b_id = db_services.register(db_api.Context(), 'b')
    new = fakes.make_node()
    fields = resource_tracker.row_fields(new, ironic.node_resources(new))
    plan = sync_plan.Plan(create={new.uuid: fields})
    plan.release['b'].append(theirs.uuid)
    plan.take['nobody-we-saw'].append(ours.uuid)  # a race lost: no write
    stats = resource_tracker.CycleStats()
    services = db_services.load_services(db_api.Context()).rows
    plan_application.apply(db_api.Context(), plan, 'a',
                           services[0].id, services, fake, stats)
    assert db_rows.live_nodes(sqlite_engine) == {
        ours.uuid: 'a', theirs.uuid: 'b', new.uuid: 'a'}
    assert (stats.created, stats.released, stats.taken,
            stats.lost_races) == (1, 1, 0, 1)
    assert any(s.id == b_id for s in services)


def test_rows_outside_our_shards_go_to_their_shards_owner():
    ring = hash_ring.HashRing({'a', 'b'}, partition_exponent=8)
    keys = [f'n{i}' for i in range(20)]
    plan = sync_plan.Plan(check_gone={k: 'a' for k in keys})
    plan.check_gone['held-by-c'] = 'c'
    plan_application.release_to_shard_owners(plan, ring, 'a')
    to_b = [k for k in keys if ring.get_hosts(k)[0] == 'b']
    assert to_b and plan.release['b'] == to_b
    assert set(plan.check_gone) == (set(keys) - set(to_b)) | {'held-by-c'}
