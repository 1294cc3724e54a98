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

"""Tests for ironic_compute.ring.assignment (consistent hashing with bounded loads)."""

import collections
import math
import random

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from oslo_config import cfg

from ironic_compute.conf import hash_ring as hash_ring_conf
from ironic_compute.ring import assignment
from ironic_compute.ring import hash_ring
from ironic_compute.ring.assignment import BoundedRing
from ironic_compute.ring.hash_ring import HashRing
from tests.unit.ring_helpers import random_keys
from tests.unit.ring_helpers import run_in_another_process

KEYS = random_keys(20261123, 2000)


def hosts(n):
    return [f'compute-{i:03d}.example.org' for i in range(n)]


def loads(ring, keys, weights=None):
    out = collections.Counter()
    for key, host in zip(keys, ring.primaries(keys), strict=True):
        out[host] += 1 if weights is None else weights[key]
    return out


# --- the bound ---------------------------------------------------------------

@pytest.mark.parametrize('n_keys, n_hosts, factor', [
    (40, 3, 1.10), (256, 4, 1.10), (1000, 10, 1.10), (2000, 7, 1.05),
    (2000, 50, 1.25), (5, 10, 1.10), (1, 1, 1.5),
])
def test_no_host_above_the_bound(n_keys, n_hosts, factor):
    keys = KEYS[:n_keys]
    ring = BoundedRing(HashRing(hosts(n_hosts), 12), keys, factor)
    mean = n_keys / n_hosts
    assert math.ceil(mean) <= ring.capacity <= math.ceil(factor * mean)
    counts = loads(ring, keys)
    assert sum(counts.values()) == n_keys
    assert max(counts.values()) <= ring.capacity
    assert ring.loads() == {h: counts.get(h, 0) for h in ring.hosts}


def test_quickstart_split_is_even():
    # The quickstart's 40 nodes on 3 services split 18 / 7 / 15 with plain
    # hashing; the bound is 14 = floor(1.1 x 13.3).
    keys = KEYS[:40]
    plain = HashRing(hosts(3))
    bounded = BoundedRing(plain, keys, 1.10)
    assert max(loads(plain, keys).values()) > 14
    assert sorted(loads(bounded, keys).values())[-1] == 14
    assert bounded.capacity == 14


def test_capacity_rounding():
    assert assignment.capacity(40, 3, 1.10) == 14  # floor(14.67), >= ceil(13.3)
    assert assignment.capacity(10, 3, 1.01) == 4  # never below ceil(mean)
    assert assignment.capacity(20, 1, 1.15) == 23  # 1.15 * 20 is 22.999...
    assert assignment.capacity(100_000, 100, 1.10) == 1100


def test_keys_stay_at_their_primary_while_it_has_room():
    keys = KEYS[:500]
    plain = HashRing(hosts(5), 12)
    # A loose bound never binds: exactly plain hashing.
    assert BoundedRing(plain, keys, 10.0).primaries(keys) == plain.primaries(keys)
    bounded = BoundedRing(plain, keys, 1.01)  # capacity 101, plain max 103
    moved = [(k, p, b) for k, p, b in zip(keys, plain.primaries(keys), bounded.primaries(keys),
                                          strict=True) if p != b]
    # Only keys of hosts over the bound move, each to a host in its ring order.
    over = {h for h, c in loads(plain, keys).items() if c > bounded.capacity}
    assert moved and {p for _, p, _ in moved} <= over
    full = HashRing(hosts(5), 12, replicas=5)
    for key, _, host in moved:
        assert host in full.get_hosts(key)[1:]


# --- determinism -------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(n_hosts=st.integers(1, 12), n_keys=st.integers(0, 300), seed=st.integers(0, 2**32),
       factor=st.floats(1.001, 3.0))
