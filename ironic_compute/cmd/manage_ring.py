"""ironic-compute-manage ring show: the ring the live services build."""

import dataclasses
import re

from ironic_compute import ownership
from ironic_compute.cmd import common
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.conf import ironic as ironic_conf
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.db import services as db_services

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


def ring_view(ctx, partition_key):
    """The peers and rings the live services of the partition build.

    Computed by the functions the services run (ownership.partition_peers
    and node_ring), from the point of view of a live member of the
    partition, over the nodes the database holds for the partition.
    """
    listing = db_services.load_services(ctx)  # the database's clock
    records = [s.record() for s in listing.rows]
    group = (partition_key or '').lower() or None  # as the services store it
    down_time = CONF.service_down_time
    shard = CONF.ironic.shard or None
    peer_list = tuple(CONF.ironic.peer_list or ())
    anchor = ownership.partition_anchor(records, listing.now, down_time, group,
                                        shard, peer_list)
    peers, warnings, ring, node_ring, uuids = frozenset(), (), None, None, ()
    if anchor is None:
        warnings = (_nobody_manages(records, listing.now, down_time, group),)
    else:
        chosen = ownership.partition_peers(records, anchor, listing.now,
                                           down_time, group, shard, peer_list)
        peers, warnings = chosen.peers, chosen.warnings
    if peers:
        # At least two ranks: the owner and who takes over if it dies.
        ring = ownership.build_ring(peers, CONF.hash_ring.partition_exponent,
                                    max(CONF.hash_ring.replicas, 2))
        nodes = [ownership.NodeInfo(uuid, conductor_group=g)
                 for uuid, g in admin.partition_nodes(ctx, group)]
        uuids = tuple(node.uuid for node in nodes)
        node_ring = ownership.node_ring(ring, nodes,
                                        db_instances.load_all(ctx),
                                        CONF.hash_ring.load_factor)
    down = {r.host: ownership.down_reason(r, listing.now, down_time)
            for r in records}
    return RingView(partition_key, peer_list, peers, ring, node_ring, uuids,
                    warnings, down)


def _nobody_manages(records, now, down_time, group):
    """Why no service of the partition is live: what the live ones manage."""
    managed = sorted({r.partition_key or '(all nodes)' for r in records
                      if ownership.is_up(r, now, down_time)})
    where = f'partition {group!r}' if group else 'all nodes (no partition key)'
    if not managed:
        return f'no live service manages {where}: no service is up'
    return (f'no live service manages {where}; the live services manage: '
            + ', '.join(managed))


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
        raise common.CommandError(
            f'invalid partition key {key!r}: letters, digits, "_", "." and '
            '"-" only')
    return key or None


_ratio = output.optional('{:.3f}')
_tenths = output.optional('{:.1f}')
_percent = output.optional('{:.2%}')


SUMMARY = output.columns(
    ('partition_key', 'Partition key'), ('peer_list', 'Peer list'), ('peers', 'Peers'),
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
               'the peers are still restricted by [ironic]peer_list')
    @format_option
    def show(self, partition_key=None, format='table'):
        """Show the ring's peers, buckets, and the nodes per host."""
        key = partition_key_option(partition_key)
        ctx = db_api.Context()
        view = ring_view(ctx, key)
        counts = admin.node_counts(ctx, key)
        report = describe(view, counts, standby_counts(view))
        output.show_report(report, format, SUMMARY, (report['hosts'], HOSTS))
