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

"""Tests for the node ownership rules (ironic_compute.nodes.ownership)."""

import hashlib
import logging
from datetime import datetime
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from ironic_compute import exception
from ironic_compute.nodes import ownership as own
from ironic_compute.nodes.ownership import InstanceInfo
from ironic_compute.nodes.ownership import NodeInfo
from ironic_compute.nodes.ownership import Reason
from ironic_compute.nodes.ownership import ServiceRecord

NOW = datetime(2024, 5, 1, 12, 0, 0)  # naive UTC
DOWN_TIME = 60.0


class FakeRing:
    """Deterministic rendezvous-hash ring with the HashRing interface."""

    def __init__(self, hosts):
        self.hosts = frozenset(h.strip().lower() for h in hosts)
        self._order = sorted(self.hosts)
        self._memo = {}
        self.assign_calls = 0
        self.get_hosts_calls = 0

    def _lookup(self, key):
        hosts = self._memo.get(key)
        if hosts is None:
            hosts = sorted(self._order, key=lambda h: hashlib.sha256(
                f'{h}/{key}'.encode()).digest(), reverse=True)[:1]
            self._memo[key] = hosts
        return hosts

    def get_hosts(self, key):
        self.get_hosts_calls += 1
        return list(self._lookup(key))

    def assign(self, keys):
        self.assign_calls += 1
        return {k: list(self._lookup(k)) for k in keys}


def svc(host, age=0.0, **kw):
    """A service record that heartbeated ``age`` seconds before NOW."""
    kw.setdefault('last_seen_up', NOW - timedelta(seconds=age))
    return ServiceRecord(host=host, **kw)


def node_for(ring, host, prefix='node'):
    """First node uuid the ring maps to ``host``."""
    for i in range(10000):
        uuid = f'{prefix}-{i}'
        if ring.get_hosts(uuid)[0] == host:
            return uuid
    raise AssertionError(f'no key maps to {host}')


# --- heartbeats -------------------------------------------------------------

def test_normalize_host():
    assert own.normalize_host('  Compute-1.Example.ORG \n') == 'compute-1.example.org'


# --- live peers -----------------------------------------------------------

def test_live_peers_one_compute():
    assert own.live_peers([svc('host1')], 'host1', NOW, DOWN_TIME) == {'host1'}


def test_live_peers_no_records_still_has_self():
    assert own.live_peers([], 'Host1', NOW, DOWN_TIME) == {'host1'}


def test_live_peers_many_computes():
    services = [svc(f'host{i}') for i in range(5)]
    assert own.live_peers(services, 'host0', NOW, DOWN_TIME) == {f'host{i}' for i in range(5)}


def test_live_peers_new_compute_without_compute_nodes():
    services = [svc('host1'), svc('host2'), svc('new', has_compute_nodes=False)]
    assert own.live_peers(services, 'new', NOW, DOWN_TIME) == {'host1', 'host2', 'new'}


def test_live_peers_excludes_others_without_compute_nodes():
    services = [svc('host1'), svc('host2', has_compute_nodes=False)]
    assert own.live_peers(services, 'host1', NOW, DOWN_TIME) == {'host1'}


def test_live_peers_some_computes_down():
    services = [
        svc('host1'),
        svc('up', age=DOWN_TIME),
        svc('old', age=DOWN_TIME + 1),
        svc('never', last_seen_up=None),
        svc('disabled', disabled=True),
        svc('forced', forced_down=True),
        svc('stopped', stopped=True),
    ]
    assert own.live_peers(services, 'host1', NOW, DOWN_TIME) == {'host1', 'up'}


def test_live_peers_self_included_even_if_own_record_looks_down():
    # The running service is alive by definition, whatever its DB row says.
    services = [svc('host1', age=3600), svc('host2')]
    assert own.live_peers(services, 'host1', NOW, DOWN_TIME) == {'host1', 'host2'}


def test_live_peers_host_case_and_whitespace():
    services = [svc('HOST1 '), svc(' Host2'), svc('host2')]
    assert own.live_peers(services, ' host1', NOW, DOWN_TIME) == {'host1', 'host2'}


# --- ring peers / peer_list -------------------------------------------------

LIVE = frozenset({'host1', 'host2', 'host3', 'host4'})


@pytest.mark.parametrize('key, peer_list', [
    (None, None), (None, []), ('', None), ('group-a', None), ('group-a', []),
])
def test_ring_peers_without_peer_list_is_live(key, peer_list):
    result = own.ring_peers(LIVE, 'host1', key, peer_list)
    assert result == own.RingPeers(LIVE, ())


