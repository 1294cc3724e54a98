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

"""The whole request spec and the tenant on the fake Ironic, on every
database: what reaches the node's instance_info, the node chosen by its
capabilities, and the lessee set by the build and cleared by the teardown
(before the undeploy, only when it is the instance's project)."""

import dataclasses
import json

from ironic_compute import exception
from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import build
from ironic_compute.instances import model as inst
from ironic_compute.instances import teardown
from ironic_compute.nodes import tracker as resource_tracker
from tests.unit import instance_cloud

UUID = '00000000-0000-0000-0000-000000000001'


def ctx():
    return db_api.Context()


def with_capabilities(cloud):
    """The cloud's two nodes get capabilities (uefi, bios), recorded by a
    cycle of each service; returns {boot_mode: (node, its host)}."""
    modes = {}
    for node, mode in zip(sorted(cloud.ironic.nodes), ('uefi', 'bios'),
                          strict=True):
        raw = cloud.ironic.nodes[node]
        cloud.ironic.set_node(node, properties={
            **raw.properties, 'capabilities': f'boot_mode:{mode},raid:1'})
        modes[mode] = node
    for host in 'ab':
        resource_tracker.ResourceTracker(
            host, cloud.ids[host], cloud.ironic).run_cycle(
            resource_tracker.Settings(partition_exponent=8))
    rows = db_nodes.load_rows(ctx(), None)
    return {mode: (node, rows[node].host) for mode, node in modes.items()}


def build_on(cloud, host, spec, **extra):
    row = db_instances.create(ctx(), UUID, 'web-1', host, spec,
                              'http://img', **extra)
    row = instance_cloud.claim(row)
    cloud.managers[host]._run(row.uuid, build.build, row)
    return db_instances.get(ctx(), row.uuid)


FULL = dict(image_checksum='http://img.sha256', image_kernel='http://k',
            image_ramdisk='http://r', project_id='demo', user_id='alice')


def test_every_field_reaches_instance_info_and_the_lessee(cloud):
    nodes = with_capabilities(cloud)
    node, host = nodes['uefi']
    spec = inst.RequestSpec('baremetal', vcpus=2, memory_mb=1024, disk_gb=10,
                            capabilities={'boot_mode': 'uefi'},
                            ephemeral_gb=5, ephemeral_format='ext4',
                            swap_mb=512)
    row = build_on(cloud, host, spec, **FULL)
    assert (row.vm_state, row.node, row.fault) == (inst.ACTIVE, node, None)
    info = cloud.ironic.instance_info[node]
    assert info == {
        'image_source': 'http://img', 'root_gb': '10', 'swap_mb': '512',
        'ephemeral_gb': '5', 'ephemeral_format': 'ext4', 'vcpus': '2',
        'memory_mb': '1024', 'display_name': 'web-1',
        'capabilities': '{"boot_mode": "uefi"}',
        'image_checksum': 'http://img.sha256', 'kernel': 'http://k',
        'ramdisk': 'http://r', 'project_id': 'demo', 'user_id': 'alice'}
    assert json.loads(info['capabilities']) == {'boot_mode': 'uefi'}
    assert cloud.ironic.lessees == {node: 'demo'}
    # One patch: the fields and the lessee together, before the deploy.
    [patch] = cloud.ironic.patches[node]
    assert {'op': 'add', 'path': '/lessee', 'value': 'demo'} in patch


def test_a_build_without_a_project_sends_no_lessee(cloud):
    node = cloud.node()
    host = db_nodes.load_rows(ctx(), None)[node].host
    row = build_on(cloud, host, inst.RequestSpec('baremetal'))
    assert row.vm_state == inst.ACTIVE
    assert cloud.ironic.lessees == {}
    assert 'capabilities' not in cloud.ironic.instance_info[row.node]
    assert not any(op['path'] == '/lessee'
                   for op in cloud.ironic.patches[row.node][0])


