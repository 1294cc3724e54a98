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

"""The ring over Ironic shards (``[ironic]shard_ring``): pure, no I/O.

With the shard ring a service lists only the nodes of the shards assigned to
it, not the whole partition. The shards (``GET /v1/shards``) are assigned to
the peers by consistent hashing with bounded loads
(:mod:`~ironic_compute.ring.assignment`), weighted by their node count; the nodes
without a shard form the pseudo-shard :data:`UNSHARDED` and go to one peer
like any shard. Who manages a node is still decided per node by the
ownership rules (:func:`ironic_compute.nodes.ownership.owned_nodes`), with a
:class:`ShardNodeRing` in place of the node ring: a node with an instance
stays with its instance's host wherever its shard goes.

The rolling switch: a partition uses the shard ring only when every peer of
its ring runs it (:func:`in_force`); while one does not, every peer lists
the whole partition and uses the node ring, so that all of them compute one
owner per node whatever mix of settings they run.
"""

import hashlib
import math
from collections.abc import Iterable
from collections.abc import Mapping

from ironic_compute.cluster import hosts

# The name Ironic gives the count of the nodes without a shard.
UNSHARDED = 'None'

# Shard keys given by ``ironic-compute-manage ironic shard-assign``.
KEY_PREFIX = 'ic'


def in_force(peers: Iterable[str], this_host: str, own_setting: bool,
             shard_ring_hosts: Iterable[str]) -> bool:
    """Whether the partition uses the shard ring this cycle.

    ``shard_ring_hosts``: the hosts whose services row records shard_ring;
    this host counts with its own (possibly just reloaded) setting. True
    only when every peer runs it; with no other peer, when this host does.
    """
    running = {hosts.normalize(h) for h in shard_ring_hosts}
    running.add(hosts.normalize(this_host))
    return own_setting and all(hosts.normalize(p) in running for p in peers)


def assign(ring, counts: Mapping[str, int], load_factor: float):
    """The bounded-load assignment of the shards of ``counts`` over the
    ring's hosts, weighted by node count, at ``[hash_ring]load_factor``
    (an object with ``get_hosts(shard)``; the ring itself when it has one
    host or none, or when ``load_factor`` is <= 1 or not finite)."""
    # Here, not at the top: assignment loads numpy, which the CLI commands
    # that import this module only for in_force or UNSHARDED do not need.
    from ironic_compute.ring import assignment
    if not assignment.loads_bounded(load_factor):
        load_factor = 1.0  # plain hashing, as ownership.node_ring does
    return assignment.bounded(ring, sorted(counts), load_factor,
                              weights=dict(counts))


def owner(assigned, shard: str) -> str | None:
    """The host a shard is assigned to (None without a live peer)."""
    hosts = assigned.get_hosts(shard)
    return hosts[0] if hosts else None


def shards_of(assigned, counts: Mapping[str, int], host: str) -> list[str]:
    """The shards of ``counts`` assigned to ``host``, sorted."""
    me = hosts.normalize(host)
    return sorted(s for s in counts if owner(assigned, s) == me)


class ShardNodeRing:
    """The ring of the ownership rules under the shard ring: a node goes
    where its shard goes.

    ``shard_of`` maps the node uuids this cycle knows (its listing, the
    rows it read) to their shard (None: unsharded). A node it does not know
    gets the plain node ring's answer: a deterministic holder for clean-up.
    """

    def __init__(self, assigned, shard_of: Mapping[str, str | None], ring):
        self.assigned = assigned
        self.shard_of = shard_of
        self.ring = ring
        self.hosts = ring.hosts
        self.replicas = 1
        self._owners = {}

    def _host(self, shard):
        host = self._owners.get(shard, False)
        if host is False:
            host = self._owners[shard] = owner(self.assigned, shard)
        return host

    def get_hosts(self, key):
        if key not in self.shard_of:
            return self.ring.get_hosts(key)
        host = self._host(self.shard_of[key] or UNSHARDED)
        return [host] if host is not None else []

    def assign(self, keys):
        return {key: self.get_hosts(key) for key in keys}


def shard_key(uuid: str, shards: int, partition_key: str | None = None) -> str:
    """The shard ``shard-assign`` gives a node: a hash of its uuid, one of
    ``shards`` names (``ic-07``; ``ic-<group>-07`` in a conductor group, so
    that the shards of two groups never share a name and Ironic's counts,
    which are over all groups, are the group's)."""
    if shards < 1:
        raise ValueError(f'the number of shards must be at least 1, got {shards}')
    # A uuid, not a host name: lower-cased so that any spelling of one
    # node's uuid gets the same shard.
    digest = hashlib.blake2b(uuid.strip().lower().encode('utf-8'),
                             digest_size=8).digest()
    index = int.from_bytes(digest, 'big') % shards
    width = max(2, int(math.log10(shards - 1)) + 1 if shards > 1 else 2)
    group = f'{partition_key}-' if partition_key else ''
    return f'{KEY_PREFIX}-{group}{index:0{width}d}'
