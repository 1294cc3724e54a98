"""ironic-compute-manage ring show: the ring the live services build."""

import dataclasses
import re

from ironic_compute import hash_ring
from ironic_compute import ownership
from ironic_compute.cmd import common
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.conf import ironic as ironic_conf
from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services
from ironic_compute.db.models import _utcnow

CONF = common.CONF


@dataclasses.dataclass(frozen=True)
class RingView:
    partition_key: str | None
    peer_list: tuple
    peers: frozenset
    ring: hash_ring.HashRing | None  # None when there is no live peer
    warnings: tuple
    down: dict  # host -> why it is down (None: up), every service


def ring_view(services, partition_key, now):
    """The peers and the ring every live service of the partition builds.

    A service counts itself as a peer even before it owns a row; the peers
    the live services agree on are the up services of the partition that
    own rows, restricted by ``[ironic]peer_list`` under a partition key. They are computed from
    the point of view of one of them, which then adds nothing of its own.
    """
    records = [s.record() for s in services]
    group = (partition_key or '').lower() or None  # as the services store it
    down_time = CONF.service_down_time
    peer_list = tuple(CONF.ironic.peer_list or ())
    wanted = {ownership.normalize_host(h) for h in peer_list} - {''}
    candidates = sorted(
        r.host for r in records
        if r.has_compute_nodes and ownership.is_up(r, now, down_time)
        and (r.partition_key or None) == group
        and (r.shard or None) == (CONF.ironic.shard or None)
        and (not (partition_key and wanted) or r.host in wanted))
    peers, warnings = frozenset(), ()
    if candidates:
        anchor = candidates[0]
        live = ownership.live_peers(records, anchor, now, down_time, group,
                                    CONF.ironic.shard)
        chosen = ownership.ring_peers(live, anchor, partition_key, peer_list)
        peers, warnings = chosen.peers, chosen.warnings
    ring = None
    if peers:
        ring = hash_ring.get_ring(peers, CONF.hash_ring.partition_exponent,
                                  CONF.hash_ring.replicas)
    down = {r.host: ownership.down_reason(r, now, down_time) for r in records}
    return RingView(partition_key, peer_list, peers, ring, warnings, down)


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


SUMMARY = [
    output.Column('partition_key', 'Partition key'),
    output.Column('peer_list', 'Peer list'),
    output.Column('peers', 'Peers'),
    output.Column('buckets', 'Buckets'),
    output.Column('replicas', 'Replicas'),
    output.Column('nodes', 'Nodes'),
    output.Column('ring_imbalance', 'Ring imbalance (max/mean share)',
                  _ratio),
    output.Column('node_imbalance', 'Node imbalance (max/mean nodes)',
                  _ratio),
    output.Column('warnings', 'Warnings'),
]
HOSTS = [
    output.Column('host', 'Host', lambda h: '(no owner)' if h is None else h),
    output.Column('state', 'State'),
    output.Column('in_ring', 'In ring'),
    output.Column('ring_share', 'Ring share', _percent),
    output.Column('expected_nodes', 'Expected nodes', _tenths),
    output.Column('nodes', 'Nodes'),
]


def _max_over_mean(values):
    values = list(values)
    if not values or not sum(values):
        return None
    return round(max(values) * len(values) / sum(values), 4)


def describe(view, counts):
    """The ``ring show`` report of ``view`` and the rows per host."""
    shares = view.ring.shares() if view.ring is not None else {}
    total = sum(counts.values())
    hosts = sorted(view.peers | counts.keys(),
                   key=lambda h: (h is None, h or ''))
    rows = [{
        'host': host,
        'state': host_state(view, host),
        'in_ring': host in view.peers,
        'ring_share': shares.get(host),
        'expected_nodes': (round(shares[host] * total, 1)
                           if host in shares else None),
        'nodes': counts.get(host, 0),
    } for host in hosts]
    return {
        'partition_key': view.partition_key,
        'peer_list': list(view.peer_list),
        'peers': sorted(view.peers),
        'buckets': 2 ** CONF.hash_ring.partition_exponent,
        'replicas': CONF.hash_ring.replicas,
        'nodes': total,
        'ring_imbalance': _max_over_mean(shares.values()),
        'node_imbalance': _max_over_mean(
            counts.get(h, 0) for h in view.peers),
        'warnings': list(view.warnings),
        'hosts': rows,
    }


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
        services = db_services.list_services(ctx)
        counts = admin.node_counts(ctx, key)
        report = describe(ring_view(services, key, _utcnow()), counts)
        if format == 'json':
            output.emit(output.to_json(report))
            return
        output.emit(output.record_table(report, SUMMARY))
        output.emit('')
        output.emit(output.listing_table(report['hosts'], HOSTS))
