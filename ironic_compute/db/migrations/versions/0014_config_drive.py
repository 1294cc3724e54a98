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

"""An instance's config drive.

``instances`` records what the deploy and every rebuild give Ironic to
build the config drive from: the SSH public keys (a JSON list), the user
data (text, a secret of the tenant's), the metadata pairs (a JSON object),
the network data (network_data.json, a JSON object) and the hostname. User
data and network data may be as large as Ironic takes (64 MiB): LONGTEXT
on MariaDB, whose TEXT stops at 64 KiB. So is ``task_args`` there: a
rebuild request carries the new user data in it until the rebuild is sent.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from ironic_compute.db.migration_ops import add_columns

revision = '0014'
down_revision = '0013'
# New nullable columns, and a wider one: a service of the previous release runs on this
# schema (it records none of them and sends no config drive, as before).
expand_only = True


def _long_text():
    return sa.Text().with_variant(mysql.LONGTEXT(), 'mysql', 'mariadb')


def upgrade():
    add_columns('instances',
                sa.Column('ssh_keys', sa.Text),
                sa.Column('user_data', _long_text()),
                sa.Column('meta', sa.Text),
                sa.Column('network_data', _long_text()),
                sa.Column('hostname', sa.String(255)))
    if op.get_bind().dialect.name in ('mysql', 'mariadb'):
        # Elsewhere TEXT has no such limit: nothing to change.
        op.alter_column('instances', 'task_args', type_=mysql.LONGTEXT(),
                        existing_type=sa.Text(), existing_nullable=True)
