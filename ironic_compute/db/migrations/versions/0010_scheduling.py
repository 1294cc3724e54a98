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

"""Scheduling in SQL, flat in cloud size, and a lock of its own.

``compute_nodes.available`` and ``compute_nodes.traits`` hold, in columns,
what the scheduler used to decode from each row's ``stats`` JSON: the
resource tracker writes them with the other synced fields, and an index
over (host, resource class, available) lets a request read a few free
nodes of each host instead of every row. Existing rows get their values
from ``stats`` here.

The ``locks`` table holds the row ``scheduler`` that schedulers update
first in their transaction: they no longer lock ``alembic_version`` (which
blocked ``db sync``, excluded nothing when missing, and is not certified
by Galera).
"""

import collections
import json

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from ironic_compute.db.migration_ops import add_columns

revision = '0010'
down_revision = '0009'
# New defaulted or nullable columns, an index and a table: a service of the
# previous release runs on this schema (it leaves the new columns as they
# are; see doc/instances.md on upgrades).
expand_only = True

_CHUNK = 500


def _traits_text(traits):
    # As compute_nodes.traits_text writes it (copied: a migration is frozen).
    return '|' + ''.join(f'{trait}|' for trait in sorted(traits))


def _backfill():
    nodes = sa.table('compute_nodes', sa.column('id'), sa.column('stats'),
                     sa.column('vcpus_used'), sa.column('deleted'),
                     sa.column('available', sa.Boolean),
                     sa.column('traits'))
    bind = op.get_bind()
    by_value = collections.defaultdict(list)
    for row_id, stats, vcpus_used in bind.execute(
            sa.select(nodes.c.id, nodes.c.stats, nodes.c.vcpus_used)
            .where(nodes.c.deleted == 0)):
        try:
            facts = json.loads(stats) if stats else {}
        except ValueError:
            facts = {}
        # As compute_nodes.offer read a row: a row without the fact is free
        # when its capacity is not used.
        available = bool(facts.get('available', not vcpus_used))
        by_value[available, _traits_text(facts.get('traits') or ())].append(
            row_id)
    for (available, traits), ids in by_value.items():
        for start in range(0, len(ids), _CHUNK):
            bind.execute(nodes.update()
                         .where(nodes.c.id.in_(ids[start:start + _CHUNK]))
                         .values(available=available, traits=traits))


def upgrade():
    add_columns('compute_nodes',
                sa.Column('available', sa.Boolean, nullable=False,
                          server_default=sa.false()),
                sa.Column('traits', sa.Text))
    op.create_index('compute_nodes_host_rc_available_idx', 'compute_nodes',
                    ['host', 'resource_class', 'available', 'deleted'])
    _backfill()
    locks = op.create_table(
        'locks',
        sa.Column('name', sa.String(255), primary_key=True),
        sa.Column('generation', sa.BigInteger, nullable=False,
                  server_default='0'),
        sa.Column('updated_at', sa.DateTime().with_variant(
            mysql.DATETIME(fsp=6), 'mysql', 'mariadb')))
    op.bulk_insert(locks, [{'name': 'scheduler', 'generation': 0}])