def test_same_answer_whatever_the_input_order(n_hosts, n_keys, seed, factor):
    names, keys = hosts(n_hosts), KEYS[:n_keys]
    rng = random.Random(seed)
    weights = {k: rng.randint(1, 9) for k in keys}
    preload = {rng.choice(names): rng.randint(0, 20)}
    first = BoundedRing(HashRing(names, 10), keys, factor, weights, preload)
    shuffled_keys, shuffled_hosts = keys[:], [f' {h.upper()} ' for h in names]
    rng.shuffle(shuffled_keys)
    rng.shuffle(shuffled_hosts)
    shuffled_weights = dict(sorted(weights.items(), key=lambda kv: rng.random()))
    preload = {f'{h.upper()}\t': w for h, w in preload.items()}
    other = BoundedRing(HashRing(shuffled_hosts, 10), shuffled_keys + keys[:3], factor,
                        shuffled_weights, preload)
    assert other.assign(keys) == first.assign(keys)
    assert other.loads() == first.loads()


_CHILD = """
import json, sys
from ironic_compute.ring.assignment import BoundedRing
from ironic_compute.ring.hash_ring import HashRing
hosts, keys = json.load(sys.stdin)
print(json.dumps(BoundedRing(HashRing(hosts), keys, 1.1).assign(keys)))
"""


@pytest.mark.parametrize('hashseed', ['0', '4242'])
def test_same_answer_in_another_process(hashseed):
    keys = KEYS[:300]
    assert run_in_another_process(_CHILD, [hosts(4), keys], hashseed) == BoundedRing(
        HashRing(hosts(4)), keys, 1.1).assign(keys)


def test_golden_values():
    # A change here makes services of two versions disagree on owners:
    # it needs a release note telling operators to upgrade all at once.
    keys = [f'node-{i}' for i in range(12)]
    ring = BoundedRing(HashRing(['a', 'b', 'c']), keys, 1.1)
    assert ring.capacity == 4
    assert ring.primaries(keys) == [
        'b', 'b', 'c', 'a', 'a', 'b', 'c', 'c', 'a', 'c', 'b', 'a']
    # Plain hashing gives 'a' five keys; node-2 is the one that moves on.
    assert HashRing(['a', 'b', 'c']).primaries(keys)[2] == 'a'


def test_tie_on_the_digest_broken_by_the_key(monkeypatch):
    # Force every key onto one digest: the order must still not depend on
    # the input order.
    real = hash_ring.key_digests
    monkeypatch.setattr(hash_ring, 'key_digests', lambda keys: real(['same'] * len(keys)))
    keys = [f'k{i}' for i in range(30)]
    first = BoundedRing(HashRing(hosts(3)), keys, 1.1)
    other = BoundedRing(HashRing(hosts(3)), list(reversed(keys)), 1.1)
    assert first.assign(keys) == other.assign(keys)
    assert max(first.loads().values()) <= first.capacity


# --- weights and preloads ------------------------------------------------------

def test_weights_bound_the_weighted_load():
    rng = random.Random(7)
    keys = [f'shard-{i:02d}' for i in range(64)]
    weights = {k: max(1, round(156 * rng.lognormvariate(0, 0.5))) for k in keys}
    plain = HashRing(hosts(10))
    ring = BoundedRing(plain, keys, 1.10, weights)
    total = sum(weights.values())
    assert ring.capacity == math.floor(1.1 * total / 10 + 1e-9)
    got = loads(ring, keys, weights)
    assert got == collections.Counter({h: w for h, w in ring.loads().items() if w})
    assert max(got.values()) <= ring.capacity
    assert max(loads(plain, keys, weights).values()) > ring.capacity  # the bound did work
    # Weights change the answer: unit weights give another placement.
    assert BoundedRing(plain, keys, 1.10).assign(keys) != ring.assign(keys)


def test_key_heavier_than_any_room_goes_where_most_room_is():
    keys = ['big', 'a', 'b', 'c', 'd']
    weights = {'big': 100, 'a': 1, 'b': 1, 'c': 1, 'd': 1}
    ring = BoundedRing(HashRing(['x', 'y']), keys, 1.1, weights)
    assert ring.capacity == 57
    owner = ring.owner('big')
    assert ring.loads()[owner] == 100  # placed first (heaviest), alone
    assert all(ring.owner(k) != owner for k in 'abcd')


def test_zero_weights_and_missing_weights():
    keys = KEYS[:30]
    ring = BoundedRing(HashRing(hosts(3)), keys, 1.1, {keys[0]: 0})
    assert sum(ring.loads().values()) == 29


