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

"""One resource-tracker cycle, orchestrated: inventory -> plan -> rows ->
instances.

The units: inventory.py (Ironic's listing, the peers, the rows), gate.py
(recovery, rejoin, the view's age), partition.py (the peers' ring),
ownership.py and sync_plan.py (the pure rules), plan_application.py (the
conditional writes). No threads and no signals here; ``service.py`` decides
when to run a cycle. Nothing is deleted on a failed or partial listing:
when Ironic cannot give the whole inventory the cycle changes no row.
"""

import dataclasses
import json
import time

from oslo_log import log as logging

from ironic_compute import ironic
from ironic_compute.cluster import lease
from ironic_compute.cluster import liveness
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import services as db_services
from ironic_compute.instances import takeover
from ironic_compute.nodes import gate
from ironic_compute.nodes import inventory
from ironic_compute.nodes import ownership
from ironic_compute.nodes import partition
from ironic_compute.nodes import plan_application
from ironic_compute.nodes import sync_plan
from ironic_compute.placement import sync as placement_sync
from ironic_compute.ring import agreement

LOG = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class Settings:
    """What a cycle reads from the configuration (mutable ones via SIGHUP)."""

    partition_key: str | None = None
    peer_list: tuple = ()
    shard: str | None = None
    service_down_time: int = 60
    partition_exponent: int = 16
    load_factor: float = 1.10  # [hash_ring]load_factor; <= 1: plain hashing
    takeover_grace: float = 0  # [DEFAULT]instance_takeover_grace; 0: never
    shard_ring: bool = False  # [ironic]shard_ring (ignored with [ironic]shard)

    @classmethod
    def from_conf(cls, conf):
        # Ironic compares conductor groups without regard to case.
        key = (conf.ironic.partition_key or '').strip().lower() or None
        return cls(partition_key=key,
                   peer_list=tuple(conf.ironic.peer_list or ()),
                   shard=conf.ironic.shard or None,
                   service_down_time=conf.service_down_time,
                   partition_exponent=conf.hash_ring.partition_exponent,
                   load_factor=conf.hash_ring.load_factor,
                   takeover_grace=conf.instance_takeover_grace,
                   shard_ring=conf.ironic.shard_ring)

    @property
    def ring_settings(self):
        """What this service records for its peers to compare."""
        return agreement.ring_settings(self.partition_exponent,
                                       self.load_factor, self.peer_list,
                                       self.partition_key)


@dataclasses.dataclass
class CycleStats:
    peers: int = 0
    owned: int = 0
    taken: int = 0
    released: int = 0
    created: int = 0
    revived: int = 0
    updated: int = 0
    deleted: int = 0
    lost_races: int = 0
    taken_over: int = 0  # instances of dead services taken over
    reaping: int = 0  # nodes of deleted instances being torn down
    fetched: int = 0  # nodes Ironic returned this cycle
    listing: float = 0.0  # seconds waiting for Ironic's listings this cycle
    seconds: float = 0.0
    skipped: str | None = None


_AVAILABLE = db_nodes.SYNCED_FIELDS.index('available')
_GROUP = db_nodes.SYNCED_FIELDS.index('conductor_group')
_TRAITS = db_nodes.SYNCED_FIELDS.index('traits')


def row_fields(node, resources):
    """The synced fields of a node's row, in SYNCED_FIELDS order."""
    # What a build needs beyond the columns: traits, and whether the node
    # is free (a node with an instance reports its capacity as used); and
    # the instance Ironic names, so node show judges the node as we do.
    stats = json.dumps({'capabilities': resources.capabilities,
                        'name': node.name, 'traits': sorted(node.traits),
                        'available': resources.available,
                        'instance_uuid': node.instance_uuid}, sort_keys=True)
    return (node.uuid, node.conductor_group or '', resources.vcpus,
            resources.memory_mb, resources.local_gb, resources.vcpus_used,
            resources.memory_mb_used, resources.local_gb_used,
            resources.cpu_arch, resources.resource_class, stats, node.shard,
            bool(resources.available), db_nodes.traits_text(node.traits),
            db_nodes.capabilities_text(resources.capabilities))


