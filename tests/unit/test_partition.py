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

"""nodes/partition.view: a partition's peers and ring from plain values
(tests/unit/cmd/test_cli_rings.py compares it at work in the tracker and the
CLI)."""

import functools
from datetime import datetime
from datetime import timedelta

from ironic_compute.db.services import ServiceRow
from ironic_compute.nodes import ownership
from ironic_compute.nodes import partition
from ironic_compute.ring import agreement
from ironic_compute.ring import hash_ring

NOW = datetime(2026, 1, 1, 12, 0)
view = functools.partial(partition.view, now=NOW, service_down_time=60,
                         partition_exponent=8, load_factor=1.1)


def row(host, group=None, peer_list=(), up=True, shard_ring=False, **kw):
    fields = dict(
        id=0, host=host, disabled=False, disabled_reason=None,
        forced_down=False,
        last_seen_up=NOW - timedelta(seconds=10 if up else 600),
        stopped_at=None, last_cycle_at=None, last_cycle_seconds=None,
        partition_key=group, shard=None,
        ring_settings=agreement.ring_settings(8, 1.1, peer_list, group),
        shard_ring=shard_ring, node_count=1)
    fields.update(kw)
    return ServiceRow(**fields)


def test_seen_from_a_live_member_with_the_peer_list_it_recorded():
    rows = [row('b1', 'g2', ('b1', 'b2')), row('b2', 'g2', ('b1', 'b2')),
            row('b3', 'g2', ('b1', 'b2', 'b3')), row('a1', 'g1')]
    seen = view(rows, partition_key='g2', shard=None)
    assert (seen.host, seen.peers, seen.peer_list) == (
        'b1', frozenset({'b1', 'b2'}), ('b1', 'b2'))
    assert seen.ring.hosts == seen.peers and not seen.shard_ring
    # The settings it was built with are the ones b1 recorded.
    assert seen.ring_settings == rows[0].ring_settings


def test_a_given_peer_list_and_host_are_used_as_given():
    rows = [row('a1', 'g1'), row('a2', 'g1'), row('a3', 'g1')]
    seen = view(rows, partition_key='g1', shard=None, peer_list=('a2', 'a3'),
                host='a3')
    assert (seen.host, seen.peers) == ('a3', frozenset({'a2', 'a3'}))


def test_a_partition_nobody_manages_has_no_ring_and_says_why():
    rows = [row('a1', 'g1'), row('b1', 'g2', up=False)]
    seen = view(rows, partition_key='g2', shard=None)
    assert seen.host is None and seen.peers == frozenset()
    assert seen.ring is ownership.NO_RING and not seen.shard_ring
    assert seen.warnings == ("no live service manages partition 'g2'; the "
                             'live services manage: g1',)


def test_the_shard_ring_is_in_force_when_every_peer_runs_it():
    both = [row('a', shard_ring=True), row('b', shard_ring=True)]
    assert view(both, partition_key=None, shard=None).shard_ring
    one = [row('a', shard_ring=True), row('b')]
    assert not view(one, partition_key=None, shard=None).shard_ring
    # The tracker's own setting counts before its row records it.
    assert view(one, partition_key=None, shard=None, host='b',
                shard_ring_wanted=True).shard_ring
    assert not view(one, partition_key=None, shard=None, host='a',
                    shard_ring_wanted=False).shard_ring
    # A peer that is down is no peer: it does not hold the ring back.
    assert view([row('a'), row('b', up=False)], partition_key=None,
                shard=None, host='a', shard_ring_wanted=True).shard_ring


def test_a_node_goes_where_its_shard_goes():
    seen = view([row('a'), row('b'), row('c')], partition_key=None,
                shard=None)
    counts = {f'ic-{i}': 10 for i in range(6)}
    shard_of = {f'node-{i}': f'ic-{i % 6}' for i in range(30)}
    shard_of['loose'] = None
    assigned = seen.shard_assignment(counts)
    node_ring = seen.shard_node_ring(assigned, shard_of)
    for uuid, shard in shard_of.items():
        assert node_ring.get_hosts(uuid) == assigned.get_hosts(
            shard or 'None')[:1]
    # No shard of more than the bound: 60 nodes (+0 unsharded) on 3 hosts.
    loads = {}
    for shard, count in counts.items():
        host = assigned.get_hosts(shard)[0]
        loads[host] = loads.get(host, 0) + count
    assert max(loads.values()) <= 30


def test_the_node_ring_bounds_the_loads_over_every_node():
    seen = view([row('a'), row('b')], partition_key=None, shard=None)
    nodes = [ownership.NodeInfo(f'n{i}') for i in range(40)]
    owners = seen.node_ring(nodes, []).assign([n.uuid for n in nodes])
    per_host = {}
    for hosts in owners.values():
        per_host[hosts[0]] = per_host.get(hosts[0], 0) + 1
    assert max(per_host.values()) <= 22  # ceil(1.1 * 40 / 2)
    assert isinstance(seen.ring, hash_ring.HashRing)
