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

"""Placement: the provider rules, the report client and the provider sync,
against a Placement held in memory at the keystoneauth Adapter boundary
(harness/fake_placement.py); then resource-tracker cycles of several
services with Placement on, on the three databases."""

import dataclasses
import datetime
import logging

import pytest
from keystoneauth1 import exceptions as ks_exc
from oslo_config import cfg

from ironic_compute import conf as ic_conf
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services
from ironic_compute.harness.fake_placement import FakePlacement
from ironic_compute.harness.fake_placement import Response
from ironic_compute.nodes import ownership
from ironic_compute.nodes import tracker as resource_tracker
from ironic_compute.placement import claims as placement_claims
from ironic_compute.placement import client as placement_client
from ironic_compute.placement import provider
from ironic_compute.placement import sync as placement_sync
from tests.unit import clocks
from tests.unit import fakes
from tests.unit.test_resource_tracker import SETTINGS
from tests.unit.test_resource_tracker import set_service


def node(**values):
    base = fakes.make_node(conductor_group='group-a',
                           resource_class='baremetal.gold',
                           traits=('CUSTOM_GPU',))
    base = dataclasses.replace(base, power_state='power off')
    return dataclasses.replace(base, **values)


@pytest.fixture
def placement():
    return FakePlacement()


def make_sync(placement, **kwargs):
    kwargs.setdefault('clock', clocks.Clock(now=1000.0))
    return placement_sync.ProviderSync(
        placement_client.PlacementClient(None, adapter=placement), **kwargs)


# -- the rules (pure)

@pytest.mark.parametrize('values, reason', [
    ({}, None),
    ({'maintenance': True}, provider.MAINTENANCE),
    ({'power_state': 'error'}, provider.POWER_ERROR),
    ({'power_state': None}, provider.POWER_UNKNOWN),
    ({'provision_state': 'active'}, 'provision state active'),
    ({'provision_state': 'manageable'}, 'provision state manageable'),
    ({'provision_state': None}, 'provision state None'),
    ({'instance_uuid': 'a-uuid'}, provider.INSTANCE),
    ({'power_state': 'power on'}, None),
])
def test_reserved_rules(values, reason):
    n = node(**values)
    assert provider.reserved_reason(n) == reason
    assert provider.inventory(n)['CUSTOM_BAREMETAL_GOLD'] == {
        'total': 1, 'reserved': 0 if reason is None else 1, 'min_unit': 1,
        'max_unit': 1, 'step_size': 1, 'allocation_ratio': 1.0}


@pytest.mark.parametrize('name, normalized', [
    ('baremetal.gold', 'CUSTOM_BAREMETAL_GOLD'),
    ('CUSTOM_X', 'CUSTOM_X'),
    ('custom-x', 'CUSTOM_X'),
    ('bm--large  1', 'CUSTOM_BM_LARGE_1'),
    ('', None),
    (None, None),
])
def test_resource_class_normalized_as_nova_does(name, normalized):
    assert provider.normalize_resource_class(name) == normalized


def test_no_resource_class_no_inventory():
    assert provider.desired(node(resource_class=None)).inventory == {}


def test_one_aggregate_per_conductor_group():
    a = provider.aggregate_uuid('group-a')
    assert a == provider.aggregate_uuid('GROUP-A') != provider.aggregate_uuid('')
    assert provider.desired(node()).aggregates == {a}
    assert provider.desired(node()).traits == {'CUSTOM_GPU', 'COMPUTE_NODE'}


# -- the sync against the fake Placement

def test_a_new_node_gets_its_provider(placement):
    n = node()
    stats = make_sync(placement).run({n.uuid: n})
    assert (stats.created, stats.updated, stats.failed) == (1, 1, 0)
    rp = placement.providers[n.uuid]
    assert rp['name'] == n.uuid
    assert rp['inventories'] == provider.inventory(n)
    assert rp['traits'] == {'CUSTOM_GPU', 'COMPUTE_NODE'}
    assert rp['aggregates'] == {provider.aggregate_uuid('group-a')}
    # The custom class and trait existed before they were used.
    paths = [p for _m, p in placement.requests]
    assert paths.index('/resource_classes/CUSTOM_BAREMETAL_GOLD') < paths.index(
        f'/resource_providers/{n.uuid}/inventories', 2)


