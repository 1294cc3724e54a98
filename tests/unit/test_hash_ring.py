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

"""Tests for ironic_compute.ring.hash_ring."""

import hashlib

import pytest
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from ironic_compute import exception
from ironic_compute.ring import hash_ring
from ironic_compute.ring.hash_ring import HashRing
from tests.unit.ring_helpers import random_keys
from tests.unit.ring_helpers import run_in_another_process

HOSTS = ['compute-a', 'compute-b', 'compute-c', 'compute-d', 'compute-e']
KEYS = random_keys(20261122, 3000)


# An independent, slow, pure-Python statement of the algorithm: any change to
# the hashing or to the vectorised build that changes results fails here.
_M64 = (1 << 64) - 1
_PHI = 0x9E3779B97F4A7C15


def _ref_mix(z):
    z ^= z >> 30
    z = z * 0xBF58476D1CE4E5B9 & _M64
    z ^= z >> 27
    z = z * 0x94D049BB133111EB & _M64
    return z ^ (z >> 31)


def _ref_score(host, exponent, bucket):
    seed = int.from_bytes(hashlib.blake2b(host.encode(), digest_size=8,
                                          person=b'ic-ring-host').digest(), 'big')
    lo_bits = exponent // 2
    hi_bits = exponent - lo_bits
    hi, lo = bucket >> lo_bits, bucket & ((1 << lo_bits) - 1)

    def feistel(rnd, x, bits):
        key = _ref_mix((seed + (rnd + 1) * _PHI) & _M64)
        return (_ref_mix((key + x * _PHI) & _M64) >> 32) & ((1 << bits) - 1)

    lo ^= feistel(0, hi, lo_bits)
    hi ^= feistel(1, lo, hi_bits)
    lo ^= feistel(2, hi, lo_bits)
    hi ^= feistel(3, lo, hi_bits)
    return hi << lo_bits | lo


def _ref_hosts(hosts, key, exponent, replicas):
    data = key.encode() if isinstance(key, str) else key
    bucket = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), 'big')
    bucket >>= 64 - exponent
    ranked = sorted(hosts, key=lambda h: (-_ref_score(h, exponent, bucket), h))
    return ranked[:replicas]


@pytest.mark.parametrize('exponent', [1, 2, 7, 10, 16])
@pytest.mark.parametrize('count', [1, 2, 5, 33])
def test_matches_reference(exponent, count):
    hosts = [f'host-{i}.example.org' for i in range(count)]
    ring = HashRing(hosts, exponent, replicas=count)
    for key in KEYS[:40]:
        assert ring.get_hosts(key) == _ref_hosts(hosts, key, exponent, count)


def test_chunked_build_matches_single_chunk(monkeypatch):
    hosts = [f'h{i}' for i in range(7)]
    whole = HashRing(hosts, 12, replicas=3)
    monkeypatch.setattr(hash_ring, '_CHUNK_CELLS', 100)  # many uneven chunks
    chunked = HashRing(hosts, 12, replicas=3)
    assert chunked.assign(KEYS) == whole.assign(KEYS)


def test_golden_values():
    ring = HashRing(HOSTS, replicas=3)
    assert ring.get_hosts('00000000-0000-0000-0000-000000000000') == [
        'compute-b', 'compute-c', 'compute-a']
    assert ring.get_hosts('1be26c0b-03f2-4d2e-ae87-c02d7f33c123') == [
        'compute-a', 'compute-e', 'compute-b']
    assert ring.get_hosts('6a3e4f7c-9b1d-4c2e-8f5a-0d1e2f3a4b5c') == [
        'compute-a', 'compute-d', 'compute-b']
    assert ring.get_hosts('shard-0') == ['compute-e', 'compute-d', 'compute-b']
    assert ring.get_hosts('shard-1') == ['compute-a', 'compute-d', 'compute-b']
    assert ring.get_hosts('') == ['compute-e', 'compute-b', 'compute-a']
    small = HashRing(HOSTS, partition_exponent=10)
    assert [small.get_hosts(f'node-{i}')[0] for i in range(8)] == [
        'compute-c', 'compute-d', 'compute-d', 'compute-a',
        'compute-e', 'compute-d', 'compute-d', 'compute-d']


