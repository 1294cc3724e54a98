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

"""Instances become build requests: what was asked for, and why it failed.

The daemons read requests from this table (there is no message bus): the
request spec (resource class, capacity, traits, image, conductor group),
a one-line fault, and when the instance went active. Only new nullable or
defaulted columns: older services keep working on this schema.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from ironic_compute.db.migration_ops import add_columns

revision = '0005'
down_revision = '0004'
# Adds columns only: a service of the previous release runs on this schema.
expand_only = True


def upgrade():
    add_columns(
        'instances',
        *(sa.Column(name, sa.String(255))
          for name in ('name', 'partition_key', 'resource_class')),
        *(sa.Column(name, sa.Integer, nullable=False, server_default='0')
          for name in ('vcpus', 'memory_mb', 'disk_gb')),
        *(sa.Column(name, sa.Text) for name in ('traits', 'image_source', 'fault')),
        sa.Column('launched_at', sa.DateTime().with_variant(
            mysql.DATETIME(fsp=6), 'mysql', 'mariadb')))
    # A daemon polls its own pending requests: host, then task_state.
    op.create_index('instances_host_task_state_idx', 'instances',
                    ['host', 'task_state', 'deleted'])
