"""Instances become build requests: what was asked for, and why it failed.

The daemons read requests from this table (there is no message bus): the
request spec (resource class, capacity, traits, image, conductor group),
a one-line fault, and when the instance went active. Only new nullable or
defaulted columns: older services keep working on this schema.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None
# Adds columns only: a service of the previous release runs on this schema.
expand_only = True


def upgrade():
    with op.batch_alter_table('instances') as batch:
        batch.add_column(sa.Column('name', sa.String(255)))
        batch.add_column(sa.Column('partition_key', sa.String(255)))
        batch.add_column(sa.Column('resource_class', sa.String(255)))
        for name in ('vcpus', 'memory_mb', 'disk_gb'):
            batch.add_column(sa.Column(name, sa.Integer, nullable=False,
                                       server_default='0'))
        batch.add_column(sa.Column('traits', sa.Text))
        batch.add_column(sa.Column('image_source', sa.Text))
        batch.add_column(sa.Column('fault', sa.Text))
        batch.add_column(sa.Column('launched_at', sa.DateTime().with_variant(
            mysql.DATETIME(fsp=6), 'mysql', 'mariadb')))
    # A daemon polls its own pending requests: host, then task_state.
    op.create_index('instances_host_task_state_idx', 'instances',
                    ['host', 'task_state', 'deleted'])