class ResourceTracker:
    def __init__(self, host, service_id, ironic_client, instance_manager=None,
                 placement=None):
        self.host = ownership.normalize_host(host)
        self.service_id = service_id
        self.ironic = ironic_client
        # Takeover, reaping and stray reports: after the rows, same view.
        self.keeper = takeover.InstanceKeeper(self.host, service_id,
                                              instance_manager)
        # uuid -> (node, fields): a node's row values are recomputed only
        # when Ironic reports the node changed.
        self._fields_cache = {}
        # Recovery, lease and rejoin: whether this cycle may judge and act.
        self.gate = gate.MembershipGate(self.host, service_id)
        # What a cycle acts on: the Ironic listing and the rows.
        self.reader = inventory.InventoryReader(self.host, ironic_client)
        # The decision of the last view (shard_ring.in_force): a cycle must
        # choose what to list before it reads the peers.
        self._shard_ring_in_force = False
        # placement.sync.ProviderSync, or None: [placement] not configured.
        self.placement = placement
        self.placement_stats = None  # of the last cycle that reported

    @property
    def db_now(self):
        """The database's time of the last view of the peers (naive UTC)."""
        return self.gate.db_now

    @property
    def peers_judged(self):
        """Whether the last view judged its peers by their heartbeats."""
        return self.gate.peers_judged

    def database_lost(self):
        """A database call failed: judge no peer until the gate opens."""
        self.gate.database_lost()

    def lease_lapsed(self):
        """This service's lease lapsed (cluster/lease.py: paused, suspended
        or cut off): the next cycle heartbeats and rejoins."""
        self.gate.lease_lapsed()

    def run_cycle(self, settings):
        """Run one cycle; return its CycleStats. DB errors propagate."""
        started = time.monotonic()
        stats = CycleStats()
        ctx = db_api.Context()
        # Ironic's listing, then the peers (the gate), then the rows.
        found = self._read_inventory(ctx, settings, stats)
        if found is not None:
            owned, plan = self._plan(found, settings, stats)
            # A view that aged while paused is not acted on.
            if self.gate.view_fresh(found.peers.loaded_at,
                                    settings.service_down_time, stats):
                before = self._placement_before(ctx, found, plan)
                applied = plan_application.apply(
                    ctx, plan, self.host, self.service_id,
                    found.peers.services, self.ironic, stats,
                    per_node=found.shards)
                self._report_placement(found, applied, before, settings)
                self._keep_instances(ctx, found, owned, settings, stats)
        return self._finish(ctx, settings, stats, started)

    def _read_inventory(self, ctx, settings, stats):
        """The cycle's inventory.Inventory, or None when it stops."""
        if self._shard_ring_in_force and self._shard_ring_wanted(settings):
            return self.reader.by_shards(ctx, settings, stats,
                                         self._read_peers)
        return self.reader.full(ctx, settings, stats, self._read_peers)

    def _plan(self, found, settings, stats):
        """(ownership.Ownership, sync_plan.Plan) of the inventory: the pure
        rules, no I/O."""
        nodes, instances, rows, ring = (found.nodes, found.instances,
                                        found.rows, found.ring)
        stats.fetched = len(nodes)
        owned = ownership.owned_nodes(self.host, ring, nodes, instances)
        stats.owned = len(owned.owned)
        by_uuid = {node.uuid: node for node in nodes}
        held = {uuid for uuid, row in rows.items() if row.host == self.host}
        # A build that reserved its node but has not recorded it yet is
        # counted by the scheduler as waiting for a free node: its node
        # stays "available" in the row until the build records it, or the
        # scheduler would count that node twice (taken, and waited for).
        waiting = {i.uuid for i in instances if not i.node}
        fields = {uuid: self._fields(by_uuid[uuid], waiting)
                  for uuid in (owned.owned.keys() | held) if uuid in by_uuid}
        for uuid in self._fields_cache.keys() - by_uuid.keys():
            del self._fields_cache[uuid]
        my_instance_nodes = {i.node for i in instances
                             if i.node and ownership.normalize_host(i.host)
                             == self.host}
        plan = sync_plan.plan(self.host, owned, by_uuid.keys(), fields, rows,
                              found.peers.up, ring, settings.partition_key,
                              my_instance_nodes)
        if found.shards:
            plan_application.release_to_shard_owners(plan, ring, self.host)
        return owned, plan

    def _placement_before(self, ctx, found, plan):
        return placement_before(self.placement, ctx, found, plan)

    def _report_placement(self, found, applied, before, settings):
        if self.placement is None:
            return
        self.placement_stats = report_placement(
            self.placement, self.host, found, applied, before, settings)

    def _keep_instances(self, ctx, found, owned, settings, stats):
        """Takeover, reaping and stray reports, on the cycle's view."""
        view = takeover.CycleView(
            now=found.peers.now, judge_peers=self.peers_judged,
            service_down_time=settings.service_down_time,
            grace=settings.takeover_grace,
            records={ownership.normalize_host(r.host): r
                     for r in found.peers.records},
            ring=found.ring, partition_key=settings.partition_key,
            rows=found.rows, owned=frozenset(owned.owned),
            unknown_instance=owned.unknown_instance)
        instance_stats = self.keeper.run(ctx, view)
        stats.taken_over = instance_stats.taken_over
        stats.reaping = instance_stats.reaping

    def _fields(self, node, waiting=frozenset()):
        cached = self._fields_cache.get(node.uuid)
        if cached is not None and cached[0] == node:
            fields = cached[1]
        else:
            fields = row_fields(node, ironic.node_resources(node))
            self._fields_cache[node.uuid] = (node, fields)
        if node.instance_uuid in waiting:
            fields = fields[:_AVAILABLE] + (True,) + fields[_AVAILABLE + 1:]
        return fields

    @staticmethod
    def _shard_ring_wanted(settings):
        # A service pinned to one shard ([ironic]shard) lists that shard.
        return settings.shard_ring and not settings.shard

    def _shard_ring_decision(self, settings, view):
        """Whether the partition uses the shard ring, as partition.view
        says (the CLI asks it too), remembered for the next cycle."""
        in_force = view.partition.shard_ring
        if in_force != self._shard_ring_in_force:
            LOG.info('The shard ring is %s in partition %s', 'in force'
                     if in_force else 'not in force: listing every node',
                     settings.partition_key or '(all)')
        self._shard_ring_in_force = in_force
        return in_force

    def _read_peers(self, ctx, settings, stats):
        """The PeerView of this cycle (None: it stops), with the shard ring
        decided (the InventoryReader's ``read_peers``)."""
        peers_view = self._load_peers(ctx, settings, stats)
        if peers_view is not None:
            self._shard_ring_decision(settings, peers_view)
        return peers_view

    def _load_peers(self, ctx, settings, stats):
        """The PeerView of this cycle, or None when the cycle must stop."""
        listing = db_services.load_services(ctx, count_nodes=False)
        # On the lease's clock: a suspend between here and the writes counts.
        loaded_at = lease.now()
        now, down_time = listing.now, settings.service_down_time
        admitted = self.gate.admit(ctx, listing, down_time, stats)
        if admitted is None:
            return None
        records, spared, up = admitted
        # Replicas 1: a cycle needs the owner only (the CLI shows standbys).
        seen = partition.view(
            listing.rows, now, partition_key=settings.partition_key,
            shard=settings.shard, service_down_time=down_time,
            partition_exponent=settings.partition_exponent,
            load_factor=settings.load_factor, peer_list=settings.peer_list,
            host=self.host, spared=spared,
            shard_ring_wanted=self._shard_ring_wanted(settings))
        stats.peers = len(seen.peers)
        self._check_agreement(listing.rows, seen.peers, settings)
        return inventory.PeerView(listing.rows, records, now, up, seen,
                                  loaded_at)

    def _check_agreement(self, rows, peers, settings):
        """Log one error per cycle and peer while they build different rings:
        rows would change owner at every cycle.

        Compared with every live service of this partition (same conductor
        group and shard), not only the ring's peers: a service that a
        different peer_list leaves out of this ring is the very case to
        report. ``self.db_now`` is this view's database time.
        """
        others = {row.host: row.ring_settings for row in rows
                  if row.host != self.host
                  and (row.host in peers
                       or self._same_partition_and_up(row, settings))}
        for host, what in agreement.disagreements(
                settings.ring_settings, others).items():
            LOG.error('Peer %s builds a different ring for partition %s: '
                      '%s; every service of a partition needs the same '
                      'settings', host, settings.partition_key or '(all)',
                      what)

    def _same_partition_and_up(self, row, settings):
        return ((row.partition_key or None) == settings.partition_key
                and (row.shard or None) == (settings.shard or None)
                and liveness.is_up(row.record(), self.db_now,
                                    settings.service_down_time))

    def _finish(self, ctx, settings, stats, started):
        stats.seconds = time.monotonic() - started
        # The partition goes with every cycle: peers see a SIGHUP change.
        db_services.record_cycle(ctx, self.service_id, stats.seconds,
                                 settings.partition_key, settings.shard,
                                 settings.ring_settings,
                                 self._shard_ring_wanted(settings))
        if stats.skipped is None:
            LOG.info('Cycle: peers=%(peers)d owned=%(owned)d '
                     'taken=%(taken)d released=%(released)d '
                     'created=%(created)d revived=%(revived)d '
                     'updated=%(updated)d deleted=%(deleted)d '
                     'lost_races=%(lost_races)d taken_over=%(taken_over)d '
                     'reaping=%(reaping)d fetched=%(fetched)d '
                     'listed in %(listing).2fs in %(seconds).2fs',
                     dataclasses.asdict(stats))
        return stats


