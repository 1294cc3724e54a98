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

"""Which Ironic nodes this ironic-compute service manages: pure rules, no I/O.

Host names compare case-insensitively and are returned normalised (see
:func:`normalize_host`).  Naive datetimes are UTC.  The ring is duck-typed like
``hash_ring.HashRing``: ``get_hosts(key)`` (primary first), bulk ``assign(keys)``
and ``hosts``, all with normalised host names.
"""

import collections
import dataclasses
import enum
import logging
import math
from collections.abc import Iterable
from collections.abc import Mapping
from datetime import datetime

from ironic_compute import exception
from ironic_compute.cluster import hosts
from ironic_compute.cluster import liveness
from ironic_compute.ring import shard_ring

# The rings (ring/hash_ring.py, ring/assignment.py) are imported by the
# functions that build them: they load numpy, a tenth of a second that the
# CLI commands reading ServiceRecord, InstanceInfo or normalize_host (every
# instance command) would pay for nothing.

LOG = logging.getLogger(__name__)


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
    shard_ring: bool = False  # it runs [ironic]shard_ring


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


normalize_host = hosts.normalize


@dataclasses.dataclass(frozen=True)
class Recovery:
    """This service is back after it lost the database or was paused.

    Its peers' heartbeats could not be seen meanwhile, so a stale heartbeat
    is not held against a peer that was up before the outage until that
    peer has heartbeated again or ``service_down_time`` has passed since
    ``since``. Times are the database's.
    """

    since: datetime  # the first view after the outage
    heartbeats: Mapping[str, datetime | None]  # host -> last_seen_up then

    def spared(self, services: Iterable[ServiceRecord], now: datetime,
               service_down_time: float) -> frozenset[str]:
        """Hosts whose heartbeat age must not make them down at ``now``."""
        if self.over(now, service_down_time):
            return frozenset()
        return frozenset(
            host for s in services
            if (host := normalize_host(s.host)) in self.heartbeats
            and s.last_seen_up == self.heartbeats[host])

    def over(self, now: datetime, service_down_time: float) -> bool:
        return liveness.age(self.since, now) >= service_down_time


def peers_caught_up(cycle_starts: Mapping[str, datetime | None],
                    peers: Iterable[str], this_host: str,
                    since: datetime) -> bool:
    """Whether every peer but this host started a cycle after ``since``.

    A service that rejoins after its lease lapsed waits for this before it
    takes rows: until then a peer may still act on a view where it is dead.
    ``cycle_starts`` maps normalised hosts to their last cycle's start.
    """
    me = normalize_host(this_host)
    for peer in peers:
        if normalize_host(peer) == me:
            continue
        started = cycle_starts.get(normalize_host(peer))
        # Started no later than ``since``: it may not have seen us yet.
        if started is None or liveness.age(since, started) <= 0:
            return False
    return True


ANY_PARTITION = object()


