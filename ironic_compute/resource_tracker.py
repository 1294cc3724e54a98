"""One resource-tracker cycle: peers -> ring -> nodes -> ownership -> rows.

No threads and no signals here; ``service.py`` decides when to run a cycle.
Nothing is deleted on a failed or partial listing: when Ironic cannot give
the whole inventory the cycle changes no row at all.
"""

import contextlib
import dataclasses
import gc
import json
import time

from oslo_log import log as logging

from ironic_compute import hash_ring
from ironic_compute import ironic
from ironic_compute import ownership
from ironic_compute import sync_plan
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.db import services as db_services
from ironic_compute.db.models import _utcnow

LOG = logging.getLogger(__name__)

# Above this many rows to confirm, one listing of all nodes is cheaper than
# asking Ironic about each node (e.g. after the partition key changed).
_BULK_EXISTS_THRESHOLD = 20


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a cycle reads from the configuration (mutable ones via SIGHUP)."""

    partition_key: str | None = None
    peer_list: tuple = ()
    shard: str | None = None
    service_down_time: int = 60
    partition_exponent: int = 16
    replicas: int = 1

    @classmethod
    def from_conf(cls, conf):
        # Ironic compares conductor groups without regard to case.
        key = (conf.ironic.partition_key or '').strip().lower() or None
        return cls(partition_key=key,
                   peer_list=tuple(conf.ironic.peer_list or ()),
                   shard=conf.ironic.shard or None,
                   service_down_time=conf.service_down_time,
                   partition_exponent=conf.hash_ring.partition_exponent,
                   replicas=conf.hash_ring.replicas)


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
    seconds: float = 0.0
    skipped: str | None = None


def row_fields(node, resources):
    """The synced fields of a node's row, in SYNCED_FIELDS order."""
    stats = json.dumps({'capabilities': resources.capabilities,
                        'name': node.name}, sort_keys=True)
    return (node.uuid, node.conductor_group or '', resources.vcpus,
            resources.memory_mb, resources.local_gb, resources.vcpus_used,
            resources.memory_mb_used, resources.local_gb_used,
            resources.cpu_arch, resources.resource_class, stats)


