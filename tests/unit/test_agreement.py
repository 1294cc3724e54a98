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

"""Services of a partition agree on the ring, or they are told."""

from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services
from ironic_compute.nodes import tracker as resource_tracker
from ironic_compute.ring import agreement
from tests.unit import fakes


def settings(exponent=16, load_factor=1.1, peers=(), key='group-a'):
    return agreement.ring_settings(exponent, load_factor, peers, key)


def test_settings_are_stable_whatever_the_spelling_of_the_peers():
    assert settings(peers=['B', ' a ', '']) == settings(peers=['a', 'b'])


def test_what_differs_is_named_per_host():
    found = agreement.disagreements(settings(), {
        'same': settings(), 'old': None, 'broken': 'not json',
        'exp': settings(exponent=12), 'both': settings(1, 2.0, ['x'])})
    assert found == {
        'exp': 'partition_exponent 12 (here 16)',
        'both': "partition_exponent 1 (here 16), load_factor 2.0 (here 1.1), "
                "peer_list ['x'] (here [])"}


def test_partitions_are_compared_separately():
    records = [('a', 'p1', settings()), ('b', 'p1', settings()),
               ('c', 'p2', settings(exponent=10)), ('d', 'p2', settings())]
    assert agreement.partition_disagreements(records) == {
        'p2': {'c': 'reference', 'd': 'partition_exponent 16 (here 10)'}}


def test_a_service_that_records_nothing_is_left_out_not_the_reference():
    # 'a' (first by name) runs an older release, or has not cycled yet.
    records = [('a', 'p1', None), ('b', 'p1', settings()), ('c', 'p1', settings()),
               ('d', 'p1', settings(exponent=12))]
    assert agreement.partition_disagreements(records) == {
        'p1': {'b': 'reference', 'd': 'partition_exponent 12 (here 16)'}}
    assert agreement.disagreements(None, {'b': settings()}) == {}


def test_settings_are_recorded_as_they_act():
    # peer_list is ignored without a partition key; <= 1 is plain hashing.
    assert settings(peers=['x'], key=None) == settings(peers=['y'], key=None)
    assert settings(peers=['x']) != settings(peers=['y'])
    assert settings(load_factor=0.5) == settings(load_factor=1.0)
    assert settings(load_factor=float('nan')) == settings(load_factor=1.0)
    assert settings(load_factor=1.2) != settings(load_factor=1.0)


def two_services_with_other_exponents():
    """a (partition_exponent 8) and b (9) after one cycle each."""
    fake = fakes.FakeIronic([fakes.make_node() for _ in range(4)])
    trackers = [resource_tracker.ResourceTracker(
        host, db_services.register(db_api.Context(), host), fake)
        for host in ('a', 'b')]
    trackers[0].run_cycle(resource_tracker.Settings(partition_exponent=8))
    trackers[1].run_cycle(resource_tracker.Settings(partition_exponent=9))
    return trackers


def errors_of_a_cycle(tracker, settings, caplog):
    caplog.clear()
    tracker.run_cycle(settings)
    return [r.getMessage() for r in caplog.records if r.levelname == 'ERROR']


def test_a_cycle_logs_a_peer_that_disagrees(sqlite_engine, caplog):
    a, _ = two_services_with_other_exponents()
    assert errors_of_a_cycle(
        a, resource_tracker.Settings(partition_exponent=8), caplog) == [
        'Peer b builds a different ring for partition (all): '
        'partition_exponent 9 (here 8); every service of a '
        'partition needs the same settings']


def test_a_service_of_the_group_left_out_of_my_ring_is_still_compared(
        sqlite_engine, caplog):
    # b's peer_list names a and b, a's names only a: b is not in a's ring,
    # yet both manage group g and their rows would swing between them.
    fake = fakes.FakeIronic([fakes.make_node(conductor_group='g')
                             for _ in range(4)])
    mine = resource_tracker.Settings(partition_key='g', peer_list=('a',))
    theirs = resource_tracker.Settings(partition_key='g', peer_list=('a', 'b'))
    other_group = resource_tracker.Settings(partition_key='h',
                                            partition_exponent=9)
    trackers = {host: resource_tracker.ResourceTracker(
        host, db_services.register(db_api.Context(), host), fake)
        for host in ('a', 'b', 'c')}
    trackers['a'].run_cycle(mine)
    trackers['b'].run_cycle(theirs)
    trackers['c'].run_cycle(other_group)  # another partition: not compared
    assert errors_of_a_cycle(trackers['a'], mine, caplog) == [
        "Peer b builds a different ring for partition g: "
        "peer_list ['a', 'b'] (here ['a']); every service of a "
        "partition needs the same settings"]


def test_a_stopped_service_of_the_group_is_not_compared(sqlite_engine, caplog):
    a, b = two_services_with_other_exponents()
    db_services.mark_stopped(db_api.Context(), b.service_id)
    assert errors_of_a_cycle(
        a, resource_tracker.Settings(partition_exponent=8), caplog) == []


def test_each_cycle_records_the_services_ring_settings(sqlite_engine):
    fake = fakes.FakeIronic([fakes.make_node(conductor_group='g')])
    tracker = resource_tracker.ResourceTracker(
        'a', db_services.register(db_api.Context(), 'a'), fake)

    def recorded():
        row = db_services.get_by_host(db_api.Context(), 'a')
        return agreement.recorded(row.ring_settings), row.shard_ring

    assert recorded() == (None, False)  # registered, no cycle yet
    tracker.run_cycle(resource_tracker.Settings(
        partition_key='g', peer_list=('B', 'a'), partition_exponent=9,
        load_factor=1.2))
    assert recorded() == ({'partition_exponent': 9, 'load_factor': 1.2,
                           'peer_list': ['a', 'b']}, False)
    # A SIGHUP's new settings are recorded by the next cycle.
    tracker.run_cycle(resource_tracker.Settings(
        partition_key='g', peer_list=('a',), partition_exponent=10,
        load_factor=0.5, shard_ring=True))
    assert recorded() == ({'partition_exponent': 10, 'load_factor': 1.0,
                           'peer_list': ['a']}, True)