def test_a_steady_cycle_sends_nothing(placement):
    nodes = {n.uuid: n for n in (node() for _ in range(5))}
    sync = make_sync(placement, refresh_interval=300)
    sync.run(nodes)
    placement.requests.clear()
    for _ in range(3):
        sync.clock.now += 10
        assert sync.run(nodes).requests == 0
    assert placement.requests == []
    # Past refresh_interval: one listing, and still no write.
    sync.clock.now += 300
    assert sync.run(nodes).requests == 1
    assert placement.requests == [
        ('GET', '/resource_providers?member_of=in:'
                + provider.aggregate_uuid('group-a'))]


def test_a_change_writes_only_what_changed(placement):
    n = node()
    sync = make_sync(placement)
    sync.run({n.uuid: n})
    placement.requests.clear()
    sync.run({n.uuid: dataclasses.replace(n, maintenance=True)})
    assert placement.requests == [
        ('PUT', f'/resource_providers/{n.uuid}/inventories')]
    assert placement.providers[n.uuid]['inventories'][
        'CUSTOM_BAREMETAL_GOLD']['reserved'] == 1


def test_a_restarted_service_adopts_without_writing(placement):
    n = node()
    make_sync(placement).run({n.uuid: n})
    placement.requests.clear()
    stats = make_sync(placement).run({n.uuid: n})
    assert (stats.created, stats.adopted, stats.updated) == (0, 1, 0)
    assert placement.writes() == [
        ('PUT', '/resource_classes/CUSTOM_BAREMETAL_GOLD'),
        ('PUT', '/traits/CUSTOM_GPU')]
    assert [r for r in placement.requests if r[0] in ('POST', 'DELETE')] == []


def test_a_409_on_create_adopts_the_provider(placement):
    n = node()

    def made_meanwhile(method, path):
        if method == 'POST':
            placement.before = None
            placement.add_provider(n.uuid, traits=['CUSTOM_OPERATOR'])
            return Response(409, {'errors': [
                {'code': 'placement.duplicate_uuid', 'detail': 'exists'}]})
    placement.before = made_meanwhile
    stats = make_sync(placement).run({n.uuid: n})
    assert (stats.created, stats.adopted, stats.failed) == (0, 1, 0)
    assert len(placement.providers) == 1
    assert placement.providers[n.uuid]['traits'] == {
        'CUSTOM_OPERATOR', 'CUSTOM_GPU', 'COMPUTE_NODE'}


def test_operator_traits_and_aggregates_are_kept(placement):
    n = node(traits=('CUSTOM_GPU', 'CUSTOM_OLD'))
    sync = make_sync(placement)
    sync.run({n.uuid: n})
    rp = placement.providers[n.uuid]
    # An operator adds a trait and an aggregate by hand.
    placement.traits.add('CUSTOM_RACK_7')
    rp['traits'].add('CUSTOM_RACK_7')
    rp['aggregates'].add('operator-aggregate')
    placement.bump(n.uuid)
    sync.clock.now += 1000  # the refresh sees the generation move
    sync.run({n.uuid: dataclasses.replace(n, traits=frozenset({'CUSTOM_GPU'}))})
    assert rp['traits'] == {'CUSTOM_GPU', 'COMPUTE_NODE', 'CUSTOM_RACK_7'}
    assert rp['aggregates'] == {provider.aggregate_uuid('group-a'),
                                'operator-aggregate'}


def test_on_first_sight_the_rows_account_says_which_traits_were_ours(placement):
    n = node(traits=('CUSTOM_GPU', 'CUSTOM_OLD'))
    make_sync(placement).run({n.uuid: n})
    placement.traits.add('CUSTOM_RACK_7')
    placement.providers[n.uuid]['traits'].add('CUSTOM_RACK_7')
    # The successor (a takeover) sees the node without CUSTOM_OLD; the row
    # recorded it, so it was set by the previous owner: it goes.
    before = placement_sync.row_account('group-a', '|CUSTOM_GPU|CUSTOM_OLD|')
    moved = dataclasses.replace(n, traits=frozenset({'CUSTOM_GPU'}),
                                conductor_group='group-b')
    make_sync(placement).run({n.uuid: moved}, before={n.uuid: before})
    rp = placement.providers[n.uuid]
    assert rp['traits'] == {'CUSTOM_GPU', 'COMPUTE_NODE', 'CUSTOM_RACK_7'}
    assert rp['aggregates'] == {provider.aggregate_uuid('group-b')}


