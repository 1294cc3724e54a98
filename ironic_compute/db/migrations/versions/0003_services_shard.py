"""Record the Ironic shard each service manages.

Services of different shards list different nodes, so they must not share a
ring: the shard is part of a service's partition, like its conductor group.
"""

import sqlalchemy as sa

from ironic_compute.db.migration_ops import add_columns

revision = '0003'
down_revision = '0002'
# Adds a nullable column: a service of the previous release runs on it.
expand_only = True


def upgrade():
    add_columns('services', sa.Column('shard', sa.String(255)))
