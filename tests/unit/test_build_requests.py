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

"""What a build asks Ironic: every read it needs, none twice, and every
change still fenced (doc/scaling.md, "Builds")."""

import collections

import pytest

from tests.unit import instance_cloud
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import claim
from tests.unit.instance_cloud import request


@pytest.fixture
def cloud(sqlite_engine):
    return instance_cloud.make_cloud()


def count_reads(cloud):
    """{'node': n, 'allocation': n, 'free listing': n}, as the build goes."""
    counts = collections.Counter()
    fake = cloud.ironic
    for name, key in (('node_get', 'node'), ('allocation_get', 'allocation'),
                      ('list_nodes', 'free listing')):
        original = getattr(fake, name)

        def counted(*args, _original=original, _key=key, **kwargs):
            counts[_key] += 1
            return _original(*args, **kwargs)
        setattr(fake, name, counted)
    return counts


def test_a_build_reads_each_thing_once_where_once_is_enough(cloud):
    counts = count_reads(cloud)
    built(cloud, 'a')
    # The allocation: once before it is made (not again inside allocate),
    # once when it is active. The node: once before the deploy, once in
    # each of the three fences (image, deploy, power on), once when the
    # deploy is done and once when it is on: the power on decides on the
    # read that saw the deploy done, and its fence reads again.
    assert counts == {'allocation': 2, 'node': 6, 'free listing': 1}


def test_a_node_that_changes_after_the_deploy_is_never_powered_on(cloud):
    """The power on reuses the read that saw the deploy done; its fence
    still reads the node right before the call."""
    a = cloud.managers['a']
    row = claim(request('a'))
    active_reads = []

    def hook(uuid):
        node = cloud.ironic.nodes[uuid]
        if node.provision_state == 'active' and node.instance_uuid == row.uuid:
            active_reads.append(uuid)
            if len(active_reads) == 2:  # the fence's, right before the call
                cloud.ironic.set_node(uuid, instance_uuid='another-instance')
    cloud.ironic.on_node_get = hook
    a._run(row.uuid, a._build, row)
    assert len(active_reads) == 2
    assert cloud.ironic.power_calls == []
