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

"""Keep sub-second precision in the timestamp columns on MariaDB/MySQL.

A plain ``DATETIME`` there stores whole seconds, so a heartbeat looked up
to one second older than it was. PostgreSQL (``timestamp``, microseconds)
and SQLite (text) keep the fraction already: this revision changes nothing
on them.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0004'
down_revision = '0003'
# Widens column precision only: a service of the previous release reads and
# writes these columns as before.
expand_only = True

_COLUMNS = {
    'services': ('created_at', 'updated_at', 'deleted_at', 'last_seen_up',
                 'stopped_at', 'last_cycle_at'),
    'compute_nodes': ('created_at', 'updated_at', 'deleted_at'),
    'instances': ('created_at', 'updated_at', 'deleted_at'),
}


def upgrade():
    if op.get_bind().dialect.name != 'mysql':
        return
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.alter_column(
                    column, type_=mysql.DATETIME(fsp=6),
                    existing_type=sa.DateTime(),
                    existing_nullable=(column != 'created_at'))
