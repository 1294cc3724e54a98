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

"""ironic-compute-manage ironic ...: the Ironic shards and the shard ring.

``shards`` shows which service lists which shard, computed by the function
the services run (shard_ring.assign over ownership.partition_peers);
``shard-assign`` gives the unsharded nodes of a partition a shard, so that
a running cloud can switch to ``[ironic]shard_ring``.
"""

import collections

from ironic_compute import exception
from ironic_compute.cmd import common
from ironic_compute.cmd import manage_ring
from ironic_compute.cmd import output
from ironic_compute.cmd.manage_args import args
from ironic_compute.cmd.manage_args import format_option
from ironic_compute.cmd.manage_ring import partition_key_option
from ironic_compute.db import api as db_api
from ironic_compute.db import services as db_services
from ironic_compute.ring import shard_ring

CONF = common.CONF
MAX_SHARDS = 10000

SUMMARY = output.columns(
    ('partition_key', 'Partition key'), ('peers', 'Peers'),
    ('shard_ring_peers', 'Peers running shard_ring'), ('in_force', 'Shard ring in force'),
    ('load_factor', 'Load factor'), ('nodes', 'Nodes'))
SHARDS = output.columns(
    ('shard', 'Shard'), ('nodes', 'Nodes'),
    ('service', 'Service', lambda h: '(no live peer)' if h is None else h))
HOSTS = output.columns(
    ('service', 'Service'), ('shards', 'Shards'), ('nodes', 'Nodes'))


def _client():
    # Imported here: the Ironic client loads keystoneauth1, which the other
    # commands do not need (see "Start-up" in doc/cli.md).
    from ironic_compute import ironic
    return ironic.IronicClient(CONF)


def _ask(func, *args, **kwargs):
    """An Ironic call; its failure is one line for the operator."""
    try:
        return func(*args, **kwargs)
    except exception.IronicUnavailable as exc:
        raise exception.CommandError(common.driver_message(exc)) from exc


def shard_view(ctx, group, counts):
    """The report of ``ironic shards``: the partition's peers as a live
    member sees them, and the service each shard is assigned to."""
    listing = db_services.load_services(ctx)  # the database's clock
    seen = manage_ring.partition_view(listing, group)
    peers = seen.peers
    running = {r.host for r in listing.rows if r.shard_ring}
    assigned = seen.shard_assignment(counts)
    shards = [{'shard': name, 'nodes': counts[name],
               'service': shard_ring.owner(assigned, name)}
              for name in sorted(counts)]
    per_host = collections.defaultdict(lambda: {'shards': 0, 'nodes': 0})
    for entry in shards:
        if entry['service'] is not None:
            per_host[entry['service']]['shards'] += 1
            per_host[entry['service']]['nodes'] += entry['nodes']
    return {
        'partition_key': group,
        'peers': sorted(peers),
        'shard_ring_peers': sorted(peers & running),
        'in_force': bool(peers) and seen.shard_ring,
        'load_factor': CONF.hash_ring.load_factor,
        'nodes': sum(counts.values()),
        'shards': shards,
        'services': [{'service': host, **per_host[host]}
                     for host in sorted(peers)],
    }


class IronicCommands:
    """The Ironic shards and the shard ring ([ironic] credentials needed)."""

    @args('--partition-key', metavar='K',
          help='conductor group whose peers to show (default: '
               '[ironic]partition_key); Ironic counts the nodes of a shard '
               'over every group')
    @format_option
    def shards(self, partition_key=None, format='table'):
        """Show the Ironic shards, their nodes and the service of each."""
        key = partition_key_option(partition_key)
        group = key.lower() if key else None
        counts = _ask(_client().list_shards)
        counts.setdefault(shard_ring.UNSHARDED, 0)
        report = shard_view(db_api.Context(), group, counts)
        output.show_report(report, format, SUMMARY, (report['shards'], SHARDS),
                           (report['services'] or None, HOSTS))

    @args('--shards', metavar='K', type=int, required=True,
          help=f'how many shards to spread the nodes over (1 to {MAX_SHARDS})')
    @args('--partition-key', metavar='K',
          help='conductor group whose nodes to shard (default: '
               '[ironic]partition_key; unset: every unsharded node)')
    @args('--dry-run', action='store_true',
          help='print what would be done, change nothing')
    def shard_assign(self, shards, partition_key=None, dry_run=False):
        """Give every unsharded node of the partition a shard from its uuid."""
        if not 1 <= shards <= MAX_SHARDS:
            raise exception.CommandError(
                f'--shards must be between 1 and {MAX_SHARDS}, not {shards}')
        key = partition_key_option(partition_key)
        group = key.lower() if key else None
        client = _client()
        nodes = _ask(client.list_nodes, conductor_group=group, sharded=False)
        plan = {n.uuid: shard_ring.shard_key(n.uuid, shards, group)
                for n in sorted(nodes, key=lambda n: n.uuid)}
        done = collections.Counter()
        for uuid, shard in plan.items():
            if not dry_run:
                try:
                    client.set_shard(uuid, shard)
                except exception.IronicUnavailable as exc:
                    raise exception.CommandError(
                        f'{common.driver_message(exc)} ({sum(done.values())} of '
                        f'{len(plan)} nodes done; run the command again to '
                        f'finish)') from exc
            done[shard] += 1
        where = f'conductor group {group!r}' if group else 'any conductor group'
        verb = 'Would give' if dry_run else 'Gave'
        output.emit(f'{verb} {len(plan)} unsharded nodes of {where} a shard '
                    f'({shards} shards)' + (':' if plan else '.'))
        for shard in sorted(done):
            output.emit(f'  {shard}: {done[shard]} nodes')
