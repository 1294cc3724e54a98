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

"""nodes/inventory.InventoryReader: the full listing and the shard listing
(tests/unit/test_shard_cycle.py runs them in cycles)."""

import dataclasses
import time

from ironic_compute.db import api as db_api
from ironic_compute.nodes import inventory
from ironic_compute.nodes import partition
from ironic_compute.nodes import tracker as resource_tracker
from ironic_compute.ring import shard_ring
from tests.unit import fakes
from tests.unit.test_partition import NOW
from tests.unit.test_partition import row

SETTINGS = resource_tracker.Settings(partition_exponent=8)
SHARDS = dataclasses.replace(SETTINGS, shard_ring=True)


def peers_of(*rows):
    """A read_peers that gives the PeerView of ``rows``, seen from a."""
    seen = partition.view(rows, NOW, partition_key=None, shard=None,
                          service_down_time=60, partition_exponent=8,
                          load_factor=1.1, host='a')
    view = inventory.PeerView(list(rows), [r.record() for r in rows], NOW,
                              seen.peers, seen, time.monotonic())
    calls = []

    def read_peers(ctx, settings, stats):
        calls.append(settings)
        return view
    read_peers.calls = calls
    return read_peers


def test_the_full_listing_is_every_node_and_every_row(sqlite_engine):
    nodes = [fakes.make_node() for _ in range(6)]
    reader = inventory.InventoryReader('a', fakes.FakeIronic(nodes))
    read = peers_of(row('a'), row('b'))
    got = reader.full(db_api.Context(), SETTINGS, resource_tracker.CycleStats(), read)
    assert {n.uuid for n in got.nodes} == {n.uuid for n in nodes}
    assert got.shards is False and got.rows == {} and read.calls
    assert got.ring.hosts == {'a', 'b'}


def test_nothing_is_read_when_ironic_cannot_list(sqlite_engine):
    fake = fakes.FakeIronic([fakes.make_node()])
    fake.fail = True
    reader = inventory.InventoryReader('a', fake)
    read = peers_of(row('a'))
    stats = resource_tracker.CycleStats()
    assert reader.full(db_api.Context(), SETTINGS, stats, read) is None
    assert stats.skipped.startswith('Ironic unavailable') and not read.calls


def test_the_shard_listing_is_this_services_shards(sqlite_engine):
    nodes = ([fakes.make_node(shard=f'ic-{i % 4}') for i in range(40)]
             + [fakes.make_node() for _ in range(3)])
    fake = fakes.FakeIronic(nodes)
    reader = inventory.InventoryReader('a', fake)
    read = peers_of(row('a', shard_ring=True), row('b', shard_ring=True))
    got = reader.by_shards(db_api.Context(), SHARDS, resource_tracker.CycleStats(), read)
    assert got.shards is True
    assigned = read(None, SHARDS, None).partition.shard_assignment(
        fake.list_shards())
    mine = {n.uuid for n in nodes
            if shard_ring.owner(assigned, n.shard or 'None') == 'a'}
    assert mine and {n.uuid for n in got.nodes} == mine
    assert all(got.ring.get_hosts(uuid) == ['a'] for uuid in mine)


def test_the_shard_listing_stops_when_the_shard_ring_is_not_in_force(
        sqlite_engine):
    reader = inventory.InventoryReader(
        'a', fakes.FakeIronic([fakes.make_node(shard='ic-0')]))
    read = peers_of(row('a', shard_ring=True), row('b'))
    stats = resource_tracker.CycleStats()
    assert reader.by_shards(db_api.Context(), SHARDS, stats, read) is None
    assert stats.skipped == 'the shard ring is no longer in force'


class _Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def monotonic(self):
        return self.now


def test_the_listing_time_is_counted_failed_or_not(sqlite_engine, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(inventory, 'time', clock)
    fake = fakes.FakeIronic([fakes.make_node()])
    listed = fake.list_nodes

    def slow_list(**kwargs):
        clock.now += 1.5
        return listed(**kwargs)
    fake.list_nodes = slow_list
    reader = inventory.InventoryReader('a', fake)
    stats = resource_tracker.CycleStats()
    assert reader.full(db_api.Context(), SETTINGS, stats, peers_of(row('a')))
    assert stats.listing == 1.5
    fake.fail = True
    stats = resource_tracker.CycleStats()
    assert reader.full(db_api.Context(), SETTINGS, stats,
                       peers_of(row('a'))) is None
    assert stats.listing == 1.5 and stats.skipped
