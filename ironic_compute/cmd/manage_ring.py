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

"""ironic-compute-manage ring show: the ring the live services build."""

import collections
import dataclasses
import re

from ironic_compute import exception
from ironic_compute.cluster import liveness
from ironic_compute.cmd import common
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.conf import ironic as ironic_conf
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import services as db_services
from ironic_compute.nodes import ownership
from ironic_compute.ring import shard_ring

CONF = common.CONF


@dataclasses.dataclass(frozen=True)
class RingView:
    partition_key: str | None
    peer_list: tuple
    peers: frozenset
    ring: object | None  # the peers' ring, None when there is no live peer
    node_ring: object | None  # who owns each node: bounded loads, if on
    node_uuids: tuple  # the nodes of the partition the database holds
    warnings: tuple
    down: dict  # host -> why it is down (None: up), every service
    shard_ring: bool = False  # the partition runs the shard ring


class ShardRingView:
    """The services' ShardNodeRing (``node_ring``), with what the CLI prints
    beside a node's owner: its standbys (its shard's), the buckets' shares
    and the nodes each host is given."""

    def __init__(self, assigned, node_ring):
        self.assigned = assigned
        self.node_ring = node_ring
        self.hosts = node_ring.hosts

    def get_hosts(self, key):
        owner = self.node_ring.get_hosts(key)
        shard_of = self.node_ring.shard_of
        if key not in shard_of or not owner:
            return owner
        shard = shard_of[key] or shard_ring.UNSHARDED
        return owner + [h for h in self.assigned.get_hosts(shard)
                        if h not in owner]

    def assign(self, keys):
        return {key: self.get_hosts(key) for key in keys}

    def shares(self):
        return self.node_ring.ring.shares()

    def loads(self):
        owners = collections.Counter(
            hosts[0] for hosts in self.node_ring.assign(
                list(self.node_ring.shard_of)).values() if hosts)
        return {host: owners.get(host, 0) for host in self.hosts}


def configured_peer_list(group):
    """[ironic]peer_list for the configured partition; None for another
    one: the peer_list its services recorded applies (partition.view)."""
    configured = (CONF.ironic.partition_key or '').strip().lower() or None
    if group == configured:
        return tuple(CONF.ironic.peer_list or ())
    return None


def partition_view(listing, group, replicas=1):
    """partition.view of conductor group ``group`` as this configuration's
    commands see it, from the services ``listing``."""
    # Imported here: the ring under it loads numpy, which the commands that
    # import this module only for its options do not need.
    from ironic_compute.nodes import partition
    return partition.view(
        listing.rows, listing.now, partition_key=group,
        shard=CONF.ironic.shard or None,
        service_down_time=CONF.service_down_time,
        partition_exponent=CONF.hash_ring.partition_exponent,
        load_factor=CONF.hash_ring.load_factor, replicas=replicas,
        peer_list=configured_peer_list(group))


def ring_view(ctx, partition_key, listing=None):
    """The peers and rings the live services of the partition build.

    Computed by partition.view, the resource tracker's function, from the
    point of view of a live member of the partition, over the nodes the
    database holds for the partition. ``listing``: the services, if read
    already.
    """
    if listing is None:
        listing = db_services.load_services(ctx)  # the database's clock
    group = (partition_key or '').lower() or None  # as the services store it
    # At least two ranks: the owner and who takes over if it dies.
    seen = partition_view(listing, group,
                          replicas=max(CONF.hash_ring.replicas, 2))
    ring, node_ring, uuids = None, None, ()
    if seen.peers:
        ring = seen.ring
        rows = admin.partition_nodes(ctx, group)
        uuids = tuple(uuid for uuid, _, _ in rows)
        if seen.shard_ring:
            node_ring = _shard_node_ring(ctx, seen, rows)
        else:
            nodes = [ownership.NodeInfo(uuid, conductor_group=g)
                     for uuid, g, _ in rows]
            node_ring = seen.node_ring(nodes, db_instances.load_all(ctx))
    down = {r.host: liveness.down_reason(r.record(), listing.now,
                                          CONF.service_down_time)
            for r in listing.rows}
    return RingView(partition_key, seen.peer_list, seen.peers, ring,
                    node_ring, uuids, seen.warnings, down,
                    seen.shard_ring and bool(seen.peers))


def _shard_node_ring(ctx, seen, rows):
    """The ring the services build under the shard ring, over the shard
    counts the database holds (every conductor group, as Ironic counts)."""
    counts = {shard or shard_ring.UNSHARDED: n
              for shard, n in admin.shard_counts(ctx).items()}
    assigned = seen.shard_assignment(counts)
    node_ring = seen.shard_node_ring(
        assigned, {uuid: shard for uuid, _, shard in rows})
    return ShardRingView(assigned, node_ring)


