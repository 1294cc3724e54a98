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

"""The models on every backend: defaults, soft delete, unique constraints."""

import pytest
from oslo_db import exception as db_exc

from ironic_compute.db import api as db_api
from ironic_compute.db import models

NODE = '1be26c0b-03f2-4d2e-ae87-c02d7f33c123'


def _add(obj):
    with db_api.context_manager.writer.using(db_api.Context()) as session:
        session.add(obj)
    return obj


def _service(host='compute-1'):
    return _add(models.Service(host=host, binary='ironic-compute',
                               topic='compute'))


def test_defaults(migrated_engine):
    service = _service()
    node = _add(models.ComputeNode(uuid=NODE, host='compute-1',
                                   service_id=service.id))
    with db_api.context_manager.reader.using(db_api.Context()) as session:
        row = session.get(models.ComputeNode, node.id)
        assert row.hypervisor_type == 'ironic'
        assert row.deleted == 0
        assert row.vcpus == row.memory_mb == row.local_gb == 0
        assert row.created_at is not None
        svc = session.get(models.Service, service.id)
        assert svc.disabled is False and svc.forced_down is False
        assert svc.report_count == 0


def test_one_live_compute_node_per_uuid(migrated_engine):
    _add(models.ComputeNode(uuid=NODE, host='compute-1'))
    with pytest.raises(db_exc.DBDuplicateEntry):
        _add(models.ComputeNode(uuid=NODE, host='compute-2'))


def test_soft_deleted_rows_do_not_block_a_returning_node(migrated_engine):
    first = _add(models.ComputeNode(uuid=NODE, host='compute-1'))
    with db_api.context_manager.writer.using(db_api.Context()) as session:
        row = session.get(models.ComputeNode, first.id)
        row.deleted = row.id
    # A second deleted row and a new live one may coexist with it.
    second = _add(models.ComputeNode(uuid=NODE, host='compute-2'))
    with db_api.context_manager.writer.using(db_api.Context()) as session:
        session.get(models.ComputeNode, second.id).deleted = second.id
    _add(models.ComputeNode(uuid=NODE, host='compute-3'))
    with db_api.context_manager.reader.using(db_api.Context()) as session:
        rows = session.query(models.ComputeNode).filter_by(uuid=NODE).all()
    assert sorted(r.deleted == 0 for r in rows) == [False, False, True]


def test_one_live_service_per_host_and_binary(migrated_engine):
    _service('compute-1')
    _service('compute-2')
    with pytest.raises(db_exc.DBDuplicateEntry):
        _service('compute-1')


def test_one_live_instance_per_uuid(migrated_engine):
    _add(models.Instance(uuid=NODE, host='compute-1', node=NODE))
    with pytest.raises(db_exc.DBDuplicateEntry):
        _add(models.Instance(uuid=NODE, host='compute-2', node=NODE))


def test_one_live_instance_per_node(migrated_engine):
    """Migration 0008: the database refuses a second live instance on a
    node; deleted rows and builds without a node never collide."""
    _add(models.Instance(uuid='a' * 36, host='h', node=NODE))
    with pytest.raises(db_exc.DBDuplicateEntry):
        _add(models.Instance(uuid='b' * 36, host='h', node=NODE))
    _add(models.Instance(uuid='c' * 36, host='h', node=NODE, deleted=7))
    _add(models.Instance(uuid='d' * 36, host='h'))
    _add(models.Instance(uuid='e' * 36, host='h'))
    with db_api.context_manager.reader.using(db_api.Context()) as session:
        assert session.query(models.Instance).count() == 4