def test_the_teardown_clears_the_lessee_before_the_undeploy(cloud):
    nodes = with_capabilities(cloud)
    node, host = nodes['bios']
    row = build_on(cloud, host, inst.RequestSpec(
        'baremetal', capabilities={'boot_mode': 'bios', 'raid': '1'}), **FULL)
    assert row.node == node and cloud.ironic.lessees == {node: 'demo'}
    calls = []
    update, provision = (cloud.ironic.node_update,
                         cloud.ironic.node_set_provision_state)
    cloud.ironic.node_update = lambda uuid, patch: (
        calls.append(('update', patch)), update(uuid, patch))[1]
    cloud.ironic.node_set_provision_state = lambda uuid, target: (
        calls.append(('provision', target)), provision(uuid, target))[1]
    row = db_instances.request_delete(ctx(), row.uuid)
    assert cloud.managers[host]._run(row.uuid, teardown.delete, row) is not False
    assert db_instances.get(ctx(), row.uuid, deleted=True).vm_state == (
        inst.DELETED)
    assert cloud.ironic.lessees == {}
    assert calls == [('update', [{'op': 'remove', 'path': '/lessee'}]),
                     ('provision', 'deleted')]


def test_the_teardown_leaves_a_lessee_that_is_not_the_instances(cloud):
    # An operator gave the node to another project meanwhile: not ours to
    # take away.
    node = cloud.node()
    host = db_nodes.load_rows(ctx(), None)[node].host
    row = build_on(cloud, host, inst.RequestSpec('baremetal'), **FULL)
    cloud.ironic.lessees[row.node] = 'other'
    row = db_instances.request_delete(ctx(), row.uuid)
    cloud.managers[host]._run(row.uuid, teardown.delete, row)
    assert cloud.ironic.nodes[row.node].provision_state == 'available'
    assert cloud.ironic.lessees == {row.node: 'other'}


def test_a_lost_answer_of_the_lessee_patch_is_decided_by_reading_it(cloud):
    # The patch reached Ironic but its answer was lost: the lessee and the
    # fields read back say it landed, and it is not sent again.
    node = cloud.node()
    host = db_nodes.load_rows(ctx(), None)[node].host
    update = cloud.ironic.node_update
    sent = []

    def lost_answer(uuid, patch):
        sent.append(patch)
        update(uuid, patch)
        # What the adapter raises after a read timeout on a change.
        raise exception.MaybeSent('cannot set the image: read timed out')
    cloud.ironic.node_update = lost_answer
    cloud.managers[host].provisioner.lost_answer_settle = 0.2
    row = build_on(cloud, host, inst.RequestSpec('baremetal'), **FULL)
    assert row.vm_state == inst.ACTIVE, row
    assert len(sent) == 1
    assert cloud.ironic.lessees == {row.node: 'demo'}


def test_a_row_keeps_the_spec_it_was_asked_with(cloud):
    spec = inst.RequestSpec('baremetal', capabilities={'b': '2', 'a': '1'},
                            ephemeral_gb=1, ephemeral_format='xfs',
                            swap_mb=3)
    row = db_instances.create(ctx(), UUID, 'x', 'a', spec, '', **FULL)
    read = db_instances.get(ctx(), UUID)
    assert read.spec() == spec == row.spec()
    assert dataclasses.asdict(read.spec())['capabilities'] == (
        ('a', '1'), ('b', '2'))
    assert {k: getattr(read, k) for k in FULL} == FULL


def test_reaping_clears_the_lessee_of_the_deleted_instance(cloud):
    # Deleted while its host was down: the node that still carries it is
    # torn down by whoever holds it, its tenant's lessee cleared first.
    node = cloud.node()
    host = db_nodes.load_rows(ctx(), None)[node].host
    row = build_on(cloud, host, inst.RequestSpec('baremetal'), **FULL)
    deleting = db_instances.request_delete(ctx(), row.uuid)
    assert db_instances.soft_delete(ctx(), deleting)
    assert teardown.reap(cloud.managers[host].worker, row.node, row.uuid)
    assert cloud.ironic.nodes[row.node].provision_state == 'available'
    assert cloud.ironic.lessees == {}
