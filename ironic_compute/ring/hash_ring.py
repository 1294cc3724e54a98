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

"""Consistent hash ring: map a key (node uuid, shard name) to ordered hosts.

Pure and deterministic (no I/O, no ``hash()``): every process, machine, Python
and numpy version computes the same table from the same host set.

Rendezvous (highest-random-weight) hashing over a precomputed table of
``2**partition_exponent`` buckets: a key's bucket is the top bits of the 64-bit
BLAKE2b digest of its UTF-8 bytes; in each bucket hosts rank by a score that
depends only on (host, bucket), ties broken by name.  The ranking of two hosts
thus never depends on the others: removing a host moves only its buckets,
and adding one moves buckets only to it.

A host's scores are a keyed pseudo-random *permutation* of the bucket numbers
(4-round Feistel network seeded from the name), not an independent hash per
bucket: each host sees every score value once, which about halves the variance
of the buckets it wins (max/mean share ~1.07 rather than ~1.10 at 100 hosts).
"""

import hashlib

import numpy as np

from ironic_compute import exception
from ironic_compute import lru
from ironic_compute.cluster import hosts as hosts_mod

__all__ = ['HashRing', 'clear_ring_cache', 'get_ring', 'key_digests', 'normalize_hosts']

_blake2b = hashlib.blake2b
_U64 = np.uint64
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_HOST_PERSON = b'ic-ring-host'  # domain-separates host seeds from key hashes
_CHUNK_CELLS = 1 << 21  # hosts x buckets scored at once while building
MIN_EXPONENT, MAX_EXPONENT = 1, 24
MAX_HOSTS = 1 << 16


def _mix64(z):
    """splitmix64 finaliser over a uint64 array (numpy array arithmetic wraps)."""
    z = z ^ (z >> _U64(30))
    z = z * _U64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> _U64(27))
    z = z * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def key_digests(keys):
    """64-bit BLAKE2b digests of ``keys`` (str as UTF-8, or bytes): a uint64 array.

    The ring's only key hash: a key's bucket is the digest's top bits.  One
    C-level join, no per-key Python ints.
    """
    digests = b''.join([_blake2b(k.encode() if isinstance(k, str) else k,
                                 digest_size=8).digest() for k in keys])
    return np.frombuffer(digests, dtype='>u8').astype(_U64)


# The ring's name for hosts.normalize_all (kept: callers and tests use it).
normalize_hosts = hosts_mod.normalize_all


