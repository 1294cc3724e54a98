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

"""The Ironic shard of each compute node, and which services run shard_ring.

With ``[ironic]shard_ring`` a service lists only the nodes of its shards and
reads only their rows: ``compute_nodes.shard`` (written by every cycle from
Ironic, indexed with the conductor group) selects them. ``services.shard_ring``
says which services take part in the ring over shards: a peer that does not
run it is not a shard peer.
"""

import sqlalchemy as sa
from alembic import op

from ironic_compute.db.migration_ops import add_columns

revision = '0007'
down_revision = '0006'
# Adds a nullable column, a defaulted one and an index: a service of the
# previous release runs on this schema.
expand_only = True


def upgrade():
    add_columns('compute_nodes', sa.Column('shard', sa.String(255)))
    op.create_index('compute_nodes_group_shard_deleted_idx', 'compute_nodes',
                    ['conductor_group', 'shard', 'deleted'])
    add_columns('services', sa.Column('shard_ring', sa.Boolean, nullable=False,
                                      server_default=sa.false()))
