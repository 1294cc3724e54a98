"""Record the partition key each service manages.

A service builds its ring only over peers of its own partition, so a
peer_list that names a service of another conductor group cannot make rows
swing between the two.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None
# Adds a nullable column: a service of the previous release runs on it.
expand_only = True


def upgrade():
    with op.batch_alter_table('services') as batch:
        batch.add_column(sa.Column('partition_key', sa.String(255)))