def test_a_generation_conflict_is_read_again_and_retried(placement):
    n = node()
    sync = make_sync(placement)
    sync.run({n.uuid: n})
    conflicts = []

    def someone_writes_first(method, path):
        if method == 'PUT' and path.endswith('/inventories') and not conflicts:
            conflicts.append(path)
            placement.bump(n.uuid)
    placement.before = someone_writes_first
    stats = sync.run({n.uuid: dataclasses.replace(n, maintenance=True)})
    assert (stats.conflicts, stats.failed, stats.updated) == (1, 0, 1)
    assert placement.providers[n.uuid]['inventories'][
        'CUSTOM_BAREMETAL_GOLD']['reserved'] == 1
    # Known again: the next cycle is steady.
    placement.before = None
    assert sync.run({n.uuid: dataclasses.replace(n, maintenance=True)}).requests == 0


def test_generation_conflicts_are_retried_a_bounded_number_of_times(placement):
    n = node()
    sync = make_sync(placement)
    sync.run({n.uuid: n})

    def always_first(method, path):
        if method == 'PUT' and path.startswith('/resource_providers/'):
            placement.bump(n.uuid)
    placement.before = always_first
    stats = sync.run({n.uuid: dataclasses.replace(n, maintenance=True)})
    assert (stats.conflicts, stats.failed) == (placement_sync.MAX_ATTEMPTS, 1)
    puts = [r for r in placement.requests if r[0] == 'PUT'
            and r[1].endswith('/inventories')]
    assert len(puts) == placement_sync.MAX_ATTEMPTS + 1  # the first run's too


def test_a_gone_node_s_provider_goes_only_without_allocations(placement):
    n, other = node(), node()
    sync = make_sync(placement)
    sync.run({n.uuid: n, other.uuid: other})
    placement.allocate('instance-1', n.uuid, 'CUSTOM_BAREMETAL_GOLD')
    stats = sync.run({other.uuid: other}, gone={n.uuid})
    assert (stats.kept, stats.deleted) == (1, 0)
    assert n.uuid in placement.providers
    # Retried every cycle while the allocation stays.
    assert sync.run({other.uuid: other}).kept == 1
    del placement.allocations['instance-1']
    stats = sync.run({other.uuid: other})
    assert (stats.kept, stats.deleted) == (0, 1)
    assert set(placement.providers) == {other.uuid}
    assert sync.run({other.uuid: other}).requests == 0


def test_a_node_that_changed_owner_keeps_its_provider(placement):
    n = node()
    a, b = make_sync(placement), make_sync(placement)
    a.run({n.uuid: n})
    created = placement.providers[n.uuid]
    a.run({})  # released: a forgets it, deletes nothing
    b.run({n.uuid: n})  # taken: b adopts it
    a.run({n.uuid: n})  # back again
    assert placement.providers[n.uuid] is created
    assert [r for r in placement.requests if r[0] in ('POST', 'DELETE')] == [
        ('POST', '/resource_providers')]


def test_placement_down_is_one_line_and_retried_next_cycle(placement, caplog):
    n = node()
    sync = make_sync(placement)

    def down(method, path):
        raise ks_exc.ConnectFailure('Unable to establish connection')
    placement.before = down
    with caplog.at_level(logging.ERROR):
        stats = sync.run({n.uuid: n})
    assert stats.skipped.startswith('Placement unavailable since')
    assert len(caplog.records) == 1 and not caplog.records[0].exc_info
    placement.before = lambda method, path: Response(503, {'errors': [{}]})
    assert sync.run({n.uuid: n}).skipped
    placement.before = None
    assert sync.run({n.uuid: n}).created == 1


def test_a_first_sync_of_many_runs_on_several_workers(placement):
    nodes = {n.uuid: n for n in (node() for _ in range(40))}
    sync = make_sync(placement, workers=4)
    stats = sync.run(nodes)
    assert (stats.created, stats.updated, stats.failed) == (40, 40, 0)
    assert stats.requests == len(placement.requests)
    assert set(placement.providers) == set(nodes)
    assert sync.run(nodes).requests == 0
    # Placement going down half way: one verdict, nothing raised.
    calls = []

    def down_after_some(method, path):
        calls.append(path)
        if len(calls) > 10:
            raise ks_exc.ConnectFailure('refused')
    placement.before = down_after_some
    fresh = make_sync(placement, workers=4)
    stats = fresh.run(nodes)
    assert stats.skipped.startswith('Placement unavailable')
    placement.before = None
    stats = fresh.run(nodes)
    assert (stats.created, stats.failed, stats.skipped) == (0, 0, None)
    assert len(fresh.known) == 40


