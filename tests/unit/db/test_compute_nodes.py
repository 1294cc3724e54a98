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

"""compute_nodes writes on SQLite, MariaDB and PostgreSQL."""

import json

import sqlalchemy as sa

from ironic_compute.db import api as db_api
from ironic_compute.db import compute_nodes as db_nodes
from ironic_compute.db import models

_nodes = models.compute_nodes


def fields(uuid, vcpus, cpu_arch='x86_64', shard=None, name='n'):
    """SYNCED_FIELDS values of a node, ``stats`` unique per node as in a cycle."""
    by_name = {'hypervisor_hostname': uuid, 'conductor_group': '',
               'vcpus': vcpus, 'memory_mb': vcpus * 1024, 'local_gb': 10,
               'vcpus_used': 0, 'memory_mb_used': 0, 'local_gb_used': 0,
               'cpu_arch': cpu_arch, 'resource_class': 'baremetal',
               'stats': json.dumps({'name': f'{name}-{uuid}'}), 'shard': shard,
               'available': True, 'traits': '|', 'capabilities': '|'}
    return tuple(by_name[name] for name in db_nodes.SYNCED_FIELDS)


def stored():
    with db_api.get_engine().connect() as conn:
        rows = conn.execute(sa.select(
            _nodes.c.uuid, *(_nodes.c[n] for n in db_nodes.SYNCED_FIELDS))
            .where(_nodes.c.deleted == 0)).all()
    return {uuid: tuple(values) for uuid, *values in rows}


def test_update_fields_writes_each_row_its_own_values(migrated_engine, monkeypatch):
    # Chunks of two: the five rows take three statements, each with its
    # own CASE lists; a column whose values are all NULL keeps its type.
    monkeypatch.setattr(db_nodes, '_UPDATE_CHUNK', 2)
    mine = [f'node-{i}' for i in range(5)]
    db_nodes.create_or_revive(db_api.Context(), {u: fields(u, 1) for u in mine},
                              'a', None)
    db_nodes.create_or_revive(db_api.Context(), {'theirs': fields('theirs', 1)},
                              'b', None)
    changes = {u: fields(u, 10 + i, cpu_arch=None, shard=f'ic-{i}', name='new')
               for i, u in enumerate(mine)}
    changes['theirs'] = fields('theirs', 99)
    db_nodes.update_fields(db_api.Context(), 'a', changes)
    after = stored()
    assert {u: after[u] for u in mine} == {u: changes[u] for u in mine}
    assert after['theirs'] == fields('theirs', 1)  # another host's row: untouched


def test_update_fields_with_nothing_to_write(migrated_engine):
    db_nodes.update_fields(db_api.Context(), 'a', {})
    assert stored() == {}