_CHILD = """
import json, sys
from ironic_compute.ring.hash_ring import HashRing
hosts, keys = json.load(sys.stdin)
print(json.dumps(HashRing(hosts, replicas=2).assign(keys)))
"""


@pytest.mark.parametrize('hashseed', ['0', '4242'])
def test_same_result_in_another_process(hashseed):
    keys = KEYS[:300] + ['shard-0', 'shard-1']
    assert run_in_another_process(_CHILD, [HOSTS, keys], hashseed) == HashRing(
        HOSTS, replicas=2).assign(keys)


def test_host_order_case_whitespace_and_duplicates():
    ring = HashRing(HOSTS, replicas=3)
    shuffled = list(reversed(HOSTS))
    messy = [f'  {h.upper()}\t' for h in shuffled] + HOSTS
    for other in (HashRing(shuffled, replicas=3), HashRing(iter(messy), replicas=3)):
        assert other.hosts == frozenset(HOSTS)
        assert other.assign(KEYS) == ring.assign(KEYS)


def test_replicas_distinct_ordered_and_consistent():
    ring = HashRing(HOSTS, replicas=3)
    bulk = ring.assign(KEYS)
    primaries = ring.primaries(KEYS)
    single = HashRing(HOSTS, replicas=1)
    for key, primary in zip(KEYS, primaries, strict=True):
        hosts = ring.get_hosts(key)
        assert len(hosts) == len(set(hosts)) == 3
        assert hosts == bulk[key]
        assert hosts[0] == primary
        # Replica lists are prefixes of each other across replica counts.
        assert single.get_hosts(key) == hosts[:1]


def test_more_replicas_than_hosts_returns_all_hosts():
    ring = HashRing(['a', 'b', 'c'], replicas=5)
    for key in KEYS[:50]:
        assert sorted(ring.get_hosts(key)) == ['a', 'b', 'c']
    assert HashRing(['solo'], replicas=3).get_hosts('x') == ['solo']


@pytest.mark.parametrize('hosts', [[], (), iter([]), set()])
def test_empty_hosts_rejected(hosts):
    with pytest.raises(exception.EmptyRingError):
        HashRing(hosts)
    assert issubclass(exception.EmptyRingError, ValueError)


@pytest.mark.parametrize('kwargs', [
    {'partition_exponent': 0}, {'partition_exponent': 25}, {'partition_exponent': 16.0},
    {'partition_exponent': True}, {'replicas': 0}, {'replicas': -1}, {'replicas': 1.5},
])
def test_bad_parameters_rejected(kwargs):
    with pytest.raises(ValueError):
        HashRing(HOSTS, **kwargs)


def test_bad_host_names_rejected():
    with pytest.raises(ValueError):
        HashRing(['a', '   '])
    with pytest.raises(TypeError):
        HashRing('compute-a')
    with pytest.raises(TypeError):
        HashRing(['a', None])


def test_str_and_bytes_keys_agree():
    ring = HashRing(HOSTS, replicas=2)
    for key in KEYS[:200] + ['nœud-ü']:
        assert ring.get_hosts(key) == ring.get_hosts(key.encode('utf-8'))
    mixed = [KEYS[0], KEYS[1].encode()]
    assert ring.assign(mixed) == {KEYS[0]: ring.get_hosts(KEYS[0]),
                                  KEYS[1].encode(): ring.get_hosts(KEYS[1])}


def test_bulk_results_are_fresh_lists():
    ring = HashRing(HOSTS, replicas=2)
    bulk = ring.assign(KEYS[:100])
    first = bulk[KEYS[0]]
    first.append('mutated')
    assert ring.get_hosts(KEYS[0]) == first[:2]
    assert all('mutated' not in v for k, v in bulk.items() if k != KEYS[0])
    assert ring.assign([]) == {} and ring.primaries([]) == []


@pytest.mark.parametrize('replicas', [1, 2, 4])
def test_ring_without_some_hosts_keeps_the_others_order(replicas):
    # Rendezvous hashing: the rank of two hosts in a bucket does not depend
    # on the other hosts, so a smaller ring is the full order filtered.
    hosts = [f'c{i}' for i in range(9)]
    full = HashRing(hosts, 12, len(hosts))
    for gone in ({'c3'}, {'c3', 'c7'}, set(hosts[:5]), set(hosts[1:8])):
        rest = HashRing(set(hosts) - gone, 12, replicas)
        for key in KEYS[:300]:
            order = [h for h in full.get_hosts(key) if h not in gone]
            assert rest.get_hosts(key) == order[:replicas]


