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

"""[hash_ring] options: the shape of the consistent hash ring."""

from oslo_config import cfg

GROUP = cfg.OptGroup(
    'hash_ring',
    title='Hash ring options',
    help='How Ironic nodes are divided between the live compute services. '
         'Every service must use the same values, or they disagree on '
         'which service owns which node.')

opts = [
    cfg.IntOpt(
        'partition_exponent',
        default=16,
        min=8,
        max=22,
        help='The ring has 2 to the power of this number buckets. Each node '
             'hashes into a bucket and each bucket is assigned to services by '
             'rendezvous hashing, so more buckets give a finer balance at the '
             'cost of a larger table (2^16 is balanced to within a few '
             'percent of random at 100 services).'),
    cfg.IntOpt(
        'replicas',
        default=1,
        min=1,
        help='Number of services the ring ranks for each node, in order of '
             'preference. The first one owns the node; the next ones are '
             'where it would go if the first went away, in that order. The '
             'service uses only the first; more replicas make the ring '
             'slower to build.'),
    cfg.FloatOpt(
        'load_factor',
        default=1.10,
        mutable=True,
        help='Consistent hashing with bounded loads: no service manages more '
             'than this factor times the mean number of nodes per service '
             '(rounded down, but never below the mean rounded up); with '
             '[ironic]shard_ring the same bound applies to the nodes of the '
             'shards a service is given (a shard larger than the room left '
             'still goes whole to one service). Nodes a '
             'service manages because of its instances count toward its '
             'load. Nodes above the bound go to their next service in ring '
             'order, so a few more nodes move when a service joins or '
             'leaves. 1.0 or less turns the bound off: plain consistent '
             'hashing, even only for large node counts. Every service must '
             'use the same value: while they differ (during a rolling '
             'change) some nodes change owner at every cycle.'),
]


def register_opts(conf):
    conf.register_group(GROUP)
    conf.register_opts(opts, group=GROUP)


def list_opts():
    return {GROUP: opts}