@contextlib.contextmanager
def _gc_paused():
    # A cycle allocates ~10 objects per node and frees them all at its end;
    # collections in between find nothing and cost a fifth of the cycle.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class ResourceTracker:
    def __init__(self, host, service_id, ironic_client):
        self.host = ownership.normalize_host(host)
        self.service_id = service_id
        self.ironic = ironic_client
        # uuid -> (node, fields): a node's row values are recomputed only
        # when Ironic reports the node changed.
        self._fields_cache = {}

    def run_cycle(self, settings):
        """Run one cycle; return its CycleStats. DB errors propagate."""
        with _gc_paused():
            return self._run_cycle(settings)

    def _set_aside(self, records):
        return any(r.host == self.host and (r.disabled or r.forced_down)
                   for r in records)

    def _fields(self, node):
        cached = self._fields_cache.get(node.uuid)
        if cached is not None and cached[0] == node:
            return cached[1]
        fields = row_fields(node, ironic.node_resources(node))
        self._fields_cache[node.uuid] = (node, fields)
        return fields

    def _run_cycle(self, settings):
        started = time.monotonic()
        stats = CycleStats()
        ctx = db_api.Context()
        services = db_services.list_services(ctx, count_nodes=False)
        records = [s.record() for s in services]
        now = _utcnow()
        # Up anywhere: whose rows are orphans, whose rows to leave alone.
        up = ownership.live_peers(records, self.host, now,
                                  settings.service_down_time)
        live = ownership.live_peers(records, self.host, now,
                                    settings.service_down_time,
                                    settings.partition_key, settings.shard)
        peers = ownership.ring_peers(live, self.host, settings.partition_key,
                                     settings.peer_list).peers
        if self._set_aside(records):
            # Disabled or forced down while running: the peers leave us out
            # of their ring, so we must too, or rows would swap owners at
            # every cycle. We keep only the nodes of our own instances.
            peers -= {self.host}
        stats.peers = len(peers)
        ring = (hash_ring.get_ring(peers, settings.partition_exponent,
                                   settings.replicas) if peers else ownership.NO_RING)
        try:
            nodes = self.ironic.list_nodes(
                conductor_group=settings.partition_key,
                shards=[settings.shard] if settings.shard else None)
        except ironic.IronicConfigError as exc:
            stats.skipped = f'configuration error: {exc}'
        except ironic.IronicUnavailable as exc:
            stats.skipped = f'Ironic unavailable: {exc}'
        if stats.skipped:
            # Logged outside the except block: one line, no traceback.
            LOG.error('Cycle skipped, no compute node changed: the Ironic '
                      'inventory is unknown (%s)', stats.skipped)
            return self._finish(ctx, settings, stats, started)

        # One read transaction (one round trip to the pool); the rows may
        # still change after it: every write below is conditional.
        with db_api.context_manager.reader.using(ctx):
            instances = db_instances.load_all(ctx)
            rows = db_nodes.load_rows(ctx, self.host)
        owned = ownership.owned_nodes(self.host, ring, nodes, instances)
        stats.owned = len(owned.owned)
        for uuid, instance in owned.unknown_instance.items():
            LOG.warning('Node %s has instance %s, which no service manages; '
                        'leaving its compute node as it is', uuid, instance)
        by_uuid = {node.uuid: node for node in nodes}
        held = {uuid for uuid, row in rows.items() if row.host == self.host}
        fields = {uuid: self._fields(by_uuid[uuid])
                  for uuid in (owned.owned.keys() | held) if uuid in by_uuid}
        for uuid in self._fields_cache.keys() - by_uuid.keys():
            del self._fields_cache[uuid]
        my_instance_nodes = {i.node for i in instances
                             if i.node and ownership.normalize_host(i.host)
                             == self.host}
        plan = sync_plan.plan(self.host, owned, by_uuid.keys(), fields, rows,
                              up, ring, settings.partition_key,
                              my_instance_nodes)
        self._apply(ctx, plan, services, stats)
        return self._finish(ctx, settings, stats, started)

    def _apply(self, ctx, plan, services, stats):
        me = self.host
        for owner, uuids in plan.take.items():
            moved = db_nodes.move(ctx, uuids, owner, me, self.service_id)
            stats.taken += len(moved)
            stats.lost_races += len(uuids) - len(moved)
            for uuid in uuids:
                LOG.debug('Node %s: %s from %s', uuid,
                          'taken' if uuid in moved else 'lost the race for',
                          owner)
        if plan.create:
            created, revived = db_nodes.create_or_revive(
                ctx, plan.create, me, self.service_id)
            stats.created, stats.revived = len(created), len(revived)
            stats.lost_races += len(plan.create) - len(created) - len(revived)
            for uuid in revived:
                LOG.debug('Node %s: its deleted row is back', uuid)
        if plan.update:
            db_nodes.update_fields(ctx, me, plan.update)
            stats.updated = len(plan.update)
        service_ids = {s.host: s.id for s in services}
        for new_owner, uuids in plan.release.items():
            moved = db_nodes.move(ctx, uuids, me, new_owner,
                                  service_ids.get(new_owner))
            stats.released += len(moved)
            LOG.debug('Nodes %s released to %s', sorted(moved), new_owner)
        self._delete_gone(ctx, plan.check_gone, stats)

    def _delete_gone(self, ctx, check_gone, stats):
        """Soft-delete rows only for nodes Ironic says are gone (404)."""
        if not check_gone:
            return
        try:
            if len(check_gone) > _BULK_EXISTS_THRESHOLD:
                existing = {n.uuid for n in self.ironic.list_nodes()}
                exists = existing.__contains__
            else:
                exists = self.ironic.node_exists
            verdicts = {uuid: exists(uuid) for uuid in check_gone}
        except ironic.IronicUnavailable as exc:
            LOG.warning('Could not confirm that %d unlisted nodes are gone '
                        '(%s); their rows stay', len(check_gone), exc)
            return
        for uuid, owner in check_gone.items():
            if not verdicts[uuid]:
                if db_nodes.soft_delete(ctx, uuid, owner):
                    stats.deleted += 1
                    LOG.debug('Node %s is gone from Ironic; row deleted', uuid)
            elif owner == self.host:
                # Still in Ironic but no longer listed for us: it moved to
                # another conductor group or shard, whose services take it.
                if db_nodes.move(ctx, [uuid], self.host, None, None):
                    stats.released += 1
                    LOG.debug('Node %s left our partition; released', uuid)

    def _finish(self, ctx, settings, stats, started):
        stats.seconds = time.monotonic() - started
        # The partition goes with every cycle: peers see a SIGHUP change.
        db_services.record_cycle(ctx, self.service_id, stats.seconds,
                                 settings.partition_key, settings.shard)
        if stats.skipped is None:
            LOG.info('Cycle: peers=%(peers)d owned=%(owned)d '
                     'taken=%(taken)d released=%(released)d '
                     'created=%(created)d revived=%(revived)d '
                     'updated=%(updated)d deleted=%(deleted)d '
                     'lost_races=%(lost_races)d in %(seconds).2fs',
                     dataclasses.asdict(stats))
        return stats
