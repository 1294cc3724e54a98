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
import json

import pytest
import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import models
from ironic_compute.instances import build
from ironic_compute.instances import calls
from tests.unit import instance_cloud
from tests.unit.instance_cloud import allocate
from tests.unit.instance_cloud import built
from tests.unit.instance_cloud import claim
from tests.unit.instance_cloud import request

_nodes = models.compute_nodes


@pytest.fixture
def cloud(sqlite_engine, monkeypatch):
    # A fence's reuse of an answer must not depend on how fast a loaded
    # machine runs the database steps between: the answers stay fresh here,
    # and the tests that need them stale say so.
    monkeypatch.setattr(calls, 'FENCE_ANSWER_AGE', 60.0)
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
    # once when it is active. The node: once when the deploy is done and
    # once when it is on. Not before the deploy: Ironic has just allocated
    # it, available. Each of the three fences (image, deploy, power on)
    # checks the node on Ironic's fresh answer to the request before it
    # (the active allocation, the patched node, the read that saw the
    # deploy done). The candidates: from the rows, Ironic not asked.
    assert counts == {'allocation': 2, 'node': 2}


def test_a_build_that_finds_its_allocation_made_reads_the_node_first(cloud):
    """Made by an earlier attempt: the node may be deployed already."""
    row = claim(request('a'))
    node = cloud.node()
    cloud.ironic.allocation.create(uuid=row.uuid, name=row.uuid,
                                   resource_class='baremetal', traits=None,
                                   candidate_nodes=[node])
    counts = count_reads(cloud)
    a = cloud.managers['a']
    a._run(row.uuid, build.build, row)
    assert counts == {'allocation': 1, 'node': 3}
    assert cloud.ironic.nodes[node].provision_state == 'active'


def test_a_fresh_allocations_node_taken_meanwhile_is_never_deployed(
        cloud, monkeypatch):
    """Taken after the allocation's answer, which is too old by the time
    of the image patch: its fence reads the node."""
    monkeypatch.setattr(calls, 'FENCE_ANSWER_AGE', -1.0)
    a = cloud.managers['a']
    row = claim(request('a'))
    read = cloud.ironic.allocation_get

    def then_taken(uuid):
        allocation = read(uuid)
        if allocation.state == 'active':
            # The operator deleted it and gave the node to another.
            del cloud.ironic.allocations[uuid]
            cloud.ironic.set_node(allocation.node_uuid, instance_uuid=None)
            allocate(cloud, 'another', allocation.node_uuid)
        return allocation
    cloud.ironic.allocation_get = then_taken
    a._run(row.uuid, build.build, row)
    assert cloud.ironic.patches == {} and cloud.ironic.provision_calls == []
    assert any(a.uuid == 'another' for a in cloud.ironic.allocations.values())


def test_a_node_that_changes_after_the_deploy_is_never_powered_on(
        cloud, monkeypatch):
    """The power on decides on the read that saw the deploy done; once that
    read is too old, its fence reads the node again right before the
    call."""
    monkeypatch.setattr(calls, 'FENCE_ANSWER_AGE', -1.0)
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
    a._run(row.uuid, build.build, row)
    assert len(active_reads) == 2
    assert cloud.ironic.power_calls == []


def test_a_patch_answer_naming_another_instance_stops_the_deploy(
        cloud, caplog):
    """The deploy's fence checks the node on the image patch's answer."""
    a = cloud.managers['a']
    row = claim(request('a'))
    patched = cloud.ironic.node_update

    def taken_as_patched(uuid, patch):
        cloud.ironic.set_node(uuid, instance_uuid='another-instance')
        return patched(uuid, patch)
    cloud.ironic.node_update = taken_as_patched
    a._run(row.uuid, build.build, row)
    assert cloud.ironic.provision_calls == []
    assert any('serves another-instance' in r.getMessage()
               for r in caplog.records)


def test_a_build_it_picks_up_scheduled_does_not_look_for_an_allocation(cloud):
    """Moved from scheduled to spawning by this worker: no attempt before."""
    row = request('a')
    counts = count_reads(cloud)
    a = cloud.managers['a']
    a._run(row.uuid, build.build, row)
    assert counts == {'allocation': 1, 'node': 2}
    assert cloud.ironic.created_allocations == [row.uuid]


def test_an_allocation_there_anyway_is_taken_not_doubled(cloud):
    """Were one made for a scheduled row, its create is refused (same uuid
    and name) and the build takes it."""
    row = request('a')
    node = cloud.node()
    cloud.ironic.allocation.create(uuid=row.uuid, name=row.uuid,
                                   resource_class='baremetal', traits=None,
                                   candidate_nodes=[node])
    a = cloud.managers['a']
    a._run(row.uuid, build.build, row)
    current = instance_cloud.db_instances.get(instance_cloud.ctx(), row.uuid)
    assert (current.vm_state, current.node) == ('active', node)
    assert cloud.ironic.created_allocations == [row.uuid]
    assert cloud.ironic.nodes[node].provision_state == 'active'


def test_candidates_come_from_ironic_when_the_rows_name_none(cloud):
    """The rows (the last cycle's) say a's node is taken; Ironic says free."""
    a = cloud.managers['a']
    row = claim(request('a'))
    with db_api.context_manager.reader.using(instance_cloud.ctx()) as session:
        held = [r.uuid for r in session.execute(
            sa.select(_nodes.c.uuid, _nodes.c.stats)
            .where(_nodes.c.host == 'a', _nodes.c.deleted == 0))]
    assert held
    with db_api.get_engine().begin() as conn:
        for uuid in held:  # as if a cycle saw them taken
            conn.execute(_nodes.update().where(_nodes.c.uuid == uuid).values(
                stats=json.dumps({'available': False, 'traits': []})))
    counts = count_reads(cloud)
    a._run(row.uuid, build.build, row)
    assert counts['free listing'] == 1
    assert instance_cloud.db_instances.get(instance_cloud.ctx(),
                                           row.uuid).vm_state == 'active'


def test_a_failed_allocation_among_the_rows_candidates_asks_ironic_next(cloud):
    a = cloud.managers['a']
    row = claim(request('a'))
    made = cloud.ironic.allocation_create
    attempts = []

    def first_lost(**kwargs):
        attempts.append(list(kwargs['candidate_nodes']))
        if len(attempts) == 1:  # another build won it meanwhile
            return made(**{**kwargs, 'candidate_nodes': []})
        return made(**kwargs)
    cloud.ironic.allocation_create = first_lost
    counts = count_reads(cloud)
    a._run(row.uuid, build.build, row)
    assert len(attempts) == 2 and counts['free listing'] == 1
    assert instance_cloud.db_instances.get(instance_cloud.ctx(),
                                           row.uuid).vm_state == 'active'
