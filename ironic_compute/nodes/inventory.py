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

"""What a cycle acts on: the Ironic listing, the peers and the rows.

Two strategies: the full listing (the whole partition, or the one
[ironic]shard), and, under the shard ring, the listing of this service's
shards and of the nodes of its instances (doc/scaling.md). Either way a
listing that Ironic cannot give stops the cycle before any row changes.
"""

import dataclasses
import time

from oslo_log import log as logging

from ironic_compute import exception
from ironic_compute import outage
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.nodes import ownership
from ironic_compute.ring import shard_ring

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PeerView:
    """The peers as one cycle sees them, on the database's clock."""

    services: list  # db_services.ServiceRow
    records: list  # ownership.ServiceRecord
    now: object  # datetime: the database's time the services were read at
    up: frozenset  # up services in any partition (spared ones included)
    partition: object  # partition.PartitionView, seen from this host
    loaded_at: float  # lease.now() when read: the view-age check (gate.py)


@dataclasses.dataclass(frozen=True)
class Inventory:
    """What a cycle acts on: the nodes it fetched, the peers, the rows it
    read and the ring that says who manages each node."""

    nodes: list
    peers: PeerView
    instances: list
    rows: dict
    ring: object
    shards: bool = False  # listed by the shard ring


class InventoryReader:
    """Reads a cycle's Inventory for ``host`` from Ironic and the rows.

    ``read_peers(ctx, settings, stats)`` gives the cycle's PeerView (None:
    the cycle stops); it is read after the listing, which may be long, so
    that the view is still fresh when the rows are written (gate.view_fresh).
    """

    def __init__(self, host, ironic_client):
        self.host = host
        self.ironic = ironic_client
        self.outage = outage.Outage('Ironic')

    def ask(self, stats, func, *args, **kwargs):
        """``func(...)``, or None with the cycle skipped (logged) when
        Ironic cannot answer. The time it took adds to ``stats.listing``."""
        started = time.monotonic()
        try:
            result = func(*args, **kwargs)
        except exception.IronicConfigError as exc:
            stats.skipped = f'configuration error: {exc}'
        except exception.IronicUnavailable as exc:
            stats.skipped = f'Ironic unavailable {self.outage.failed(exc)}'
        finally:
            stats.listing += time.monotonic() - started
        if stats.skipped:
            # Logged outside the except block: one line, no traceback.
            LOG.error('Cycle skipped, no compute node changed: the Ironic '
                      'inventory is unknown (%s)', stats.skipped)
            return None
        return result

    def full(self, ctx, settings, stats, read_peers):
        """The whole partition (or the one [ironic]shard) and every row."""
        nodes = self.ask(
            stats, self.ironic.list_nodes,
            conductor_group=settings.partition_key,
            shards=[settings.shard] if settings.shard else None)
        if nodes is None:
            return None
        self.outage.ended(LOG)
        # The peers are read after the listing, which may be long: the view
        # must still be fresh when the rows are written (the lease fence).
        peers_view = read_peers(ctx, settings, stats)
        if peers_view is None:
            return None
        # One read transaction (one round trip to the pool); the rows may
        # still change after it: every write below is conditional.
        with db_api.context_manager.reader.using(ctx):
            instances = db_instances.load_all(ctx)
            rows = db_nodes.load_rows(ctx, self.host)
        # Bounded loads need the whole listing: the same ring object then
        # answers the ownership rules and the orphan clean-up.
        ring = peers_view.partition.node_ring(nodes, instances)
        return Inventory(nodes, peers_view, instances, rows, ring)

    def by_shards(self, ctx, settings, stats, read_peers):
        """The nodes of this service's shards and of its instances, and the
        rows it may act on (see doc/scaling.md)."""
        counts = self.ask(stats, self.ironic.list_shards)
        if counts is None:
            return None
        counts.setdefault(shard_ring.UNSHARDED, 0)
        peers_view = read_peers(ctx, settings, stats)
        if peers_view is None:
            return None
        if not peers_view.partition.shard_ring:
            # A peer stopped running it: list every node from the next
            # cycle, when the view of the peers is fresh again.
            stats.skipped = 'the shard ring is no longer in force'
            return None
        assigned = peers_view.partition.shard_assignment(counts)
        mine = shard_ring.shards_of(assigned, counts, self.host)
        named = [s for s in mine if s != shard_ring.UNSHARDED]
        unsharded = shard_ring.UNSHARDED in mine
        group = settings.partition_key
        nodes = []
        if named:
            nodes = self.ask(stats, self.ironic.list_nodes,
                                 conductor_group=group, shards=named)
        if nodes is not None and unsharded:
            more = self.ask(stats, self.ironic.list_nodes,
                                conductor_group=group, sharded=False)
            nodes = None if more is None else nodes + more
        if nodes is None:
            return None
        with db_api.context_manager.reader.using(ctx):
            instances = db_instances.load_all(ctx)
            rows = db_nodes.load_shard_rows(ctx, self.host, group, named,
                                            unsharded)
        # A node of our instance stays ours wherever its shard goes: fetch
        # the ones outside our shards, each on its own.
        listed = {n.uuid for n in nodes}
        outside = sorted({i.node for i in instances if i.node
                          and ownership.normalize_host(i.host) == self.host}
                         - listed)
        if outside:
            extra = self.ask(stats, self.ironic.get_nodes, outside)
            if extra is None:
                return None
            nodes += [n for n in extra
                      if group is None or n.conductor_group == group]
        self.outage.ended(LOG)
        # Rows filed under another shard (or none yet) for nodes we list.
        missing = [n.uuid for n in nodes if n.uuid not in rows]
        if missing:
            rows.update(db_nodes.load_rows_of(ctx, self.host, missing))
        shard_of = {uuid: row.shard for uuid, row in rows.items()}
        shard_of.update((n.uuid, n.shard) for n in nodes)
        ring = peers_view.partition.shard_node_ring(assigned, shard_of)
        return Inventory(nodes, peers_view, instances, rows, ring, shards=True)