def test_ring_peers_peer_list_limits_ring():
    result = own.ring_peers(LIVE, 'host1', 'group-a', ['host1', 'host2', 'host9'])
    # host9 is listed but not live: it must not get a share of the ring.
    assert result.peers == {'host1', 'host2'}
    assert result.warnings == ()


def test_ring_peers_always_contains_self():
    result = own.ring_peers({'host2'}, 'host1', 'group-a', ['host1', 'host2'])
    assert result.peers == {'host1', 'host2'}
    assert own.ring_peers(set(), 'host1', None, None).peers == {'host1'}


def test_ring_peers_peer_list_case_and_whitespace():
    result = own.ring_peers(['HOST1', 'host2 '], ' Host1', 'group-a', [' host1', 'HOST2'])
    assert result.peers == {'host1', 'host2'}


def test_ring_peers_peer_list_as_comma_string():
    result = own.ring_peers(LIVE, 'host1', 'group-a', 'host1, host2,')
    assert result.peers == {'host1', 'host2'}


def test_ring_peers_peer_list_without_this_host():
    with pytest.raises(exception.PeerListError) as exc:
        own.ring_peers(LIVE, 'host1', 'group-a', ['host2', 'host3'])
    assert isinstance(exc.value, ValueError)
    msg = str(exc.value)
    assert 'host1' in msg and 'host2' in msg and 'host3' in msg


def test_ring_peers_peer_list_without_partition_key(caplog):
    with caplog.at_level(logging.WARNING, logger=own.__name__):
        result = own.ring_peers(LIVE, 'host1', None, ['host2'])
    assert result.peers == LIVE  # ignored, and no PeerListError either
    assert len(result.warnings) == 1
    assert 'partition_key' in result.warnings[0]
    assert result.warnings[0] in caplog.text


# --- node ownership ---------------------------------------------------------

def test_one_compute_owns_every_free_node():
    ring = FakeRing(['host1'])
    nodes = [NodeInfo(f'n{i}') for i in range(20)]
    result = own.owned_nodes('host1', ring, nodes, [])
    assert result.owned == {n.uuid: Reason.RING for n in nodes}
    assert (result.foreign, result.unknown_instance, result.others) == ({}, {}, {})


def test_many_computes_split_free_nodes():
    hosts = ['host1', 'host2', 'host3']
    ring = FakeRing(hosts)
    nodes = [NodeInfo(f'n{i}') for i in range(60)]
    results = {h: own.owned_nodes(h, ring, nodes, []) for h in hosts}
    for h, result in results.items():
        assert result.owned, f'{h} got no nodes'
        assert set(result.owned.values()) == {Reason.RING}
        assert set(result.others.values()) == set(hosts) - {h}
        assert result.owned.keys() | result.others.keys() == {n.uuid for n in nodes}
    owned = [u for r in results.values() for u in r.owned]
    assert sorted(owned) == sorted(n.uuid for n in nodes)


def test_own_instance_kept_whatever_the_ring_says():
    ring = FakeRing(['host1', 'host2'])
    uuid = node_for(ring, 'host2')
    nodes = [NodeInfo(uuid, instance_uuid='i1')]
    instances = [InstanceInfo('i1', 'HOST1', node=uuid)]
    result = own.owned_nodes('host1', ring, nodes, instances)
    assert result.owned == {uuid: Reason.OWN_INSTANCE}
    assert own.owned_nodes('host2', ring, nodes, instances).foreign == {uuid: 'host1'}


def test_foreign_instance_excluded_even_if_it_hashes_to_us():
    ring = FakeRing(['host1', 'host2'])
    uuid = node_for(ring, 'host1')
    nodes = [NodeInfo(uuid, instance_uuid='i1')]
    result = own.owned_nodes('host1', ring, nodes, [InstanceInfo('i1', 'host2')])
    assert result.owned == {}
    assert result.foreign == {uuid: 'host2'}


def test_instance_of_a_dead_host_stays_foreign():
    # Nobody else picks it up through the ring: recovery is an explicit action.
    ring = FakeRing(['host1'])
    nodes = [NodeInfo('n1', instance_uuid='i1')]
    result = own.owned_nodes('host1', ring, nodes, [InstanceInfo('i1', 'dead')])
    assert result.owned == {} and result.foreign == {'n1': 'dead'}


