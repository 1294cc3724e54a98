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

"""nodes/gate.MembershipGate: recovery, lease and rejoin, on plain service
rows (tests/unit/test_recovery.py and test_lease.py run them in cycles)."""

import dataclasses
from datetime import timedelta

from ironic_compute.cluster import lease
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services
from ironic_compute.nodes import gate
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit.test_partition import NOW
from tests.unit.test_partition import row

DOWN = 60


@dataclasses.dataclass
class Listing:
    rows: list
    now: object


def at(seconds, *rows):
    return Listing(list(rows), NOW + timedelta(seconds=seconds))


def fresh(host, seconds=0, **kw):
    """A service that heartbeated ``seconds`` after NOW."""
    return row(host, last_seen_up=NOW + timedelta(seconds=seconds), **kw)


def admit(the_gate, listing):
    stats = resource_tracker.CycleStats()
    return the_gate.admit(None, listing, DOWN, stats), stats


def test_a_steady_view_is_admitted_and_judges_its_peers():
    the_gate = gate.MembershipGate('a', 1)
    (records, spared, up), _ = admit(the_gate, at(5, fresh('a'), fresh('b'),
                                                  row('c', up=False)))
    assert [r.host for r in records] == ['a', 'b', 'c']
    assert (spared, up) == (frozenset(), frozenset({'a', 'b'}))
    assert the_gate.peers_judged and the_gate.db_now == NOW + timedelta(
        seconds=5)


def test_after_a_database_outage_silent_peers_are_spared_for_a_while():
    the_gate = gate.MembershipGate('a', 1)
    admit(the_gate, at(5, fresh('a'), fresh('b')))
    the_gate.database_lost()
    # b's heartbeat is 90 s old, but this service could not see it.
    (_, spared, up), _ = admit(the_gate, at(90, fresh('a', 89), fresh('b')))
    assert spared == {'b'} and 'b' in up and not the_gate.peers_judged
    # service_down_time later, b is judged by its heartbeat again.
    (_, spared, up), _ = admit(the_gate, at(151, fresh('a', 150),
                                            fresh('b')))
    assert spared == frozenset() and 'b' not in up and the_gate.peers_judged


def test_a_lapsed_lease_heartbeats_and_waits_for_the_peers(sqlite_engine):
    ctx = db_api.Context()
    service_id = db_services.register(ctx, 'a')
    the_gate = gate.MembershipGate('a', service_id)
    the_gate.lease_lapsed()
    stats = resource_tracker.CycleStats()
    assert the_gate.admit(ctx, at(5, fresh('a'), fresh('b')), DOWN,
                          stats) is None
    assert stats.skipped.startswith('rejoining: last own heartbeat')
    rejoined = the_gate._rejoined_at
    assert rejoined is not None
    # b has not run a cycle since: wait.
    listing = Listing([row('a', last_seen_up=rejoined),
                       row('b', last_seen_up=rejoined)],
                      rejoined + timedelta(seconds=1))
    stats = resource_tracker.CycleStats()
    assert the_gate.admit(ctx, listing, DOWN, stats) is None
    assert stats.skipped == ('rejoining: waiting for the peers to see this '
                             'service')
    # Once b started a cycle after the heartbeat, the cycle goes on.
    b = dataclasses.replace(listing.rows[1],
                            last_cycle_at=rejoined + timedelta(seconds=2),
                            last_cycle_seconds=1)
    admitted = the_gate.admit(ctx, Listing([listing.rows[0], b], rejoined + timedelta(
        seconds=3)), DOWN, resource_tracker.CycleStats())
    assert admitted is not None and admitted[2] == {'a', 'b'}


def test_an_old_view_is_not_acted_on_and_the_next_cycle_rejoins():
    the_gate = gate.MembershipGate('a', 1)
    stats = resource_tracker.CycleStats()
    assert the_gate.view_fresh(lease.now(), DOWN, stats)
    assert not the_gate.view_fresh(lease.now() - DOWN, DOWN, stats)
    assert stats.skipped == f'the view of the peers is {DOWN} s old'
    assert the_gate._lapsed