class HashRing:
    """Immutable ring of ``hosts`` (iterable of str, order irrelevant).

    ``replicas`` is how many distinct hosts :meth:`get_hosts` returns per key
    (primary first); with fewer hosts than that, all hosts are returned.
    Raises :class:`EmptyRingError` (a ValueError) for an empty host set;
    ValueError for an empty name, more than 65536 hosts, ``replicas < 1`` or
    ``partition_exponent`` outside 1..24; TypeError for a non-str name.
    Building takes ~0.06 s at 100 hosts and 2**16 buckets (~0.3 s at 2**18);
    use :func:`get_ring` to reuse the ring while the host set is unchanged.
    """

    def __init__(self, hosts, partition_exponent=16, replicas=1):
        if (not isinstance(partition_exponent, int) or isinstance(partition_exponent, bool)
                or not MIN_EXPONENT <= partition_exponent <= MAX_EXPONENT):
            raise ValueError(f'partition_exponent must be an int in '
                             f'{MIN_EXPONENT}..{MAX_EXPONENT}, got {partition_exponent!r}')
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError(f'replicas must be an int >= 1, got {replicas!r}')
        self.hosts = normalize_hosts(hosts)
        if not self.hosts:
            raise exception.EmptyRingError('cannot build a hash ring without hosts')
        if len(self.hosts) > MAX_HOSTS:  # scores must fit in int64
            raise ValueError(f'at most {MAX_HOSTS} hosts are supported')
        self.partition_exponent = partition_exponent
        self.replicas = replicas
        self._shift = 64 - partition_exponent
        # Sorted names: the index order is the tie-break order, which is the
        # same for any two hosts whatever the rest of the set is.
        self._names = tuple(sorted(self.hosts))
        self._lo_bits = partition_exponent // 2
        self._row_bits = max(1, (len(self._names) - 1).bit_length())
        # int32 halves the memory traffic of the build when the scores fit.
        fits = partition_exponent + 2 * self._row_bits < 31
        self._dtype = np.int32 if fits else np.int64
        self._tables = self._round_tables()
        n = len(self._names)
        self._depth = min(n, replicas)  # ranks stored per bucket
        self._order = self._build_order()
        names = np.empty(n, dtype=object)
        names[:] = self._names
        self._primary = names[self._order[:, 0]]
        self._row_array = self._row_table(names, self._order)
        self._rows = self._row_array.tolist()  # list indexing is the fastest lookup

    @staticmethod
    def _row_table(names, top):
        """Object array of per-bucket host tuples, one tuple per distinct row.

        Sharing the tuples keeps the table at one pointer per bucket.
        """
        n, width = len(names), top.shape[1]
        if n ** width < 1 << 62:
            # One int64 code per bucket: much faster to unique than rows.
            code = np.zeros(len(top), dtype=np.int64)
            for col in top.T:
                code = code * n + col
            code, inverse = np.unique(code, return_inverse=True)
            uniq = np.stack(np.unravel_index(code, (n,) * width), axis=1)
        else:
            uniq, inverse = np.unique(top, axis=0, return_inverse=True)
        rows = np.empty(len(uniq), dtype=object)
        for i, row in enumerate(names[uniq].tolist()):
            rows[i] = tuple(row)  # item by item: numpy would unpack tuples
        return rows[inverse.ravel()]

    def __repr__(self):
        return (f'HashRing({len(self._names)} hosts, partition_exponent='
                f'{self.partition_exponent}, replicas={self.replicas})')

    def _round_tables(self):
        """Per-host Feistel round functions as flat lookup tables.

        Each table row is one host; values carry the host's row number in
        their high bits so the next round's lookup index is a plain xor.
        """
        seeds = np.array([int.from_bytes(_blake2b(name.encode(), digest_size=8,
                                                  person=_HOST_PERSON).digest(), 'big')
                          for name in self._names], dtype=_U64)
        n, lo_bits = len(self._names), self._lo_bits
        hi_bits = self.partition_exponent - lo_bits
        row = np.arange(n, dtype=np.int64)[:, None]
        tables = []
        for rnd, (in_bits, out_bits) in enumerate([(hi_bits, lo_bits), (lo_bits, hi_bits)] * 2):
            key = _mix64(seeds + _U64((rnd + 1) * _GOLDEN & _MASK64))
            x = np.arange(1 << in_bits, dtype=_U64) * _U64(_GOLDEN)
            out = (_mix64(key[:, None] + x[None, :]) >> _U64(32)) & _U64((1 << out_bits) - 1)
            tables.append(out.astype(np.int64))
        t1, t2, t3, t4 = tables
        # t3 keeps no row bits (lo keeps its own); t4 cancels hi's row bits.
        tables = [t1 | row << lo_bits, t2 | row << hi_bits, t3, t4 ^ row << hi_bits]
        return [t.astype(self._dtype).ravel() for t in tables]

    def _scores(self, hi_start, hi_stop):
        """Scores (hosts, buckets hi_start << lo_bits ... hi_stop << lo_bits).

        A score is (keyed permutation of the bucket) << row_bits | (row_mask -
        row), so all scores in a bucket differ, max() breaks ties by name and
        the winner's row is in the low bits.
        """
        t1, t2, t3, t4 = self._tables
        lo_bits, row_bits, dtype = self._lo_bits, self._row_bits, self._dtype
        n, width_hi = len(self._names), 1 << (self.partition_exponent - lo_bits)
        hi = np.arange(hi_start, hi_stop, dtype=dtype)[None, :, None]
        lo = np.arange(1 << lo_bits, dtype=dtype)[None, None, :]
        t1 = t1.reshape(n, width_hi)[:, hi_start:hi_stop, None]
        lo = lo ^ t1  # (row << lo_bits) | lo: also the index into t2 and t4
        hi = hi ^ t2.take(lo)  # (row << hi_bits) | hi: the index into t3
        lo ^= t3.take(hi)
        hi ^= t4.take(lo)  # row bits cancelled: the final hi half
        row = np.arange(n, dtype=dtype)[:, None, None]
        tag = row << (lo_bits + row_bits) | ((1 << row_bits) - 1 - row)
        scores = (hi << (lo_bits + row_bits)) ^ (lo << row_bits) ^ tag
        return scores.reshape(n, -1)

    def _build_order(self):
        # Chunks of buckets bound the memory and keep the working set in cache.
        n, hi_count = len(self._names), 1 << (self.partition_exponent - self._lo_bits)
        row_mask = (1 << self._row_bits) - 1
        order = []
        step = max(1, _CHUNK_CELLS // (n << self._lo_bits))
        for hi_start in range(0, hi_count, step):
            scores = self._scores(hi_start, min(hi_count, hi_start + step))
            cols = np.arange(scores.shape[1])
            ranks = np.empty((scores.shape[1], self._depth), dtype=np.int32)
            for rank in range(self._depth):
                # max over axis 0 is an elementwise max of rows: fast in numpy.
                rows = row_mask - (scores.max(axis=0) & row_mask)
                ranks[:, rank] = rows
                scores[rows, cols] = -1
            order.append(ranks)
        return np.concatenate(order)

    def shares(self):
        """``{host: fraction of buckets it is primary for}``: its expected load."""
        counts = np.bincount(self._order[:, 0], minlength=len(self._names))
        return dict(zip(self._names, (counts / len(self._order)).tolist(), strict=True))

    def _buckets(self, keys):
        """Bucket numbers of many keys as an int array."""
        return self.buckets(key_digests(keys))

    @property
    def names(self):
        """The host names, sorted: host index ``i`` in :meth:`ranked` is ``names[i]``."""
        return self._names

    def buckets(self, digests):
        """Bucket numbers of :func:`key_digests` values (an int array)."""
        return digests >> _U64(self._shift)

    def ranked(self, buckets):
        """Host indices of each bucket, best first: (len(buckets), depth) array.

        ``depth`` is ``min(hosts, replicas)``; :meth:`ranking` gives all.
        """
        return self._order[buckets]

    def ranking(self, bucket):
        """Indices of every host for one bucket, best first (a list)."""
        if self._depth == len(self._names):
            return self._order[bucket].tolist()
        hi, lo = divmod(int(bucket), 1 << self._lo_bits)
        return np.argsort(-self._scores(hi, hi + 1)[:, lo]).tolist()

    def get_hosts(self, key):
        """Hosts for ``key`` (str or bytes), primary first, at most ``replicas``."""
        if isinstance(key, str):
            key = key.encode()
        bucket = int.from_bytes(_blake2b(key, digest_size=8).digest(), 'big') >> self._shift
        return [*self._rows[bucket]]

    def assign(self, keys):
        """Bulk :meth:`get_hosts`: ``{key: [hosts]}`` for the given key objects."""
        keys = list(keys)
        rows = self._row_array[self._buckets(keys)].tolist()
        return dict(zip(keys, map(list, rows), strict=True))

    def primaries(self, keys):
        """Primary host of each key, as a list in input order; fastest bulk path."""
        return self._primary[self._buckets(list(keys))].tolist()


_CACHE = lru.LRUCache(8)


def get_ring(hosts, partition_exponent=16, replicas=1):
    """Return a cached :class:`HashRing` for this host set (any order or case).

    The same object is returned while the normalised set, exponent and replica
    count are unchanged, so callers may call this every cycle; a hit costs a
    normalisation of the names and a dict lookup.  Keeps the last 8 rings.
    """
    key = (normalize_hosts(hosts), partition_exponent, replicas)
    return _CACHE.get(key, lambda: HashRing(key[0], partition_exponent,
                                            replicas))


def clear_ring_cache():
    """Forget all cached rings (tests, or to release memory)."""
    _CACHE.clear()
