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

"""Fencing of instances: a generation per instance, one live instance per node.

``instances.generation`` is bumped by every change of the managing host (a
takeover, ``node move``): a worker writes only while the row still has the
host *and* the generation it read, so a worker of a host that was judged
dead and took the instance back later (ABA) still matches nothing.

The unique constraint over ``(node, deleted)`` replaces the plain index of
0001: the database itself refuses a second live instance on a node (a NULL
node, a build without a node yet, is never a duplicate; deleted rows carry
their id in ``deleted``).
"""

import sqlalchemy as sa
from alembic import op

from ironic_compute import exception
from ironic_compute.db.migration_ops import add_columns

revision = '0008'
down_revision = '0007'
# A defaulted column and a stricter index: a service of the previous
# release runs on this schema (a write the constraint refuses is one that
# would have put two live instances on one node).
expand_only = True


def _refuse_duplicates():
    instances = sa.table('instances', sa.column('node'),
                         sa.column('deleted'), sa.column('uuid'))
    bind = op.get_bind()
    duplicated = bind.execute(
        sa.select(instances.c.node)
        .where(instances.c.node.is_not(None), instances.c.deleted == 0)
        .group_by(instances.c.node)
        .having(sa.func.count() > 1)).scalars().all()
    if duplicated:
        raise exception.SchemaError(
            'cannot add the one-live-instance-per-node constraint: nodes '
            f'{", ".join(sorted(duplicated)[:10])} have two or more live '
            'instances; remove the wrong records ("ironic-compute-manage '
            'instance remove --force UUID") and run db sync again')


def upgrade():
    _refuse_duplicates()
    add_columns('instances', sa.Column('generation', sa.Integer,
                                       nullable=False, server_default='0'))
    with op.batch_alter_table('instances') as batch:
        batch.drop_index('instances_node_deleted_idx')
        batch.create_unique_constraint('uniq_instances0node0deleted',
                                       ['node', 'deleted'])