def test_unknown_instance_reported_separately():
    ring = FakeRing(['host1'])
    nodes = [NodeInfo('n1', instance_uuid='ghost'), NodeInfo('n2')]
    # An instance record pointing at n1 does not override the listed uuid.
    instances = [InstanceInfo('other', 'host1', node='n1')]
    result = own.owned_nodes('host1', ring, nodes, instances)
    assert result.unknown_instance == {'n1': 'ghost'}
    # The ring's host holds the row of n1 (never stranded), and says why.
    assert result.owned == {'n1': Reason.UNKNOWN_INSTANCE, 'n2': Reason.RING}
    assert own.node_manager(nodes[0], ring, {}, {}) == ('host1', Reason.UNKNOWN_INSTANCE)


def test_instance_without_host_is_managed_by_nobody():
    ring = FakeRing(['host1'])
    nodes = [NodeInfo('n1', instance_uuid='i1'), NodeInfo('n2')]
    instances = [InstanceInfo('i1', ''), InstanceInfo('i2', ' ', node='n2')]
    result = own.owned_nodes('host1', ring, nodes, instances)
    assert result.unknown_instance == {'n1': 'i1', 'n2': 'i2'}
    assert result.owned == {'n1': Reason.UNKNOWN_INSTANCE,
                            'n2': Reason.UNKNOWN_INSTANCE}


def test_stale_listing_own_instance():
    ring = FakeRing(['host1', 'host2'])
    uuid = node_for(ring, 'host2')
    nodes = [NodeInfo(uuid)]  # Ironic does not show the instance yet
    instances = [InstanceInfo('i1', 'host1', node=uuid)]
    assert own.owned_nodes('host1', ring, nodes, instances).owned == {
        uuid: Reason.OWN_INSTANCE}
    other = own.owned_nodes('host2', ring, nodes, instances)
    assert other.owned == {} and other.foreign == {uuid: 'host1'}


def test_stale_listing_foreign_instance():
    ring = FakeRing(['host1', 'host2'])
    uuid = node_for(ring, 'host1')
    instances = [InstanceInfo('i1', 'host2', node=uuid)]
    result = own.owned_nodes('host1', ring, [NodeInfo(uuid)], instances)
    assert result.owned == {} and result.foreign == {uuid: 'host2'}


def test_listed_instance_is_authoritative_over_instance_node_field():
    ring = FakeRing(['host1', 'host2', 'host3'])
    nodes = [NodeInfo('n1', instance_uuid='i1')]
    instances = [InstanceInfo('i1', 'host1', node='elsewhere'),
                 InstanceInfo('i2', 'host2', node='n1')]
    assert own.owned_nodes('host1', ring, nodes, instances).owned == {
        'n1': Reason.OWN_INSTANCE}
    assert own.owned_nodes('host2', ring, nodes, instances).foreign == {'n1': 'host1'}


def test_two_instances_on_one_node_resolved_the_same_everywhere():
    ring = FakeRing(['host1', 'host2'])
    a = InstanceInfo('aaa', 'host2', node='n1')
    b = InstanceInfo('bbb', 'host1', node='n1')
    for instances in ([a, b], [b, a]):
        result = own.owned_nodes('host1', ring, [NodeInfo('n1')], instances)
        assert result.foreign == {'n1': 'host2'}


def test_ring_bulk_assign_used_once():
    ring = FakeRing(['host1', 'host2'])
    nodes = [NodeInfo(f'n{i}') for i in range(50)] + [NodeInfo('x', instance_uuid='i1')]
    own.owned_nodes('host1', ring, nodes, [InstanceInfo('i1', 'host1')])
    assert (ring.assign_calls, ring.get_hosts_calls) == (1, 0)
    ring = FakeRing(['host1'])
    own.owned_nodes('host1', ring, [NodeInfo('x', instance_uuid='i1')],
                    [InstanceInfo('i1', 'host1')])
    assert ring.assign_calls == 0


def test_owned_nodes_accepts_generators_and_mixed_case_this_host():
    ring = FakeRing(['host1'])
    result = own.owned_nodes(' HOST1', ring, (NodeInfo(f'n{i}') for i in range(3)),
                             iter([]))
    assert set(result.owned) == {'n0', 'n1', 'n2'}


def test_this_host_missing_from_ring_warns(caplog):
    ring = FakeRing(['host2'])
    with caplog.at_level(logging.WARNING, logger=own.__name__):
        result = own.owned_nodes('host1', ring, [NodeInfo('n1')], [])
    assert result.others == {'n1': 'host2'}
    assert 'not in the hash ring' in caplog.text


