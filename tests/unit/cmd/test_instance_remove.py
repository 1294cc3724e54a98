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

"""instance remove: a record is forgotten, its node is never torn down.

A built instance (made by ``instance create``) is refused without
``--force``; with it, or for a record made by ``instance add``, the record
is soft-deleted as ``removed`` and neither the reaper nor ``node show``
treats its node as a deleted instance's.
"""

import json
import types

import sqlalchemy as sa

from ironic_compute.db import admin
from ironic_compute.db import api as db_api
from ironic_compute.db import instances as db_instances
from ironic_compute.instances import model as inst
from ironic_compute.instances import takeover
from ironic_compute.ring import hash_ring
from tests.unit.cmd.test_manage_admin import EXPONENT
from tests.unit.cmd.test_manage_admin import _instances
from tests.unit.cmd.test_manage_admin import _nodes
from tests.unit.cmd.test_manage_admin import _nodes_mapped_to
from tests.unit.cmd.test_manage_admin import instance
from tests.unit.cmd.test_manage_admin import instance_uuid
from tests.unit.cmd.test_manage_admin import node_uuid
from tests.unit.cmd.test_manage_admin import service


def built(uuid, host, node):
    """An instance as ``instance create`` and its host leave it: active."""
    db_instances.create(db_api.Context(), uuid, 'web', host,
                        inst.RequestSpec('baremetal'), 'http://image')
    with db_api.get_engine().begin() as conn:
        conn.execute(_instances.update().where(_instances.c.uuid == uuid)
                     .values(node=node, vm_state=inst.ACTIVE,
                             task_state=None))


def rows(uuid):
    with db_api.get_engine().connect() as conn:
        return conn.execute(
            sa.select(_instances.c.id, _instances.c.deleted,
                      _instances.c.vm_state, _instances.c.task_state,
                      _instances.c.node)
            .where(_instances.c.uuid == uuid)).all()


class FakeManager:
    def __init__(self):
        self.reaped = []

    def reap(self, node, uuid):
        self.reaped.append((node, uuid))
        return True


def reaped(nodes_to_instances):
    """What the owner of these nodes reaps at its next cycle."""
    manager = FakeManager()
    keeper = takeover.InstanceKeeper('cmp-1', 1, manager)
    view = types.SimpleNamespace(unknown_instance=dict(nodes_to_instances),
                                 owned=dict.fromkeys(nodes_to_instances))
    keeper._reap_and_report(db_api.Context(), view)
    return manager.reaped


def test_a_built_instance_is_refused_without_force(migrated_engine, manage_cli):
    service('cmp-1', node_uuid(1))
    uuid = instance_uuid(1)
    built(uuid, 'cmp-1', node_uuid(1))
    result = manage_cli('instance', 'remove', uuid)
    result.one_line_error(
        f'instance {uuid} was built by ironic-compute',
        f"'instance delete {uuid}' tears its node down",
        f"'instance remove --force {uuid}' only forgets the record and "
        'leaves the node and its allocation as they are')
    assert [r.deleted for r in rows(uuid)] == [0]

    out = manage_cli('instance', 'remove', '--force', uuid).ok().out
    assert out == (f'Instance {uuid} removed; node {node_uuid(1)} and its '
                   'allocation are left as they are.\n')
    (row,) = rows(uuid)
    assert (row.deleted, row.vm_state, row.task_state) == (
        row.id, inst.REMOVED, None)
    # Nobody tears its node down: not the reaper, which only knows it is
    # no deleted build.
    assert db_instances.deleted_builds(db_api.Context(), {uuid}) == set()
    assert admin.removed_instances(db_api.Context(), {uuid}) == {uuid}
    assert reaped({node_uuid(1): uuid}) == []
    manage_cli('instance', 'remove', '--force', uuid).one_line_error(
        f'no instance {uuid}')


def test_a_record_made_by_instance_add_needs_no_force(migrated_engine, manage_cli):
    service('cmp-1', node_uuid(1))
    instance(instance_uuid(2), 'cmp-1', node_uuid(1))
    assert manage_cli('instance', 'remove', instance_uuid(2)).ok().out == (
        f'Instance {instance_uuid(2)} removed.\n')
    (row,) = rows(instance_uuid(2))
    assert (row.deleted, row.vm_state) == (row.id, inst.REMOVED)
    assert reaped({node_uuid(1): instance_uuid(2)}) == []
    # Its uuid can be recorded again, and removed again.
    instance(instance_uuid(2), 'cmp-1', node_uuid(1))
    manage_cli('instance', 'remove', '--force', instance_uuid(2)).ok()
    assert [r.vm_state for r in rows(instance_uuid(2))] == [inst.REMOVED] * 2


def test_only_a_deleted_build_is_reaped(migrated_engine):
    service('cmp-1', node_uuid(1), node_uuid(2))
    ctx = db_api.Context()
    deleted, removed = instance_uuid(3), instance_uuid(4)
    built(deleted, 'cmp-1', node_uuid(1))
    built(removed, 'cmp-1', node_uuid(2))
    assert db_instances.soft_delete(
        ctx, db_instances.request_delete(ctx, deleted))
    assert admin.remove_instance(ctx, removed, force=True) == (
        admin.RemovedInstance(removed, node_uuid(2), True))
    assert db_instances.deleted_builds(ctx, {deleted, removed}) == {deleted}
    assert admin.removed_instances(ctx, {deleted, removed}) == {removed}
    assert reaped({node_uuid(1): deleted, node_uuid(2): removed}) == [
        (node_uuid(1), deleted)]


def test_a_removed_build_being_rebuilt_is_neither(migrated_engine):
    # The same uuid live again (recorded by "instance add" after a
    # removal): the live record wins, as for deleted builds.
    service('cmp-1', node_uuid(1))
    ctx = db_api.Context()
    built(instance_uuid(5), 'cmp-1', node_uuid(1))
    admin.remove_instance(ctx, instance_uuid(5), force=True)
    instance(instance_uuid(5), 'cmp-1', node_uuid(1))
    assert admin.removed_instances(ctx, {instance_uuid(5)}) == set()
    assert db_instances.deleted_builds(ctx, {instance_uuid(5)}) == set()


def test_node_show_says_a_removed_record_leaves_the_node_alone(
        sqlite_engine, manage_cli):
    ring = hash_ring.HashRing({'cmp-1'}, EXPONENT)
    (node,) = _nodes_mapped_to(ring, 'cmp-1', 1)
    service('cmp-1', node)
    uuid = instance_uuid(6)
    built(uuid, 'cmp-1', node)
    manage_cli('instance', 'remove', '--force', uuid).ok()
    # Ironic still names the instance on the node, as the cycle records.
    with db_api.get_engine().begin() as conn:
        conn.execute(_nodes.update().where(_nodes.c.uuid == node).values(
            stats=json.dumps({'instance_uuid': uuid})))
    report = manage_cli('node', 'show', node, '--format', 'json').json()
    assert (report['managed_by'], report['reason'], report['instance']) == (
        'cmp-1', 'removed instance', uuid)
    assert 'left as they are' in report['detail']
    assert 'reaping' not in report['detail']
    assert [(n['uuid'], n['reason']) for n in manage_cli(
        'node', 'list', '--reason', 'removed instance', '--format',
        'json').json()] == [(node, 'removed instance')]


def test_help_says_what_remove_does(manage_cli):
    text = manage_cli('instance', 'remove', '--help').out
    assert 'Ironic is not touched, now or later' in ' '.join(text.split())
    assert 'never torn down' in text