def placement_before(placement, ctx, found, plan):
    """{uuid: provider.State}: what the last writer of each provider this
    cycle may see first set, as the rows recorded it before this cycle's
    writes (placement/sync.py, traits). Empty without Placement."""
    if placement is None:
        return {}
    known = placement.known
    before = {uuid: placement_sync.row_account(row.fields[_GROUP],
                                               row.fields[_TRAITS])
              for uuid, row in found.rows.items()
              if row.fields is not None and uuid not in known}
    taken = {uuid for uuids in plan.take.values() for uuid in uuids
             if uuid not in known}
    if taken:
        before.update(
            (uuid, placement_sync.row_account(group, traits))
            for uuid, (group, traits)
            in db_nodes.recorded_traits(ctx, taken).items())
    return before


def report_placement(placement, host, found, applied, before, settings):
    """The providers of the rows ``host`` holds now (only the owner of a
    row writes its provider); those of the rows deleted after Ironic's 404
    go once no allocation is left. Placement's troubles never stop a
    cycle. Like the rows, no provider is written once the cycle's view of
    its peers is older than service_down_time / 2 (a long first sync goes
    on at the next cycle). Returns the sync's stats (None after a bug)."""
    held = ({uuid for uuid, row in found.rows.items() if row.host == host}
            | applied.gained) - applied.lost
    nodes = {node.uuid: node for node in found.nodes if node.uuid in held}
    try:
        return placement.run(
            nodes, applied.deleted, before,
            fresh=lambda: (lease.now() - found.peers.loaded_at
                           < settings.service_down_time / 2))
    except Exception:  # noqa: BLE001 - a bug here must not stop the rows
        LOG.exception('Placement not updated this cycle')
        return None