def test_node_manager_perspectives():
    ring = FakeRing(['host1', 'host2'])
    mine, theirs = node_for(ring, 'host1'), node_for(ring, 'host2')
    instances = [InstanceInfo('i1', 'Host1'), InstanceInfo('i2', 'host2', node='stale')]
    by_uuid, by_node = own.index_instances(instances)
    cases = {
        NodeInfo(mine): ('host1', Reason.RING, Reason.RING),
        NodeInfo(theirs): ('host2', Reason.RING, Reason.OTHER_HOST),
        NodeInfo(theirs, instance_uuid='i1'):
            ('host1', Reason.OWN_INSTANCE, Reason.OWN_INSTANCE),
        NodeInfo(mine, instance_uuid='i2'):
            ('host2', Reason.OWN_INSTANCE, Reason.FOREIGN_INSTANCE),
        NodeInfo('stale'): ('host2', Reason.OWN_INSTANCE, Reason.FOREIGN_INSTANCE),
        NodeInfo(mine, instance_uuid='nope'):
            ('host1', Reason.UNKNOWN_INSTANCE, Reason.UNKNOWN_INSTANCE),
    }
    for node, (host, neutral, from_host1) in cases.items():
        assert own.node_manager(node, ring, by_uuid, by_node) == (host, neutral)
        assert own.node_manager(node, ring, by_uuid, by_node, 'HOST1') == (host, from_host1)


# --- property: every node has exactly the right owner ----------------------

@st.composite
def clusters(draw):
    n_hosts = draw(st.integers(1, 20))
    hosts = [f'host-{i}' for i in range(n_hosts)]
    # Some hosts hold instances but do not compute (dead or outside the ring).
    computing = draw(st.lists(st.sampled_from(hosts), min_size=1, unique=True))
    owners = st.sampled_from(hosts + ['gone'])
    nodes, instances, expected = [], [], {}
    kinds = draw(st.lists(st.sampled_from(['free', 'listed', 'stale', 'unknown']),
                          max_size=40))
    for i, kind in enumerate(kinds):
        uuid, inst = f'node-{i}', f'inst-{i}'
        if kind == 'free':
            nodes.append(NodeInfo(uuid))
            expected[uuid] = None
            continue
        if kind == 'unknown':
            # Nobody manages the instance: the ring's host holds the row.
            nodes.append(NodeInfo(uuid, instance_uuid=inst))
            expected[uuid] = None
            continue
        host = draw(owners)
        shown = draw(st.sampled_from([host, host.upper(), f' {host} ']))
        if kind == 'listed':
            nodes.append(NodeInfo(uuid, instance_uuid=inst))
            instances.append(InstanceInfo(inst, shown, node=draw(st.sampled_from([uuid, None]))))
        else:
            nodes.append(NodeInfo(uuid))
            instances.append(InstanceInfo(inst, shown, node=uuid))
        expected[uuid] = (host,) if host in computing else ()
    return computing, nodes, instances, expected


def check_exclusive_ownership(make_ring, computing, nodes, instances, expected):
    ring = make_ring(computing)
    owners = {n.uuid: [] for n in nodes}
    for host in computing:
        # Each service may spell its own name differently from the DB.
        result = own.owned_nodes(host.upper(), ring, nodes, instances)
        for uuid in result.owned:
            owners[uuid].append(host)
        assert not (result.owned.keys() & result.foreign.keys())
    by_uuid, by_node = own.index_instances(instances)
    for node in nodes:
        want, got = expected[node.uuid], owners[node.uuid]
        if want is None:
            assert len(got) == 1, (node, got)
        else:
            assert tuple(got) == want, (node, got)
        # The admin CLI's answer agrees with what the services do.
        manager, _ = own.node_manager(node, ring, by_uuid, by_node)
        if got:
            assert manager == got[0]


@settings(max_examples=60, deadline=None)
@given(clusters())
def test_property_exactly_one_owner_fake_ring(cluster):
    check_exclusive_ownership(FakeRing, *cluster)


@settings(max_examples=40, deadline=None)
@given(clusters())
def test_property_exactly_one_owner_real_ring(cluster):
    from ironic_compute.ring.hash_ring import HashRing

    # A small table keeps the build cheap; the rules do not depend on its size.
    check_exclusive_ownership(lambda hosts: HashRing(hosts, partition_exponent=10), *cluster)


