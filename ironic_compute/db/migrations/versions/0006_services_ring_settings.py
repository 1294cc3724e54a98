"""Record the ring settings of each service.

Services of one partition must agree on the settings that shape the ring
(``[hash_ring]partition_exponent`` and ``load_factor``, ``[ironic]
peer_list``); each records them at every cycle so that its peers and
``ironic-compute-status upgrade check`` can tell when one differs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None
# Adds a nullable column: a service of the previous release runs on it.
expand_only = True


def upgrade():
    with op.batch_alter_table('services') as batch:
        batch.add_column(sa.Column('ring_settings', sa.Text))
