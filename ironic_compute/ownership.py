"""Which Ironic nodes this ironic-compute service manages: pure rules, no I/O.

Host names compare case-insensitively and are returned normalised (see
:func:`normalize_host`).  Naive datetimes are UTC.  The ring is duck-typed like
``hash_ring.HashRing``: ``get_hosts(key)`` (primary first), bulk ``assign(keys)``
and ``hosts``, all with normalised host names.
"""

import dataclasses
import enum
import logging
from collections.abc import Iterable
from collections.abc import Mapping
from datetime import UTC
from datetime import datetime

LOG = logging.getLogger(__name__)


class PeerListError(ValueError):
    """The configured peer_list does not name this host."""


@dataclasses.dataclass(frozen=True)
class ServiceRecord:
    """One ironic-compute service as the DB knows it (caller filters binary)."""

    host: str
    disabled: bool = False
    forced_down: bool = False
    stopped: bool = False  # the service left cleanly (SIGTERM)
    last_seen_up: datetime | None = None  # naive means UTC
    has_compute_nodes: bool = True
    partition_key: str | None = None  # the conductor group it manages
    shard: str | None = None  # the Ironic shard it manages


@dataclasses.dataclass(frozen=True)
class RingPeers:
    peers: frozenset[str]
    warnings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    uuid: str
    instance_uuid: str | None = None
    conductor_group: str | None = None


@dataclasses.dataclass(frozen=True)
class InstanceInfo:
    uuid: str
    host: str
    node: str | None = None  # uuid of the Ironic node the instance is on


class Reason(enum.StrEnum):
    OWN_INSTANCE = 'own instance'
    RING = 'ring'
    FOREIGN_INSTANCE = 'foreign instance'
    UNKNOWN_INSTANCE = 'unknown instance'  # instance_uuid not in the known instances
    OTHER_HOST = 'ring: other host'


@dataclasses.dataclass(frozen=True)
class Ownership:
    owned: dict[str, Reason]  # node uuid -> OWN_INSTANCE or RING
    foreign: dict[str, str]  # node uuid -> host managing its instance
    unknown_instance: dict[str, str]  # node uuid -> the unknown instance uuid
    others: dict[str, str]  # node uuid -> ring primary host (not us), no instance


class _NoRing:
    """A ring that maps no key: no service may own nodes (no live peer)."""

    hosts: frozenset[str] = frozenset()

    def get_hosts(self, key) -> list[str]:
        return []

    def assign(self, keys) -> dict:
        return {key: [] for key in keys}


NO_RING = _NoRing()


def normalize_host(host: str) -> str:
    return host.strip().lower()


def _utc(dt: datetime) -> datetime:
    # Naive values come from the DB in UTC; aware ones may be in any zone.
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def down_reason(record: ServiceRecord, now: datetime,
                service_down_time: float) -> str | None:
    """Why the service is not a live peer, or None when it is up."""
    if record.disabled:
        return 'disabled'
    if record.forced_down:
        return 'forced down'
    if record.stopped:
        return 'stopped'
    if record.last_seen_up is None:
        return 'never reported'
    elapsed = (_utc(now) - _utc(record.last_seen_up)).total_seconds()
    # Exactly service_down_time old still counts as up.
    if elapsed > service_down_time:
        return f'no heartbeat for {elapsed:.0f} s'
    return None


def is_up(record: ServiceRecord, now: datetime, service_down_time: float) -> bool:
    return down_reason(record, now, service_down_time) is None


ANY_PARTITION = object()


def live_peers(services: Iterable[ServiceRecord], this_host: str, now: datetime,
               service_down_time: float, partition_key=ANY_PARTITION,
               shard: str | None = None) -> frozenset[str]:
    """Normalised hosts of the up services with compute nodes, plus this host.

    This host always counts: a brand-new service has no compute_nodes rows yet.
    Given a ``partition_key``, only services that manage the same partition
    (conductor group and ``shard``) count: handing a node to a service that
    does not list it would make it swing back and forth.
    """
    peers = {normalize_host(s.host) for s in services
             if s.has_compute_nodes and is_up(s, now, service_down_time)
             and (partition_key is ANY_PARTITION
                  or ((s.partition_key or None) == (partition_key or None)
                      and (s.shard or None) == (shard or None)))}
    peers.add(normalize_host(this_host))
    return frozenset(peers)


