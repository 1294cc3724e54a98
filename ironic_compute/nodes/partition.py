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

"""One partition as its services see it: pure, no I/O.

The one place that says which services a partition's ring is built over,
whether the partition runs the shard ring, and which ring then decides who
manages each node. The resource tracker asks it for itself; ``ring show``,
``node show``, ``node list`` and ``ironic shards`` ask it for a live member
of the partition (the anchor). The callers read the inputs (the services
rows, the database's time, the node listing or the shard counts) and pass
them in as plain values.
"""

import dataclasses
from collections.abc import Iterable
from collections.abc import Mapping
from datetime import datetime

from ironic_compute.cluster import liveness
from ironic_compute.nodes import ownership
from ironic_compute.ring import agreement
from ironic_compute.ring import shard_ring


@dataclasses.dataclass(frozen=True)
class PartitionView:
    """A partition's peers and ring, seen from ``host`` (None: no live
    service manages the partition)."""

    partition_key: str | None
    shard: str | None
    peer_list: tuple  # the peer_list the ring was built with
    host: str | None  # the service it is seen from
    peers: frozenset
    warnings: tuple
    ring: object  # the peers' ring (ownership.NO_RING without peer)
    shard_ring: bool  # the partition runs the shard ring
    load_factor: float
    partition_exponent: int

    @property
    def ring_settings(self):
        """The settings that shape this ring, as services record them
        (agreement.ring_settings)."""
        return agreement.ring_settings(self.partition_exponent,
                                       self.load_factor, self.peer_list,
                                       self.partition_key)

    def node_ring(self, nodes: Iterable[ownership.NodeInfo],
                  instances: Iterable[ownership.InstanceInfo]):
        """Who manages each node without the shard ring: bounded loads over
        every node of the partition (ownership.node_ring)."""
        return ownership.node_ring(self.ring, nodes, instances,
                                   self.load_factor)

    def shard_assignment(self, counts: Mapping[str, int]):
        """The shards' assignment over the peers; ``counts``: {shard: nodes}
        as Ironic counts them (UNSHARDED for the nodes without shard)."""
        counts = dict(counts)
        counts.setdefault(shard_ring.UNSHARDED, 0)
        return shard_ring.assign(self.ring, counts, self.load_factor)

    def shard_node_ring(self, assigned, shard_of: Mapping[str, str | None]):
        """Who manages each node under the shard ring: its shard's service
        (``shard_of``: {node uuid: shard or None} of the nodes to place)."""
        return shard_ring.ShardNodeRing(assigned, shard_of, self.ring)


def recorded_peer_list(services, host) -> tuple:
    """The peer_list ``host`` recorded in its ring settings (() if none)."""
    me = ownership.normalize_host(host or '')
    settings = next((agreement.recorded(s.ring_settings) for s in services
                     if ownership.normalize_host(s.host) == me), None)
    return tuple((settings or {}).get('peer_list') or ())


def view(services, now: datetime, *, partition_key: str | None,
         shard: str | None, service_down_time: float,
         partition_exponent: int, load_factor: float, replicas: int = 1,
         peer_list: Iterable[str] | None = None, host: str | None = None,
         spared: frozenset = frozenset(),
         shard_ring_wanted: bool | None = None) -> PartitionView:
    """The view of a partition (conductor group ``partition_key`` and
    ``shard``) from the services rows (``db_services.ServiceRow``) read at
    the database's time ``now``.

    ``host``: the service to see it from (the resource tracker's own); None
    for a live member of the partition (ownership.partition_anchor), as the
    CLI sees it. ``peer_list``: None for the one that member recorded (the
    peer_list of a partition this configuration does not name).
    ``shard_ring_wanted``: whether ``host`` runs [ironic]shard_ring; None
    for what it recorded. ``spared``: see ownership.Recovery.
    """
    services = list(services)
    records = [s.record() for s in services]
    if host is None:
        # Without a peer_list first: the recorded one is the anchor's.
        host = ownership.partition_anchor(
            records, now, service_down_time, partition_key, shard, peer_list)
        if host is not None and peer_list is None:
            peer_list = recorded_peer_list(services, host)
            host = ownership.partition_anchor(
                records, now, service_down_time, partition_key, shard,
                peer_list)
    peer_list = tuple(peer_list or ())
    if host is None:
        return PartitionView(
            partition_key, shard, peer_list, None, frozenset(),
            (nobody_manages(records, now, service_down_time, partition_key),),
            ownership.NO_RING, False, load_factor, partition_exponent)
    chosen = ownership.partition_peers(records, host, now, service_down_time,
                                       partition_key, shard, peer_list,
                                       spared=spared)
    ring = ownership.build_ring(chosen.peers, partition_exponent, replicas)
    if shard_ring_wanted is None:
        shard_ring_wanted = any(
            ownership.normalize_host(r.host) == host and r.shard_ring
            for r in records)
    in_force = ownership.shard_ring_in_force(records, host, ring.hosts,
                                             shard_ring_wanted)
    return PartitionView(partition_key, shard, peer_list, host, chosen.peers,
                         chosen.warnings, ring, in_force, load_factor,
                         partition_exponent)


def nobody_manages(records, now, down_time, group) -> str:
    """Why no service of the partition is live: what the live ones manage."""
    managed = sorted({r.partition_key or '(all nodes)' for r in records
                      if liveness.is_up(r, now, down_time)})
    where = f'partition {group!r}' if group else 'all nodes (no partition key)'
    if not managed:
        return f'no live service manages {where}: no service is up'
    return (f'no live service manages {where}; the live services manage: '
            + ', '.join(managed))
