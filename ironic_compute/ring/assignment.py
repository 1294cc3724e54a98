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

"""Consistent hashing with bounded loads over the hash ring: pure, no I/O.

Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads"
(SODA 2018): every host gets the same capacity, a little above the mean load,
and each key goes to the first host in its ring order that still has room.
The ring order is :class:`~ironic_compute.ring.hash_ring.HashRing`'s rendezvous
ranking of the key's bucket.  Each host first takes its own primary keys up
to its capacity, so most keys land where plain hashing puts them and only
the overflow of the fullest hosts moves on (see :meth:`BoundedRing._place`).

The keys are placed one after another in an order that depends only on each
key (heaviest first, then a 64-bit hash of the key independent of its
bucket), never on the order they were given in.  The answer is therefore a
function of the host set, the key set, the weights and the preloads: every
service computes the same one from the same peers and the same listing.

Capacity: ``max(ceil(mean), floor(load_factor * mean))`` where ``mean`` is
(weight of all keys + preloaded weight on ring hosts) / hosts.  It never
exceeds ``ceil(load_factor * mean)``, and it never drops below ``ceil(mean)``
so unit keys always fit.  A key heavier than the room left anywhere goes to
the host with the most room (a shard larger than the bound is placed, not
refused).
"""

import math

import numpy as np

from ironic_compute import lru
from ironic_compute.cluster import hosts
from ironic_compute.ring import hash_ring

__all__ = ['BoundedRing', 'bounded', 'capacity', 'clear_cache']

_CACHE = lru.LRUCache(2)

# Bits of the key digest the placement order reads first: the bucket uses the
# top 1..24 bits, so the order of the keys in one host's buckets is random.
_ORDER_ROTATE = 24


def loads_bounded(load_factor) -> bool:
    """Whether ``[hash_ring]load_factor`` asks for bounded loads: a finite
    number above 1 (None, 1 or less, or not finite: plain hashing). The one
    rule every ring, the CLI and the ring agreement apply."""
    return (isinstance(load_factor, (int, float))
            and not isinstance(load_factor, bool)
            and math.isfinite(load_factor) and load_factor > 1)


def _check_load_factor(load_factor):
    if (isinstance(load_factor, bool) or not isinstance(load_factor, (int, float))
            or not math.isfinite(load_factor)):
        raise ValueError(f'load_factor must be a finite number, got {load_factor!r}')


def _check_weight(key, weight):
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise TypeError(f'weight of {key!r} must be a number, not {type(weight).__name__}')
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f'weight of {key!r} must be finite and >= 0, got {weight!r}')


def capacity(total, hosts, load_factor):
    """The per-host bound for ``total`` weight over ``hosts`` hosts."""
    mean = total / hosts
    # The epsilon keeps 1.15 * 20 = 22.999999999999996 from flooring to 22.
    return max(math.ceil(mean), math.floor(load_factor * mean + 1e-9))


def bounded(ring, keys, load_factor, weights=None, preload=None):
    """A :class:`BoundedRing` over ``ring``, or ``ring`` itself when
    ``load_factor <= 1`` (plain hashing) or the ring has no host.

    The last two answers are cached: a steady cycle lists the same nodes
    again, and comparing key sets costs a few ms where placing 10^5 keys
    costs ~0.1 s.
    """
    _check_load_factor(load_factor)
    if not loads_bounded(load_factor) or not ring.hosts:
        return ring
    keys = list(keys)
    cache_key = (ring, load_factor, frozenset(keys),
                 frozenset(weights.items()) if weights else None,
                 frozenset((hosts.normalize(h), w) for h, w in (preload or {}).items() if w))
    return _CACHE.get(cache_key, lambda: BoundedRing(
        ring, keys, load_factor, weights, preload))


def clear_cache():
    """Forget the cached assignments (tests, or to release memory)."""
    _CACHE.clear()


