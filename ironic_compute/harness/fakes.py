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

"""An Ironic held in memory, at the adapter boundary (``ironic_compute.ironic``).

For the unit tests (``tests/unit/fakes.py`` builds on it) and the cycle
benchmark, which measure the service's own work without a real Ironic.
"""

import uuid as uuidlib

from ironic_compute import exception
from ironic_compute import ironic


def make_node(uuid=None, conductor_group='', instance_uuid=None, cpus=8,
              memory_mb=16384, local_gb=100, provision_state='available',
              shard=None, resource_class='baremetal', traits=(), **properties):
    props = {'cpus': cpus, 'memory_mb': memory_mb, 'local_gb': local_gb,
             'cpu_arch': 'x86_64', **properties}
    return ironic.Node(
        uuid=uuid or str(uuidlib.uuid4()), name=None,
        conductor_group=conductor_group, shard=shard,
        instance_uuid=instance_uuid, provision_state=provision_state,
        power_state='power off', maintenance=False, properties=props,
        resource_class=resource_class, last_error=None, updated_at=None,
        traits=frozenset(traits))


class FakeIronic:
    """Holds nodes in memory; ``fail`` makes every call unavailable."""

    def __init__(self, nodes=()):
        self.nodes = {n.uuid: n for n in nodes}
        self.fail = False
        self.exists_calls = 0
        self.fetched = 0  # nodes returned by list_nodes and get_nodes

    def add(self, *nodes):
        for node in nodes:
            self.nodes[node.uuid] = node

    def list_nodes(self, conductor_group=None, shards=None, sharded=None):
        if self.fail:
            raise exception.IronicUnavailable('fake Ironic is down')
        nodes = [n for n in self.nodes.values()
                 if (conductor_group is None or n.conductor_group == conductor_group)
                 and (shards is None or n.shard in shards)
                 and (sharded is None or (n.shard is not None) == sharded)]
        self.fetched += len(nodes)
        return nodes

    def list_shards(self):
        if self.fail:
            raise exception.IronicUnavailable('fake Ironic is down')
        counts = {}
        for node in self.nodes.values():
            name = node.shard or ironic.UNSHARDED
            counts[name] = counts.get(name, 0) + 1
        return counts

    def get_nodes(self, uuids):
        if self.fail:
            raise exception.IronicUnavailable('fake Ironic is down')
        nodes = [self.nodes[u] for u in dict.fromkeys(uuids) if u in self.nodes]
        self.fetched += len(nodes)
        return nodes

    def node_exists(self, uuid):
        self.exists_calls += 1
        if self.fail:
            raise exception.IronicUnavailable('fake Ironic is down')
        return uuid in self.nodes
