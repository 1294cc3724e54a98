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

"""Record the partition key each service manages.

A service builds its ring only over peers of its own partition, so a
peer_list that names a service of another conductor group cannot make rows
swing between the two.
"""

import sqlalchemy as sa

from ironic_compute.db.migration_ops import add_columns

revision = '0002'
down_revision = '0001'
# Adds a nullable column: a service of the previous release runs on it.
expand_only = True


def upgrade():
    add_columns('services', sa.Column('partition_key', sa.String(255)))