def test_no_provider_is_written_once_the_view_is_too_old(placement):
    nodes = {n.uuid: n for n in (node() for _ in range(3))}
    sync = make_sync(placement)
    stats = sync.run(nodes, fresh=lambda: False)
    assert stats.skipped.startswith('the view of the peers is too old')
    assert placement.writes() == [] and sync.known == {}
    assert sync.run(nodes, fresh=lambda: True).created == 3


def test_a_provider_deleted_by_hand_is_made_again_at_the_refresh(placement):
    n = node()
    sync = make_sync(placement, refresh_interval=60)
    sync.run({n.uuid: n})
    del placement.providers[n.uuid]
    sync.clock.now += 61
    assert sync.run({n.uuid: n}).created == 1
    assert placement.providers[n.uuid]['inventories'] == provider.inventory(n)


def test_a_refused_trait_fails_that_provider_only(placement):
    bad, good = node(traits=('NOT_A_STANDARD_TRAIT',)), node()

    def unknown_standard_trait(method, path):
        if method == 'PUT' and path == f'/resource_providers/{bad.uuid}/traits':
            return Response(400, {'errors': [{'detail': 'No such trait'}]})
    placement.before = unknown_standard_trait
    stats = make_sync(placement).run({bad.uuid: bad, good.uuid: good})
    assert stats.failed == 1
    assert placement.providers[good.uuid]['traits'] == {'CUSTOM_GPU',
                                                        'COMPUTE_NODE'}


# -- configuration, the client

def conf_with(**placement_opts):
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    conf([])
    for name, value in placement_opts.items():
        conf.set_override(name, value, group='placement')
    return conf


def test_unset_placement_section_means_no_sync():
    assert placement_sync.ProviderSync.from_conf(conf_with()) is None


def test_the_token_is_never_logged(caplog, tmp_path):
    path = tmp_path / 'ironic-compute.conf'
    path.write_text('[placement]\nauth_type = admin_token\n'
                    'endpoint = http://127.0.0.1:1\ntoken = sekrit-token\n')
    conf = cfg.ConfigOpts()
    ic_conf.register_opts(conf)
    conf(['--config-file', str(path)])
    sync = placement_sync.ProviderSync.from_conf(conf)
    assert sync is not None
    n = node()
    with caplog.at_level(logging.DEBUG):
        stats = sync.run({n.uuid: n})
    assert stats.skipped  # nothing listens on port 1
    assert 'sekrit' not in caplog.text
    assert 'http://127.0.0.1:1' in caplog.text


# -- resource-tracker cycles of several services, with Placement

def tracker(host, fake, placement):
    service_id = db_services.register(db_api.Context(),
                                      ownership.normalize_host(host))
    return resource_tracker.ResourceTracker(host, service_id, fake,
                                            placement=make_sync(placement))


def settle(trackers, rounds=3):
    for _ in range(rounds):
        for t in trackers:
            t.run_cycle(SETTINGS)


def test_providers_follow_the_rows_through_a_takeover(migrated_engine,
                                                      placement):
    ironic = fakes.FakeIronic(node(traits=('CUSTOM_GPU', 'CUSTOM_OLD'))
                              for _ in range(30))
    trackers = [tracker(h, ironic, placement) for h in ('a', 'b', 'c')]
    settle(trackers)
    assert set(placement.providers) == set(ironic.nodes)
    posts = [r for r in placement.requests if r[0] == 'POST']
    assert len(posts) == 30
    # Each provider written by its row's owner only: steady now.
    placement.requests.clear()
    settle(trackers, rounds=1)
    assert placement.requests == []
    # c dies; while it is down a node of c's loses a trait in Ironic.
    victim = next(u for u, t in trackers[2].placement.known.items())
    ironic.nodes[victim] = dataclasses.replace(
        ironic.nodes[victim], traits=frozenset({'CUSTOM_GPU'}))
    set_service(migrated_engine, 'c',
                last_seen_up=datetime.datetime(2020, 1, 1))
    settle(trackers[:2])
    assert [r for r in placement.requests if r[0] in ('POST', 'DELETE')] == []
    assert placement.providers[victim]['traits'] == {'CUSTOM_GPU',
                                                     'COMPUTE_NODE'}
    # A node deleted in Ironic: its row goes after the 404, its provider too.
    gone = next(iter(trackers[0].placement.known))
    del ironic.nodes[gone]
    settle(trackers[:2], rounds=1)
    assert set(placement.providers) == set(ironic.nodes)


