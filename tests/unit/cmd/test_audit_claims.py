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

"""placement audit's claims: leaked claims and live instances without
theirs, and what --fix does of each, against the fake Ironic and the fake
Placement (the adapter boundary), on the three databases."""

import datetime
import json

from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import models
from ironic_compute.db.models import _utcnow
from ironic_compute.harness import fake_placement
from ironic_compute.instances import model as inst
from ironic_compute.placement import audit
from tests.unit import test_placement as helpers
from tests.unit.cmd.test_manage_placement import PLACEMENT_CONF
from tests.unit.cmd.test_manage_placement import world  # noqa: F401
from tests.unit.test_resource_tracker import SETTINGS

RC = 'CUSTOM_BAREMETAL_GOLD'
BUILT, OLD, RECENT, STRANGER = (f'{i}0000000-0000-4000-8000-00000000000{i}'
                                for i in range(1, 5))
_instances = models.instances


def built(uuid, node, **values):
    """An instance made by instance create, active on ``node``."""
    db_instances.create(db_api.Context(), uuid, f'vm-{uuid[:4]}', 'a',
                        inst.RequestSpec('baremetal.gold'), 'http://image',
                        project_id='demo', user_id='alice')
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == uuid).values(
            node=node, vm_state='active', task_state=None, **values))


def deleted(uuid, node, minutes_ago):
    built(uuid, node)
    ctx = db_api.Context()
    assert db_instances.soft_delete(ctx, db_instances.request_delete(ctx, uuid))
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == uuid).values(
            deleted_at=_utcnow() - datetime.timedelta(minutes=minutes_ago)))


def audit_json(cli, *extra):
    result = cli('placement', 'audit', '--format', 'json', *extra, conf=PLACEMENT_CONF)
    return result.code, json.loads(result.out)


def test_leaked_and_missing_claims_and_what_fix_does(migrated_engine, cli, world):  # noqa: F811
    ironic_fake, placement = world
    n_built, n_old, n_recent, n_stranger = sorted(ironic_fake.nodes)
    # BUILT is on its node (reserved: it carries an instance), unclaimed:
    # built before Placement was turned on.
    ironic_fake.nodes[n_built] = helpers.node(uuid=n_built, instance_uuid=BUILT,
                                              provision_state='active')
    built(BUILT, n_built)
    helpers.tracker('a', ironic_fake, placement).run_cycle(SETTINGS)
    assert placement.providers[n_built]['inventories'][RC]['reserved'] == 1
    deleted(OLD, n_old, minutes_ago=20)
    deleted(RECENT, n_recent, minutes_ago=1)
    for consumer, node in ((OLD, n_old), (RECENT, n_recent), (STRANGER, n_stranger)):
        placement.allocate(consumer, node, RC)

    code, report = audit_json(cli)
    assert code == 1
    found = {f['instance']: f for f in report['disagreements']}
    assert set(found) == {BUILT, OLD, RECENT, STRANGER}, found
    assert (found[BUILT]['problem'], found[BUILT]['node'], found[BUILT]['fixable']) == (
        audit.UNCLAIMED, n_built, True)
    assert [found[c]['problem'] for c in (OLD, RECENT, STRANGER)] == [audit.LEAKED] * 3
    assert [found[c]['fixable'] for c in (OLD, RECENT, STRANGER)] == [True, False, False]
    assert 'no instance of this database' in found[STRANGER]['detail']
    assert '--fix deletes it once' in found[RECENT]['fix']

    code, report = audit_json(cli, '--fix')
    assert (code, report['fixed']) == (1, 2)
    assert {f['instance'] for f in report['disagreements']} == {RECENT, STRANGER}
    assert OLD not in placement.allocations
    assert placement.allocations[BUILT] == {n_built: {RC: 1}}
    assert placement.owners[BUILT] == ('demo', 'alice')
    # The reserved flag lifted for the claim only, in the same request.
    assert placement.providers[n_built]['inventories'][RC]['reserved'] == 1
    assert ('POST', '/reshaper') in placement.requests


def built_and_reported(fakes_):
    """BUILT recorded on the fake Ironic's first node, whose provider a
    cycle of service a then wrote (``fakes_``: the world fixture's
    Ironic and Placement); the node."""
    ironic_fake, placement = fakes_
    node = sorted(ironic_fake.nodes)[0]
    built(BUILT, node)
    helpers.tracker('a', ironic_fake, placement).run_cycle(SETTINGS)
    return node


def test_no_claim_is_made_for_an_instance_that_goes_meanwhile(
        migrated_engine, cli, world):  # noqa: F811
    placement = world[1]
    built_and_reported(world)

    def delete_first(method, path):
        if path == '/reshaper':  # the delete gave the claim back already
            placement.before = None
            with db_api.get_engine().begin() as conn:
                conn.execute(_instances.update().where(_instances.c.uuid == BUILT)
                             .values(task_state=inst.DELETING))
    placement.before = delete_first
    code, report = audit_json(cli, '--fix')
    assert report['fixed'] == 0 and code == 0
    assert BUILT not in placement.allocations


