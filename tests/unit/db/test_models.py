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

"""The tables on every backend: defaults, soft delete, unique constraints."""

import pytest
import sqlalchemy as sa
from oslo_db import exception as db_exc

from ironic_compute.db import api as db_api
from ironic_compute.db import models

NODE = '1be26c0b-03f2-4d2e-ae87-c02d7f33c123'


def _add(table, **values):
    """The id of a new row of ``table``."""
    with db_api.context_manager.writer.using(db_api.Context()) as session:
        return session.execute(table.insert().values(**values)).inserted_primary_key[0]


def _service(host='compute-1'):
    return _add(models.services, host=host, binary='ironic-compute',
                topic='compute')


def _row(session, table, row_id):
    return session.execute(sa.select(table).where(table.c.id == row_id)).one()


def test_defaults(migrated_engine):
    service = _service()
    node = _add(models.compute_nodes, uuid=NODE, host='compute-1',
                service_id=service)
    with db_api.context_manager.reader.using(db_api.Context()) as session:
        row = _row(session, models.compute_nodes, node)
        assert row.hypervisor_type == 'ironic'
        assert row.deleted == 0
        assert row.vcpus == row.memory_mb == row.local_gb == 0
        assert row.created_at is not None
        svc = _row(session, models.services, service)
        assert svc.disabled is False and svc.forced_down is False
        assert svc.report_count == 0


def test_one_live_compute_node_per_uuid(migrated_engine):
    _add(models.compute_nodes, uuid=NODE, host='compute-1')
    with pytest.raises(db_exc.DBDuplicateEntry):
        _add(models.compute_nodes, uuid=NODE, host='compute-2')


def _soft_delete(table, row_id):
    with db_api.context_manager.writer.using(db_api.Context()) as session:
        session.execute(table.update().where(table.c.id == row_id)
                        .values(deleted=row_id))


def test_soft_deleted_rows_do_not_block_a_returning_node(migrated_engine):
    _soft_delete(models.compute_nodes,
                 _add(models.compute_nodes, uuid=NODE, host='compute-1'))
    # A second deleted row and a new live one may coexist with it.
    _soft_delete(models.compute_nodes,
                 _add(models.compute_nodes, uuid=NODE, host='compute-2'))
    _add(models.compute_nodes, uuid=NODE, host='compute-3')
    with db_api.context_manager.reader.using(db_api.Context()) as session:
        deleted = session.execute(sa.select(models.compute_nodes.c.deleted).where(
            models.compute_nodes.c.uuid == NODE)).scalars().all()
    assert sorted(value == 0 for value in deleted) == [False, False, True]


def test_one_live_service_per_host_and_binary(migrated_engine):
    _service('compute-1')
    _service('compute-2')
    with pytest.raises(db_exc.DBDuplicateEntry):
        _service('compute-1')


def test_one_live_instance_per_uuid(migrated_engine):
    _add(models.instances, uuid=NODE, host='compute-1', node=NODE)
    with pytest.raises(db_exc.DBDuplicateEntry):
        _add(models.instances, uuid=NODE, host='compute-2', node=NODE)


def test_one_live_instance_per_node(migrated_engine):
    """Migration 0008: the database refuses a second live instance on a
    node; deleted rows and builds without a node never collide."""
    _add(models.instances, uuid='a' * 36, host='h', node=NODE)
    with pytest.raises(db_exc.DBDuplicateEntry):
        _add(models.instances, uuid='b' * 36, host='h', node=NODE)
    _add(models.instances, uuid='c' * 36, host='h', node=NODE, deleted=7)
    _add(models.instances, uuid='d' * 36, host='h')
    _add(models.instances, uuid='e' * 36, host='h')
    with db_api.context_manager.reader.using(db_api.Context()) as session:
        assert session.execute(sa.select(sa.func.count()).select_from(
            models.instances)).scalar_one() == 4
