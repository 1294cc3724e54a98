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

"""The whole request spec and the tenant of an instance.

``instances`` records what ``instance create`` now asks for beyond the
resource class, traits and sizes: the node capabilities it must have (a
JSON object), an ephemeral partition and its file system, swap, the image's
checksum, kernel and ramdisk, and the project and user it is built for
(indexed with ``deleted``: ``instance list --project``).

``compute_nodes.capabilities`` holds a node's capabilities as
``|key:value|...|`` (sorted), so that the scheduler matches them in SQL as
it matches traits, exactly (the binary collation on MariaDB, as migration
0011 gave the traits). Existing rows get it from ``stats`` here.
"""

import collections
import json

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from ironic_compute.db.migration_ops import add_columns

revision = '0013'
down_revision = '0012'
# New nullable or defaulted columns and an index: a service of the
# previous release runs on this schema (it records none of them, and its
# scheduler does not match capabilities, as before).
expand_only = True

_CHUNK = 500


def _capabilities_text(capabilities):
    # As compute_nodes.capabilities_text writes it (copied: a migration is
    # frozen).
    return '|' + ''.join(
        f'{key}:{value}|' for key, value in sorted(capabilities.items())
        if '|' not in f'{key}{value}')


def _exact_text(bind):
    """TEXT compared exactly: on MariaDB the binary collation of the
    table's character set (the one migration 0011 gave ``traits``)."""
    if bind.dialect.name not in ('mysql', 'mariadb'):
        return sa.Text()
    charset = bind.execute(sa.text(
        'SELECT character_set_name FROM information_schema.columns'
        ' WHERE table_schema = DATABASE()'
        " AND table_name = 'compute_nodes' AND column_name = 'traits'")
    ).scalar() or 'utf8mb4'
    return mysql.TEXT(charset=charset, collation=f'{charset}_bin')


def _backfill():
    nodes = sa.table('compute_nodes', sa.column('id'), sa.column('stats'),
                     sa.column('deleted'), sa.column('capabilities'))
    bind = op.get_bind()
    by_value = collections.defaultdict(list)
    for row_id, stats in bind.execute(
            sa.select(nodes.c.id, nodes.c.stats)
            .where(nodes.c.deleted == 0)):
        try:
            facts = json.loads(stats) if stats else {}
        except ValueError:
            facts = {}
        capabilities = facts.get('capabilities')
        if not isinstance(capabilities, dict):
            capabilities = {}
        by_value[_capabilities_text(capabilities)].append(row_id)
    for text, ids in by_value.items():
        for start in range(0, len(ids), _CHUNK):
            bind.execute(nodes.update()
                         .where(nodes.c.id.in_(ids[start:start + _CHUNK]))
                         .values(capabilities=text))


def upgrade():
    add_columns('instances',
                sa.Column('capabilities', sa.Text),
                sa.Column('ephemeral_gb', sa.Integer, nullable=False,
                          server_default='0'),
                sa.Column('ephemeral_format', sa.String(255)),
                sa.Column('swap_mb', sa.Integer, nullable=False,
                          server_default='0'),
                sa.Column('image_checksum', sa.Text),
                sa.Column('image_kernel', sa.Text),
                sa.Column('image_ramdisk', sa.Text),
                sa.Column('project_id', sa.String(255)),
                sa.Column('user_id', sa.String(255)))
    op.create_index('instances_project_id_deleted_idx', 'instances',
                    ['project_id', 'deleted'])
    add_columns('compute_nodes',
                sa.Column('capabilities', _exact_text(op.get_bind())))
    _backfill()