class BoundedRing:
    """The bounded-load assignment of ``keys`` with the ring's interface.

    :param ring: a :class:`~ironic_compute.ring.hash_ring.HashRing`
    :param keys: str or bytes keys, any order; duplicates count once
    :param load_factor: the bound over the mean load, > 1
    :param weights: optional mapping key -> number >= 0 (default 1 each)
    :param preload: optional mapping host -> weight already on that host
        that the assignment cannot move (nodes pinned by an instance);
        hosts outside the ring are ignored

    ``get_hosts(key)`` is ``[owner]`` followed by the ring's order of the
    other hosts (the standby order: where the key would go first if its
    owner left, when that host has room), ``replicas`` hosts in all.  A key
    outside the assigned set gets the plain ring's answer, so rows Ironic no
    longer lists still have one deterministic owner for clean-up.
    """

    def __init__(self, ring, keys, load_factor, weights=None, preload=None):
        _check_load_factor(load_factor)
        if not loads_bounded(load_factor):
            raise ValueError('a bounded-load ring needs load_factor > 1; '
                             'use bounded() for plain hashing')
        self.ring = ring
        self.hosts = ring.hosts
        self.replicas = ring.replicas
        self.load_factor = load_factor
        keys = list(dict.fromkeys(keys))
        if weights is None:
            weight_list = None
        else:
            weight_list = [weights.get(key, 1) for key in keys]
            for key, weight in zip(keys, weight_list, strict=True):
                _check_weight(key, weight)
        names = ring.names
        index = {name: i for i, name in enumerate(names)}
        base = [0] * len(names)
        for host, weight in (preload or {}).items():
            _check_weight(host, weight)
            i = index.get(hosts.normalize(host))
            if i is not None:
                base[i] += weight
        total = sum(base) + (len(keys) if weight_list is None else sum(weight_list))
        self.capacity = capacity(total, len(names), load_factor)
        placed, room = self._place(keys, weight_list, base)
        host_of = np.empty(len(names), dtype=object)
        host_of[:] = names
        self._owner = dict(zip(keys, host_of[placed].tolist(), strict=True))
        self._loads = {name: self.capacity - left for name, left in zip(names, room, strict=True)}

    def __repr__(self):
        return (f'BoundedRing({len(self.hosts)} hosts, {len(self._owner)} keys, '
                f'load_factor={self.load_factor}, capacity={self.capacity})')

    def _place(self, keys, weights, base):
        """(host index per key in input order, room left per host).

        First every host takes its own primary keys in placement order until
        the next one does not fit; then the keys left over walk their ring
        order, in placement order, to the first host with room.  Taking the
        primary keys first keeps every key of a host below the bound where
        plain hashing puts it: when the capacity changes (a host joins or
        leaves), mostly the overflow of the fullest hosts is placed anew.
        """
        ring = self.ring
        digests = hash_ring.key_digests(keys)
        buckets = ring.buckets(digests)
        ranked = ring.ranked(buckets)
        order = _placement_order(keys, weights, digests)
        room = [self.capacity - b for b in base]
        placed = np.empty(len(keys), dtype=np.int64)
        primary = ranked[:, 0].tolist()
        closed = [False] * len(room)
        spilled = []
        for i in order:
            weight = 1 if weights is None else weights[i]
            host = primary[i]
            if not closed[host] and room[host] >= weight:
                room[host] -= weight
                placed[i] = host
            else:
                closed[host] = True
                spilled.append(i)
        full = {}  # bucket -> every host index, best first (rarely needed)
        for i in spilled:
            weight = 1 if weights is None else weights[i]
            host = self._spill(i, weight, ranked, buckets, room, full)
            room[host] -= weight
            placed[i] = host
        return placed, room

    def _spill(self, i, weight, ranked, buckets, room, full):
        """The host for a key its primary did not take: the next one in ring
        order with room, else the one with the most room (first in ring
        order on a tie)."""
        for host in ranked[i, 1:].tolist():
            if room[host] >= weight:
                return host
        bucket = int(buckets[i])
        order = full.get(bucket)
        if order is None:
            order = full[bucket] = self.ring.ranking(bucket)
        for host in order[ranked.shape[1]:]:
            if room[host] >= weight:
                return host
        return max(order, key=room.__getitem__)

    def owner(self, key):
        """The host the key is assigned to, or None if it is not a key of ours."""
        return self._owner.get(key)

    def get_hosts(self, key):
        """Owner first, then the ring's order of the others; ``replicas`` hosts."""
        owner = self._owner.get(key)
        if owner is None:
            return self.ring.get_hosts(key)
        # The ring gives ``replicas`` hosts: without the owner, at least
        # ``replicas - 1`` are left (or every other host of a smaller ring).
        others = [host for host in self.ring.get_hosts(key) if host != owner]
        return [owner] + others[:self.replicas - 1]

    def assign(self, keys):
        """Bulk :meth:`get_hosts`: ``{key: [hosts]}``."""
        if self.replicas == 1:
            owner = self._owner
            return {key: [owner[key]] if key in owner else self.ring.get_hosts(key)
                    for key in keys}
        return {key: self.get_hosts(key) for key in keys}

    def primaries(self, keys):
        """The owner of each key, as a list in input order."""
        owner, ring = self._owner, self.ring
        return [owner[key] if key in owner else ring.get_hosts(key)[0] for key in keys]

    def loads(self):
        """``{host: assigned weight + preload}`` for every ring host."""
        return dict(self._loads)

    def shares(self):
        """``{host: fraction of the total load}`` (the ring's shares when empty)."""
        total = sum(self._loads.values())
        if not total:
            return self.ring.shares()
        return {host: load / total for host, load in self._loads.items()}


def _placement_order(keys, weights, digests):
    """Indices of ``keys``, heaviest first, then by a hash of the key.

    Heaviest first packs uneven weights (first-fit decreasing).  The hash is
    the key's digest rotated so that its low bits, not the bucket bits, lead.
    """
    rot = np.uint64(_ORDER_ROTATE)
    prio = (digests << rot) | (digests >> np.uint64(64 - _ORDER_ROTATE))
    if weights is None:
        neg = np.zeros(len(keys))
        order = np.argsort(prio, kind='stable')
    else:
        neg = -np.asarray(weights, dtype=np.float64)
        order = np.lexsort((prio, neg))
    same = (prio[order][1:] == prio[order][:-1]) & (neg[order][1:] == neg[order][:-1])
    if same.any():
        # Two keys with one 64-bit digest: break the tie by the key itself,
        # not by the input order.
        def tiebreak(i):
            key = keys[i]
            raw = key.encode() if isinstance(key, str) else key
            return neg[i], int(prio[i]), raw, isinstance(key, str)
        return sorted(range(len(keys)), key=tiebreak)
    return order.tolist()
