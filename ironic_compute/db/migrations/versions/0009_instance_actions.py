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

"""Instance actions and power state: stop, start, reboot, rebuild, sync.

``power_state`` is what Ironic last said of the node's power (on, off,
unknown; NULL before the first read). An action is queued on the row like
a build: ``task_state`` names it, ``task_args`` (JSON) carries its
arguments (``hard``, ``image``) and what the worker recorded before the
call it must not send twice, and ``task_requested_at`` says since when it
waits.
"""

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ironic_compute.db.migration_ops import add_columns

revision = '0009'
down_revision = '0008'
# New nullable columns only: a service of the previous release runs on
# this schema (it ignores the new task states: they are not its).
expand_only = True


def upgrade():
    add_columns(
        'instances',
        sa.Column('power_state', sa.String(16)),
        sa.Column('task_args', sa.Text),
        sa.Column('task_requested_at', sa.DateTime().with_variant(
            mysql.DATETIME(fsp=6), 'mysql', 'mariadb')))