def test_placement_down_never_stops_the_rows(migrated_engine, placement):
    ironic = fakes.FakeIronic(node() for _ in range(5))
    t = tracker('a', ironic, placement)

    def down(method, path):
        raise ks_exc.ConnectFailure('refused')
    placement.before = down
    stats = t.run_cycle(SETTINGS)
    assert stats.created == 5 and t.placement_stats.skipped
    placement.before = None
    t.run_cycle(SETTINGS)
    assert set(placement.providers) == set(ironic.nodes)


# -- claims

@pytest.fixture
def claimable(placement):
    """Three free nodes' providers and one in maintenance, in group-a."""
    nodes = [node(traits=('CUSTOM_GPU',)) for _ in range(3)]
    nodes.append(node(maintenance=True))
    make_sync(placement).run({n.uuid: n for n in nodes})
    return [n.uuid for n in nodes]


def make_claims(placement):
    return placement_claims.Claims(
        placement_client.PlacementClient(None, adapter=placement))


def test_candidates_are_the_free_matching_nodes_of_the_group(placement, claimable):
    claims = make_claims(placement)
    assert claims.candidates('baremetal.gold', ('CUSTOM_GPU',), 'group-a') == claimable[:3]
    assert claims.candidates('baremetal.gold', (), 'group-a', among=claimable[1:]) == claimable[1:3]
    assert claims.candidates('baremetal.gold', ('CUSTOM_OTHER',), 'group-a') == []
    assert claims.candidates('baremetal.gold', (), 'group-b') == []


def test_a_claim_is_one_allocation_and_idempotent(placement, claimable):
    claims = make_claims(placement)
    node_uuid = claims.claim_one('inst-1', 'baremetal.gold', (), 'group-a', None, 'p', 'u')
    assert node_uuid == claimable[0]
    assert placement.allocations == {'inst-1': {node_uuid: {'CUSTOM_BAREMETAL_GOLD': 1}}}
    # Sent again (an answer lost): the same claim, no second allocation.
    assert claims.claim('inst-1', node_uuid, 'baremetal.gold', 'p', 'u')
    assert claims.holder('inst-1') == node_uuid
    # Another instance gets another node, then none is left.
    assert claims.claim_one('inst-2', 'baremetal.gold', (), 'group-a', None,
                            'p', 'u') == claimable[1]
    assert not claims.claim('inst-3', node_uuid, 'baremetal.gold', 'p', 'u')
    claims.claim_one('inst-3', 'baremetal.gold', (), 'group-a', None, 'p', 'u')
    assert claims.claim_one('inst-4', 'baremetal.gold', (), 'group-a', None,
                            'p', 'u') is None


def test_release_is_idempotent_and_frees_the_node(placement, claimable):
    claims = make_claims(placement)
    claims.claim_one('inst-1', 'baremetal.gold', (), 'group-a', None, 'p', 'u')
    claims.release('inst-1')
    claims.release('inst-1')
    assert placement.allocations == {}
    assert claims.holder('inst-1') is None
    assert claims.claim_one('inst-2', 'baremetal.gold', (), 'group-a', None,
                            'p', 'u') == claimable[0]


def test_a_double_allocation_by_placement_is_given_back(placement, claimable):
    """Placement on MariaDB may write two allocations on one provider under
    concurrency (claims.py): the claimer that sees it gives its own back
    and takes another node."""
    claims = make_claims(placement)
    doubled = []

    def someone_else_too(method, path):
        if method == 'GET' and path.endswith('/allocations') and not doubled:
            uuid = path.split('/')[2]
            doubled.append(uuid)
            placement.allocations['intruder'] = {uuid: {'CUSTOM_BAREMETAL_GOLD': 1}}
    placement.before = someone_else_too
    got = claims.claim_one('inst-1', 'baremetal.gold', (), 'group-a', None, 'p', 'u')
    assert got == claimable[1] and doubled == [claimable[0]]
    assert {c: list(a) for c, a in placement.allocations.items()} == {
        'intruder': [claimable[0]], 'inst-1': [claimable[1]]}