def test_a_provider_held_by_another_is_not_claimed_over(migrated_engine, cli, world):  # noqa: F811
    placement = world[1]
    node = built_and_reported(world)
    placement.allocate(STRANGER, node, RC)
    code, report = audit_json(cli, '--fix')
    found = {f['instance']: f for f in report['disagreements']}
    assert (code, report['fixed']) == (1, 0)
    assert not found[BUILT]['fixable'] and STRANGER in found[BUILT]['detail']
    assert BUILT not in placement.allocations


def test_the_pure_claim_rules():
    n = helpers.node()
    now = datetime.datetime(2026, 11, 27, 12, 0)
    state = {n.uuid: object()}

    def holder(uuid, node=n.uuid, task=None, built=True, minutes_ago=None):
        gone = None if minutes_ago is None else now - datetime.timedelta(minutes=minutes_ago)
        return audit.Holder(uuid, node, task, built, gone)

    def problems(holders, allocations, rows=None):
        return [(f.problem, f.instance, f.fixable) for f in audit.claim_findings(
            {n.uuid: n}, {n.uuid: 'a'} if rows is None else rows, state, allocations,
            {h.uuid: h for h in holders}, now)]
    assert problems([holder(BUILT)], {n.uuid: [BUILT]}) == []
    # Being deleted, failing, or a record: no claim needed.
    for h in (holder(BUILT, task=inst.DELETING), holder(BUILT, task=inst.RELEASING),
              holder(BUILT, built=False), holder(BUILT, node=None)):
        assert problems([h], {}) == []
    # A failed build gives its claim back after it wrote the failure.
    assert problems([holder(BUILT, node=None, task=inst.RELEASING)], {n.uuid: [BUILT]}) == []
    assert problems([holder(BUILT, task=inst.SPAWNING)], {}) == [(audit.UNCLAIMED, BUILT, True)]
    assert problems([holder(BUILT)], {}) == [(audit.UNCLAIMED, BUILT, True)]
    assert problems([holder(BUILT)], {}, rows={}) == [(audit.UNCLAIMED, BUILT, False)]
    assert problems([holder(OLD, minutes_ago=11)], {n.uuid: [OLD]}) == [
        (audit.LEAKED, OLD, True)]
    assert problems([holder(OLD, minutes_ago=11)], {n.uuid: [OLD]}, rows={}) == [
        (audit.LEAKED, OLD, False)]
    assert problems([holder(RECENT, minutes_ago=9)], {n.uuid: [RECENT]}) == [
        (audit.LEAKED, RECENT, False)]
    assert problems([holder(BUILT, node=None, task=None)], {n.uuid: [BUILT]}) == [
        (audit.LEAKED, BUILT, False)]
    # Ironic still serving the deleted instance: its teardown releases it.
    served = helpers.node(uuid=n.uuid, instance_uuid=OLD)
    (finding,) = audit.claim_findings({n.uuid: served}, {n.uuid: 'a'}, state,
                                      {n.uuid: [OLD]},
                                      {OLD: holder(OLD, minutes_ago=30)}, now)
    assert not finding.fixable and 'serving it' in finding.detail


def test_a_provider_written_meanwhile_is_claimed_at_the_next_audit(
        migrated_engine, cli, world):  # noqa: F811
    placement = world[1]
    node = built_and_reported(world)

    def owner_writes_first(method, path):
        if path == '/reshaper':
            placement.before = None
            placement.bump(node)
    placement.before = owner_writes_first
    code, report = audit_json(cli, '--fix')
    assert (code, report['fixed']) == (1, 0)
    assert BUILT not in placement.allocations
    assert audit_json(cli, '--fix')[1]['fixed'] == 1
    assert placement.allocations[BUILT] == {node: {RC: 1}}


def test_a_reshaper_refused_to_our_role_leaves_the_claim_and_fixes_the_rest(
        migrated_engine, cli, world):  # noqa: F811
    ironic_fake, placement = world
    node, old_node = sorted(ironic_fake.nodes)[:2]
    built(BUILT, node)
    helpers.tracker('a', ironic_fake, placement).run_cycle(SETTINGS)
    deleted(OLD, old_node, minutes_ago=20)
    placement.allocate(OLD, old_node, RC)
    placement.before = lambda method, path: _forbidden() if path == '/reshaper' else None
    result = cli('placement', 'audit', '--fix', '--format', 'json', conf=PLACEMENT_CONF)
    report = json.loads(result.out)
    assert (result.code, report['fixed']) == (1, 1)
    assert [f['instance'] for f in report['disagreements']] == [BUILT]
    assert OLD not in placement.allocations and BUILT not in placement.allocations


def _forbidden():
    return fake_placement.Response(403, {'errors': [{'detail': 'Policy does not allow '
                                                     'placement:reshaper:reshape'}]})
