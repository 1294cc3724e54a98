"""Record the ring settings of each service.

Services of one partition must agree on the settings that shape the ring
(``[hash_ring]partition_exponent`` and ``load_factor``, ``[ironic]
peer_list``); each records them at every cycle so that its peers and
``ironic-compute-status upgrade check`` can tell when one differs.
"""

import sqlalchemy as sa

from ironic_compute.db.migration_ops import add_columns

revision = '0006'
down_revision = '0005'
# Adds a nullable column: a service of the previous release runs on it.
expand_only = True


def upgrade():
    add_columns('services', sa.Column('ring_settings', sa.Text))
