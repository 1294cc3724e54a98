"""A fake Ironic at the adapter boundary, for unit tests of the tracker."""

import uuid as uuidlib

from ironic_compute import ironic


def make_node(uuid=None, conductor_group='', instance_uuid=None, cpus=8,
              memory_mb=16384, local_gb=100, provision_state='available',
              shard=None, **properties):
    props = {'cpus': cpus, 'memory_mb': memory_mb, 'local_gb': local_gb,
             'cpu_arch': 'x86_64', **properties}
    return ironic.Node(
        uuid=uuid or str(uuidlib.uuid4()), name=None,
        conductor_group=conductor_group, shard=shard,
        instance_uuid=instance_uuid, provision_state=provision_state,
        power_state='power off', maintenance=False, properties=props,
        resource_class='baremetal', last_error=None, updated_at=None)


class FakeIronic:
    """Holds nodes in memory; ``fail`` makes every call unavailable."""

    def __init__(self, nodes=()):
        self.nodes = {n.uuid: n for n in nodes}
        self.fail = False
        self.exists_calls = 0

    def add(self, *nodes):
        for node in nodes:
            self.nodes[node.uuid] = node

    def list_nodes(self, conductor_group=None, shards=None):
        if self.fail:
            raise ironic.IronicUnavailable('fake Ironic is down')
        return [n for n in self.nodes.values()
                if (conductor_group is None or n.conductor_group == conductor_group)
                and (shards is None or n.shard in shards)]

    def node_exists(self, uuid):
        self.exists_calls += 1
        if self.fail:
            raise ironic.IronicUnavailable('fake Ironic is down')
        return uuid in self.nodes
