"""Record the Ironic shard each service manages.

Services of different shards list different nodes, so they must not share a
ring: the shard is part of a service's partition, like its conductor group.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None
# Adds a nullable column: a service of the previous release runs on it.
expand_only = True


def upgrade():
    with op.batch_alter_table('services') as batch:
        batch.add_column(sa.Column('shard', sa.String(255)))