def test_live_peers_of_one_partition_only():
    now = datetime(2026, 11, 22, 12, 0, 0)
    records = [ServiceRecord('a', last_seen_up=now, partition_key='g1'),
               ServiceRecord('b', last_seen_up=now, partition_key='g2'),
               ServiceRecord('c', last_seen_up=now)]
    assert own.live_peers(records, 'a', now, 60) == {'a', 'b', 'c'}
    assert own.live_peers(records, 'a', now, 60, partition_key='g1') == {'a'}
    assert own.live_peers(records, 'z', now, 60, partition_key=None) == {'c', 'z'}
    assert own.live_peers(records, 'z', now, 60, partition_key='') == {'c', 'z'}


# --- bounded loads (ownership.node_ring) ------------------------------------

def _hash_ring(hosts, replicas=1):
    from ironic_compute.ring.hash_ring import HashRing

    return HashRing(hosts, partition_exponent=10, replicas=replicas)


@pytest.mark.parametrize('factor', [None, 1.0, 0.9])
def test_node_ring_plain_without_a_load_factor_above_one(factor):
    ring = _hash_ring(['a', 'b'])
    assert own.node_ring(ring, [NodeInfo('n1')], [], factor) is ring
    assert own.node_ring(own.NO_RING, [NodeInfo('n1')], [], 1.1) is own.NO_RING


def test_node_ring_bounds_what_each_service_manages():
    hosts = ['a', 'b', 'c']
    nodes = [NodeInfo(f'bm-{i}') for i in range(40)]  # plain hashing: 9 / 13 / 18
    ring = own.node_ring(_hash_ring(hosts), nodes, [], 1.1)
    owned = {h: own.owned_nodes(h, ring, nodes, []).owned for h in hosts}
    assert max(len(o) for o in owned.values()) <= 14  # floor(1.1 x 40 / 3)
    assert sum(len(o) for o in owned.values()) == 40
    assert set().union(*owned.values()) == {n.uuid for n in nodes}
    plain = {h: own.owned_nodes(h, _hash_ring(hosts), nodes, []).owned for h in hosts}
    assert max(len(o) for o in plain.values()) > 14


def test_node_ring_counts_pinned_nodes_toward_their_host():
    hosts = ['a', 'b', 'c']
    pinned = [NodeInfo(f'p{i}', instance_uuid=f'i{i}') for i in range(10)]
    free = [NodeInfo(f'node-{i}') for i in range(30)]
    # The ring holds the row of an instance nobody knows (a free key); an
    # instance of a host outside the ring counts for nobody.
    other = [NodeInfo('u1', instance_uuid='nope'), NodeInfo('d1', instance_uuid='dead')]
    instances = ([InstanceInfo(f'i{i}', 'A') for i in range(10)]
                 + [InstanceInfo('dead', 'gone-host')])
    nodes = pinned + free + other
    ring = own.node_ring(_hash_ring(hosts), nodes, instances, 1.1)
    assert ring.capacity == 15  # (10 + 30 + 1) / 3 x 1.1
    result = own.owned_nodes('a', ring, nodes, instances)
    assert len(result.owned) == ring.loads()['a'] <= 15
    assert sum(1 for r in result.owned.values() if r is not Reason.OWN_INSTANCE) <= 5
    assert sum(ring.loads().values()) == 41
    assert ring.loads() == {h: len(own.owned_nodes(h, ring, nodes, instances).owned)
                            for h in hosts}


def test_build_on_an_owned_node_moves_no_other_node():
    hosts = ['a', 'b', 'c', 'd']
    nodes = [NodeInfo(f'node-{i}') for i in range(60)]
    before = own.node_ring(_hash_ring(hosts), nodes, [], 1.05)
    for uuid in ('node-3', 'node-17', 'node-42'):
        host = before.get_hosts(uuid)[0]
        instances = [InstanceInfo('inst', host, node=uuid)]
        after = own.node_ring(_hash_ring(hosts), nodes, instances, 1.05)
        assert after.loads() == before.loads()
        others = [n.uuid for n in nodes if n.uuid != uuid]
        assert after.assign(others) == before.assign(others)