@pytest.mark.parametrize('weight, error', [(-1, ValueError), (float('nan'), ValueError),
                                           (float('inf'), ValueError), ('3', TypeError),
                                           (True, TypeError)])
def test_bad_weights_rejected(weight, error):
    with pytest.raises(error):
        BoundedRing(HashRing(['a']), ['k'], 1.1, {'k': weight})
    with pytest.raises(error):
        BoundedRing(HashRing(['a']), ['k'], 1.1, preload={'a': weight})


def test_preload_counts_toward_the_bound():
    keys = KEYS[:30]
    ring = BoundedRing(HashRing(['a', 'b', 'c']), keys, 1.1,
                       preload={'A ': 10, 'gone': 50})
    # 40 in all on the ring's hosts ('gone' is not one): capacity 14.
    assert ring.capacity == 14
    assert ring.loads()['a'] <= 14
    assert sum(1 for k in keys if ring.owner(k) == 'a') == ring.loads()['a'] - 10


def test_host_preloaded_above_the_bound_gets_no_key():
    ring = BoundedRing(HashRing(['a', 'b', 'c']), KEYS[:30], 1.1, preload={'a': 25})
    assert ring.loads()['a'] == 25
    assert not any(ring.owner(k) == 'a' for k in KEYS[:30])
    assert max(ring.loads()[h] for h in 'bc') <= ring.capacity


# --- movement ------------------------------------------------------------------

def _moves(before, after, keys, changed):
    moved = [(a, b) for a, b in zip(before.primaries(keys), after.primaries(keys), strict=True)
             if a != b]
    cross = sum(1 for a, b in moved if changed not in (a, b))
    return len(moved), cross


@pytest.mark.parametrize('n_keys, n_hosts', [(40, 3), (1000, 10), (2000, 40)])
def test_a_host_leaving_or_joining_moves_little(n_keys, n_hosts):
    keys, names = KEYS[:n_keys], hosts(n_hosts)
    base = BoundedRing(HashRing(names), keys, 1.1)
    left = BoundedRing(HashRing(names[:-1]), keys, 1.1)
    joined = BoundedRing(HashRing(hosts(n_hosts + 1)), keys, 1.1)
    moved, cross = _moves(base, left, keys, names[-1])
    assert moved <= 1.3 * n_keys / n_hosts
    # Bounded loads move a few keys between hosts that stay: the capacity
    # changes, and the overflow of the fullest hosts is placed anew.
    assert cross <= 0.3 * n_keys / n_hosts
    moved, cross = _moves(base, joined, keys, hosts(n_hosts + 1)[-1])
    assert moved <= 1.3 * n_keys / (n_hosts + 1)
    assert cross <= 0.3 * n_keys / (n_hosts + 1)


@settings(max_examples=30, deadline=None)
@given(n_hosts=st.integers(2, 10), n_keys=st.integers(1, 400), data=st.data())
def test_leaving_host_keeps_the_bound_and_loses_every_key(n_hosts, n_keys, data):
    names, keys = hosts(n_hosts), KEYS[:n_keys]
    gone = data.draw(st.sampled_from(names))
    factor = data.draw(st.floats(1.01, 1.5))
    before = BoundedRing(HashRing(names, 10), keys, factor)
    after = BoundedRing(HashRing(set(names) - {gone}, 10), keys, factor)
    assert gone not in after.primaries(keys)
    assert max(loads(after, keys).values()) <= after.capacity
    assert max(loads(before, keys).values()) <= before.capacity


# --- the ring interface ------------------------------------------------------------

def test_get_hosts_owner_then_standby_order():
    names = hosts(6)
    plain = HashRing(names, 12, replicas=3)
    keys = KEYS[:600]
    ring = BoundedRing(plain, keys, 1.02)
    bulk = ring.assign(keys)
    # The ring's full order of every host (a ring is immutable: build it once).
    full = HashRing(names, 12, replicas=6)
    for key in keys:
        got = ring.get_hosts(key)
        owner = ring.owner(key)
        order = full.get_hosts(key)
        assert got == bulk[key] and got[0] == owner and len(set(got)) == 3
        # The standbys are the ring's order without the owner.
        assert got[1:] == [h for h in order if h != owner][:2]
    # Both paths ran: an owner among the ring's 3 hosts, and one beyond them.
    assert any(ring.owner(k) in plain.get_hosts(k) for k in keys)
    assert any(ring.owner(k) not in plain.get_hosts(k) for k in keys)