def test_balance_of_bucket_shares():
    shares = HashRing([f'compute-{i:03d}' for i in range(10)]).shares()
    assert sum(shares.values()) == pytest.approx(1.0)
    assert max(shares.values()) * 10 < 1.03


_host_sets = st.sets(st.text('abcdefgh', min_size=1, max_size=3), min_size=1, max_size=12)


def _moved_only_to(before, after, allowed):
    """Keys whose primary changed must now be on a host in ``allowed``."""
    return all(a == b or b in allowed for a, b in zip(before, after, strict=True))


@settings(max_examples=40, deadline=None)
@given(hosts=_host_sets, new=st.text('abcdefgh', min_size=1, max_size=3),
       replicas=st.integers(1, 3))
def test_adding_a_host_moves_keys_only_to_it(hosts, new, replicas):
    assume(new not in hosts)
    before = HashRing(hosts, 10, replicas)
    after = HashRing(hosts | {new}, 10, replicas)
    keys = KEYS[:1500]
    assert _moved_only_to(before.primaries(keys), after.primaries(keys), {new})
    old, cur = before.assign(keys), after.assign(keys)
    for key in keys:
        # Ranks are a per-bucket total order: the new host is inserted, the
        # others keep their relative order.
        without = [h for h in cur[key] if h != new]
        assert without == old[key][:len(without)]


@settings(max_examples=40, deadline=None)
@given(hosts=_host_sets.filter(lambda s: len(s) > 1), data=st.data())
def test_removing_a_host_moves_only_its_keys(hosts, data):
    gone = data.draw(st.sampled_from(sorted(hosts)))
    before = HashRing(hosts, 10).primaries(KEYS[:1500])
    after = HashRing(hosts - {gone}, 10).primaries(KEYS[:1500])
    assert all(a == b for a, b in zip(before, after, strict=True) if a != gone)
    assert gone not in after


def test_cache_reuses_ring_for_same_set():
    ring = hash_ring.get_ring(HOSTS)
    assert hash_ring.get_ring(list(reversed(HOSTS))) is ring
    assert hash_ring.get_ring({f' {h.upper()} ' for h in HOSTS}) is ring
    assert hash_ring.get_ring(HOSTS[:-1]) is not ring
    assert hash_ring.get_ring(HOSTS, replicas=2) is not ring
    assert hash_ring.get_ring(HOSTS, partition_exponent=10) is not ring
    assert hash_ring.get_ring(HOSTS) is ring  # still cached
    hash_ring.clear_ring_cache()
    assert hash_ring.get_ring(HOSTS) is not ring
    with pytest.raises(exception.EmptyRingError):
        hash_ring.get_ring([])


def test_cache_is_bounded():
    first = hash_ring.get_ring(['h0'], 8)
    for i in range(1, 20):
        hash_ring.get_ring([f'h{i}'], 8)
    assert hash_ring.get_ring(['h0'], 8) is not first


def test_ranking_helpers_match_the_reference():
    hosts = [f'host-{i}.example.org' for i in range(7)]
    ring = HashRing(hosts, 10, replicas=3)  # stores 3 ranks of 7
    digests = hash_ring.key_digests(KEYS[:60])
    buckets = ring.buckets(digests)
    ranked = ring.ranked(buckets)
    assert ranked.shape == (60, 3)
    assert list(ring.names) == sorted(hosts)
    for key, bucket, prefix in zip(KEYS[:60], buckets.tolist(), ranked.tolist(), strict=True):
        full = [ring.names[i] for i in ring.ranking(bucket)]
        assert full == _ref_hosts(hosts, key, 10, 7)
        assert [ring.names[i] for i in prefix] == full[:3]
        assert ring.get_hosts(key) == full[:3]
    # With every rank stored, the stored order is the whole ranking.
    small = HashRing(hosts[:2], 10)
    assert sorted(small.ranking(5)) == [0, 1]


def test_key_digests_str_and_bytes():
    got = hash_ring.key_digests(['a', b'a', 'nœud'])
    want = [int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), 'big')
            for k in (b'a', b'a', 'nœud'.encode())]
    assert got.tolist() == want
    assert hash_ring.key_digests([]).tolist() == []