def ring_peers(live: Iterable[str], this_host: str, partition_key: str | None,
               peer_list: Iterable[str] | None) -> RingPeers:
    """Hosts to build the ring over, restricted by peer_list under a partition key."""
    me = normalize_host(this_host)
    peers = {normalize_host(h) for h in live}
    if isinstance(peer_list, str):  # a raw option value, not a list
        peer_list = peer_list.split(',')
    wanted = {normalize_host(h) for h in peer_list or ()} - {''}
    warnings = []
    if partition_key and partition_key.strip():
        if wanted:
            if me not in wanted:
                raise PeerListError(
                    f'peer_list {sorted(wanted)} does not contain this host {me!r}; '
                    'every service of a partition must list itself')
            peers &= wanted
    elif wanted:
        msg = f'peer_list {sorted(wanted)} is ignored because partition_key is not set'
        LOG.warning(msg)
        warnings.append(msg)
    peers.add(me)
    return RingPeers(frozenset(peers), tuple(warnings))


def index_instances(instances: Iterable[InstanceInfo]
                    ) -> tuple[dict[str, InstanceInfo], dict[str, InstanceInfo]]:
    """Build (instances_by_uuid, instances_by_node) for :func:`node_manager`."""
    by_uuid: dict[str, InstanceInfo] = {}
    by_node: dict[str, InstanceInfo] = {}
    for inst in instances:
        by_uuid[inst.uuid] = inst
        if inst.node:
            prev = by_node.get(inst.node)
            # Two instances on one node is a DB anomaly; every host must pick
            # the same one whatever the input order, hence the uuid tie-break.
            if prev is None or inst.uuid < prev.uuid:
                by_node[inst.node] = inst
    return by_uuid, by_node


def _instance_decision(node: NodeInfo, by_uuid: Mapping[str, InstanceInfo],
                       by_node: Mapping[str, InstanceInfo]) -> tuple[str | None, Reason]:
    """The per-node rule: (host, OWN_INSTANCE) when an instance pins the node to
    host, (None, UNKNOWN_INSTANCE) when nobody may claim it, (None, RING) when
    the ring decides."""
    if node.instance_uuid:
        # The listed instance is authoritative when set.
        inst = by_uuid.get(node.instance_uuid)
    else:
        # Ironic's listing can lag behind the DB: an instance already placed
        # on the node pins it even though the node shows no instance yet.
        inst = by_node.get(node.uuid)
        if inst is None:
            return None, Reason.RING
    host = normalize_host(inst.host or '') if inst is not None else ''
    if not host:
        # Nobody may claim a node whose instance has no known manager.
        return None, Reason.UNKNOWN_INSTANCE
    return host, Reason.OWN_INSTANCE


def node_manager(node: NodeInfo, ring, instances_by_uuid: Mapping[str, InstanceInfo],
                 instances_by_node: Mapping[str, InstanceInfo],
                 this_host: str | None = None) -> tuple[str | None, Reason]:
    """Which host manages ``node`` and why.

    Without ``this_host`` the reason is from the manager's own point of view
    (OWN_INSTANCE or RING); with it, a manager other than ``this_host`` is
    reported as FOREIGN_INSTANCE or OTHER_HOST.  Unknown instance: (None, ...).
    """
    host, reason = _instance_decision(node, instances_by_uuid, instances_by_node)
    if reason is Reason.RING:
        hosts = ring.get_hosts(node.uuid)
        host = hosts[0] if hosts else None
    me = normalize_host(this_host) if this_host is not None else None
    if me is None or host == me or host is None:
        return host, reason
    return host, Reason.FOREIGN_INSTANCE if reason is Reason.OWN_INSTANCE else Reason.OTHER_HOST


def owned_nodes(this_host: str, ring, nodes: Iterable[NodeInfo],
                instances: Iterable[InstanceInfo]) -> Ownership:
    """Split ``nodes`` by manager; ``instances`` are all known ones, any host."""
    me = normalize_host(this_host)
    if me not in getattr(ring, 'hosts', (me,)):
        LOG.warning('host %s is not in the hash ring; it will only manage nodes '
                    'of its own instances', me)
    by_uuid, by_node = index_instances(instances)
    owned: dict[str, Reason] = {}
    foreign: dict[str, str] = {}
    unknown: dict[str, str] = {}
    free: list[str] = []
    for node in nodes:
        host, reason = _instance_decision(node, by_uuid, by_node)
        if reason is Reason.RING:
            free.append(node.uuid)
        elif reason is Reason.UNKNOWN_INSTANCE:
            unknown[node.uuid] = node.instance_uuid or by_node[node.uuid].uuid
        elif host == me:
            owned[node.uuid] = Reason.OWN_INSTANCE
        else:
            foreign[node.uuid] = host
    others: dict[str, str] = {}
    if free:
        # One bulk call: per-key lookups dominate a 10^5-node cycle otherwise.
        for uuid, hosts in ring.assign(free).items():
            primary = hosts[0] if hosts else None
            if primary == me:
                owned[uuid] = Reason.RING
            elif primary is not None:
                others[uuid] = primary
    return Ownership(owned, foreign, unknown, others)