def live_peers(services: Iterable[ServiceRecord], this_host: str, now: datetime,
               service_down_time: float, partition_key=ANY_PARTITION,
               shard: str | None = None,
               spared: frozenset[str] = frozenset()) -> frozenset[str]:
    """Normalised hosts of the up services with compute nodes, plus this host.

    This host always counts: a brand-new service has no compute_nodes rows yet.
    Given a ``partition_key``, only services that manage the same partition
    (conductor group and ``shard``) count: handing a node to a service that
    does not list it would make it swing back and forth. A host in
    ``spared`` (see :meth:`Recovery.spared`) counts as up whatever the age
    of its heartbeat.
    """
    peers = {normalize_host(s.host) for s in services
             if s.has_compute_nodes
             and (liveness.is_up(s, now, service_down_time)
                  # Spared: up whatever its heartbeat's age, but not when
                  # an operator set it aside or it left.
                  or (normalize_host(s.host) in spared
                      and liveness.is_up(s, now, math.inf)))
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
    wanted = hosts.parse_list(peer_list)  # a list or a raw option value
    warnings = []
    if partition_key and partition_key.strip():
        if wanted:
            if me not in wanted:
                raise exception.PeerListError(
                    f'peer_list {sorted(wanted)} does not contain this host {me!r}; '
                    'every service of a partition must list itself')
            peers &= wanted
    elif wanted:
        msg = f'peer_list {sorted(wanted)} is ignored because partition_key is not set'
        LOG.warning(msg)
        warnings.append(msg)
    peers.add(me)
    return RingPeers(frozenset(peers), tuple(warnings))


def is_set_aside(services: Iterable[ServiceRecord], host: str) -> bool:
    """Whether ``host`` runs but is disabled or forced down.

    Its peers leave it out of their ring, so it must too, or rows would
    swap owners at every cycle; it keeps only the nodes of its instances.
    """
    me = normalize_host(host)
    return any(normalize_host(s.host) == me and (s.disabled or s.forced_down)
               for s in services)


def partition_peers(services: Iterable[ServiceRecord], this_host: str,
                    now: datetime, service_down_time: float,
                    partition_key: str | None, shard: str | None,
                    peer_list: Iterable[str] | None,
                    spared: frozenset[str] = frozenset()) -> RingPeers:
    """The hosts of the ring of a partition, as ``this_host`` builds it.

    The one function for "who are the peers": the resource tracker calls it
    for itself, the CLI for a live member of the partition
    (:func:`partition_anchor`). Rule 1 (live, with rows, same partition,
    plus this host), rule 2 (peer_list under a partition key), and a host
    that is set aside (:func:`is_set_aside`) leaves itself out.
    """
    services = list(services)
    live = live_peers(services, this_host, now, service_down_time,
                      partition_key, shard, spared=spared)
    chosen = ring_peers(live, this_host, partition_key, peer_list)
    if is_set_aside(services, this_host):
        return RingPeers(chosen.peers - {normalize_host(this_host)},
                         chosen.warnings)
    return chosen


def build_ring(peers: Iterable[str], partition_exponent: int, replicas: int = 1):
    """The consistent hash ring over ``peers`` (cached), or NO_RING."""
    from ironic_compute.ring import hash_ring
    peers = frozenset(peers)
    if not peers:
        return NO_RING
    return hash_ring.get_ring(peers, partition_exponent, replicas)


def partition_anchor(services: Iterable[ServiceRecord], now: datetime,
                     service_down_time: float, partition_key: str | None,
                     shard: str | None, peer_list: Iterable[str] | None
                     ) -> str | None:
    """A live member of the partition to see its ring from (the first by
    name), or None when no live service manages it."""
    wanted = hosts.parse_list(peer_list)
    members = sorted(
        normalize_host(s.host) for s in services
        if s.has_compute_nodes and liveness.is_up(s, now, service_down_time)
        and (s.partition_key or None) == (partition_key or None)
        and (s.shard or None) == (shard or None)
        and not (partition_key and wanted
                 and normalize_host(s.host) not in wanted))
    return members[0] if members else None


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
    host, (None, UNKNOWN_INSTANCE) when nobody manages its instance, (None, RING) when
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


# What explain() says of a node whose instance nobody manages, when this
# database knows why: the instance was deleted here while its host was down
# (the ring's host tears the node down: takeover.InstanceKeeper reaps it),
# or its record was removed ("instance remove": the node is left as it is).
REAPING = 'deleted instance'
REMOVED = 'removed instance'
NO_RING_COVERS_IT = 'no ring covers it'


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Who manages a node and why, as :func:`explain` says."""

    host: str | None  # who manages the node (None: no ring covers it)
    reason: Reason  # as node_manager returns it
    instance: str | None  # the instance on the node, if any
    label: str  # the reason as the CLI prints it
    why: str  # one sentence


def explain(node: NodeInfo, ring, instances_by_uuid: Mapping[str, InstanceInfo],
            instances_by_node: Mapping[str, InstanceInfo],
            this_host: str | None = None, deleted: Iterable[str] = (),
            removed: Iterable[str] = ()) -> Explanation:
    """Who manages ``node`` and why: the ownership rule, walked once.

    Without ``this_host`` the reason is from the manager's own point of
    view (OWN_INSTANCE or RING); with it, a manager other than
    ``this_host`` is reported as FOREIGN_INSTANCE or OTHER_HOST. A node
    whose instance nobody manages: the ring's host holds its row
    (UNKNOWN_INSTANCE). ``deleted``, ``removed``: the instances this
    database deleted while their host was down, or forgot ("instance
    remove"), which say more about an unknown instance.
    """
    host, reason = _instance_decision(node, instances_by_uuid,
                                      instances_by_node)
    pinned = instances_by_node.get(node.uuid)
    instance = node.instance_uuid or (pinned.uuid if pinned else None)
    if reason is not Reason.OWN_INSTANCE:
        # The ring places free nodes, and holds the rows of nodes whose
        # instance nobody manages (it never touches them in Ironic).
        hosts = ring.get_hosts(node.uuid)
        host = hosts[0] if hosts else None
    me = normalize_host(this_host) if this_host is not None else None
    if not (me is None or host == me or host is None
            or reason is Reason.UNKNOWN_INSTANCE):
        reason = (Reason.FOREIGN_INSTANCE if reason is Reason.OWN_INSTANCE
                  else Reason.OTHER_HOST)
    label, why = _why(host, reason, instance, set(deleted), set(removed))
    return Explanation(host, reason, instance, str(label), why)


def _why(host, reason, instance, deleted, removed):
    """(label, sentence) of an explanation."""
    if reason is Reason.OWN_INSTANCE:
        return reason, f'{host} manages instance {instance} on this node'
    if reason is Reason.FOREIGN_INSTANCE:
        return reason, (f'instance {instance} is managed by {host}: the node '
                        'moves there at the next cycle')
    if reason is Reason.UNKNOWN_INSTANCE and instance in deleted:
        return REAPING, (f'instance {instance} was deleted while its host '
                         f'was down: {host}, which the ring gives the node, '
                         'tears it down (reaping) and frees it for the next '
                         'build')
    if reason is Reason.UNKNOWN_INSTANCE and instance in removed:
        return REMOVED, (f'the record of instance {instance} was removed '
                         '("instance remove"): the node and its allocation '
                         'are left as they are, never torn down; the ring '
                         'places its row')
    if reason is Reason.UNKNOWN_INSTANCE:
        return reason, (f'no service manages instance {instance}: the node '
                        'is never touched in Ironic; the ring places its row')
    if host is None:
        return Reason.OTHER_HOST, NO_RING_COVERS_IT
    if reason is Reason.RING:
        return reason, 'no instance; the ring maps the node to its owner'
    return reason, (f'no instance; the ring maps the node to {host}: it '
                    'moves there at the next cycle')


def node_manager(node: NodeInfo, ring, instances_by_uuid: Mapping[str, InstanceInfo],
                 instances_by_node: Mapping[str, InstanceInfo],
                 this_host: str | None = None) -> tuple[str | None, Reason]:
    """(host, reason) of :func:`explain`."""
    said = explain(node, ring, instances_by_uuid, instances_by_node, this_host)
    return said.host, said.reason


def node_ring(ring, nodes: Iterable[NodeInfo], instances: Iterable[InstanceInfo],
              load_factor: float | None):
    """The ring that decides who manages the free nodes, with bounded loads.

    Every caller that asks who owns a node (the resource tracker, the CLI)
    goes through this, with every node of the partition and every known
    instance, so all compute the same answer.  The nodes without instance
    are assigned by consistent hashing with bounded loads; the nodes an
    instance pins to a ring host count toward that host's load: the load is
    what a service manages (its failure domain), and a build on a node its
    host already owns changes no other node's owner.  Pinned nodes of hosts
    outside the ring count for nobody.  ``load_factor`` None or <= 1, or a
    ring without host, gives ``ring`` itself (plain hashing).
    """
    if load_factor is not None and not math.isfinite(load_factor):
        LOG.warning('[hash_ring]load_factor %s is not a finite number; nodes '
                    'are assigned by plain hashing', load_factor)
        return ring
    from ironic_compute.ring import assignment
    if not assignment.loads_bounded(load_factor) or not ring.hosts:
        return ring
    by_uuid, by_node = index_instances(instances)
    pinned: collections.Counter = collections.Counter()
    free = []
    for node in nodes:
        if not node.instance_uuid and node.uuid not in by_node:
            free.append(node.uuid)  # the common case, without a call
            continue
        host, _ = _instance_decision(node, by_uuid, by_node)
        if host is None:
            # The ring decides: a free node, or who holds the row of a node
            # whose instance nobody manages (as owned_nodes does).
            free.append(node.uuid)
        else:
            pinned[host] += 1
    return assignment.bounded(ring, free, load_factor, preload=pinned)


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
            # Nobody manages the instance, but the row still needs a live
            # holder (never stranded on a service that is gone): the ring's.
            # Holding the row never touches the node in Ironic.
            free.append(node.uuid)
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
                owned[uuid] = (Reason.UNKNOWN_INSTANCE if uuid in unknown
                               else Reason.RING)
            elif primary is not None:
                others[uuid] = primary
    return Ownership(owned, foreign, unknown, others)


def shard_ring_in_force(services: Iterable[ServiceRecord], this_host: str,
                        peers: Iterable[str], wanted: bool) -> bool:
    """Whether the partition of ``this_host`` runs the shard ring: it wants
    it (``[ironic]shard_ring`` without ``[ironic]shard``) and every peer
    recorded that it runs it (:func:`shard_ring.in_force`). The resource
    tracker's decision, and the CLI's seen from a member of the partition.
    """
    running = {s.host for s in services if s.shard_ring}
    return wanted and shard_ring.in_force(
        frozenset(peers) or {normalize_host(this_host)}, this_host, True,
        running)