def test_node_ring_answers_the_cli_and_orphans_like_the_tracker():
    hosts = ['a', 'b', 'c']
    nodes = [NodeInfo(f'node-{i}') for i in range(40)]
    ring = own.node_ring(_hash_ring(hosts, replicas=2), nodes, [], 1.1)
    by_uuid, by_node = own.index_instances([])
    for node in nodes:
        host, reason = own.node_manager(node, ring, by_uuid, by_node)
        assert reason is Reason.RING
        assert node.uuid in own.owned_nodes(host, ring, nodes, []).owned
        assert ring.get_hosts(node.uuid)[0] == host and len(ring.get_hosts(node.uuid)) == 2
    # A row Ironic no longer lists: the plain ring's answer, the same for all.
    assert ring.get_hosts('orphan') == _hash_ring(hosts, replicas=2).get_hosts('orphan')


@settings(max_examples=40, deadline=None)
@given(clusters(), st.floats(1.01, 2.0))
def test_property_exactly_one_owner_bounded_ring(cluster, factor):
    computing, nodes, instances, expected = cluster
    check_exclusive_ownership(
        lambda hosts: own.node_ring(_hash_ring(hosts), nodes, instances, factor),
        computing, nodes, instances, expected)


@pytest.mark.parametrize('factor', [float('nan'), float('inf')])
def test_node_ring_non_finite_load_factor_is_plain_hashing_with_a_warning(factor, caplog):
    ring = _hash_ring(['a', 'b'])
    with caplog.at_level(logging.WARNING, logger=own.__name__):
        assert own.node_ring(ring, [NodeInfo('n1')], [], factor) is ring
    assert 'not a finite number' in caplog.text


# --- the shard ring (shared by the resource tracker and the CLI) -------------

def test_the_shard_ring_is_in_force_only_when_every_peer_runs_it():
    records = [ServiceRecord('a', shard_ring=True), ServiceRecord('b', shard_ring=True),
               ServiceRecord('c')]
    assert own.shard_ring_in_force(records, 'a', {'a', 'b'}, True)
    assert not own.shard_ring_in_force(records, 'a', {'a', 'b'}, False)
    assert not own.shard_ring_in_force(records, 'a', {'a', 'b', 'c'}, True)
    # Its own setting counts before its row records it (just reloaded).
    assert own.shard_ring_in_force(records, 'C', {'c'}, True)
    assert own.shard_ring_in_force(records, 'c', (), True)


# --- explain: who manages a node and why ---------------------------------------

def test_explain_says_who_manages_a_node_and_why():
    ring = _hash_ring(['a', 'b'])
    free = NodeInfo('n-free')
    ring_host = ring.get_hosts('n-free')[0]
    other = 'b' if ring_host == 'a' else 'a'
    said = own.explain(free, ring, {}, {})
    assert (said.host, said.reason, said.instance, said.label) == (
        ring_host, Reason.RING, None, 'ring')
    said = own.explain(free, ring, {}, {}, this_host=other.upper())
    assert (said.host, said.label) == (ring_host, 'ring: other host')
    assert said.why.endswith(f'maps the node to {ring_host}: it moves there '
                             'at the next cycle')
    pinned = NodeInfo('n-1', instance_uuid='i-1')
    by_uuid, by_node = own.index_instances([InstanceInfo('i-1', 'A', 'n-1')])
    said = own.explain(pinned, ring, by_uuid, by_node)
    assert (said.host, said.reason, said.instance) == (
        'a', Reason.OWN_INSTANCE, 'i-1')
    assert said.why == 'a manages instance i-1 on this node'
    said = own.explain(pinned, ring, by_uuid, by_node, this_host='b')
    assert (said.host, said.reason) == ('a', Reason.FOREIGN_INSTANCE)


def test_explain_says_what_this_database_knows_of_an_unknown_instance():
    ring = _hash_ring(['a'])
    node = NodeInfo('n-1', instance_uuid='gone')
    assert own.explain(node, ring, {}, {}).label == 'unknown instance'
    said = own.explain(node, ring, {}, {}, deleted={'gone'})
    assert (said.host, said.reason, said.label) == (
        'a', Reason.UNKNOWN_INSTANCE, own.REAPING)
    assert 'reaping' in said.why
    said = own.explain(node, ring, {}, {}, removed={'gone'})
    assert said.label == own.REMOVED and 'never torn down' in said.why


def test_explain_without_a_ring():
    said = own.explain(NodeInfo('n-1'), own.NO_RING, {}, {}, this_host='a')
    assert (said.host, said.reason) == (None, Reason.RING)
    assert (said.label, said.why) == ('ring: other host', own.NO_RING_COVERS_IT)
