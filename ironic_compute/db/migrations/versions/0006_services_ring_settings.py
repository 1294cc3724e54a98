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