def test_get_hosts_with_more_replicas_than_hosts():
    plain = HashRing(hosts(2), 10, replicas=3)
    ring = BoundedRing(plain, KEYS[:50], 1.1)
    for key in KEYS[:50]:
        assert sorted(ring.get_hosts(key)) == sorted(plain.hosts)
        assert ring.get_hosts(key)[0] == ring.owner(key)


def test_unknown_key_gets_the_plain_ring_answer():
    plain = HashRing(hosts(4), replicas=2)
    ring = BoundedRing(plain, KEYS[:10], 1.1)
    assert ring.owner('elsewhere') is None
    assert ring.get_hosts('elsewhere') == plain.get_hosts('elsewhere')
    assert ring.assign(['elsewhere']) == {'elsewhere': plain.get_hosts('elsewhere')}
    single = BoundedRing(HashRing(hosts(4)), KEYS[:10], 1.1)
    assert single.primaries(['elsewhere', KEYS[0]]) == [
        plain.get_hosts('elsewhere')[0], single.owner(KEYS[0])]
    assert single.assign(['elsewhere']) == {'elsewhere': plain.get_hosts('elsewhere')[:1]}


def test_shares_and_repr():
    ring = BoundedRing(HashRing(hosts(3)), KEYS[:40], 1.1)
    assert sum(ring.shares().values()) == pytest.approx(1.0)
    assert max(ring.shares().values()) <= 14 / 40
    empty = BoundedRing(HashRing(hosts(3)), [], 1.1)
    assert empty.shares() == empty.ring.shares()
    assert 'capacity=14' in repr(ring)


# --- plain hashing ------------------------------------------------------------------

@pytest.mark.parametrize('factor', [1.0, 0.5, 0, -3])
def test_load_factor_one_or_less_is_plain_hashing(factor):
    plain = HashRing(hosts(3))
    assert assignment.bounded(plain, KEYS[:40], factor) is plain
    with pytest.raises(ValueError):
        BoundedRing(plain, KEYS[:40], factor)


@pytest.mark.parametrize('factor', [float('nan'), float('inf'), '1.1', None, True])
def test_bad_load_factor_rejected(factor):
    with pytest.raises(ValueError):
        assignment.bounded(HashRing(['a']), ['k'], factor)


def test_bounded_reuses_the_answer_for_the_same_inputs():
    ring = HashRing(hosts(3))
    first = assignment.bounded(ring, KEYS[:40], 1.1, preload={'compute-000.example.org': 2})
    again = assignment.bounded(ring, reversed(KEYS[:40]), 1.1,
                               preload={' COMPUTE-000.example.org': 2, 'x': 0})
    assert again is first
    assert assignment.bounded(ring, KEYS[:41], 1.1) is not first
    assert assignment.bounded(ring, KEYS[:40], 1.2) is not first
    assert assignment.bounded(ring, KEYS[:40], 1.1, weights={KEYS[0]: 3}) is not first
    assert assignment.bounded(HashRing(hosts(3)), KEYS[:40], 1.1) is not first
    # Only the last two are kept.
    assert assignment.bounded(ring, KEYS[:40], 1.1,
                              preload={'compute-000.example.org': 2}) is not first
    assignment.clear_cache()
    again = assignment.bounded(ring, KEYS[:40], 1.1)
    assert assignment.bounded(ring, KEYS[:40], 1.1) is again
    assert again.assign(KEYS[:40]) == BoundedRing(ring, KEYS[:40], 1.1).assign(KEYS[:40])


def test_ring_without_host_passes_through():
    from ironic_compute.nodes import ownership

    assert assignment.bounded(ownership.NO_RING, ['k'], 1.1) is ownership.NO_RING


def test_load_factor_option():
    conf = cfg.ConfigOpts()
    hash_ring_conf.register_opts(conf)
    conf([], project='ironic-compute-test', default_config_files=[])
    assert conf.hash_ring.load_factor == pytest.approx(1.10)
    opt = conf._get_opt_info('load_factor', 'hash_ring')['opt']
    assert opt.mutable