class PartitionViews:
    """The ring view of each partition a command meets, built once: a node
    is judged by the ring of the services that list it, not by the
    configured partition's."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.listing = db_services.load_services(ctx)
        self._records = [s.record() for s in self.listing.rows]
        self._partitions = {}  # conductor group -> partition_of's answer
        self._views = {}

    def partition_of(self, conductor_group):
        """The partition whose services list a node of ``conductor_group``:
        the group's own, when a service manages it (or nobody manages all
        nodes), else the services without a partition key (they list every
        node)."""
        group = (conductor_group or '').strip().lower() or None
        if group is None:
            return None
        if group not in self._partitions:  # asked once per node by list
            self._partitions[group] = self._partition_of(group)
        return self._partitions[group]

    def _partition_of(self, group):
        if any((r.partition_key or '').lower() == group
               for r in self._records):
            return group
        # A live service without a partition key lists every node.
        everything = partition_view(self.listing, None).host
        return None if everything is not None else group

    def of_node(self, conductor_group):
        """The RingView that judges a node of ``conductor_group``."""
        key = self.partition_of(conductor_group)
        if key not in self._views:
            self._views[key] = ring_view(self.ctx, key, self.listing)
        return self._views[key]


def host_state(view, host):
    if host is None:
        return 'no owner'
    if host not in view.down:
        return 'not a registered service'
    why = view.down[host]
    return 'up' if why is None else f'down: {why}'


def partition_key_option(value):
    """--partition-key, else [ironic]partition_key; None when unset."""
    key = CONF.ironic.partition_key if value is None else value
    key = (key or '').strip()  # stays as given: shown in the report
    if not re.match(ironic_conf.PARTITION_KEY_REGEX, key):
        raise exception.CommandError(
            f'invalid partition key {key!r}: letters, digits, "_", "." and '
            '"-" only')
    return key or None


_ratio = output.optional('{:.3f}')
_tenths = output.optional('{:.1f}')
_percent = output.optional('{:.2%}')


SUMMARY = output.columns(
    ('partition_key', 'Partition key'), ('peer_list', 'Peer list'), ('peers', 'Peers'),
    ('shard_ring', 'Shard ring in force'),
    ('buckets', 'Buckets'), ('replicas', 'Replicas (owner + standbys)'),
    ('load_factor', 'Load factor'), ('nodes', 'Nodes'),
    ('ring_imbalance', 'Ring imbalance (max/mean share)', _ratio),
    ('node_imbalance', 'Node imbalance (max/mean nodes)', _ratio), ('warnings', 'Warnings'))
HOSTS = output.columns(
    ('host', 'Host', lambda h: '(no owner)' if h is None else h), ('state', 'State'),
    ('in_ring', 'In ring'), ('ring_share', 'Ring share', _percent),
    ('expected_nodes', 'Expected nodes', _tenths), ('nodes', 'Nodes'),
    ('standby_for', 'First standby for'))


def _max_over_mean(values):
    values = list(values)
    if not values or not sum(values):
        return None
    return round(max(values) * len(values) / sum(values), 4)


def describe(view, counts, standby_counts=None):
    """The ``ring show`` report of ``view`` and the rows per host."""
    shares = view.node_ring.shares() if view.node_ring is not None else {}
    standby_counts = standby_counts or {}
    total = sum(counts.values())
    if hasattr(view.node_ring, 'loads'):
        # Bounded loads: exactly what each host is given.
        expected = {h: float(n) for h, n in view.node_ring.loads().items()}
    else:
        expected = {h: round(share * total, 1) for h, share in shares.items()}
    hosts = sorted(view.peers | counts.keys(),
                   key=lambda h: (h is None, h or ''))
    rows = [{
        'host': host,
        'state': host_state(view, host),
        'in_ring': host in view.peers,
        'ring_share': shares.get(host),
        'expected_nodes': expected.get(host),
        'nodes': counts.get(host, 0),
        'standby_for': standby_counts.get(host, 0),
    } for host in hosts]
    return {
        'partition_key': view.partition_key,
        'peer_list': list(view.peer_list),
        'peers': sorted(view.peers),
        'shard_ring': view.shard_ring,
        'buckets': 2 ** CONF.hash_ring.partition_exponent,
        'replicas': view.ring.replicas if view.ring is not None else None,
        'load_factor': CONF.hash_ring.load_factor,
        'nodes': total,
        'ring_imbalance': _max_over_mean(shares.values()),
        'node_imbalance': _max_over_mean(
            counts.get(h, 0) for h in view.peers),
        'warnings': list(view.warnings),
        'hosts': rows,
    }


def standby_counts(view):
    """{host: how many nodes it takes first if their owner dies}."""
    if view.node_ring is None:
        return {}
    counts = {}
    for hosts in view.node_ring.assign(list(view.node_uuids)).values():
        if len(hosts) > 1:
            counts[hosts[1]] = counts.get(hosts[1], 0) + 1
    return counts


class RingCommands:
    """The consistent hash ring over the live services."""

    @args('--partition-key', metavar='K',
          help='conductor group to show (default: [ironic]partition_key); '
               'the peers are restricted by [ironic]peer_list for the '
               'configured partition, by the peer_list its services '
               'recorded for another')
    @format_option
    def show(self, partition_key=None, format='table'):
        """Show the ring's peers, buckets, and the nodes per host."""
        key = partition_key_option(partition_key)
        ctx = db_api.Context()
        view = ring_view(ctx, key)
        counts = admin.node_counts(ctx, key)
        report = describe(view, counts, standby_counts(view))
        output.show_report(report, format, SUMMARY, (report['hosts'], HOSTS))
