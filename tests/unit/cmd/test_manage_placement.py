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

"""ironic-compute-manage placement audit: the disagreements between the
database, Ironic and Placement, and --fix, against the fake Ironic and the
fake Placement, on the three databases."""

import dataclasses
import json

import pytest

from ironic_compute import ironic
from ironic_compute.harness.fake_placement import FakePlacement
from ironic_compute.placement import audit
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import provider
from tests.unit import fakes
from tests.unit import test_placement as helpers
from tests.unit.test_resource_tracker import SETTINGS

PLACEMENT_CONF = """[placement]
auth_type = admin_token
endpoint = http://placement.invalid
token = admin
"""


@pytest.fixture
def world(monkeypatch):
    """(fake Ironic, fake Placement) that the command talks to."""
    ironic_fake = fakes.FakeIronic(helpers.node() for _ in range(4))
    placement = FakePlacement()
    # The command imports the clients' modules when it runs (start-up).
    monkeypatch.setattr(ironic, 'IronicClient',
                        lambda conf: ironic_fake)
    real = placement_client.PlacementClient
    monkeypatch.setattr(placement_client, 'PlacementClient',
                        lambda conf, adapter=None: real(conf, adapter=adapter or placement))
    return ironic_fake, placement


def test_a_clean_fleet_has_nothing_to_say(migrated_engine, cli, world):
    ironic_fake, placement = world
    helpers.tracker('a', ironic_fake, placement).run_cycle(SETTINGS)
    result = cli('placement', 'audit', '--format', 'json', conf=PLACEMENT_CONF)
    assert result.code == 0, result.err
    report = result.json()
    assert (report['nodes'], report['providers'], report['findings']) == (4, 4, 0)


def test_audit_says_what_is_wrong_and_fix_mends_only_ours(migrated_engine, cli,
                                                          world):
    ironic_fake, placement = world
    a = helpers.tracker('a', ironic_fake, placement)
    a.run_cycle(SETTINGS)
    missing, differs, gone, kept = sorted(ironic_fake.nodes)
    # By hand: one provider deleted, one changed, an operator's trait too.
    del placement.providers[missing]
    rp = placement.providers[differs]
    rp['inventories']['CUSTOM_BAREMETAL_GOLD']['reserved'] = 1
    rp['traits'] = {'CUSTOM_OPERATOR'}
    placement.traits.add('CUSTOM_OPERATOR')
    # Two nodes deleted in Ironic while no service reported to Placement:
    # their rows go, their providers stay; one has an allocation.
    placement.allocate('instance-1', kept, 'CUSTOM_BAREMETAL_GOLD')
    del ironic_fake.nodes[gone], ironic_fake.nodes[kept]
    a.placement = None
    a.run_cycle(SETTINGS)
    # And a provider of a node this database never had, in our aggregate.
    stranger = placement.add_provider(
        'a0000000-0000-4000-8000-000000000000',
        aggregates=[provider.aggregate_uuid('group-a')])
    assert stranger

    result = cli('placement', 'audit', '--format', 'json', conf=PLACEMENT_CONF)
    assert result.code == 1, result.err
    found = {f['node']: f for f in json.loads(result.out)['disagreements']}
    assert found[missing]['problem'] == audit.MISSING
    assert found[differs]['problem'] == audit.DIFFERS
    assert 'should be' in found[differs]['detail']
    assert "traits ['COMPUTE_NODE', 'CUSTOM_GPU'] missing" in found[differs]['detail']
    assert found[gone]['problem'] == audit.STALE and found[gone]['fixable']
    assert 'instance-1' in found[kept]['fix'] and not found[kept]['fixable']
    assert not found['a0000000-0000-4000-8000-000000000000']['fixable']
    assert set(found) == {missing, differs, gone, kept,
                          'a0000000-0000-4000-8000-000000000000'}

    result = cli('placement', 'audit', '--fix', '--format', 'json',
                 conf=PLACEMENT_CONF)
    report = json.loads(result.out)
    assert result.code == 1 and report['fixed'] == 3
    assert {f['node'] for f in report['disagreements']} == {
        kept, 'a0000000-0000-4000-8000-000000000000'}
    assert placement.providers[differs]['traits'] == {
        'CUSTOM_OPERATOR', 'CUSTOM_GPU', 'COMPUTE_NODE'}
    assert missing in placement.providers and gone not in placement.providers


def test_without_placement_configured_it_says_so(migrated_engine, cli, world):
    result = cli('placement', 'audit')
    assert result.code == 1
    assert '[placement] is not configured here' in result.err


def test_the_pure_findings():
    n = helpers.node()
    want = provider.desired(n)
    assert audit.findings({n.uuid: n}, {n.uuid: 'a'}, {n.uuid: want}, {}, {}) == []
    wrong = dataclasses.replace(want, aggregates=frozenset())
    (finding,) = audit.findings({n.uuid: n}, {}, {n.uuid: wrong}, {}, {})
    assert finding.problem == audit.DIFFERS and not finding.fixable
    assert 'not in the aggregate' in finding.detail


def test_node_show_says_the_provider(migrated_engine, cli, world):
    ironic_fake, placement = world
    helpers.tracker('a', ironic_fake, placement).run_cycle(SETTINGS)
    uuid = sorted(ironic_fake.nodes)[0]
    ironic_fake.nodes[uuid] = dataclasses.replace(ironic_fake.nodes[uuid],
                                                  maintenance=True)
    placement.allocate('instance-1', uuid, 'CUSTOM_BAREMETAL_GOLD')
    conf = PLACEMENT_CONF + '[ironic]\nauth_type = none\n'
    report = cli('node', 'show', uuid, '--format', 'json', conf=conf).json()
    assert report['provider'] == uuid
    assert report['inventory'] == 'CUSTOM_BAREMETAL_GOLD 1 (reserved 0)'
    assert report['reserved_reason'] == provider.MAINTENANCE  # Ironic's now
    assert report['allocations'] == ['instance-1']
    assert report['provider_traits'] == ['COMPUTE_NODE', 'CUSTOM_GPU']
    table = cli('node', 'show', uuid, conf=conf)
    assert 'Reserved because' in table.out and 'instance-1' in table.out
    # Without [placement], node show is as it was.
    assert 'provider' not in cli('node', 'show', uuid, '--format', 'json').json()


def test_node_list_carries_the_provider_generation(migrated_engine, cli, world):
    ironic_fake, placement = world
    helpers.tracker('a', ironic_fake, placement).run_cycle(SETTINGS)
    gone = sorted(ironic_fake.nodes)[0]
    del placement.providers[gone]
    listing = cli('node', 'list', '--format', 'json', conf=PLACEMENT_CONF).json()
    generations = {r['uuid']: r['provider_generation'] for r in listing}
    assert generations[gone] is None
    assert {u: g for u, g in generations.items() if u != gone} == {
        u: placement.providers[u]['generation'] for u in generations if u != gone}
    assert 'Provider generation' in cli('node', 'list', conf=PLACEMENT_CONF).out
    assert 'provider_generation' not in cli('node', 'list', '--format', 'json').json()[0]
